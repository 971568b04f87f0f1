"""The clairvoyant tail oracle: critical requests, its WARM order, and what it shows."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from loraplane.policy.factory import make_policy
from loraplane.policy.model import Priority, RequestClass
from loraplane.sim.bench import POLICY_ORDER, Targets, case_figures, ceilings, clairvoyant_run
from loraplane.sim.cost import CostModel
from loraplane.sim.oracle import TailOracle, critical_requests
from loraplane.sim.simulator import Capacities, simulate, ttft_floor
from loraplane.sim.trace import Trace, TraceRow, format_rows, parse_rows, read_trace

MB = 1_000_000
GIB = 2**30
CONV = Path("tests/data/traces/conv-1h.csv.gz")


def trace_of(rows: list[TraceRow]) -> Trace:
    text = "".join(format_rows(rows, with_base_model=True))
    return parse_rows(csv.DictReader(io.StringIO(text)), "oracle")


def row(ts: float, name: str, size_mb: int, cls: RequestClass = RequestClass.INTERACTIVE,
        prompt: int = 100) -> TraceRow:
    return TraceRow(
        ts=ts, tenant_id="t", adapter_id=f"t/{name}@v1", priority=Priority.GOLD,
        request_class=cls, rank=8, size_bytes=size_mb * MB, canary=False,
        prompt_tokens=prompt, output_tokens=0, base_model="bm",
    )


def test_critical_requests_are_interactive_and_slow_only_when_cold() -> None:
    cost = CostModel()
    rows = [
        row(0, "big", 300),                                   # 300 MB from COLD: ~1.9 s
        row(1, "small", 5),                                   # ~0.1 s from COLD: under 0.5 s
        row(2, "big", 300, cls=RequestClass.BACKGROUND),      # background never counts
        row(3, "big", 300, prompt=20_000),                    # 1 s of prefill: slow anyway
        row(4, "big", 300, prompt=9_000),                     # 0.47 s + 40 ms from WARM: slow
    ]
    assert critical_requests(trace_of(rows), 0.5, cost) == [True, False, False, False, False]


def test_without_critical_requests_ahead_the_version_used_furthest_goes_first() -> None:
    # only small versions (never critical): the oracle's WARM order is Belady's
    # when "d" needs room, "a" (never again) or "b" (asked at 40) may go: "a" goes
    rows = [row(0, "a", 20), row(10, "b", 20), row(20, "c", 20), row(30, "d", 20),
            row(40, "b", 20)]
    trace = trace_of(rows)
    caps = Capacities(gpu_slots=1, host_bytes=60 * MB, workers=1)
    oracle = simulate(trace, TailOracle(trace, 0.5), caps)
    belady = simulate(trace, make_policy("belady"), caps)
    assert oracle.host_hits == belady.host_hits == 1
    assert oracle.cold_starts == belady.cold_starts == 0


def test_oracle_refuses_a_run_with_other_bandwidths() -> None:
    trace = trace_of([row(0, "a", 10), row(1, "a", 10)])
    with pytest.raises(ValueError, match="other bandwidths"):
        simulate(trace, TailOracle(trace, 0.5), Capacities(1, GIB),
                 CostModel.from_units(s3_mb_per_s=50.0))


def test_oracle_keeps_the_version_whose_cold_load_would_break_the_target() -> None:
    # One slot, 640 MB of WARM. When "x" needs room, "big" (300 MB) and "small" (20 MB) may go
    # ("other" is HOT). Belady evicts the one used furthest ahead ("big"), which then comes back
    # from COLD (~1.9 s); the oracle evicts "small" (its reload stays under the 0.5 s target).
    rows = [row(0, "big", 300), row(10, "small", 20), row(20, "other", 300), row(30, "x", 40),
            row(40, "small", 20), row(50, "big", 300)]
    trace = trace_of(rows)
    caps = Capacities(gpu_slots=1, host_bytes=640 * MB, workers=1)
    oracle = simulate(trace, TailOracle(trace, 0.5), caps)
    belady = simulate(trace, make_policy("belady"), caps)
    assert belady.cold_starts_by_class["interactive"] == 1
    assert belady.ttft_ms["interactive"]["p99"] > 1500
    assert oracle.cold_starts_by_class["interactive"] == 1
    assert oracle.ttft_ms["interactive"]["p99"] < 500


def test_oracle_needs_the_trace_it_was_built_for() -> None:
    trace = trace_of([row(0, "a", 10), row(1, "a", 10)])
    other = trace_of([row(0, "a", 10)])
    with pytest.raises(ValueError, match="critical flags for 2 requests"):
        simulate(other, TailOracle(trace, 0.5), Capacities(1, GIB))


def test_on_conv_1h_a_clairvoyant_policy_reaches_half_of_lrus_p99() -> None:
    # the reference figure printed by make bench-policy (conv-1h, 4 x 16 slots, 10 GiB)
    trace = read_trace(CONV)
    caps = Capacities(gpu_slots=16, host_bytes=10 * GIB, workers=4)
    lru = simulate(trace, make_policy("lru"), caps).ttft_ms["interactive"]["p99"]
    oracle = simulate(trace, TailOracle(trace, 0.5 * lru / 1000), caps)
    belady = simulate(trace, make_policy("belady"), caps)
    assert oracle.ttft_ms["interactive"]["p99"] <= 0.5 * lru
    assert abs(oracle.gpu_hits - belady.gpu_hits) <= 0.001 * len(trace)  # HOT: Belady order


def test_bench_ceilings_carry_the_clairvoyant_p99() -> None:
    trace = read_trace(CONV)
    caps = Capacities(gpu_slots=16, host_bytes=10 * GIB, workers=4)
    results = {name: simulate(trace, make_policy(name), caps) for name in POLICY_ORDER}
    figures = case_figures(results)
    floor = ttft_floor(trace, caps)
    run = clairvoyant_run(trace, caps, results, Targets(), CostModel())
    assert run is not None
    with_oracle = ceilings(figures, floor, run)
    lru_p99 = results["lru"].ttft_ms["interactive"]["p99"]
    assert with_oracle["interactive_p99_clairvoyant_ms"] == run.ttft_ms["interactive"]["p99"]
    assert with_oracle["interactive_p99_clairvoyant_vs_lru"] == pytest.approx(
        run.ttft_ms["interactive"]["p99"] / lru_p99, abs=1e-4)
    without = ceilings(figures, floor)
    assert without["interactive_p99_clairvoyant_ms"] is None
    assert without["interactive_p99_clairvoyant_vs_lru"] is None
    assert without["belady_vs_lru"] == with_oracle["belady_vs_lru"]
