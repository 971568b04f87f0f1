"""Request traces (``shared/traces/FORMAT.md``): read, validate, write.

A trace is held column-wise with interned version ids so the simulator's hot
loop reads plain lists. ``.csv`` and ``.csv.gz`` are both accepted.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from loraplane.policy.cost import Bandwidths
from loraplane.policy.model import Priority, RequestClass
from loraplane.policy.online import CLASS_CODE, PRIORITY_CODE, OnlineContext

COLUMNS = (
    "ts",
    "tenant_id",
    "adapter_id",
    "priority",
    "request_class",
    "rank",
    "size_bytes",
    "canary",
    "prompt_tokens",
    "output_tokens",
)
"""Required columns, in the order :func:`write_trace` writes them."""
OPTIONAL_COLUMNS = ("base_model",)
"""Columns read when present (one base model, ``default``, otherwise)."""
DEFAULT_BASE_MODEL = "default"
MAX_REPORTED_PROBLEMS = 20


class TraceError(ValueError):
    """The trace cannot be simulated; ``problems`` lists what is wrong (first ones)."""

    retriable = False

    def __init__(self, path: str, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"{path}: " + "; ".join(problems))


@dataclass
class Trace:
    """A parsed trace: one list per column, versions interned to 0..n-1."""

    name: str
    ts: list[float] = field(default_factory=list)
    version: list[int] = field(default_factory=list)
    classes: list[int] = field(default_factory=list)
    priorities: list[int] = field(default_factory=list)
    canary: list[int] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)
    version_ids: list[str] = field(default_factory=list)
    """Adapter id (version) of each interned version."""
    version_tenant: list[str] = field(default_factory=list)
    version_size: list[int] = field(default_factory=list)
    version_rank: list[int] = field(default_factory=list)
    version_base_model: list[int] = field(default_factory=list)
    version_adapter: list[int] = field(default_factory=list)
    """Adapter name (the id before ``@``) of each version, interned."""
    base_models: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ts)

    @property
    def n_versions(self) -> int:
        """Distinct versions in the trace."""
        return len(self.version_ids)

    def _tenant_codes(self) -> list[int]:
        codes: dict[str, int] = {}
        return [codes.setdefault(t, len(codes)) for t in self.version_tenant]

    def online_context(
        self, *, workers: int, gpu_slots: int, host_bytes: int, bandwidths: Bandwidths
    ) -> OnlineContext:
        """The view an online policy gets of this trace."""
        return OnlineContext(
            n_versions=self.n_versions,
            n_workers=workers,
            n_base_models=max(1, len(self.base_models)),
            hot_slots=gpu_slots,
            warm_bytes=host_bytes,
            sizes=self.version_size,
            adapters=self.version_adapter,
            tenants=self._tenant_codes(),
            versions=self.version,
            classes=self.classes,
            priorities=self.priorities,
            canary=self.canary,
            bandwidths=bandwidths,
        )


def _open_text(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return path.open("r", encoding="utf-8", newline="")


def _field(
    row: Mapping[str, str], column: str, convert: type[float | int], problems: list[str]
) -> float:
    """``convert(row[column])``; on failure a problem naming the column, and 0."""
    text = row.get(column)
    if text is None:
        problems.append(f"column {column}: missing")
        return 0
    try:
        return convert(text)
    except ValueError:
        problems.append(f"column {column}: not {convert.__name__}: {text!r}")
        return 0


def parse_rows(rows: Iterable[Mapping[str, str]], name: str) -> Trace:
    """Build a :class:`Trace` from CSV dict rows, reporting every (first 20) problem."""
    trace = Trace(name=name)
    problems: list[str] = []
    index: dict[str, int] = {}
    bm_index: dict[str, int] = {}
    name_index: dict[str, int] = {}
    prio_code = {p.value: c for p, c in PRIORITY_CODE.items()}
    class_code = {k.value: c for k, c in CLASS_CODE.items()}
    last_ts = float("-inf")
    for line, row in enumerate(rows, start=2):
        if len(problems) >= MAX_REPORTED_PROBLEMS:
            break
        row_problems: list[str] = []

        ts = float(_field(row, "ts", float, row_problems))
        rank = int(_field(row, "rank", int, row_problems))
        size = int(_field(row, "size_bytes", int, row_problems))
        canary = int(_field(row, "canary", int, row_problems))
        prompt = int(_field(row, "prompt_tokens", int, row_problems))
        output = int(_field(row, "output_tokens", int, row_problems))
        adapter = row.get("adapter_id") or ""
        prio = prio_code.get(row.get("priority") or "")
        cls = class_code.get(row.get("request_class") or "")
        if not math.isfinite(ts):
            row_problems.append(f"column ts: not finite: {ts}")
        elif ts < last_ts:
            row_problems.append(f"column ts: {ts} < previous {last_ts} (must not decrease)")
        if prio is None:
            row_problems.append(
                f"column priority: {row.get('priority')!r} not one of {list(prio_code)}"
            )
        if cls is None:
            row_problems.append(
                f"column request_class: {row.get('request_class')!r} not one of {list(class_code)}"
            )
        if canary not in (0, 1):
            row_problems.append(f"column canary: {canary} not 0 or 1")
        for column, value, least in (("rank", rank, 1), ("size_bytes", size, 1),
                                     ("prompt_tokens", prompt, 0), ("output_tokens", output, 0)):
            if value < least:
                row_problems.append(f"column {column}: {value} < {least}")
        if not adapter:
            row_problems.append("column adapter_id: empty")
        if not row.get("tenant_id"):
            row_problems.append("column tenant_id: empty")
        if row_problems:
            problems.append(f"line {line}: " + "; ".join(row_problems))
            continue
        assert prio is not None and cls is not None
        last_ts = ts
        v = index.get(adapter)
        if v is None:
            v = index[adapter] = len(trace.version_ids)
            bm_name = row.get("base_model") or DEFAULT_BASE_MODEL
            bm = bm_index.get(bm_name)
            if bm is None:
                bm = bm_index[bm_name] = len(trace.base_models)
                trace.base_models.append(bm_name)
            trace.version_ids.append(adapter)
            trace.version_tenant.append(row["tenant_id"])
            trace.version_size.append(size)
            trace.version_rank.append(rank)
            trace.version_base_model.append(bm)
            name = adapter.split("@", 1)[0]
            trace.version_adapter.append(name_index.setdefault(name, len(name_index)))
        trace.ts.append(ts)
        trace.version.append(v)
        trace.classes.append(cls)
        trace.priorities.append(prio)
        trace.canary.append(canary)
        trace.prompt_tokens.append(prompt)
        trace.output_tokens.append(output)
    if problems:
        raise TraceError(name, problems)
    if not trace.ts:
        raise TraceError(name, ["no requests"])
    return trace


def read_trace(path: str | Path) -> Trace:
    """Read and validate a trace file (``.csv`` or ``.csv.gz``)."""
    p = Path(path)
    with _open_text(p) as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(str(p), [f"missing columns: {', '.join(missing)}"])
        return parse_rows(reader, str(p))


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request, as written by the generator."""

    ts: float
    tenant_id: str
    adapter_id: str
    priority: Priority
    request_class: RequestClass
    rank: int
    size_bytes: int
    canary: bool
    prompt_tokens: int
    output_tokens: int
    base_model: str = ""


def format_rows(rows: Iterable[TraceRow], *, with_base_model: bool = False) -> Iterator[str]:
    """CSV lines (header first) for ``rows``; deterministic float formatting."""
    header = list(COLUMNS) + (["base_model"] if with_base_model else [])
    yield ",".join(header) + "\n"
    for r in rows:
        fields = [
            f"{r.ts:.6f}",
            r.tenant_id,
            r.adapter_id,
            r.priority.value,
            r.request_class.value,
            str(r.rank),
            str(r.size_bytes),
            "1" if r.canary else "0",
            str(r.prompt_tokens),
            str(r.output_tokens),
        ]
        if with_base_model:
            fields.append(r.base_model or DEFAULT_BASE_MODEL)
        yield ",".join(fields) + "\n"


def write_trace(path: str | Path, rows: Iterable[TraceRow], *, with_base_model: bool = False) -> None:
    """Write ``rows`` as a trace (gzip when the name ends in ``.gz``, reproducibly: mtime 0)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(format_rows(rows, with_base_model=with_base_model)).encode("utf-8")
    if p.suffix == ".gz":
        with p.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
            gz.write(text)
    else:
        p.write_bytes(text)
