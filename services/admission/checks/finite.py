"""Finite check: no NaN or Inf in any floating-point tensor.

Streams over the data buffer of the (already header-checked) safetensors file through a
read-only memory map, one bounded chunk at a time, so memory stays flat whatever the file
size. Tensors tile the buffer, so consecutive tensors of one dtype form one contiguous
region that is scanned as a whole (a LoRA file has hundreds of small tensors).

The test works on the raw bits, the same way for every float format: a value is NaN or
Inf exactly when its exponent bits are all ones, i.e. when its magnitude bits (sign
cleared) are at least the pattern ``E`` of an all-ones exponent. Viewing the chunk as
signed integers, a positive non-finite value is ``>= E``; viewing it as unsigned
integers, a negative one is ``>= sign | E``. So two vectorised ``max`` reductions per
chunk decide, with no temporary array:

* F64/F32/F16/BF16: ``E`` = ``0x7FF0…``, ``0x7F800000``, ``0x7C00``, ``0x7F80``;
* F8_E5M2: ``0x7C``; F8_E4M3 has no Inf and NaN is ``0x7F`` (``E = 0x7F``).

Only a flagged region is examined again to count NaN and Inf per tensor exactly (for the
message). Integer and bool tensors cannot hold non-finite values and are skipped.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from loraplane.admission.checks.safetensors import SafetensorsHeader, TensorInfo
from loraplane.admission.problems import NON_FINITE, Problem

CHUNK_BYTES = 4 << 20
"""Bytes examined per step (a multiple of every item size)."""


@dataclass(frozen=True, slots=True)
class _Bits:
    """How to find non-finite values in the raw bits of one dtype."""

    signed: type[np.signedinteger]
    unsigned: type[np.unsignedinteger]
    exp_all_ones: int
    """Smallest magnitude pattern that is NaN or Inf."""
    inf_pattern: int | None
    """Magnitude bits of infinity (None: the format has no infinity)."""

    @property
    def itemsize(self) -> int:
        return np.dtype(self.unsigned).itemsize

    @property
    def sign(self) -> int:
        return 1 << (8 * self.itemsize - 1)


_BITS: dict[str, _Bits] = {
    "F64": _Bits(np.int64, np.uint64, 0x7FF0_0000_0000_0000, 0x7FF0_0000_0000_0000),
    "F32": _Bits(np.int32, np.uint32, 0x7F80_0000, 0x7F80_0000),
    "F16": _Bits(np.int16, np.uint16, 0x7C00, 0x7C00),
    "BF16": _Bits(np.int16, np.uint16, 0x7F80, 0x7F80),
    "F8_E5M2": _Bits(np.int8, np.uint8, 0x7C, 0x7C),
    "F8_E4M3": _Bits(np.int8, np.uint8, 0x7F, None),
}


def _flagged(buf: mmap.mmap, start: int, nbytes: int, spec: _Bits) -> bool:
    """True when any value in ``[start, start + nbytes)`` is NaN or Inf."""
    step = CHUNK_BYTES - CHUNK_BYTES % spec.itemsize
    for off in range(0, nbytes, step):
        count = min(step, nbytes - off) // spec.itemsize
        signed = np.frombuffer(buf, dtype=spec.signed, count=count, offset=start + off)
        if int(signed.max()) >= spec.exp_all_ones:
            return True
        if int(signed.view(spec.unsigned).max()) >= spec.sign | spec.exp_all_ones:
            return True
    return False


def _count(buf: mmap.mmap, start: int, t: TensorInfo, spec: _Bits) -> tuple[int, int]:
    """Exact (NaN, Inf) counts of tensor ``t`` (rare path: only for flagged regions)."""
    nan = inf = 0
    step = CHUNK_BYTES - CHUNK_BYTES % spec.itemsize
    mask = spec.unsigned(spec.sign - 1)
    for off in range(0, t.nbytes, step):
        count = min(step, t.nbytes - off) // spec.itemsize
        bits: npt.NDArray[np.unsignedinteger] = np.frombuffer(
            buf, dtype=spec.unsigned, count=count, offset=start + off)
        magnitude = bits & mask
        bad = int(np.count_nonzero(magnitude >= spec.exp_all_ones))
        n_inf = 0 if spec.inf_pattern is None else int(
            np.count_nonzero(magnitude == spec.inf_pattern))
        nan += bad - n_inf
        inf += n_inf
    return nan, inf


def _regions(tensors: list[TensorInfo]) -> Iterator[list[TensorInfo]]:
    """Runs of byte-contiguous tensors of one dtype (``tensors`` sorted by offset)."""
    run: list[TensorInfo] = []
    for t in tensors:
        if run and (t.dtype != run[-1].dtype or t.begin != run[-1].end):
            yield run
            run = []
        run.append(t)
    if run:
        yield run


def check_finite(header: SafetensorsHeader) -> tuple[list[Problem], int]:
    """Scan every floating-point tensor of ``header``'s file.

    Returns the problems (one per tensor holding NaN or Inf) and the number of bytes
    scanned. Tensors whose bytes are not inside the file are skipped (the header check
    reports them).
    """
    todo = sorted((t for t in header.tensors.values()
                   if t.dtype in _BITS and t.nbytes > 0 and header.readable(t)),
                  key=lambda t: (t.begin, t.end))
    if not todo:
        return [], 0
    problems: list[Problem] = []
    scanned = 0
    with header.path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        for region in _regions(todo):
            spec = _BITS[region[0].dtype]
            first = region[0].begin
            size = region[-1].end - first
            scanned += size
            if not _flagged(buf, header.data_start + first, size, spec):
                continue
            for t in region:
                nan, inf = _count(buf, header.data_start + t.begin, t, spec)
                if nan or inf:
                    parts = [f"{nan} NaN" if nan else "", f"{inf} Inf" if inf else ""]
                    problems.append(Problem(
                        NON_FINITE, " and ".join(p for p in parts if p)
                        + f" among {t.nbytes // spec.itemsize} {t.dtype} values", t.name))
    return problems, scanned
