"""The trace generator: reproducible, and with the structure it promises."""

from __future__ import annotations

import collections
import itertools
import random
from dataclasses import replace
from pathlib import Path

import pytest

from loraplane.policy.model import Priority, RequestClass
from loraplane.sim.generator import Arrival, GenConfig, adapter_size_bytes, generate, read_azure
from loraplane.sim.presets import PRESETS
from loraplane.sim.trace import TraceRow, read_trace, write_trace

ROOT = Path(__file__).resolve().parents[3]
AZURE = ROOT.parent / "shared" / "traces" / "azure-llm-2023"
CHECKED_IN = ROOT / "tests" / "data" / "traces"


def arrivals(n: int = 18_000, rate: float = 5.0) -> list[Arrival]:
    rng = random.Random(7)
    t = 0.0
    out = []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(Arrival(t, rng.randint(50, 4000), rng.randint(1, 600)))
    return out


ARRIVALS = arrivals()
CFG = GenConfig(seed=5, tenants=100)


@pytest.fixture(scope="module")
def rows() -> list[TraceRow]:
    return list(generate(CFG, ARRIVALS))


def test_same_seed_same_trace_other_seed_other_trace(rows: list[TraceRow]) -> None:
    assert list(generate(CFG, ARRIVALS)) == rows
    other = list(generate(replace(CFG, seed=6), ARRIVALS))
    assert [r.adapter_id for r in other] != [r.adapter_id for r in rows]
    # the arrivals themselves are kept
    assert [r.ts for r in rows] == [round(a.ts, 6) for a in ARRIVALS]
    assert [r.prompt_tokens for r in rows] == [a.prompt_tokens for a in ARRIVALS]


def test_popularity_is_heavy_tailed(rows: list[TraceRow]) -> None:
    counts = sorted(collections.Counter(r.adapter_id for r in rows).values(), reverse=True)
    top = counts[: max(1, len(counts) // 10)]
    assert sum(top) > 0.5 * len(rows)  # top 10 % of versions take most requests
    assert sum(1 for c in counts if c <= 3) > len(counts) // 4  # and there is a long tail


def test_popularity_drifts(rows: list[TraceRow]) -> None:
    quarter = len(rows) // 4

    def top(part: list[TraceRow]) -> set[str]:
        return {a for a, _ in collections.Counter(r.adapter_id for r in part).most_common(20)}

    first, last = top(rows[:quarter]), top(rows[-quarter:])
    assert 5 <= len(first & last) < 20


def test_bursts_hit_cold_adapters(rows: list[TraceRow]) -> None:
    total = collections.Counter(r.adapter_id for r in rows)
    median = sorted(total.values())[len(total) // 2]
    by_minute: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for r in rows:
        by_minute[int(r.ts // 60)][r.adapter_id] += 1
    bursty = {a for minute in by_minute.values() for a, c in minute.items()
              if c >= 20 and total[a] < 40 * median}
    assert bursty, "no adapter of modest overall traffic ever took 20+ requests in a minute"


def test_tiers_classes_canaries_and_sizes(rows: list[TraceRow]) -> None:
    assert {r.priority for r in rows} == set(Priority)
    classes = collections.Counter(r.request_class for r in rows)
    assert classes[RequestClass.INTERACTIVE] > classes[RequestClass.BACKGROUND] > 0
    canary = [r for r in rows if r.canary]
    assert canary and all(r.request_class is RequestClass.CANARY for r in canary)
    assert all(r.request_class is not RequestClass.CANARY for r in rows if not r.canary)
    # a canary version is a new version of an adapter that also has an older one
    names = {r.adapter_id.split("@")[0] for r in canary}
    assert any(r.adapter_id.split("@")[0] in names and not r.canary for r in rows)
    allowed = {adapter_size_bytes(rank, al) for rank in (8, 16, 32, 64) for al in (False, True)}
    assert {r.size_bytes for r in rows} <= allowed
    assert min(allowed) < 10_000_000 and max(allowed) > 300_000_000
    # sizes and ranks belong to the adapter: every version of it has the same
    per_version = {(r.adapter_id, r.size_bytes, r.rank) for r in rows}
    assert len(per_version) == len({r.adapter_id for r in rows})


def test_tiling_continues_time(rows: list[TraceRow]) -> None:
    two = list(generate(replace(CFG, hours=2), ARRIVALS[:1000]))
    assert len(two) == 2000
    assert all(b.ts >= a.ts for a, b in itertools.pairwise(two))


def _require_azure() -> None:
    # A missing input is a failure, never a skip: CI lays shared/ beside the clone.
    assert AZURE.is_dir(), f"the Azure arrivals are missing: expected {AZURE}"


@pytest.mark.parametrize("name", ["conv-1h", "large-1h"])
def test_checked_in_reference_traces_are_what_the_generator_makes(
    name: str, tmp_path: Path
) -> None:
    _require_azure()
    out = tmp_path / f"{name}.csv.gz"
    write_trace(out, generate(replace(PRESETS[name], azure_dir=AZURE)))
    assert out.read_bytes() == (CHECKED_IN / f"{name}.csv.gz").read_bytes()


def test_reads_the_azure_arrivals() -> None:
    _require_azure()
    conv = read_azure(AZURE, ("conv",))
    assert len(conv) > 19_000 and conv[0].ts == 0.0
    assert all(b.ts >= a.ts for a, b in itertools.pairwise(conv))
    both = read_azure(AZURE, ("conv", "code"))
    assert len(both) > len(conv) + 8_000
    with pytest.raises(ValueError, match="unknown source"):
        read_azure(AZURE, ("chat",))


def test_checked_in_traces_are_small_and_valid() -> None:
    total = sum(p.stat().st_size for p in CHECKED_IN.glob("*.csv.gz"))
    assert total < 2_000_000
    t = read_trace(CHECKED_IN / "conv-1h.csv.gz")
    assert len(t) > 19_000 and t.n_versions > 500
