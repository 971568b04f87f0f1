"""The TTFT floor (what no placement policy can beat) and the benchmark's honest verdicts."""

from __future__ import annotations

import csv
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loraplane.policy.factory import POLICIES, make_policy
from loraplane.policy.model import Priority, RequestClass
from loraplane.policy.online import CachePolicy
from loraplane.sim.bench import Targets, check_status
from loraplane.sim.cost import CostModel
from loraplane.sim.oracle import TailOracle
from loraplane.sim.simulator import Capacities, simulate, ttft_floor
from loraplane.sim.trace import Trace, TraceRow, format_rows, parse_rows

MB = 1_000_000


def trace_of(rows: list[TraceRow]) -> Trace:
    text = "".join(format_rows(rows, with_base_model=True))
    return parse_rows(csv.DictReader(io.StringIO(text)), "floor")


def row(ts: float, name: str, output_tokens: int = 0, **kw: object) -> TraceRow:
    base: dict[str, object] = {
        "ts": ts, "tenant_id": "t", "adapter_id": f"t/{name}@v1", "priority": Priority.GOLD,
        "request_class": RequestClass.INTERACTIVE, "rank": 8, "size_bytes": 10 * MB,
        "canary": False, "prompt_tokens": 1000, "output_tokens": output_tokens,
        "base_model": "bm",
    }
    base.update(kw)
    return TraceRow(**base)  # type: ignore[arg-type]


def test_floor_serves_every_later_request_hot_and_keeps_compulsory_misses_out() -> None:
    cost = CostModel()
    rows = [row(0, "a"), row(10, "b"), row(20, "a"), row(30, "b"), row(40, "c")]
    floor = ttft_floor(trace_of(rows), Capacities(1, 10**12), cost)
    prefill_ms = 1000 * cost.prefill_ms_per_token + cost.base_ttft_ms
    assert floor["interactive"] == {"p50": pytest.approx(prefill_ms), "p99": pytest.approx(
        prefill_ms), "count": 2.0}


def test_floor_waits_when_other_versions_hold_every_slot() -> None:
    # one slot; a is in flight for 100 output tokens (1.5 s) when b arrives: b must wait
    cost = CostModel()
    rows = [row(0, "b"), row(100, "a"), row(200, "a", output_tokens=100), row(200.1, "b")]
    floor = ttft_floor(trace_of(rows), Capacities(1, 10**12), cost)
    prefill_s = (1000 * cost.prefill_ms_per_token + cost.base_ttft_ms) / 1000
    a_ends = 200 + prefill_s + 100 * cost.tpot_ms / 1000
    wait = a_ends - 200.1
    assert floor["interactive"]["p99"] == pytest.approx((wait + prefill_s) * 1000, abs=1e-3)
    real = simulate(trace_of(rows), make_policy("lru"), Capacities(1, 10**12), cost)
    assert real.slot_waits == 1
    assert real.ttft_ms["interactive"]["p99"] >= floor["interactive"]["p99"]


@st.composite
def random_traces(draw: st.DrawFn) -> Trace:
    n = draw(st.integers(min_value=1, max_value=50))
    names = [f"v{i}" for i in range(draw(st.integers(min_value=1, max_value=8)))]
    rows = []
    t = 0.0
    for _ in range(n):
        t += draw(st.sampled_from([0.0, 0.05, 0.5, 2.0, 100.0]))
        name = draw(st.sampled_from(names))
        k = names.index(name)
        rows.append(row(
            t, name, output_tokens=draw(st.integers(min_value=0, max_value=400)),
            request_class=list(RequestClass)[k % 2], priority=list(Priority)[k % 4],
            size_bytes=(1 + k % 4) * 10 * MB, prompt_tokens=draw(st.integers(0, 3000)),
            base_model=f"bm{k % 2}",
        ))
    return trace_of(rows)


@settings(max_examples=60, deadline=None)
@given(random_traces(), st.integers(min_value=1, max_value=3), st.integers(min_value=1, max_value=2))
def test_no_policy_beats_the_floor(trace: Trace, slots: int, workers: int) -> None:
    cost = CostModel()
    caps = Capacities(slots, (slots * 2 + 1) * 40 * MB + 10 * MB, workers)
    floor = ttft_floor(trace, caps, cost)
    policies: list[CachePolicy] = [make_policy(name) for name in POLICIES]
    policies.append(TailOracle(trace, 0.3, cost))  # clairvoyant, still above the floor
    for policy in policies:
        name = policy.name
        r = simulate(trace, policy, caps, cost)
        for cls, figures in floor.items():
            assert figures["count"] == r.ttft_ms[cls]["count"]
            for q in ("p50", "p99"):
                assert r.ttft_ms[cls][q] >= figures[q] - 1e-6, (name, cls, q)


def _status(
    heat_ok: bool, p99_ok: bool, belady_vs_lru: float, floor_vs_lru: float,
    clairvoyant_vs_lru: float | None = None,
) -> dict[str, str]:
    t = Targets()
    verdict = {
        f"hit >= {t.vs_belady} x belady": True,
        f"hit >= {t.vs_lru} x lru": heat_ok,
        f"interactive p99 <= {t.p99_vs_lru} x lru": p99_ok,
    }
    ceiling: dict[str, float | None] = {
        "belady_vs_lru": belady_vs_lru, "interactive_p99_floor_vs_lru": floor_vs_lru,
        "interactive_p99_clairvoyant_vs_lru": clairvoyant_vs_lru,
    }
    return check_status(verdict, ceiling, t)


def test_check_status_marks_only_missed_targets_beyond_the_ceiling_as_unreachable() -> None:
    s = _status(heat_ok=False, p99_ok=False, belady_vs_lru=1.066, floor_vs_lru=0.645)
    assert s["hit >= 1.1 x lru"] == "unreachable (belady/lru = 1.066)"
    assert s["interactive p99 <= 0.5 x lru"] == "unreachable (p99 floor = 0.645 x lru)"
    assert s["hit >= 0.85 x belady"] == "met"
    s = _status(heat_ok=False, p99_ok=False, belady_vs_lru=1.125, floor_vs_lru=0.36)
    assert s["hit >= 1.1 x lru"] == "missed (needs 0.978 x belady)"
    assert s["interactive p99 <= 0.5 x lru"] == "missed"
    s = _status(heat_ok=False, p99_ok=False, belady_vs_lru=1.125, floor_vs_lru=0.36,
                clairvoyant_vs_lru=0.34)
    assert s["interactive p99 <= 0.5 x lru"] == "missed (clairvoyant tail oracle: 0.34 x lru)"
    s = _status(heat_ok=True, p99_ok=True, belady_vs_lru=1.05, floor_vs_lru=0.9)
    assert set(s.values()) == {"met"}
