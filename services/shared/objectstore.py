"""The cold tier as every service reads it: one object-store interface and the allow-list
grammar of the locations it may be read from.

* :class:`ObjectStore` is the blocking read interface (callers run it in a thread):
  ``list(bucket, prefix)`` and ``stream(bucket, key)``. Implementations raise
  :class:`ObjectMissing` for an absent object or bucket (a property of the release) and
  :class:`~loraplane.shared.errors.Unavailable` for an unreachable or failing store (an
  outage: retry later). :class:`MinioStore` is the implementation over the ``minio`` SDK
  (SeaweedFS locally, MinIO in compose, any S3 API); tests use in-memory or directory
  fakes of the same two methods.
* :func:`check_location` is the allow-list: ``s3://<bucket>/<prefix>/<tenant>/<segment>/...``
  with ``<bucket>`` the artifact bucket, ``<prefix>`` the registry's key prefix (``adapters``
  by default) and ``<tenant>`` the tenant of the released version. The URI is checked as
  text and never decoded: anything that would need decoding or normalising to be judged is
  refused (percent escapes, backslashes, ``.``/``..`` segments, empty segments, control
  characters, non-ASCII, query strings, fragments, credentials or ports in the authority).
  Admission judges releases with it; the worker checks every load command with it again.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from loraplane.shared.errors import Unavailable

# ---------------------------------------------------------------------------- interface


class ObjectMissing(Exception):
    """The object (or its bucket) does not exist."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One listed object."""

    key: str
    size: int


class ObjectStore(Protocol):
    """Blocking object-store reads (raise :class:`ObjectMissing` / ``Unavailable``)."""

    def list(self, bucket: str, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (recursive; no directory markers)."""
        ...

    def stream(self, bucket: str, key: str) -> Iterator[bytes]:
        """The object's bytes in chunks; closing the iterator aborts the transfer."""
        ...


_MISSING_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NoSuchObject"})


def minio_client(
    endpoint: str, access_key: str, secret_key: str, *, secure: bool = False,
    ca_file: str = "", region: str = "us-east-1", connect_timeout_s: float = 300.0,
    read_timeout_s: float = 300.0, retries: int = 5, maxsize: int = 10,
) -> Any:
    """A ``minio.Minio`` client of ``endpoint`` (``host:port``). With ``secure`` it speaks
    HTTPS and verifies the server's certificate (and its host name) against ``ca_file``
    (PEM; empty: the system's roots, ``SSL_CERT_FILE``); ``retries`` of a failed request
    (5xx). The defaults are minio's own."""
    import urllib3
    from minio import Minio

    if ca_file and not secure:
        raise ValueError("an S3 CA file is set but the client is not secure (https)")
    http = urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=connect_timeout_s, read=read_timeout_s),
        retries=urllib3.Retry(total=retries, backoff_factor=0.2,
                              status_forcelist=(500, 502, 503, 504)),
        maxsize=maxsize,  # concurrent reads from threads keep their connections
        cert_reqs="CERT_REQUIRED",
        ca_certs=ca_file or None,
    )
    return Minio(endpoint, access_key=access_key, secret_key=secret_key, secure=secure,
                 region=region, http_client=http)


class MinioStore:
    """:class:`ObjectStore` over the ``minio`` SDK."""

    def __init__(
        self, endpoint: str, access_key: str, secret_key: str, *, secure: bool = False,
        ca_file: str = "", region: str = "us-east-1", chunk_bytes: int = 1 << 20,
        connect_timeout_s: float = 5.0, read_timeout_s: float = 30.0, retries: int = 2,
    ) -> None:
        """Client for ``endpoint`` (``host:port``; HTTPS trusting ``ca_file`` with
        ``secure``, :func:`minio_client`); reads come in ``chunk_bytes`` chunks;
        ``retries`` of a failed request (5xx) before it counts as an outage."""
        self.endpoint = endpoint
        self.chunk_bytes = chunk_bytes
        self.client = minio_client(
            endpoint, access_key, secret_key, secure=secure, ca_file=ca_file, region=region,
            connect_timeout_s=connect_timeout_s, read_timeout_s=read_timeout_s,
            retries=retries)

    def _classify(self, exc: Exception, what: str) -> Exception:
        """:class:`ObjectMissing` for an absent object, ``Unavailable`` (naming the store)
        for everything else."""
        from minio.error import S3Error

        if isinstance(exc, S3Error):
            if exc.code in _MISSING_CODES:
                return ObjectMissing(f"object store at {self.endpoint}: {what} failed: "
                                     f"{exc.code}")
            return Unavailable(f"object store at {self.endpoint}: {what} failed: "
                               f"{exc.code}: {exc.message}")
        return Unavailable(f"cannot reach the object store at {self.endpoint}: {what} "
                           f"failed: {exc}")

    def list(self, bucket: str, prefix: str) -> list[ObjectInfo]:
        """Every object under ``prefix``."""
        try:
            return [ObjectInfo(o.object_name, int(o.size or 0))
                    for o in self.client.list_objects(bucket, prefix=prefix, recursive=True)
                    if o.object_name is not None and not o.is_dir]
        except Exception as exc:
            raise self._classify(exc, f"listing s3://{bucket}/{prefix}") from exc

    def stream(self, bucket: str, key: str) -> Iterator[bytes]:
        """Chunks of the object; the connection is released when the iterator closes."""
        try:
            resp = self.client.get_object(bucket, key)
        except Exception as exc:
            raise self._classify(exc, f"GET s3://{bucket}/{key}") from exc
        return self._chunks(resp, f"s3://{bucket}/{key}")

    def _chunks(self, resp: Any, what: str) -> Iterator[bytes]:
        try:
            yield from resp.stream(self.chunk_bytes)
        except Exception as exc:
            raise self._classify(exc, f"reading {what}") from exc
        finally:
            resp.close()
            resp.release_conn()


# ---------------------------------------------------------------------------- allow-list

MAX_URI_CHARS = 1024
"""Longer locations are refused outright."""
SCHEME = "s3://"
"""The only accepted scheme (lowercase, exactly)."""
SEGMENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
"""One path segment: no leading dot, no separators, no escapes."""
BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
"""S3 bucket naming rules (lowercase, 3-63 characters)."""
TENANT_RE = re.compile(r"^[a-z0-9][a-z0-9-]{1,62}$")
"""Tenant ids as the registry allows them."""
_FORBIDDEN_CHARS = {
    "%": "percent-encoded characters",
    "\\": "backslash",
    "?": "query string",
    "#": "fragment",
    "@": "credentials",
    ":": "port or drive letter",
}


@dataclass(frozen=True, slots=True)
class S3Location:
    """A checked location: bucket and key (``key`` ends with ``/`` for a directory)."""

    bucket: str
    key: str

    @property
    def uri(self) -> str:
        """``s3://bucket/key``."""
        return f"{SCHEME}{self.bucket}/{self.key}"

    def is_inside(self, root: S3Location) -> bool:
        """True when this location is below the directory ``root``."""
        return self.bucket == root.bucket and self.key.startswith(root.key) and self.key != root.key


def check_location(
    uri: str,
    *,
    tenant_id: str,
    bucket: str,
    prefix: str,
    directory: bool,
    what: str = "artifact_uri",
) -> tuple[S3Location | None, list[str]]:
    """Check ``uri`` against the allow-list; return the parsed location when it passes,
    else every problem (messages starting with ``what``).

    ``directory`` says whether the URI names a directory (the artifact root; a trailing
    ``/`` is optional) or one object (the signature).
    """

    def bad(message: str) -> str:
        return f"{what} {message}"

    problems: list[str] = []
    if not TENANT_RE.match(tenant_id):
        problems.append(bad(f"belongs to an invalid tenant id {tenant_id!r}"))
    if not uri:
        return None, [*problems, bad("is empty")]
    if len(uri) > MAX_URI_CHARS:
        return None, [*problems, bad(f"is longer than {MAX_URI_CHARS} characters")]
    if not uri.isascii():
        problems.append(bad("contains non-ASCII characters"))
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in uri):
        problems.append(bad("contains whitespace, NUL or control characters"))
    if not uri.startswith(SCHEME):
        scheme = uri.split(":", 1)[0] if ":" in uri else ""
        problems.append(bad(f"must use the s3:// scheme (got {scheme!r})"))
        return None, problems
    rest = uri[len(SCHEME):]
    for char, label in _FORBIDDEN_CHARS.items():
        if char in rest:
            problems.append(bad(f"contains {label} ({char!r})"))
    if "/" not in rest:
        return None, [*problems, bad("has no object key")]
    uri_bucket, key = rest.split("/", 1)
    if uri_bucket != bucket:
        problems.append(bad(f"is in bucket {uri_bucket!r}, not the artifact bucket {bucket!r}"))
    elif not BUCKET_RE.match(uri_bucket):
        problems.append(bad(f"has an invalid bucket name {uri_bucket!r}"))

    is_dir_form = key.endswith("/")
    if is_dir_form and not directory:
        problems.append(bad("names a directory, not an object"))
    segments = key[:-1].split("/") if is_dir_form else key.split("/")
    for seg in segments:
        if seg in ("", ".", ".."):
            problems.append(bad(f"has an empty, '.' or '..' path segment in {key!r}"))
            break
    else:
        for seg in segments:
            if not SEGMENT_RE.match(seg):
                problems.append(bad(f"has a disallowed path segment {seg[:64]!r}"))
                break

    want = [*[s for s in prefix.strip("/").split("/") if s], tenant_id]
    if segments[: len(want)] != want:
        problems.append(bad(f"is outside the tenant prefix {'/'.join(want)}/"))
    elif len(segments) <= len(want):
        problems.append(bad("names the tenant prefix itself, not an artifact below it"))
    if problems:
        return None, problems
    clean_key = "/".join(segments) + ("/" if directory else "")
    return S3Location(bucket=uri_bucket, key=clean_key), []
