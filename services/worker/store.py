"""The cold tier as the worker reads it: the shared object store
(:mod:`loraplane.shared.objectstore`, blocking: callers run it in a thread) plus the
worker's download, which hashes the bytes as it writes them. Every failure of the store
becomes :class:`~loraplane.worker.errors.DownloadFailed` naming the object store."""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from loraplane.shared import objectstore
from loraplane.shared.errors import Unavailable
from loraplane.shared.objectstore import ObjectInfo, ObjectMissing, ObjectStore
from loraplane.worker.errors import DownloadFailed

__all__ = ["CHUNK_BYTES", "MinioStore", "ObjectInfo", "ObjectStore", "download",
           "get_and_hash", "list_objects", "write_hashed"]

CHUNK_BYTES = 4 << 20
"""Read size for downloads."""
PIPELINE_DEPTH = 4
"""Chunks read ahead of the hash-and-write thread (bounds memory to ~16 MiB per download)."""


class MinioStore(objectstore.MinioStore):
    """The worker's client of the shared store: 4 MiB reads and the ``minio`` SDK's own
    patience (5 min timeouts, 5 retries of a 5xx): a load waits out a slow store."""

    def __init__(self, endpoint: str, access_key: str, secret_key: str, *,
                 secure: bool = False) -> None:
        """Client for ``endpoint`` (``host:port``)."""
        super().__init__(endpoint, access_key, secret_key, secure=secure,
                         chunk_bytes=CHUNK_BYTES, connect_timeout_s=300.0,
                         read_timeout_s=300.0, retries=5)


def list_objects(store: ObjectStore, bucket: str, prefix: str) -> list[ObjectInfo]:
    """Objects below ``prefix`` (:class:`DownloadFailed` when the store fails)."""
    try:
        return store.list(bucket, prefix)
    except (ObjectMissing, Unavailable) as exc:
        raise DownloadFailed(str(exc)) from exc


def _chunks(store: ObjectStore, bucket: str, key: str) -> Iterator[bytes]:
    try:
        yield from store.stream(bucket, key)
    except (ObjectMissing, Unavailable) as exc:
        raise DownloadFailed(str(exc)) from exc


def download(store: ObjectStore, bucket: str, key: str, dest: Path, *,
             max_bytes: int | None = None) -> tuple[int, str]:
    """Stream the object into ``dest``, hashing the bytes as they are written; returns
    ``(bytes written, sha256 hex)``. Raises :class:`DownloadFailed` (also when more than
    ``max_bytes`` arrive: the download stops there).

    (Parallel ranged GETs were measured too: on a 2-core host shared with the object
    store they were not faster than one stream with hashing and writing overlapped.)
    """
    return write_hashed(_chunks(store, bucket, key), dest, max_bytes=max_bytes,
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
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    return written, h.hexdigest()


def get_and_hash(store: ObjectStore, bucket: str, keys: list[str]) -> tuple[int, list[str]]:
    """Raw baseline of the benchmark: GET every object and sha256 it in memory."""
    total = 0
    digests: list[str] = []
    for key in keys:
        h = hashlib.sha256()
        for chunk in _chunks(store, bucket, key):
            h.update(chunk)
            total += len(chunk)
        digests.append(h.hexdigest())
    return total, digests
