"""Source check: the artifact location is inside the allow-listed bucket and tenant prefix.

Allowed locations have exactly the shape ``s3://<bucket>/<prefix>/<tenant>/<segment>/...``
where ``<bucket>`` is the artifact bucket, ``<prefix>`` the registry's key prefix
(``adapters`` by default) and ``<tenant>`` the tenant of the released version. The URI
is checked as text and never decoded: anything that would need decoding or
normalising to be judged is refused (percent escapes, backslashes, ``.``/``..``
segments, empty segments, control characters, non-ASCII, query strings, fragments,
credentials or ports in the authority).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from loraplane.admission.problems import SOURCE_NOT_ALLOWED, Problem
from loraplane.shared.signing import SIGNATURE_FILENAME

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
) -> tuple[S3Location | None, list[Problem]]:
    """Check ``uri`` against the allow-list; return the parsed location when it passes.

    ``directory`` says whether the URI names a directory (the artifact root; a trailing
    ``/`` is optional) or one object (the signature). Every problem is reported.
    """

    def bad(message: str) -> Problem:
        return Problem(SOURCE_NOT_ALLOWED, f"{what} {message}", path=what)

    problems: list[Problem] = []
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


def check_source(
    artifact_uri: str,
    signature_uri: str,
    *,
    tenant_id: str,
    bucket: str,
    prefix: str,
) -> tuple[S3Location | None, S3Location | None, list[Problem]]:
    """Check both locations of a release.

    Returns ``(artifact root, signature object, problems)``. An empty ``signature_uri``
    means the signature is ``model.sig`` (:data:`SIGNATURE_FILENAME`) inside the artifact root. Both locations are
    ``None`` unless every problem list is empty.
    """
    root, problems = check_location(
        artifact_uri, tenant_id=tenant_id, bucket=bucket, prefix=prefix, directory=True
    )
    sig: S3Location | None = None
    if signature_uri:
        sig, sig_problems = check_location(
            signature_uri, tenant_id=tenant_id, bucket=bucket, prefix=prefix,
            directory=False, what="signature_uri",
        )
        problems = [*problems, *sig_problems]
    elif root is not None:
        sig = S3Location(root.bucket, root.key + SIGNATURE_FILENAME)
    if problems:
        return None, None, problems
    return root, sig, []
