"""Safetensors check: the header parses within a size bound and describes the file exactly.

Layout of a safetensors file: an 8-byte little-endian header length ``N``, ``N`` bytes of
JSON (``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``),
then the data buffer. Offsets are relative to the buffer. This module reads only the
length and the header (never more than ``max_header_bytes``) and checks, without loading
any tensor:

* the header is strict JSON and not larger than the bound;
* every entry has a dtype, a shape of non-negative integers and two offsets whose
  difference is ``numel * itemsize``;
* the entries tile the data buffer exactly (no gap, no overlap, nothing after the last
  tensor, nothing missing: a truncated file is caught here).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeGuard

from loraplane.admission.checks.config import parse_strict_json
from loraplane.admission.problems import SAFETENSORS_INVALID, TENSOR_DTYPE, Problem

WEIGHTS_PATH = "adapter_model.safetensors"
DEFAULT_MAX_HEADER_BYTES = 1 << 20
"""Default header bound: ~7,000 LoRA tensors fit in far less."""
MAX_TENSORS = 20_000
"""More entries than this is refused (a LoRA for a 100-layer model has ~1,400)."""
MAX_NAME_CHARS = 512
METADATA_KEY = "__metadata__"

ITEMSIZE: MappingProxyType[str, int] = MappingProxyType({
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1,
    "U64": 8, "U32": 4, "U16": 2, "U8": 1,
    "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
})
"""Bytes per element of every safetensors dtype this module can size."""


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One header entry."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    """Offset of the first byte, relative to the data buffer."""
    end: int
    """Offset past the last byte, relative to the data buffer."""

    @property
    def nbytes(self) -> int:
        """Bytes the entry claims."""
        return self.end - self.begin


@dataclass(frozen=True)
class SafetensorsHeader:
    """A parsed header. ``tensors`` holds every well-formed entry."""

    path: Path
    header_bytes: int
    """``N``, the JSON header length."""
    file_size: int
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def data_start(self) -> int:
        """Absolute file offset of the data buffer."""
        return 8 + self.header_bytes

    @property
    def data_size(self) -> int:
        """Bytes in the data buffer as the file has them."""
        return self.file_size - self.data_start

    def readable(self, t: TensorInfo) -> bool:
        """True when ``t``'s bytes lie inside the file."""
        return 0 <= t.begin <= t.end <= self.data_size


def _bad(msg: str, path: str = WEIGHTS_PATH) -> Problem:
    return Problem(SAFETENSORS_INVALID, msg, path)


def _int_list(v: Any) -> TypeGuard[list[int]]:
    if not isinstance(v, list):
        return False
    for x in v:
        if type(x) is not int or x < 0:  # bool is a subclass of int: refused too
            return False
    return True


def _entry(name: str, raw: Any) -> tuple[TensorInfo | None, list[Problem]]:
    if not isinstance(raw, dict):
        return None, [_bad("header entry is not an object", name)]
    problems: list[Problem] = []
    extra = sorted(set(raw) - {"dtype", "shape", "data_offsets"})
    if extra:
        problems.append(_bad(f"unexpected keys {extra}", name))
    dtype, shape, offsets = raw.get("dtype"), raw.get("shape"), raw.get("data_offsets")
    if not isinstance(dtype, str):
        problems.append(_bad(f"dtype must be a string, got {dtype!r}", name))
    elif dtype not in ITEMSIZE:
        problems.append(Problem(TENSOR_DTYPE, f"unknown dtype {dtype[:32]!r}", name))
    if not _int_list(shape) or len(shape) > 8:
        problems.append(_bad(f"shape must be a list of non-negative integers, got {shape!r}",
                             name))
    if not _int_list(offsets) or len(offsets) != 2 or offsets[0] > offsets[1]:
        problems.append(_bad(f"data_offsets must be [begin, end] with begin <= end, "
                             f"got {offsets!r}", name))
    if problems or not _int_list(shape) or not _int_list(offsets):
        return None, problems
    info = TensorInfo(name, str(dtype), tuple(shape), offsets[0], offsets[1])
    if dtype in ITEMSIZE:
        want = math.prod(info.shape) * ITEMSIZE[info.dtype]
        if want != info.nbytes:
            problems.append(_bad(f"{info.dtype}{list(info.shape)} needs {want} bytes, "
                                 f"data_offsets span {info.nbytes}", name))
    return (None if problems else info), problems


def read_header(
    path: Path, *, max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
) -> tuple[SafetensorsHeader | None, list[Problem]]:
    """Read and check the header of ``path`` (see the module doc). Never loads tensors.

    Returns the header (with its well-formed entries) whenever it parsed, so that later
    checks can look at names and shapes even when the layout is broken.
    """
    path = Path(path)
    try:
        file_size = path.stat().st_size
        with path.open("rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                return None, [_bad(f"file of {file_size} bytes is too small for a header")]
            (n,) = struct.unpack("<Q", prefix)
            if n > max_header_bytes:
                return None, [_bad(f"header length {n} bytes exceeds the limit "
                                   f"{max_header_bytes}")]
            if 8 + n > file_size:
                return None, [_bad(f"header of {n} bytes runs past the end of the "
                                   f"{file_size}-byte file (truncated)")]
            raw = f.read(n)
    except FileNotFoundError:
        return None, []  # reported by the files check
    except OSError as exc:
        return None, [_bad(f"unreadable: {exc}")]

    if not raw.startswith(b"{"):
        return None, [_bad("header does not start with '{'")]
    try:
        doc = parse_strict_json(raw.rstrip(b" "))
    except (ValueError, RecursionError) as exc:
        return None, [_bad(f"header is not strict JSON: {exc}")]
    if not isinstance(doc, dict):
        return None, [_bad("header is not a JSON object")]

    problems: list[Problem] = []
    metadata: dict[str, str] = {}
    meta = doc.pop(METADATA_KEY, None)
    if meta is not None:
        if isinstance(meta, dict) and all(isinstance(k, str) and isinstance(v, str)
                                          for k, v in meta.items()):
            metadata = dict(meta)
        else:
            problems.append(_bad("__metadata__ must map strings to strings"))
    if len(doc) > MAX_TENSORS:
        return None, [*problems, _bad(f"{len(doc)} tensors > limit {MAX_TENSORS}")]
    if not doc:
        problems.append(_bad("header lists no tensors"))

    tensors: dict[str, TensorInfo] = {}
    for name, entry in doc.items():
        if len(name) > MAX_NAME_CHARS or not name.isprintable():
            problems.append(_bad(f"tensor name is too long or not printable: {name[:64]!r}"))
            continue
        info, entry_problems = _entry(name, entry)
        problems.extend(entry_problems)
        if info is not None:
            tensors[name] = info

    header = SafetensorsHeader(path, n, file_size, tensors, metadata)
    problems.extend(_layout_problems(header, all_entries_ok=len(tensors) == len(doc)))
    return header, problems


def _layout_problems(header: SafetensorsHeader, *, all_entries_ok: bool) -> list[Problem]:
    """The entries must tile the data buffer exactly."""
    problems: list[Problem] = []
    expected = 0
    for t in sorted(header.tensors.values(), key=lambda t: (t.begin, t.end, t.name)):
        if t.begin < expected:
            problems.append(_bad(f"overlaps the previous tensor (begins at {t.begin}, "
                                 f"previous ends at {expected})", t.name))
        elif t.begin > expected and all_entries_ok:
            problems.append(_bad(f"gap of {t.begin - expected} bytes before this tensor",
                                 t.name))
        expected = max(expected, t.end)
    if expected > header.data_size:
        problems.append(_bad(f"tensors need {expected} data bytes but the file has "
                             f"{header.data_size} (truncated)"))
    elif expected < header.data_size and all_entries_ok:
        problems.append(_bad(f"{header.data_size - expected} unexplained bytes after the "
                             f"last tensor"))
    return problems
