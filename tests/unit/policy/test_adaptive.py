"""The adaptive heat policy (``adaptive.py``, what ``heat`` runs online): request clock, experts
over shadow caches, live-stream pins and the protected WARM share (hypothesis + table tests)."""

from __future__ import annotations

import csv
import io
import itertools
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from loraplane.policy.adaptive import AdaptiveHeatOnline
from loraplane.policy.config import PolicyConfig
from loraplane.policy.factory import make_policy
from loraplane.policy.heat import HeatOnline, HeatPolicy
from loraplane.policy.model import Priority, RequestClass
from loraplane.policy.online import OnlineContext
from loraplane.sim.cost import CostModel
from loraplane.sim.simulator import Capacities, SimResult, simulate
from loraplane.sim.trace import Trace, TraceRow, format_rows, parse_rows

MB = 1_000_000


def _trace(rows: list[TraceRow]) -> Trace:
    return parse_rows(csv.DictReader(io.StringIO("".join(format_rows(rows)))), "t")


@st.composite
def traces(draw: st.DrawFn, *, protected: bool = True) -> list[TraceRow]:
    n = draw(st.integers(min_value=1, max_value=120))
    k_max = draw(st.integers(min_value=1, max_value=14))
    rows = []
    t = 0.0
    for _ in range(n):
        t += draw(st.sampled_from([0.0, 0.05, 1.0, 30.0, 500.0, 5000.0]))
        k = draw(st.integers(min_value=0, max_value=k_max - 1))
        canary = protected and k == 0 and draw(st.booleans())
        prio = list(Priority)[k % 4] if protected else Priority.BRONZE
        rows.append(TraceRow(
            ts=t, tenant_id=f"t{k % 3}", adapter_id=f"t{k % 3}/a{k}@v1", priority=prio,
            request_class=RequestClass.CANARY if canary else list(RequestClass)[k % 2],
            rank=8, size_bytes=(1 + k % 4) * 10 * MB, canary=canary,
            prompt_tokens=draw(st.integers(min_value=0, max_value=2000)),
            output_tokens=draw(st.integers(min_value=0, max_value=400)),
        ))
    return rows


def _run(rows: list[TraceRow], slots: int, host_mb: int, cfg: PolicyConfig | None = None,
         workers: int = 1) -> SimResult:
    return simulate(_trace(rows), make_policy("heat", cfg), Capacities(slots, host_mb * MB, workers),
                    CostModel())


def test_heat_runs_the_adaptive_online_policy_unless_disabled() -> None:
    ctx = _trace([TraceRow(0.0, "t", "t/a@1", Priority.BRONZE, RequestClass.INTERACTIVE, 8,
                           MB, False, 1, 1)]).online_context(
        workers=1, gpu_slots=2, host_bytes=10**9, bandwidths=CostModel().bandwidths)
    cfg = PolicyConfig()
    assert isinstance(HeatPolicy(cfg).online(ctx), AdaptiveHeatOnline)
    off = replace(cfg, adaptive=replace(cfg.adaptive, enabled=False))
    assert isinstance(HeatPolicy(off).online(ctx), HeatOnline)


@settings(max_examples=60, deadline=None)
@given(traces(), st.integers(min_value=1, max_value=4), st.integers(min_value=1, max_value=2))
def test_deterministic_and_within_every_rule(rows: list[TraceRow], slots: int,
                                             workers: int) -> None:
    """Same trace, same figures; the simulator raises on any busy / absent victim or overflow."""
    host_mb = (slots * 2 + 1) * 40 + 10
    a = _run(rows, slots, host_mb, workers=workers)
    b = _run(rows, slots, host_mb, workers=workers)
    keys = ("gpu_hits", "host_hits", "cold_starts", "hot_evictions", "warm_evictions",
            "slot_waits", "ttft_ms", "extra")
    assert [getattr(a, k) for k in keys] == [getattr(b, k) for k in keys]
    assert a.gpu_hits + a.host_hits + a.compulsory_misses + a.cold_starts == a.requests


@settings(max_examples=50, deadline=None)
@given(traces(protected=False), st.integers(min_value=1, max_value=4),
       st.sampled_from([2.0, 24.0, 1000.0]))
def test_time_scale_changes_nothing_but_in_flight_overlaps(
    rows: list[TraceRow], slots: int, scale: float
) -> None:
    """On the request clock a trace replayed faster gives the same placements, as long as no
    request is still in flight at the next one (no output tokens, gaps of at least seconds)."""
    spaced = [replace(r, ts=100.0 * i * scale, output_tokens=0) for i, r in enumerate(rows)]
    slow = [replace(r, ts=100.0 * i * scale * scale, output_tokens=0) for i, r in enumerate(rows)]
    host_mb = (slots + 2) * 40
    a = _run(spaced, slots, host_mb)
    b = _run(slow, slots, host_mb)
    assert (a.gpu_hits, a.host_hits, a.cold_starts) == (b.gpu_hits, b.host_hits, b.cold_starts)


@settings(max_examples=60, deadline=None)
@given(traces(), st.integers(min_value=2, max_value=4))
def test_protected_versions_never_cold_start_while_they_fit_their_share(
    rows: list[TraceRow], slots: int
) -> None:
    """Platinum and active canaries: zero non-compulsory cold starts unless an overflow was
    counted (the protected set outgrew ``never_evict.warm_share``); an overflow is never silent."""
    cfg = PolicyConfig()
    cfg = replace(cfg, never_evict=replace(cfg.never_evict, warm_share=1.0))
    r = _run(rows, slots, (slots * 2 + 1) * 40 + 10, cfg)
    if r.extra["protection_overflows"] == 0:
        assert r.cold_starts_by_priority["platinum"] == 0
        # canary protection lapses after demote.idle_minutes without canary traffic
        gaps_ok = all(b.ts - a.ts < 3600.0 for a, b in itertools.pairwise(rows))
        if gaps_ok:
            assert r.cold_starts_canary == 0


class _Given(HeatPolicy):
    """The heat policy whose online state is the one given (a subclass: a compiled policy's
    methods cannot be replaced on an instance)."""

    def __init__(self, online: AdaptiveHeatOnline) -> None:
        super().__init__()
        self.given = online

    def online(self, ctx: OnlineContext) -> AdaptiveHeatOnline:
        return self.given


def test_the_hot_tier_follows_recency_on_a_recency_trace_and_heat_on_a_frequency_trace() -> None:
    def rows_of(names: list[str]) -> list[TraceRow]:
        return [TraceRow(10.0 * i, "t", f"t/{n}@1", Priority.BRONZE, RequestClass.INTERACTIVE,
                         8, 10 * MB, False, 10, 0) for i, n in enumerate(names)]

    # a working set of 4 that moves slowly (recency wins) vs. 3 hot versions among one-offs
    moving = [f"m{(i // 40) + (i % 4)}" for i in range(2_000)]
    frequent = [f"h{i % 3}" if i % 2 else f"once{i}" for i in range(2_000)]
    picked = {}
    for label, names in (("moving", moving), ("frequent", frequent)):
        trace = _trace(rows_of(names))
        ctx = trace.online_context(workers=1, gpu_slots=4, host_bytes=10**10,
                                   bandwidths=CostModel().bandwidths)
        online = make_policy("heat").online(ctx)
        assert isinstance(online, AdaptiveHeatOnline)
        simulate(trace, _Given(online), Capacities(4, 10**10, 1), CostModel())
        picked[label] = online.hot_expert(0)
    assert picked == {"moving": "lru", "frequent": "heat"}


def test_a_one_off_platinum_request_does_not_hold_a_pinned_slot() -> None:
    """Pins protect a live stream: after pin_idle_per_slot x slots requests without one, the
    platinum version competes like any other (and stays WARM: no cold start)."""
    names = ["plat"] + [f"b{i % 3}" for i in range(200)] + ["plat"]
    rows = [TraceRow(10.0 * i, "t", f"t/{n}@1",
                     Priority.PLATINUM if n == "plat" else Priority.BRONZE,
                     RequestClass.INTERACTIVE, 8, 10 * MB, False, 10, 0)
            for i, n in enumerate(names)]
    cfg = PolicyConfig()
    cfg = replace(cfg, never_evict=replace(cfg.never_evict, hot_share_priority=0.5))
    r = _run(rows, 3, 1_000, cfg)
    # with the slot held by the idle platinum version the three bronze ones would thrash
    assert r.gpu_hits >= 200 - 3 - 2 * cfg.adaptive.pin_idle_per_slot * 3
    assert r.cold_starts_by_priority["platinum"] == 0


def test_a_platinum_canary_keeps_its_priority_protection_when_its_canary_traffic_ends() -> None:
    """A platinum version first requested as a canary: once its canary traffic has been idle
    for demote.idle_minutes it loses the canary's protection, not platinum's (WARM keeps it)."""
    def row(t: float, k: int, prio: Priority, canary: bool = False) -> TraceRow:
        return TraceRow(ts=t, tenant_id="t", adapter_id=f"t/a{k}@v1", priority=prio,
                        request_class=RequestClass.CANARY if canary else RequestClass.INTERACTIVE,
                        rank=8, size_bytes=40 * MB, canary=canary, prompt_tokens=10,
                        output_tokens=10)
    rows = [row(0.0, k, Priority.BRONZE) for k in range(1, 4)]
    rows += [row(0.0, 0, Priority.PLATINUM, canary=True)]
    rows += [row(5000.0 + k, k, Priority.BRONZE) for k in range(1, 9)]  # WARM pressure
    rows += [row(5100.0, 0, Priority.PLATINUM)]
    r = _run(rows, 2, 5 * 40 + 10)
    assert r.warm_evictions > 0 and r.extra["protection_overflows"] == 0
    assert r.cold_starts_by_priority["platinum"] == 0
