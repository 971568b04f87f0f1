"""The cold tier as the worker reads it: an S3 object store (SeaweedFS locally, MinIO in
compose) behind a small blocking interface (callers run it in a thread)."""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from minio import Minio
from minio.error import S3Error
from urllib3.exceptions import HTTPError

from loraplane.worker.errors import DownloadFailed

CHUNK_BYTES = 4 << 20
"""Read size for downloads."""
PIPELINE_DEPTH = 4
"""Chunks read ahead of the hash-and-write thread (bounds memory to ~16 MiB per download)."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object below a prefix."""

    key: str
    size: int


class ObjectStore(Protocol):
    """Blocking object-store reads."""

    def list_objects(self, bucket: str, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (recursive)."""
        ...

    def download(
        self, bucket: str, key: str, dest: Path, *, max_bytes: int | None = None
    ) -> tuple[int, str]:
        """Write the object to ``dest``; returns ``(bytes written, sha256 hex)`` of what
        was written. Raises :class:`DownloadFailed` (also when more than ``max_bytes``
        arrive: the download stops there)."""
        ...

    def iter_object(self, bucket: str, key: str) -> Iterator[bytes]:
        """The object's bytes in chunks."""
        ...


class MinioStore:
    """:class:`ObjectStore` over the ``minio`` SDK; every failure is :class:`DownloadFailed`."""

    def __init__(
        self, endpoint: str, access_key: str, secret_key: str, *, secure: bool = False
    ) -> None:
        """Client for ``endpoint`` (``host:port``)."""
        self.endpoint = endpoint
        self.client = Minio(
            endpoint, access_key=access_key, secret_key=secret_key, secure=secure,
            region="us-east-1",
        )

    def _failed(self, what: str, exc: BaseException) -> str:
        """The message of a failed read, naming the object store (unreachable or erring)."""
        if isinstance(exc, S3Error):
            return f"object store at {self.endpoint}: {what} failed: {exc.code}: {exc.message}"
        return f"cannot reach the object store at {self.endpoint}: {what} failed: {exc}"

    def list_objects(self, bucket: str, prefix: str) -> list[ObjectInfo]:
        """Objects below ``prefix``."""
        try:
            return [
                ObjectInfo(o.object_name, int(o.size or 0))
                for o in self.client.list_objects(bucket, prefix=prefix, recursive=True)
                if o.object_name is not None and not o.is_dir
            ]
        except (S3Error, HTTPError, OSError) as exc:
            raise DownloadFailed(self._failed(f"listing s3://{bucket}/{prefix}", exc)) from exc

    def iter_object(self, bucket: str, key: str) -> Iterator[bytes]:
        """Stream the object."""
        try:
            resp = self.client.get_object(bucket, key)
        except (S3Error, HTTPError, OSError) as exc:
            raise DownloadFailed(self._failed(f"GET s3://{bucket}/{key}", exc)) from exc
        try:
            yield from resp.stream(CHUNK_BYTES)
        except (S3Error, HTTPError, OSError) as exc:
            raise DownloadFailed(self._failed(f"reading s3://{bucket}/{key}", exc)) from exc
        finally:
            resp.close()
            resp.release_conn()

    def download(
        self, bucket: str, key: str, dest: Path, *, max_bytes: int | None = None
    ) -> tuple[int, str]:
        """Stream the object into ``dest``, hashing the bytes as they are written.

        (Parallel ranged GETs were measured too: on a 2-core host shared with the object
        store they were not faster than one stream with hashing and writing overlapped.)
        """
        return write_hashed(self.iter_object(bucket, key), dest, max_bytes=max_bytes,
                            what=f"s3://{bucket}/{key}")


def write_hashed(
    chunks: Iterator[bytes], dest: Path, *, max_bytes: int | None, what: str
) -> tuple[int, str]:
    """Write ``chunks`` to ``dest`` and sha256 them; ``(bytes, hex digest)``.

    Hashing and writing run in a second thread, overlapped with reading the next chunk
    from the network (both release the GIL on large buffers), so the download costs
    about max(network, hash + write) instead of their sum.
    """
    h = hashlib.sha256()
    written = 0
    try:
        with open(dest, "wb") as f, ThreadPoolExecutor(1, "lp-hash-write") as sink:
            pending: deque[Future[None]] = deque()

            def consume(chunk: bytes) -> None:
                h.update(chunk)
                f.write(chunk)

            for chunk in chunks:
                written += len(chunk)
                if max_bytes is not None and written > max_bytes:
                    raise DownloadFailed(f"{what} is larger than the {max_bytes} bytes allowed")
                pending.append(sink.submit(consume, chunk))
                while len(pending) > PIPELINE_DEPTH or (pending and pending[0].done()):
                    pending.popleft().result()
            while pending:
                pending.popleft().result()
    except OSError as exc:
        dest.unlink(missing_ok=True)
        raise DownloadFailed(f"writing {dest} failed: {exc}") from exc
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    return written, h.hexdigest()


def get_and_hash(store: ObjectStore, bucket: str, keys: list[str]) -> tuple[int, list[str]]:
    """Raw baseline of the benchmark: GET every object and sha256 it in memory."""
    total = 0
    digests: list[str] = []
    for key in keys:
        h = hashlib.sha256()
        for chunk in store.iter_object(bucket, key):
            h.update(chunk)
            total += len(chunk)
        digests.append(h.hexdigest())
    return total, digests
