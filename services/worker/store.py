"""The cold tier as the worker reads it: an S3 object store (SeaweedFS locally, MinIO in
compose) behind a small blocking interface (callers run it in a thread)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from minio import Minio
from minio.error import S3Error
from urllib3.exceptions import HTTPError

from loraplane.worker.errors import DownloadFailed

CHUNK_BYTES = 4 << 20
"""Read size for downloads."""


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

    def download(self, bucket: str, key: str, dest: Path) -> int:
        """Write the object to ``dest``; returns the bytes written."""
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

    def download(self, bucket: str, key: str, dest: Path) -> int:
        """Stream the object into ``dest``."""
        written = 0
        try:
            with open(dest, "wb") as f:
                for chunk in self.iter_object(bucket, key):
                    f.write(chunk)
                    written += len(chunk)
        except OSError as exc:
            raise DownloadFailed(f"writing {dest} failed: {exc}") from exc
        return written


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
