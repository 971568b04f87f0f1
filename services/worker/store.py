"""The cold tier as the worker reads it: the shared object store
(:mod:`loraplane.shared.objectstore`, blocking: callers run it in a thread) plus the
worker's download, which makes one pass over the bytes: each buffer is read from the
network, hashed and written while the next one is read. Every failure of the store
becomes :class:`~loraplane.worker.errors.DownloadFailed` naming the object store.

Measured on the 2-core host beside SeaweedFS (``make bench-cold`` and its breakdown): the
cost of a download is the CPU it needs (kernel → buffer copy, sha256, buffer → page cache
copy), so the pipeline reads into a few reused 1 MiB buffers (``readinto``: no new
``bytes`` per chunk, no copy inside the HTTP client) and hands each one to a second
thread that hashes it and writes it while it is still in that thread's cache
(:func:`write_hashed`; the raw baseline reads and hashes one after the other in one
thread). The reading thread does nothing else, so the socket is drained at the pace the
store sends. Measured against the alternatives, 100 MB object, alternating with the raw
GET+sha256, paired difference to the raw GET beside it (medians of 31-41, issue 19):
read | hash+write +11.6 / +17.6 ms, read | hash | write (three threads, before)
+16.9 / +24.5 ms, all in one thread +23.3 ms, read+hash | write +41.7 ms; the process's
CPU per download raw 136 ms, one thread 163, two or three threads 186 (the extra of the
split is the buffer crossing to the other core). Side by side with the three threads
(41 rounds each): 50 MB +6.2 against +9.1 ms, 100 MB +12.6 against +17.9 ms over the raw
GET (``services/worker/README.md``, runs M, N and O). Parallel ranged GETs were measured again
(2 and 4 ranges of 10 and 100 MB): not faster than one stream here, where the store shares
the two cores.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from loraplane.shared import objectstore
from loraplane.shared.errors import Unavailable
from loraplane.shared.objectstore import ObjectInfo, ObjectMissing, ObjectStore
from loraplane.worker.errors import DownloadFailed

__all__ = ["BUFFER_BYTES", "CHUNK_BYTES", "MinioStore", "ObjectInfo", "ObjectReader",
           "ObjectStore", "Streamed", "download", "get_and_hash", "list_objects",
           "open_reader", "write_hashed"]

CHUNK_BYTES = 4 << 20
"""Chunk size of :meth:`MinioStore.stream` (the shared interface; downloads read with
:meth:`MinioStore.open_reader` instead)."""
BUFFER_BYTES = 1 << 20
"""Size of one download buffer: hashed right after it is filled, while it is in cache."""
INLINE_BYTES = 2 << 20
"""An object announced at no more than this many bytes is read, hashed and written by one
thread, buffer after buffer (no hasher and writer threads to start, no hand-offs). The
crossover measured beside SeaweedFS (one object, medians of 11, issue 19): at load 5,
1.1 / 2.2 / 4.4 / 8.8 / 17.6 MB took 7.3 / 10.8 / 17.3 / 27.0 / 49.3 ms in one thread
against 9.1 / 12.4 / 17.7 / 27.9 / 46.1 ms in three; quiet (load 0.9), 1.1 / 3.3 / 5.5 /
7.7 / 11 MB 5.4 / 12.8 / 17.2 / 20.2 / 26.0 against 5.8 / 11.9 / 16.8 / 19.6 / 25.7."""
PIPELINE_DEPTH = 8
"""Buffers per download (bounds memory to 8 MiB per file): the reader fills the next ones
while the sink thread hashes and writes the filled ones (16 buffers measured slower at 50
and 100 MB, 4 alike: the backlog the sink drains after the last byte grows with it)."""


class ObjectReader(Protocol):
    """One object being read: ``readinto`` fills a buffer, 0 at the end (raises
    :class:`DownloadFailed`); ``close`` releases the connection (idempotent)."""

    size: int | None
    """Length the store announced (``None`` when unknown)."""

    def readinto(self, buffer: memoryview) -> int:
        """Read up to ``len(buffer)`` bytes into ``buffer``; 0 at the end."""
        ...

    def close(self) -> None:
        """Release the transfer (aborts it when unfinished)."""
        ...


@dataclass(frozen=True, slots=True)
class Streamed:
    """One object streamed to disk: what was written and where the time went."""

    size: int
    """Bytes written."""
    sha256: str
    """Hex digest of exactly those bytes."""
    get_s: float = 0.0
    """Time the reading thread waited for bytes from the store."""
    hash_s: float = 0.0
    """Time spent in sha256 (overlapped with the GET)."""
    write_s: float = 0.0
    """Time spent writing to the file (overlapped with the GET)."""
    open_s: float = 0.0
    """Wall time of the GET until its response headers (:func:`download`)."""
    stream_s: float = 0.0
    """Wall time from the first read to the last byte read (the GET, with the hash and
    the write overlapped; waits for a free buffer included)."""
    tail_s: float = 0.0
    """Wall time from the last byte read to the file closed: the sink thread hashing and
    writing what it still held, and the transfer released."""


class MinioStore(objectstore.MinioStore):
    """The worker's client of the shared store: downloads read the body into the caller's
    buffers (:meth:`open_reader`), ``stream`` yields 4 MiB chunks; the ``minio`` SDK's own
    patience (5 min timeouts, 5 retries of a 5xx): a load waits out a slow store."""

    def __init__(self, endpoint: str, access_key: str, secret_key: str, *,
                 secure: bool = False, ca_file: str = "") -> None:
        """Client for ``endpoint`` (``host:port``; HTTPS trusting ``ca_file`` with
        ``secure``)."""
        super().__init__(endpoint, access_key, secret_key, secure=secure, ca_file=ca_file,
                         chunk_bytes=CHUNK_BYTES, connect_timeout_s=300.0,
                         read_timeout_s=300.0, retries=5)

    def open_reader(self, bucket: str, key: str) -> ObjectReader:
        """GET the object; its body is read into the caller's buffers."""
        what = f"s3://{bucket}/{key}"
        try:
            resp = self.client.get_object(bucket, key)
        except Exception as exc:
            raise DownloadFailed(str(self._classify(exc, f"GET {what}"))) from exc
        return _HttpReader(resp, what, self._classify)


class _HttpReader:
    """The body of a ``minio`` GET (a ``urllib3`` response) read into caller buffers.

    Without a ``Content-Encoding`` the bytes are read straight from the HTTP response
    underneath ``urllib3`` (``http.client``, which checks the ``Content-Length`` and
    decodes chunked framing): one copy from the socket into the buffer. An encoded body
    goes through ``urllib3``'s decoding ``readinto``."""

    def __init__(self, resp: Any, what: str, classify: Any) -> None:
        self._resp: Any = resp
        self._what = what
        self._classify = classify
        length = resp.headers.get("Content-Length")
        self.size: int | None = int(length) if length and length.isdigit() else None
        raw: Any = getattr(resp, "_fp", None)
        plain = not resp.headers.get("Content-Encoding")
        self._readinto = raw.readinto if plain and hasattr(raw, "readinto") else resp.readinto

    def readinto(self, buffer: memoryview) -> int:
        try:
            return int(self._readinto(buffer))
        except Exception as exc:
            raise DownloadFailed(str(self._classify(exc, f"reading {self._what}"))) from exc

    def close(self) -> None:
        resp, self._resp = self._resp, None
        if resp is not None:
            resp.close()
            resp.release_conn()


class _ChunkReader:
    """:class:`ObjectReader` over any store's ``stream`` (one copy into the buffer)."""

    size: int | None = None

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._left = memoryview(b"")

    def readinto(self, buffer: memoryview) -> int:
        filled = 0
        while filled < len(buffer):
            if not self._left:
                try:
                    self._left = memoryview(next(self._chunks))
                except StopIteration:
                    break
                except (ObjectMissing, Unavailable) as exc:
                    raise DownloadFailed(str(exc)) from exc
            n = min(len(self._left), len(buffer) - filled)
            buffer[filled:filled + n] = self._left[:n]
            self._left = self._left[n:]
            filled += n
        return filled

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()


def open_reader(store: ObjectStore, bucket: str, key: str) -> ObjectReader:
    """The store's own reader when it has one (:meth:`MinioStore.open_reader`), else a
    reader over its ``stream``. Raises :class:`DownloadFailed`."""
    own = getattr(store, "open_reader", None)
    if own is not None:
        reader: ObjectReader = own(bucket, key)
        return reader
    try:
        return _ChunkReader(iter(store.stream(bucket, key)))
    except (ObjectMissing, Unavailable) as exc:
        raise DownloadFailed(str(exc)) from exc


def list_objects(store: ObjectStore, bucket: str, prefix: str) -> list[ObjectInfo]:
    """Objects below ``prefix`` (:class:`DownloadFailed` when the store fails)."""
    try:
        return store.list(bucket, prefix)
    except (ObjectMissing, Unavailable) as exc:
        raise DownloadFailed(str(exc)) from exc


def download(store: ObjectStore, bucket: str, key: str, dest: Path, *,
             max_bytes: int | None = None) -> Streamed:
    """Stream the object into ``dest``, hashing the bytes on the way; returns what was
    written (:class:`Streamed`). Raises :class:`DownloadFailed` (also when more than
    ``max_bytes`` are announced or arrive: the download stops there)."""
    what = f"s3://{bucket}/{key}"
    t0 = time.perf_counter()
    reader = open_reader(store, bucket, key)
    open_s = time.perf_counter() - t0
    try:
        if max_bytes is not None and reader.size is not None and reader.size > max_bytes:
            raise DownloadFailed(f"{what} is larger than the {max_bytes} bytes allowed "
                                 f"({reader.size} announced)")
        streamed = write_hashed(reader, dest, max_bytes=max_bytes, what=what)
    finally:
        t1 = time.perf_counter()
        reader.close()
    return replace(streamed, open_s=open_s,
                   tail_s=streamed.tail_s + time.perf_counter() - t1)


def _fill(reader: ObjectReader, buffer: memoryview) -> int:
    """Fill ``buffer`` (fewer bytes only at the end of the object)."""
    filled = 0
    while filled < len(buffer):
        n = reader.readinto(buffer[filled:])
        if not n:
            break
        filled += n
    return filled


class _BufferPool:
    """Download buffers kept for the next downloads (a fresh 1 MiB ``bytearray`` costs
    256 page faults on first touch): at most ``keep`` are held between downloads."""

    def __init__(self, size: int, keep: int) -> None:
        self.size = size
        self.keep = keep
        self._free: list[memoryview] = []
        self._lock = threading.Lock()

    def take(self) -> memoryview:
        with self._lock:
            if self._free:
                return self._free.pop()
        return memoryview(bytearray(self.size))

    def give(self, buf: memoryview) -> None:
        with self._lock:
            if len(self._free) < self.keep:
                self._free.append(buf)


_POOL = _BufferPool(BUFFER_BYTES, keep=2 * PIPELINE_DEPTH)


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view):]


def write_hashed(
    reader: ObjectReader, dest: Path, *, max_bytes: int | None, what: str
) -> Streamed:
    """Read ``reader`` to its end into ``dest`` and sha256 the bytes, in one pass.

    Two stages hand the same few buffers on, in order: this thread fills a buffer from
    the network, a sink thread sha256es it and writes it to ``dest`` (from its own cache,
    right after hashing it) and hands it back. Socket reads, sha256 and file writes all
    release the GIL, so the next buffers are read while the last ones are hashed and
    written (the raw baseline reads and hashes one after the other in one thread). An
    object that fits one buffer, or is announced at no more than :data:`INLINE_BYTES`, is
    hashed and written by this thread (no thread started). Nothing is left at ``dest`` on
    failure.
    """
    clock = time.perf_counter
    h = hashlib.sha256()
    free: queue.SimpleQueue[memoryview] = queue.SimpleQueue()
    filled: queue.SimpleQueue[tuple[memoryview, int] | None] = queue.SimpleQueue()
    failure: list[BaseException] = []
    busy = {"hash": 0.0, "write": 0.0}
    get_s = 0.0
    written = owned = 0
    read_end = started = clock()
    inline = reader.size is not None and reader.size <= INLINE_BYTES

    def sink(fd: int) -> None:
        while (item := filled.get()) is not None:
            buf, n = item
            if not failure:
                t0 = clock()
                h.update(buf[:n])
                t1 = clock()
                try:
                    _write_all(fd, buf[:n])
                except BaseException as exc:  # noqa: BLE001 - handed to the reader
                    failure.append(exc)
                busy["hash"] += t1 - t0
                busy["write"] += clock() - t1
            free.put(buf)

    try:
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as exc:
        raise DownloadFailed(f"writing {dest} failed: {exc}") from exc
    worker: threading.Thread | None = None
    try:
        while not failure:
            if owned < PIPELINE_DEPTH and free.empty():
                buf = _POOL.take()
                owned += 1
            else:
                buf = free.get()
            t0 = clock()
            n = _fill(reader, buf)
            read_end = clock()
            get_s += read_end - t0
            if not n:
                free.put(buf)
                break
            written += n
            if max_bytes is not None and written > max_bytes:
                free.put(buf)
                raise DownloadFailed(f"{what} is larger than the {max_bytes} bytes allowed")
            last = n < len(buf)
            if inline or (worker is None and last):  # small, or the whole object in one buffer
                t1 = clock()
                h.update(buf[:n])
                t2 = clock()
                _write_all(fd, buf[:n])
                busy["hash"] += t2 - t1
                busy["write"] += clock() - t2
                free.put(buf)
                if last:
                    break
                continue
            if worker is None:
                worker = threading.Thread(target=sink, args=(fd,), daemon=True,
                                          name="lp-download-sink")
                worker.start()
            filled.put((buf, n))
            if last:
                break
        if worker is not None:
            filled.put(None)
            worker.join()
            worker = None
        if failure:
            raise failure[0]
    except OSError as exc:
        _abandon(worker, filled, failure, fd, dest)
        raise DownloadFailed(f"writing {dest} failed: {exc}") from exc
    except BaseException:
        _abandon(worker, filled, failure, fd, dest)
        raise
    finally:
        while not free.empty():  # the sink has stopped: every buffer it had is back
            _POOL.give(free.get())
    os.close(fd)
    done = clock()
    return Streamed(written, h.hexdigest(), get_s, busy["hash"], busy["write"],
                    stream_s=read_end - started, tail_s=done - read_end)


def _abandon(worker: threading.Thread | None,
             filled: queue.SimpleQueue[tuple[memoryview, int] | None],
             failure: list[BaseException], fd: int, dest: Path) -> None:
    """Stop the sink thread (it skips what is left), close and delete a failed download."""
    if worker is not None:
        failure.append(DownloadFailed(f"download to {dest} abandoned"))
        filled.put(None)
        worker.join()
    os.close(fd)
    dest.unlink(missing_ok=True)


def get_and_hash(store: ObjectStore, bucket: str, keys: list[str]) -> tuple[int, list[str]]:
    """Raw baseline of the benchmark: GET every object and sha256 it in memory, in one
    thread, through the same reader as :func:`download` (one reused buffer)."""
    total = 0
    digests: list[str] = []
    buf = _POOL.take()
    for key in keys:
        h = hashlib.sha256()
        reader = open_reader(store, bucket, key)
        try:
            while n := _fill(reader, buf):
                h.update(buf[:n])
                total += n
        finally:
            reader.close()
        digests.append(h.hexdigest())
    _POOL.give(buf)
    return total, digests
