"""The online (per-request) face of every policy, driven by the simulator on small traces:
hand-computed victim orders, Belady against a brute-force optimum, and invariants (hypothesis)."""

from __future__ import annotations

import csv
import io
import itertools
from collections.abc import Container
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loraplane.policy.config import PolicyConfig
from loraplane.policy.cost import Bandwidths
from loraplane.policy.factory import POLICIES, make_policy
from loraplane.policy.heat import HeatOnline, HeatPolicy
from loraplane.policy.model import Priority, RequestClass
from loraplane.policy.online import OnlineContext
from loraplane.sim.cost import CostModel
from loraplane.sim.simulator import Capacities, SimResult, simulate
from loraplane.sim.trace import Trace, TraceRow, format_rows, parse_rows

MB = 1_000_000
INSTANT = CostModel(
    bandwidths=Bandwidths(
        host_to_gpu_bytes_per_s=1e18, s3_bytes_per_s=1e18, s3_latency_s=0.0,
        verify_bytes_per_s=1e18, register_s=0.0,
    ),
    prefill_ms_per_token=0.0,
    base_ttft_ms=0.0,
    tpot_ms=0.0,
)
"""Loads and requests take no time: no version is ever busy, so policies choose freely."""


def trace_of(
    refs: list[str],
    *,
    gap: float = 100.0,
    priority: dict[str, Priority] | None = None,
    sizes: dict[str, int] | None = None,
    classes: dict[str, RequestClass] | None = None,
    output_tokens: int = 10,
) -> Trace:
    """A trace requesting ``refs`` in order, ``gap`` seconds apart."""
    rows = [
        TraceRow(
            ts=i * gap,
            tenant_id="t",
            adapter_id=f"t/{r}@v1",
            priority=(priority or {}).get(r, Priority.BRONZE),
            request_class=(classes or {}).get(r, RequestClass.INTERACTIVE),
            rank=8,
            size_bytes=(sizes or {}).get(r, 10 * MB),
            canary=False,
            prompt_tokens=100,
            output_tokens=output_tokens,
        )
        for i, r in enumerate(refs)
    ]
    return parse_rows(csv.DictReader(io.StringIO("".join(format_rows(rows)))), "test")


def run(name: str, trace: Trace, slots: int, host_mb: int = 10_000, cost: CostModel = INSTANT,
        workers: int = 1) -> SimResult:
    return simulate(trace, make_policy(name), Capacities(slots, host_mb * MB, workers), cost)


# the textbook reference string (Silberschatz): 3 frames → OPT 7 faults, LRU 10, FIFO 9
CLASSIC = [str(x) for x in (1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5)]


@pytest.mark.parametrize(("policy", "faults"), [("belady", 7), ("lru", 10), ("fifo", 9)])
def test_textbook_reference_string(policy: str, faults: int) -> None:
    r = run(policy, trace_of(CLASSIC), slots=3)
    assert r.requests - r.gpu_hits == faults
    assert r.compulsory_misses == 5


def test_fifo_with_four_frames_shows_beladys_anomaly() -> None:
    r = run("fifo", trace_of(CLASSIC), slots=4)
    assert r.requests - r.gpu_hits == 10  # more frames, more faults


def test_lfu_keeps_the_frequent_version_lru_does_not() -> None:
    refs = ["a", "a", "a", "b", "c", "a"]  # 2 slots: c evicts the LRU, which is a
    assert run("lru", trace_of(refs), slots=2).gpu_hits == 2
    assert run("lfu", trace_of(refs), slots=2).gpu_hits == 3


def test_heat_keeps_the_frequent_version_and_lets_recent_one_offs_go() -> None:
    refs = ["a", "a", "a", "b", "c", "a", "d", "a"]
    heat = run("heat", trace_of(refs, gap=10.0), slots=2)
    lru = run("lru", trace_of(refs, gap=10.0), slots=2)
    assert heat.gpu_hits == 4 and lru.gpu_hits == 3  # LRU lost a to c


def test_gdsf_keeps_the_version_that_is_expensive_to_reload() -> None:
    # equal frequency; "big" costs 100x more to reload from WARM (size / host→GPU bandwidth)
    refs = ["big", "small", "x", "big", "small"]
    cost = CostModel(bandwidths=Bandwidths(host_to_gpu_bytes_per_s=1e8, register_s=0.0),
                     prefill_ms_per_token=0.0, base_ttft_ms=0.0, tpot_ms=0.0)
    trace = trace_of(refs, gap=1000.0, sizes={"big": 100 * MB, "small": 1 * MB, "x": 1 * MB})
    r = simulate(trace, make_policy("gdsf"), Capacities(2, 1000 * MB), cost)
    assert r.gpu_hits == 1  # "big" survived x's arrival; "small" did not


def test_heat_never_evicts_platinum_from_warm_while_others_can_go() -> None:
    refs = ["p", "b1", "b2", "b3", "b4", "p"]
    trace = trace_of(refs, priority={"p": Priority.PLATINUM})
    # 1 slot, host for 3 versions (one is the HOT one): every new version pushes one out
    heat = run("heat", trace, slots=1, host_mb=30)
    lru = run("lru", trace, slots=1, host_mb=30)
    assert heat.cold_starts_by_priority["platinum"] == 0 and heat.host_hits == 1
    assert lru.cold_starts_by_priority["platinum"] == 1


def test_busy_versions_are_not_evicted_and_the_request_waits_when_all_are_busy() -> None:
    # slot 1 busy for 10 s (10 000 output tokens at 1 ms), next request at t=1
    trace = trace_of(["a", "b"], gap=1.0, output_tokens=10_000)
    cost = CostModel(bandwidths=INSTANT.bandwidths, prefill_ms_per_token=0.0, base_ttft_ms=0.0,
                     tpot_ms=1.0)
    for name in POLICIES:
        r = simulate(trace, make_policy(name), Capacities(1, 10_000 * MB), cost)
        assert r.slot_waits == 1
        # b (a compulsory miss) waited for a to finish: 10 s after a started, 9 s after b came
        assert r.compulsory_ttft_ms["p99"] == pytest.approx(9_000.0, abs=1.0)


# --- Belady is optimal: brute force over every eviction choice ------------------------------


def optimal_hits(refs: tuple[str, ...], slots: int) -> int:
    """Most HOT hits any demand-paging policy can get (exhaustive search)."""

    @cache
    def best(i: int, cache: frozenset[str]) -> int:
        if i == len(refs):
            return 0
        r = refs[i]
        if r in cache:
            return 1 + best(i + 1, cache)
        if len(cache) < slots:
            return best(i + 1, cache | {r})
        return max(best(i + 1, (cache - {v}) | {r}) for v in cache)

    return best(0, frozenset())


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from("abcde"), min_size=1, max_size=11),
    st.integers(min_value=1, max_value=3),
)
def test_belady_matches_the_brute_force_optimum_and_beats_everyone(
    refs: list[str], slots: int
) -> None:
    trace = trace_of(refs)
    opt = optimal_hits(tuple(refs), slots)
    assert run("belady", trace, slots).gpu_hits == opt
    for name in POLICIES:
        assert run(name, trace, slots).gpu_hits <= opt


# --- invariants under random traces ---------------------------------------------------------


@st.composite
def random_traces(draw: st.DrawFn) -> Trace:
    n = draw(st.integers(min_value=1, max_value=60))
    names = [f"v{i}" for i in range(draw(st.integers(min_value=1, max_value=10)))]
    rows = []
    t = 0.0
    for _ in range(n):
        t += draw(st.sampled_from([0.0, 0.1, 1.0, 5.0, 100.0, 4000.0]))
        name = draw(st.sampled_from(names))
        k = names.index(name)
        canary = k == 0 and draw(st.booleans())
        rows.append(TraceRow(
            ts=t, tenant_id=f"t{k % 3}", adapter_id=f"t{k % 3}/{name}@v{1 + (k % 2)}",
            priority=list(Priority)[k % 4],
            request_class=RequestClass.CANARY if canary else list(RequestClass)[k % 2],
            rank=8, size_bytes=(1 + k % 4) * 10 * MB, canary=canary,
            prompt_tokens=draw(st.integers(min_value=0, max_value=3000)),
            output_tokens=draw(st.integers(min_value=0, max_value=500)),
            base_model=f"bm{k % 2}",
        ))
    text = "".join(format_rows(rows, with_base_model=True))
    return parse_rows(csv.DictReader(io.StringIO(text)), "random")


@settings(max_examples=60, deadline=None)
@given(random_traces(), st.integers(min_value=1, max_value=3), st.integers(min_value=1, max_value=2))
def test_every_policy_follows_the_simulation_rules(trace: Trace, slots: int, workers: int) -> None:
    """The simulator raises if a policy picks a busy, absent or HOT-on-WARM victim or
    overflows a tier; the counts must add up."""
    host_mb = (slots * 2 + 1) * 40 + 10
    for name in POLICIES:
        r = run(name, trace, slots, host_mb=host_mb, cost=CostModel(), workers=workers)
        assert r.gpu_hits + r.host_hits + r.compulsory_misses + r.cold_starts == r.requests
        assert r.compulsory_misses == trace.n_versions
        assert r.loads == r.requests - r.gpu_hits


@pytest.mark.parametrize("gap", [37.0, 150_000.0])  # the second one forces rebasing
def test_online_heat_score_matches_the_plan_score(gap: float) -> None:
    """The simulator's fast path and plan() rank with the same formula."""
    from loraplane.policy.config import PolicyConfig
    from loraplane.policy.heat import HeatOnline
    from loraplane.policy.score import hot_terms, warm_value
    from loraplane.policy.snapshot import VersionMeta
    from loraplane.policy.stats import VersionStats

    refs = ["a", "b", "a", "a", "b", "c"]
    cls = {"a": RequestClass.INTERACTIVE, "b": RequestClass.BACKGROUND, "c": RequestClass.CANARY}
    sizes = {"a": 300 * MB, "b": 80 * MB, "c": 7 * MB}
    prio = {"a": Priority.GOLD, "b": Priority.BRONZE, "c": Priority.SILVER}
    trace = trace_of(refs, gap=gap, classes=cls, sizes=sizes, priority=prio)
    cfg = PolicyConfig()
    ctx = trace.online_context(workers=1, gpu_slots=2, host_bytes=10**12,
                               bandwidths=Bandwidths())
    online = HeatOnline(ctx, cfg)
    stats = {v: VersionStats() for v in range(trace.n_versions)}
    for i, v in enumerate(trace.version):
        online.on_request(i, v, trace.ts[i])
        stats[v].record_request(trace.ts[i], list(RequestClass)[trace.classes[i]])
    now = trace.ts[-1] + 123.0
    for v in range(trace.n_versions):
        name = trace.version_ids[v].split("/")[1].split("@")[0]
        m = VersionMeta(trace.version_ids[v], "t", "default", prio[name], sizes[name])
        view = stats[v].view()
        assert online.heat_hot(v, now) == pytest.approx(hot_terms(m, view, now, cfg.score,
                                                                  Bandwidths()).heat)
        assert online.value_warm(v, now) == pytest.approx(warm_value(m, view, now, cfg.score,
                                                                     Bandwidths()))


def test_each_policy_is_registered_once() -> None:
    assert sorted(POLICIES) == sorted({"heat", "lru", "fifo", "lfu", "gdsf", "belady"})
    assert len(set(itertools.chain(POLICIES))) == 6


class _CheckedOnline(HeatOnline):
    """Plain heat online state whose WARM victim is checked against a plain scan of every
    member (a subclass: a compiled class's methods cannot be replaced on an instance)."""

    def __init__(self, ctx: OnlineContext, cfg: PolicyConfig) -> None:
        super().__init__(ctx, cfg)
        self.members: list[set[int]] = [set() for _ in range(ctx.n_workers)]

    def on_insert_warm(self, w: int, v: int, now: float) -> None:
        self.members[w].add(v)
        super().on_insert_warm(w, v, now)

    def on_remove_warm(self, w: int, v: int) -> None:
        self.members[w].discard(v)
        super().on_remove_warm(w, v)

    def warm_victim(self, w: int, now: float, hot: Container[int]) -> int | None:
        got = super().warm_victim(w, now, hot)
        idle_before = now - self._idle_s
        free = [u for u in self.members[w] if u not in hot]

        def protected(u: int) -> bool:
            if self.superseded(u) or not self._prot[u]:
                return False
            return not (self._prot[u] == 1 and self._last[u] < idle_before)

        pool = [u for u in free if not protected(u)] or free
        want = min(pool, key=lambda u: (self.value_warm(u, now), u)) if pool else None
        if want is not None and got != want:
            assert got is not None
            assert self.value_warm(got, now) == pytest.approx(self.value_warm(want, now))
        else:
            assert got == want
        return got


class CheckedHeat(HeatPolicy):
    """Plain heat (``adaptive.enabled: false``) whose WARM victim is checked against a plain
    scan of every member."""

    def online(self, ctx: OnlineContext) -> HeatOnline:
        from dataclasses import replace

        cfg = replace(self.config, adaptive=replace(self.config.adaptive, enabled=False))
        return _CheckedOnline(ctx, cfg)


@settings(max_examples=60, deadline=None)
@given(random_traces(), st.integers(min_value=1, max_value=2))
def test_heat_warm_victim_is_the_lowest_value_member(trace: Trace, slots: int) -> None:
    """The heap + scan split finds the same victim as scanning every WARM member."""
    simulate(trace, CheckedHeat(), Capacities(slots, ((slots * 2 + 1) * 40 + 10) * MB), CostModel())


@pytest.mark.parametrize(("scale", "expected"), [(0.3, "burst"), (0.0, "steady")])
def test_online_heat_demotes_a_burst_that_ended_before_a_steady_stream(
    scale: float, expected: str
) -> None:
    """30 requests 1 s apart then silence vs one request every 5 minutes: the burst's decayed
    count is larger, but it has been idle for hundreds of its own gaps (liveness)."""
    from dataclasses import replace

    from loraplane.policy.config import PolicyConfig

    trace = trace_of(["burst", "steady"])
    ctx = trace.online_context(workers=1, gpu_slots=2, host_bytes=10**12, bandwidths=Bandwidths())
    cfg = PolicyConfig()
    online = HeatOnline(ctx, replace(cfg, score=replace(cfg.score, liveness_scale=scale)))
    ids = {trace.version_ids[v].split("/")[1].split("@")[0]: v for v in range(trace.n_versions)}
    events = [(1000.0 + k, ids["burst"]) for k in range(30)]
    events += [(t, ids["steady"]) for t in (600.0, 900.0, 1200.0, 1500.0)]
    for t, v in sorted(events):
        online.on_request(0, v, t)
    for v in ids.values():
        online.on_insert_hot(0, v, 0.0)
    assert online.hot_victim(0, 1560.0, {}) == ids[expected]
