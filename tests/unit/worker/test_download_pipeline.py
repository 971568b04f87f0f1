"""The worker's one-pass download (loraplane.worker.store.write_hashed): every byte
written in order and hashed, short reads, the size cap, and failures of the store or the
disk leave nothing behind."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from loraplane.worker import store as store_mod
from loraplane.worker.errors import DownloadFailed
from loraplane.worker.store import (
    BUFFER_BYTES,
    PIPELINE_DEPTH,
    download,
    get_and_hash,
    open_reader,
    write_hashed,
)


class PieceReader:
    """Reader handing out ``data`` in pieces of ``piece`` bytes (a slow socket), failing
    with ``fail_after`` bytes read when set."""

    size: int | None = None

    def __init__(self, data: bytes, piece: int, fail_after: int | None = None) -> None:
        self.data = memoryview(data)
        self.piece = piece
        self.fail_after = fail_after
        self.pos = 0
        self.closed = False

    def readinto(self, buffer: memoryview) -> int:
        if self.fail_after is not None and self.pos >= self.fail_after:
            raise DownloadFailed("connection reset by the store")
        n = min(self.piece, len(buffer), len(self.data) - self.pos)
        buffer[:n] = self.data[self.pos:self.pos + n]
        self.pos += n
        return n

    def close(self) -> None:
        self.closed = True


SIZES = [0, 1, BUFFER_BYTES - 1, BUFFER_BYTES, (PIPELINE_DEPTH + 3) * BUFFER_BYTES + 12345]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("piece", [7_001, BUFFER_BYTES, 3 * BUFFER_BYTES])
def test_every_byte_is_written_in_order_and_hashed(tmp_path: Path, size: int,
                                                   piece: int) -> None:
    data = os.urandom(size)
    dest = tmp_path / "blob"
    out = write_hashed(PieceReader(data, piece), dest, max_bytes=None, what="blob")
    assert out.size == size
    assert out.sha256 == hashlib.sha256(data).hexdigest()
    assert dest.read_bytes() == data
    assert out.get_s >= 0 and out.hash_s >= 0 and out.write_s >= 0


def test_over_the_cap_stops_and_leaves_nothing(tmp_path: Path) -> None:
    data = os.urandom(3 * BUFFER_BYTES)
    dest = tmp_path / "big"
    with pytest.raises(DownloadFailed, match="larger than the 1048577 bytes allowed"):
        write_hashed(PieceReader(data, BUFFER_BYTES), dest, max_bytes=BUFFER_BYTES + 1,
                     what="big")
    assert not dest.exists()


def test_store_failure_mid_stream_leaves_nothing(tmp_path: Path) -> None:
    data = os.urandom(4 * BUFFER_BYTES)
    dest = tmp_path / "cut"
    with pytest.raises(DownloadFailed, match="connection reset"):
        write_hashed(PieceReader(data, 65_536, fail_after=2 * BUFFER_BYTES + 5), dest,
                     max_bytes=None, what="cut")
    assert not dest.exists()


def test_disk_failure_is_a_download_failure_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = os.write
    calls = [0]

    def failing_write(fd: int, data: memoryview) -> int:
        calls[0] += 1
        if calls[0] == 2:
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(store_mod.os, "write", failing_write)
    dest = tmp_path / "full"
    with pytest.raises(DownloadFailed, match="No space left on device"):
        write_hashed(PieceReader(os.urandom(20 * BUFFER_BYTES), BUFFER_BYTES), dest,
                     max_bytes=None, what="full")
    assert not dest.exists()


def test_unwritable_destination_is_a_download_failure(tmp_path: Path) -> None:
    with pytest.raises(DownloadFailed, match="writing"):
        write_hashed(PieceReader(b"abc", 3), tmp_path / "absent-dir" / "x", max_bytes=None,
                     what="x")


class StreamOnlyStore:
    """A store with only the shared interface (``stream``): read through the chunk reader."""

    def __init__(self, objects: dict[str, list[bytes]]) -> None:
        self.objects = objects
        self.closed: list[str] = []

    def list(self, bucket: str, prefix: str) -> list[object]:
        raise AssertionError("not used")

    def stream(self, bucket: str, key: str) -> Iterator[bytes]:
        def gen() -> Iterator[bytes]:
            try:
                yield from self.objects[key]
            finally:
                self.closed.append(key)
        return gen()


def test_stream_only_store_and_the_raw_baseline_read_the_same_bytes(tmp_path: Path) -> None:
    chunks = [os.urandom(n) for n in (10, BUFFER_BYTES + 3, 0, 5, 2 * BUFFER_BYTES)]
    data = b"".join(chunks)
    st = StreamOnlyStore({"k": chunks})
    out = download(st, "b", "k", tmp_path / "k")  # type: ignore[arg-type]
    assert (tmp_path / "k").read_bytes() == data and out.size == len(data)
    assert out.sha256 == hashlib.sha256(data).hexdigest()
    assert get_and_hash(st, "b", ["k"]) == (len(data), [out.sha256])  # type: ignore[arg-type]
    assert st.closed == ["k", "k"]  # every transfer released


def test_announced_size_over_the_cap_is_refused_before_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = PieceReader(os.urandom(100), 100)
    reader.size = 100

    class OwnReaderStore(StreamOnlyStore):
        def open_reader(self, bucket: str, key: str) -> PieceReader:
            return reader

    st = OwnReaderStore({})
    assert open_reader(st, "b", "k") is reader  # type: ignore[arg-type]
    with pytest.raises(DownloadFailed, match="100 announced"):
        download(st, "b", "k", tmp_path / "k", max_bytes=99)  # type: ignore[arg-type]
    assert reader.pos == 0 and reader.closed and not (tmp_path / "k").exists()


@pytest.mark.parametrize("size", [1, BUFFER_BYTES, 3 * BUFFER_BYTES + 5])
def test_a_small_object_is_read_hashed_and_written_by_one_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    def no_thread(*args: object, **kwargs: object) -> None:
        raise AssertionError("a thread was started for an object at or below INLINE_BYTES")

    monkeypatch.setattr(store_mod, "INLINE_BYTES", 3 * BUFFER_BYTES + 5)
    monkeypatch.setattr(store_mod.threading, "Thread", no_thread)
    data = os.urandom(size)
    reader = PieceReader(data, 65_536)
    reader.size = size  # announced: what decides
    out = write_hashed(reader, tmp_path / "small", max_bytes=None, what="small")
    assert (tmp_path / "small").read_bytes() == data
    assert out.size == size and out.sha256 == hashlib.sha256(data).hexdigest()


def test_above_the_inline_size_or_unannounced_the_sink_runs_in_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    started: list[str] = []
    real = threading.Thread

    def counting(*args: object, **kwargs: object) -> threading.Thread:
        started.append(str(kwargs.get("name")))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(store_mod, "INLINE_BYTES", 2 * BUFFER_BYTES)
    monkeypatch.setattr(store_mod.threading, "Thread", counting)
    data = os.urandom(2 * BUFFER_BYTES + 1)
    announced = PieceReader(data, BUFFER_BYTES)
    announced.size = len(data)
    write_hashed(announced, tmp_path / "a", max_bytes=None, what="a")
    write_hashed(PieceReader(data[:BUFFER_BYTES + 1], BUFFER_BYTES), tmp_path / "b",
                 max_bytes=None, what="b")  # size unknown: not inline
    assert started == ["lp-download-sink"] * 2
    assert (tmp_path / "a").read_bytes() == data
    assert (tmp_path / "b").read_bytes() == data[:BUFFER_BYTES + 1]


def test_the_wall_time_splits_into_open_stream_and_tail(tmp_path: Path) -> None:
    data = os.urandom(3 * BUFFER_BYTES + 7)
    st = StreamOnlyStore({"k": [data]})
    import time

    t0 = time.perf_counter()
    out = download(st, "b", "k", tmp_path / "k")  # type: ignore[arg-type]
    wall = time.perf_counter() - t0
    parts = (out.open_s, out.stream_s, out.tail_s)
    assert all(p >= 0 for p in parts) and out.stream_s > 0
    assert sum(parts) <= wall  # disjoint parts of the call
    assert out.get_s <= out.stream_s  # the reads happen inside the stream
