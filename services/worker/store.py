"""The cold tier as the worker reads it: an S3 object store (SeaweedFS locally, MinIO in
compose) behind a small blocking interface (callers run it in a thread)."""

from __future__ import annotations

import hashlib
import os
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
PART_BYTES = 8 << 20
"""Byte range of one GET of a download."""
PARALLEL_PARTS = 4
"""Ranges fetched at once by one download."""
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
        self.client = Minio(
            endpoint, access_key=access_key, secret_key=secret_key, secure=secure,
            region="us-east-1",
        )

    def list_objects(self, bucket: str, prefix: str) -> list[ObjectInfo]:
        """Objects below ``prefix``."""
        try:
            return [
                ObjectInfo(o.object_name, int(o.size or 0))
                for o in self.client.list_objects(bucket, prefix=prefix, recursive=True)
                if o.object_name is not None and not o.is_dir
            ]
        except (S3Error, HTTPError, OSError) as exc:
            raise DownloadFailed(f"listing s3://{bucket}/{prefix} failed: {exc}") from exc

    def iter_object(self, bucket: str, key: str) -> Iterator[bytes]:
        """Stream the object."""
        try:
            resp = self.client.get_object(bucket, key)
        except (S3Error, HTTPError, OSError) as exc:
            raise DownloadFailed(f"GET s3://{bucket}/{key} failed: {exc}") from exc
        try:
            yield from resp.stream(CHUNK_BYTES)
        except (S3Error, HTTPError, OSError) as exc:
            raise DownloadFailed(f"reading s3://{bucket}/{key} failed: {exc}") from exc
        finally:
            resp.close()
            resp.release_conn()

    def _get_range(self, bucket: str, key: str, offset: int, length: int) -> tuple[bytes, int]:
        """``(bytes, total object size)`` of one byte range."""
        what = f"s3://{bucket}/{key}"
        try:
            resp = self.client.get_object(bucket, key, offset=offset, length=length)
        except S3Error as exc:
            if exc.code == "InvalidRange" and offset == 0:  # an empty object
                return b"".join(self.iter_object(bucket, key)), 0
            raise DownloadFailed(f"GET {what} failed: {exc}") from exc
        except (HTTPError, OSError) as exc:
            raise DownloadFailed(f"GET {what} failed: {exc}") from exc
        try:
            data = resp.read()
            content_range = resp.headers.get("Content-Range", "")
        except (S3Error, HTTPError, OSError) as exc:
            raise DownloadFailed(f"reading {what} failed: {exc}") from exc
        finally:
            resp.close()
            resp.release_conn()
        total = content_range.rsplit("/", 1)[-1]
        return data, int(total) if total.isdigit() else offset + len(data)

    def download(
        self, bucket: str, key: str, dest: Path, *, max_bytes: int | None = None
    ) -> tuple[int, str]:
        """Fetch the object into ``dest`` in byte ranges of :data:`PART_BYTES`, up to
        :data:`PARALLEL_PARTS` at once, written in place and hashed in order.

        The first range also tells the object's size, so a too-large object is refused
        before the rest is fetched and no HEAD request is needed.
        """
        what = f"s3://{bucket}/{key}"
        first, size = self._get_range(bucket, key, 0, PART_BYTES)
        if max_bytes is not None and size > max_bytes:
            raise DownloadFailed(f"{what} is larger than the {max_bytes} bytes allowed")
        h = hashlib.sha256(first)
        try:
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as exc:
            raise DownloadFailed(f"writing {dest} failed: {exc}") from exc

        def fetch(offset: int) -> bytes:
            data, _ = self._get_range(bucket, key, offset, min(PART_BYTES, size - offset))
            os.pwrite(fd, data, offset)
            return data

        try:
            os.pwrite(fd, first, 0)
            offsets = deque(range(len(first), size, PART_BYTES))
            with ThreadPoolExecutor(PARALLEL_PARTS, "lp-s3-part") as pool:
                window: deque[Future[bytes]] = deque()
                while offsets or window:
                    while offsets and len(window) < 2 * PARALLEL_PARTS:
                        window.append(pool.submit(fetch, offsets.popleft()))
                    h.update(window.popleft().result())
        except OSError as exc:
            raise DownloadFailed(f"writing {dest} failed: {exc}") from exc
        finally:
            os.close(fd)
        return size, h.hexdigest()


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
        raise DownloadFailed(f"writing {dest} failed: {exc}") from exc
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
