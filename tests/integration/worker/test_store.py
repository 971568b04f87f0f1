"""The worker's S3 reads against SeaweedFS: streamed download + sha256, size cap, errors."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import pytest

from loraplane.stack.stack import Stack
from loraplane.worker.errors import DownloadFailed
from loraplane.worker.store import CHUNK_BYTES, MinioStore, download, get_and_hash, list_objects


def _store(stack: Stack) -> tuple[MinioStore, str]:
    s = stack.settings
    return MinioStore(**s.s3_connection()), s.artifact_bucket


def _put(stack: Stack, key: str, data: bytes) -> None:
    s = stack.settings
    s.s3_client().put_object(s.artifact_bucket, key, io.BytesIO(data), len(data))


@pytest.mark.parametrize("size", [0, 1, CHUNK_BYTES, 2 * CHUNK_BYTES + 12345])
def test_download_writes_and_hashes_every_byte(
    stack: Stack, unique: str, tmp_path: Path, size: int
) -> None:
    store, bucket = _store(stack)
    data = os.urandom(size)
    key = f"tests/{unique}/blob-{size}"
    _put(stack, key, data)
    dest = tmp_path / "blob"
    streamed = download(store, bucket, key, dest)
    assert streamed.size == size and dest.read_bytes() == data
    assert streamed.sha256 == hashlib.sha256(data).hexdigest()
    assert get_and_hash(store, bucket, [key]) == (size, [streamed.sha256])


def test_object_over_the_cap_is_cut_off(
    stack: Stack, unique: str, tmp_path: Path
) -> None:
    store, bucket = _store(stack)
    key = f"tests/{unique}/big"
    _put(stack, key, os.urandom(CHUNK_BYTES + 10))
    with pytest.raises(DownloadFailed, match="larger than"):
        download(store, bucket, key, tmp_path / "big", max_bytes=CHUNK_BYTES)
    assert not (tmp_path / "big").exists()


def test_missing_object_and_listing(stack: Stack, unique: str, tmp_path: Path) -> None:
    store, bucket = _store(stack)
    with pytest.raises(DownloadFailed, match="NoSuchKey|does not exist|not found"):
        download(store, bucket, f"tests/{unique}/absent", tmp_path / "x")
    _put(stack, f"tests/{unique}/dir/a", b"a")
    _put(stack, f"tests/{unique}/dir/sub/b", b"bb")
    listed = sorted((o.key, o.size) for o in list_objects(store, bucket, f"tests/{unique}/dir/"))
    assert listed == [(f"tests/{unique}/dir/a", 1), (f"tests/{unique}/dir/sub/b", 2)]
