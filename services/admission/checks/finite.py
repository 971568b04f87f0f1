"""Finite check: no NaN or Inf in any floating-point tensor.

Streams over the data buffer of the (already header-checked) safetensors file through a
read-only memory map, one bounded chunk at a time, so memory stays flat whatever the
file size. Per dtype:

* ``F32``/``F64``: ``min`` and ``max`` of the chunk (NaN propagates through both, an
  infinity shows up as one of them) — one vectorised pass, no temporary arrays;
* ``F16``/``BF16`` (no native numpy bf16): the bits with the sign cleared are at least
  the all-ones exponent pattern exactly when the value is NaN or Inf, so ``max(bits &
  0x7FFF) >= 0x7C00`` (F16) or ``0x7F80`` (BF16);
* ``F8_E4M3`` has no Inf and NaN is ``0x7F``/``0xFF``; ``F8_E5M2`` is F16's top byte.

Only when a chunk is flagged are NaN and Inf counted exactly (for the message).
Integer and bool tensors cannot hold non-finite values and are skipped.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from loraplane.admission.checks.safetensors import SafetensorsHeader, TensorInfo
from loraplane.admission.problems import NON_FINITE, Problem

CHUNK_BYTES = 4 << 20
"""Bytes examined per step."""


@dataclass(frozen=True, slots=True)
class _Bits:
    """How to find non-finite values in the raw bits of one dtype."""

    uint: type[np.unsignedinteger]
    """Unsigned integer type of the same width."""
    abs_mask: int
    """Clears the sign bit."""
    exp_all_ones: int
    """Smallest magnitude pattern that is NaN or Inf."""
    inf_pattern: int | None
    """Magnitude bits of infinity (None: the format has no infinity)."""


_BITS: dict[str, _Bits] = {
    "F64": _Bits(np.uint64, 0x7FFF_FFFF_FFFF_FFFF, 0x7FF0_0000_0000_0000,
                 0x7FF0_0000_0000_0000),
    "F32": _Bits(np.uint32, 0x7FFF_FFFF, 0x7F80_0000, 0x7F80_0000),
    "F16": _Bits(np.uint16, 0x7FFF, 0x7C00, 0x7C00),
    "BF16": _Bits(np.uint16, 0x7FFF, 0x7F80, 0x7F80),
    "F8_E5M2": _Bits(np.uint8, 0x7F, 0x7C, 0x7C),
    "F8_E4M3": _Bits(np.uint8, 0x7F, 0x7F, None),
}
_FLOATS: dict[str, type[np.floating]] = {"F32": np.float32, "F64": np.float64}


def _count(bits: npt.NDArray[np.unsignedinteger], spec: _Bits) -> tuple[int, int]:
    """Exact (NaN, Inf) counts in ``bits``."""
    magnitude = bits & spec.uint(spec.abs_mask)
    bad = magnitude >= spec.exp_all_ones
    if spec.inf_pattern is None:
        return int(np.count_nonzero(bad)), 0
    inf = int(np.count_nonzero(magnitude == spec.inf_pattern))
    return int(np.count_nonzero(bad)) - inf, inf


def _scan_tensor(buf: mmap.mmap, start: int, t: TensorInfo) -> tuple[int, int]:
    """(NaN, Inf) counts of tensor ``t`` whose bytes start at absolute offset ``start``."""
    spec = _BITS[t.dtype]
    item = np.dtype(spec.uint).itemsize
    step = max(item, CHUNK_BYTES - CHUNK_BYTES % item)
    nan = inf = 0
    scratch = np.empty(step // item, dtype=spec.uint)
    floating = _FLOATS.get(t.dtype)
    for off in range(0, t.nbytes, step):
        size = min(step, t.nbytes - off)
        count = size // item
        bits = np.frombuffer(buf, dtype=spec.uint, count=count, offset=start + off)
        if floating is not None:
            values = bits.view(floating)
            flagged = not (np.isfinite(values.min()) and np.isfinite(values.max()))
        else:
            masked = np.bitwise_and(bits, spec.uint(spec.abs_mask), out=scratch[:count])
            flagged = bool(masked.max() >= spec.exp_all_ones)
        if flagged:
            n, i = _count(bits, spec)
            nan += n
            inf += i
    return nan, inf


def check_finite(header: SafetensorsHeader) -> tuple[list[Problem], int]:
    """Scan every floating-point tensor of ``header``'s file.

    Returns the problems (one per tensor holding NaN or Inf) and the number of bytes
    scanned. Tensors whose bytes are not inside the file are skipped (the header check
    reports them).
    """
    todo = [t for t in header.tensors.values()
            if t.dtype in _BITS and t.nbytes > 0 and header.readable(t)]
    if not todo:
        return [], 0
    problems: list[Problem] = []
    scanned = 0
    with header.path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        for t in sorted(todo, key=lambda t: t.begin):
            nan, inf = _scan_tensor(buf, header.data_start + t.begin, t)
            scanned += t.nbytes
            if nan or inf:
                parts = [f"{nan} NaN" if nan else "", f"{inf} Inf" if inf else ""]
                problems.append(Problem(NON_FINITE, " and ".join(p for p in parts if p)
                                        + f" among {t.nbytes // _itemsize(t)} {t.dtype} "
                                        "values", t.name))
    return problems, scanned


def _itemsize(t: TensorInfo) -> int:
    return np.dtype(_BITS[t.dtype].uint).itemsize

