"""The issue's acceptance ratios on the checked-in reference traces, at the benchmark's
capacities (4 workers × 16 engine slots, 10 or 12 GiB host memory each). Ratios only: the
simulation speed is reported by ``python -m loraplane.sim.bench``, never timed in a test.

Two targets are not met on ``conv-1h`` (1.1 x LRU's hit ratio; interactive P99 <= 0.5 x LRU's
at 10 GiB) and are kept here as strict xfails so the gap stays visible (see services/policy/README.md, "Benchmark"): they start failing the day they pass.
At 12 GiB the P99 target lies below the floor no policy can beat (``ttft_floor``), which is
asserted instead.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from loraplane.policy.factory import make_policy
from loraplane.sim.simulator import Capacities, SimResult, simulate, ttft_floor
from loraplane.sim.trace import Trace, read_trace

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"
GIB = 2**30
CASES = [(name, gib) for name in ("conv-1h", "large-1h") for gib in (10, 12)]


@cache
def load(name: str) -> Trace:
    return read_trace(TRACES / f"{name}.csv.gz")


@cache
def results(name: str, gib: int) -> dict[str, SimResult]:
    caps = Capacities(gpu_slots=16, host_bytes=gib * GIB, workers=4)
    return {p: simulate(load(name), make_policy(p), caps) for p in ("heat", "lru", "belady")}


def p99(r: SimResult) -> float:
    return r.ttft_ms["interactive"]["p99"]


@pytest.mark.parametrize(("name", "gib"), CASES)
def test_heat_is_within_85_percent_of_belady_and_beats_lru(name: str, gib: int) -> None:
    r = results(name, gib)
    assert r["heat"].gpu_hit_ratio >= 0.85 * r["belady"].gpu_hit_ratio
    assert r["heat"].gpu_hit_ratio > 1.04 * r["lru"].gpu_hit_ratio
    assert r["heat"].cold_starts < 0.75 * r["lru"].cold_starts


@pytest.mark.parametrize(("name", "gib"), CASES)
def test_no_platinum_or_canary_cold_start_beyond_the_compulsory_one(name: str, gib: int) -> None:
    r = results(name, gib)
    assert r["heat"].cold_starts_by_priority["platinum"] == 0
    assert r["heat"].cold_starts_canary == 0
    # the traces do exercise it: LRU cold-starts platinum versions
    assert r["lru"].cold_starts_by_priority["platinum"] > 0


@pytest.mark.parametrize(("name", "gib"), CASES)
def test_interactive_tail_is_no_worse_than_lru(name: str, gib: int) -> None:
    r = results(name, gib)
    assert p99(r["heat"]) <= p99(r["lru"])
    assert r["heat"].cold_starts_by_class["interactive"] < r["lru"].cold_starts_by_class[
        "interactive"]


@pytest.mark.parametrize("gib", [10, 12])
def test_large_catalog_heat_reaches_1_1_times_lru(gib: int) -> None:
    r = results("large-1h", gib)
    assert r["heat"].gpu_hit_ratio >= 1.1 * r["lru"].gpu_hit_ratio


@pytest.mark.xfail(strict=True, reason="Belady itself is only ~1.12 x LRU on conv-1h")
def test_conv_heat_reaches_1_1_times_lru() -> None:
    r = results("conv-1h", 12)
    assert r["heat"].gpu_hit_ratio >= 1.1 * r["lru"].gpu_hit_ratio


@pytest.mark.xfail(strict=True, reason="heat's interactive P99 is 0.59 x LRU's at 10 GiB, not 0.5")
def test_conv_interactive_p99_is_half_of_lru() -> None:
    r = results("conv-1h", 10)
    assert p99(r["heat"]) <= 0.5 * p99(r["lru"])


def test_conv_12gib_interactive_p99_target_is_below_the_floor() -> None:
    """At 12 GiB LRU's interactive P99 (323 ms) is already close to the prefill of long
    prompts: half of it lies below the floor no placement policy can beat, so the benchmark
    marks the target unreachable; heat sits between the floor and LRU."""
    r = results("conv-1h", 12)
    floor = ttft_floor(load("conv-1h"), Capacities(16, 12 * GIB, 4))["interactive"]["p99"]
    assert floor > 0.5 * p99(r["lru"])
    assert floor <= p99(r["heat"]) < p99(r["lru"])
    assert floor <= p99(r["belady"])


def test_large_catalog_at_8_slots_heat_reaches_1_1_times_lru() -> None:
    caps = Capacities(gpu_slots=8, host_bytes=10 * GIB, workers=4)
    heat, lru = (simulate(load("large-1h"), make_policy(p), caps) for p in ("heat", "lru"))
    assert heat.gpu_hit_ratio >= 1.1 * lru.gpu_hit_ratio
