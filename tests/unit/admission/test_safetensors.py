"""Safetensors header: bounded read, strict JSON, offsets tile the file exactly."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loraplane.admission.checks.safetensors import read_header
from loraplane.admission.problems import SAFETENSORS_INVALID, TENSOR_DTYPE
from tests.support.synth import RawTensor, safetensors_bytes, to_raw

T = {"a": to_raw(np.ones((2, 3), np.float32), "F32"),
     "b": to_raw(np.ones((4,), np.float32), "BF16")}


def _write(tmp_path: Path, data: bytes) -> Path:
    p = tmp_path / "adapter_model.safetensors"
    p.write_bytes(data)
    return p


def _messages(tmp_path: Path, data: bytes, **kw: Any) -> list[str]:
    _, problems = read_header(_write(tmp_path, data), **kw)
    assert all(p.code in (SAFETENSORS_INVALID, TENSOR_DTYPE) for p in problems)
    return [p.message for p in problems]


def test_valid_file(tmp_path: Path) -> None:
    header, problems = read_header(_write(tmp_path, safetensors_bytes(T, {"format": "pt"})))
    assert problems == []
    assert header is not None
    assert header.metadata == {"format": "pt"}
    assert {n: (t.dtype, t.shape, t.nbytes) for n, t in header.tensors.items()} == {
        "a": ("F32", (2, 3), 24), "b": ("BF16", (4,), 8)}
    assert header.data_size == 32


def test_matches_the_safetensors_library(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    path = tmp_path / "lib.safetensors"
    save_file({"x": np.zeros((3, 5), np.float16), "y": np.ones((7,), np.float32)}, str(path))
    header, problems = read_header(path)
    assert problems == [] and header is not None
    assert header.tensors["x"].shape == (3, 5) and header.tensors["y"].dtype == "F32"


@pytest.mark.parametrize(("data", "fragment"), [
    (b"", "too small"),
    (b"\x01\x00", "too small"),
    (struct.pack("<Q", 1 << 40) + b"{}", "exceeds the limit"),
    (struct.pack("<Q", 100) + b"{}", "runs past the end"),
    (struct.pack("<Q", 4) + b"[1] ", "does not start with '{'"),
    (struct.pack("<Q", 8) + b"{'a':1} ", "not strict JSON"),
    (struct.pack("<Q", 2) + b"{}", "no tensors"),
])
def test_broken_headers(tmp_path: Path, data: bytes, fragment: str) -> None:
    messages = _messages(tmp_path, data)
    assert any(fragment in m for m in messages), messages


def test_header_size_bound_is_enforced_before_reading(tmp_path: Path) -> None:
    big = safetensors_bytes(T, {"pad": "x" * 5000})
    assert _messages(tmp_path, big, max_header_bytes=1 << 20) == []
    messages = _messages(tmp_path, big, max_header_bytes=4096)
    assert len(messages) == 1 and "exceeds the limit 4096" in messages[0]


def test_truncated_data(tmp_path: Path) -> None:
    data = safetensors_bytes(T)
    messages = _messages(tmp_path, data[:-5])
    assert any("truncated" in m for m in messages), messages


def test_trailing_bytes(tmp_path: Path) -> None:
    messages = _messages(tmp_path, safetensors_bytes(T) + b"\x00" * 4)
    assert messages == ["4 unexplained bytes after the last tensor"]


def _custom(entries: dict[str, Any], data: bytes) -> bytes:
    t = {"a": RawTensor("F32", (1,), data)}
    return safetensors_bytes(t, header=entries)[: -len(data)] + data if data else \
        safetensors_bytes({}, header=entries)


@pytest.mark.parametrize(("entry", "fragment"), [
    ({"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}, "needs 8 bytes"),
    ({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}, "non-negative"),
    ({"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}, "begin <= end"),
    ({"dtype": "F32", "shape": [1], "data_offsets": [0]}, "begin <= end"),
    ({"dtype": 7, "shape": [1], "data_offsets": [0, 4]}, "dtype must be a string"),
    ({"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": 1}, "unexpected keys"),
    ({"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}, "non-negative"),
    ("not an object", "not an object"),
])
def test_bad_entries(tmp_path: Path, entry: Any, fragment: str) -> None:
    messages = _messages(tmp_path, _custom({"a": entry}, b"\x00" * 4))
    assert any(fragment in m for m in messages), messages


def test_unknown_dtype_is_a_dtype_problem(tmp_path: Path) -> None:
    _, problems = read_header(_write(tmp_path, _custom(
        {"a": {"dtype": "F128", "shape": [1], "data_offsets": [0, 4]}}, b"\x00" * 4)))
    assert [p.code for p in problems] == [TENSOR_DTYPE]


def test_overlap_and_gap(tmp_path: Path) -> None:
    overlap = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
               "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
    assert any("overlaps" in m for m in _messages(tmp_path, _custom(overlap, b"\x00" * 12)))
    gap = {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
           "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}
    assert any("gap of 4 bytes" in m for m in _messages(tmp_path, _custom(gap, b"\x00" * 12)))


def test_bad_metadata_and_duplicate_names(tmp_path: Path) -> None:
    meta = {"__metadata__": {"k": 1}, "a": {"dtype": "F32", "shape": [1],
                                           "data_offsets": [0, 4]}}
    assert any("__metadata__" in m for m in _messages(tmp_path, _custom(meta, b"\x00" * 4)))
    raw = (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
           b'"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}')
    data = struct.pack("<Q", len(raw)) + raw + b"\x00" * 4
    assert any("duplicate key" in m for m in _messages(tmp_path, data))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_crash(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "f.safetensors"
    path.write_bytes(data)
    header, problems = read_header(path)
    assert header is not None or problems


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 40), st.binary(max_size=64))
def test_mutated_valid_file_never_crashes(tmp_path_factory: pytest.TempPathFactory,
                                          index: int, junk: bytes) -> None:
    data = bytearray(safetensors_bytes(T))
    data[8 + index: 8 + index + len(junk)] = junk
    path = tmp_path_factory.mktemp("fuzz") / "f.safetensors"
    path.write_bytes(bytes(data))
    read_header(path)
