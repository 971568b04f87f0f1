"""NaN/Inf scan per dtype, streaming in chunks (values at chunk edges included)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from loraplane.admission.checks import finite
from loraplane.admission.checks.finite import check_finite
from loraplane.admission.checks.safetensors import read_header
from loraplane.admission.problems import NON_FINITE
from tests.support.synth import RawTensor, safetensors_bytes, to_raw


def _scan(tmp_path: Path, tensors: dict[str, RawTensor]) -> tuple[list[str], int]:
    path = tmp_path / "w.safetensors"
    path.write_bytes(safetensors_bytes(tensors))
    header, problems = read_header(path)
    assert problems == [] and header is not None
    found, scanned = check_finite(header)
    assert all(p.code == NON_FINITE for p in found)
    return [f"{p.path}: {p.message}" for p in found], scanned


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16", "F64"])
def test_finite_values_pass(tmp_path: Path, dtype: str) -> None:
    values = np.linspace(-1e4, 1e4, 1001, dtype=np.float32)
    messages, scanned = _scan(tmp_path, {"t": to_raw(values, dtype)})
    assert messages == []
    assert scanned == values.size * {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}[dtype]


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16", "F64"])
@pytest.mark.parametrize(("bad", "expect"), [
    ([np.nan], "1 NaN"), ([np.inf], "1 Inf"), ([-np.inf, np.nan, np.nan], "2 NaN and 1 Inf"),
])
def test_non_finite_found_and_counted(tmp_path: Path, dtype: str, bad: list[float],
                                      expect: str) -> None:
    values = np.zeros(100, np.float32)
    values[-len(bad):] = bad
    messages, _ = _scan(tmp_path, {"ok": to_raw(np.ones(3, np.float32), dtype),
                                   "bad": to_raw(values, dtype)})
    assert messages == [f"bad: {expect} among 100 {dtype} values"]


def test_largest_finite_values_are_not_flagged(tmp_path: Path) -> None:
    f16 = np.array([np.finfo(np.float16).max, -np.finfo(np.float16).max], np.float16)
    bf16_max = RawTensor("BF16", (2,), np.array([0x7F7F, 0xFF7F], "<u2").tobytes())
    messages, _ = _scan(tmp_path, {"a": RawTensor("F16", (2,), f16.tobytes()),
                                   "b": bf16_max})
    assert messages == []


def test_f16_overflow_from_f32_is_inf(tmp_path: Path) -> None:
    with np.errstate(over="ignore"):
        raw = to_raw(np.array([1e6], np.float32), "F16")
    messages, _ = _scan(tmp_path, {"t": raw})
    assert messages == ["t: 1 Inf among 1 F16 values"]


def test_integer_tensors_are_skipped(tmp_path: Path) -> None:
    raw = RawTensor("U8", (4,), b"\xff\xff\xff\xff")
    assert _scan(tmp_path, {"t": raw}) == ([], 0)


@pytest.mark.parametrize("dtype", ["F32", "BF16"])
def test_chunk_boundaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    monkeypatch.setattr(finite, "CHUNK_BYTES", 64)
    item = 4 if dtype == "F32" else 2
    per_chunk = 64 // item
    for index in (0, per_chunk - 1, per_chunk, 5 * per_chunk + 3, 10 * per_chunk - 1):
        values = np.zeros(10 * per_chunk, np.float32)
        values[index] = np.nan
        messages, _ = _scan(tmp_path, {"t": to_raw(values, dtype)})
        assert messages == [f"t: 1 NaN among {values.size} {dtype} values"], index


def test_f8_formats(tmp_path: Path) -> None:
    e4m3 = RawTensor("F8_E4M3", (3,), bytes([0x00, 0x7E, 0xFF]))  # 0xFF is NaN
    e5m2 = RawTensor("F8_E5M2", (3,), bytes([0x00, 0x7C, 0x7B]))  # 0x7C is +Inf
    messages, _ = _scan(tmp_path, {"a": e4m3, "b": e5m2})
    assert messages == ["a: 1 NaN among 3 F8_E4M3 values", "b: 1 Inf among 3 F8_E5M2 values"]


def test_memory_stays_bounded_for_large_tensors(tmp_path: Path) -> None:
    values = np.zeros(6 << 20, np.float32)  # 24 MiB, several chunks
    values[-1] = np.inf
    messages, scanned = _scan(tmp_path, {"t": to_raw(values, "F32")})
    assert messages == [f"t: 1 Inf among {values.size} F32 values"]
    assert scanned == values.nbytes


def test_regions_of_mixed_dtypes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(finite, "CHUNK_BYTES", 64)
    ok = np.linspace(-3, 3, 50, dtype=np.float32)
    bad = ok.copy()
    bad[49] = np.inf
    tensors = {
        "a": to_raw(ok, "F32"), "b": to_raw(ok, "F32"), "c": to_raw(bad, "BF16"),
        "d": to_raw(ok, "BF16"), "e": RawTensor("U8", (3,), b"\xff\xff\xff"),
        "f": to_raw(ok, "F32"), "g": to_raw(bad, "F32"), "h": to_raw(ok, "F16"),
    }
    messages, scanned = _scan(tmp_path, tensors)
    assert messages == ["c: 1 Inf among 50 BF16 values", "g: 1 Inf among 50 F32 values"]
    assert scanned == 4 * 200 + 3 * 100
