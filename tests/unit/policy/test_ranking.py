"""One implementation: the cache-manager's heat plan takes the victims the simulator measures.

The simulator runs :class:`~loraplane.policy.adaptive.AdaptiveHeatOnline` request by request;
the cache-manager feeds a separate :class:`~loraplane.policy.ranking.AdaptiveRanking` the
same requests and evictions (as heat events and worker reports) and plans on snapshots
carrying its :class:`~loraplane.policy.snapshot.Ranks`. At every victim choice of a simulated
run the test builds the cache-manager's snapshot of that moment and checks that the ranking
names the simulator's victim and that :meth:`HeatPolicy.plan` demotes / evicts that version.
"""

from __future__ import annotations

import csv
import functools
import io
import random
from collections import Counter
from collections.abc import Container, Mapping
from dataclasses import replace
from types import MappingProxyType

import pytest

from loraplane.policy.config import PolicyConfig
from loraplane.policy.cost import Bandwidths
from loraplane.policy.heat import HeatPolicy
from loraplane.policy.model import PRIORITIES, REQUEST_CLASSES, Priority, RequestClass
from loraplane.policy.online import OnlineContext
from loraplane.policy.plan import ActionKind, Plan
from loraplane.policy.ranking import AdaptiveRanking, RankedVersion, RankedWorker
from loraplane.policy.snapshot import Ranks, Snapshot, VersionMeta, WorkerState
from loraplane.policy.stats import VersionStats
from loraplane.policy.victims import HotMember, hot_victim
from loraplane.sim.cost import CostModel
from loraplane.sim.simulator import Capacities, simulate
from loraplane.sim.trace import Trace, TraceRow, format_rows, parse_rows
from tests.support.native import interpreted

# the interpreted class, subclassed below (test_native.py: the compiled one decides alike);
# AdaptiveRanking runs the module the cache manager imports
AdaptiveHeatOnline = interpreted("loraplane.policy.adaptive").AdaptiveHeatOnline

MB = 1_000_000
SLOTS = 4
HOST = 220 * MB
W = "w0"


def _rows(seed: int, n: int, moving: bool) -> list[TraceRow]:
    """A trace with a popular core, bursts and one-off versions; ``moving``: the working set
    drifts (recency wins), else it is steady (frequency wins). Versions are named in order of
    first appearance, so the simulator's integers and the ranking's sorted ids agree."""
    rnd = random.Random(seed)
    t = 0.0
    keys: list[int] = []
    burst = 0
    for i in range(n):
        t += rnd.choice([0.0, 0.3, 1.0, 4.0, 30.0])
        if burst:
            burst -= 1
            k = keys[-1]
        elif rnd.random() < 0.05:
            k, burst = rnd.randrange(40, 400), rnd.randrange(2, 12)
        else:
            base = (i // 300) * 6 if moving else 0
            k = base + min(int(rnd.paretovariate(1.2)) - 1, 30)
        keys.append(k)
    order: dict[int, int] = {}
    for k in keys:
        order.setdefault(k, len(order))
    rows = []
    t = 0.0
    rnd = random.Random(seed + 1)
    for k in keys:
        t += rnd.choice([0.0, 0.3, 1.0, 4.0, 30.0])
        rows.append(TraceRow(
            ts=t, tenant_id=f"t{k % 3}", adapter_id=f"x/a{order[k]:04d}@v1",
            priority=Priority.BRONZE, request_class=list(RequestClass)[k % 2], rank=8,
            size_bytes=(1 + k % 4) * 10 * MB, canary=False,
            prompt_tokens=rnd.randrange(0, 800), output_tokens=rnd.randrange(0, 200),
        ))
    return rows


def _trace(rows: list[TraceRow]) -> Trace:
    return parse_rows(csv.DictReader(io.StringIO("".join(format_rows(rows)))), "t")


class _CrossChecked(AdaptiveHeatOnline):
    """The simulator's online policy, checking the cache-manager's side at every victim."""

    def __init__(self, ctx: OnlineContext, cfg: PolicyConfig, trace: Trace) -> None:
        super().__init__(ctx, cfg)
        assert trace.version_ids == sorted(trace.version_ids)
        self.cfg = cfg
        self.trace = trace
        self.bw = ctx.bandwidths
        self.names = trace.version_ids
        self.ranking = AdaptiveRanking(cfg, self.bw)
        self.universe = [
            RankedVersion(name, trace.version_size[v], name, trace.version_tenant[v], "bm")
            for v, name in enumerate(self.names)
        ]
        self.metas = [
            VersionMeta(version_id=name, tenant_id=trace.version_tenant[v], base_model="bm",
                        priority=Priority.BRONZE, size_bytes=trace.version_size[v], rank=8)
            for v, name in enumerate(self.names)
        ]
        self.stats = [VersionStats(cfg.score.rate_window_s, cfg.score.warm_rate_window_s)
                      for _ in self.names]
        self.hot: set[int] = set()
        self.warm: set[int] = set()
        self.checks: Counter[str] = Counter()
        self._sync()

    def _sync(self) -> None:
        resident = frozenset(self.names[u] for u in self.warm)
        self.ranking.update(self.universe, [RankedWorker(W, {"bm": SLOTS}, HOST, resident)])

    def _ranks(self) -> Ranks | None:
        return self.ranking.ranks((W, self.names[u]) for u in self.warm)

    def _snapshot(self, ranks: Ranks, busy: Mapping[int, float], now: float,
                  warm_bytes: int) -> Snapshot:
        names = self.names
        worker = WorkerState(
            worker_id=W, hot_slots=MappingProxyType({"bm": SLOTS}), warm_bytes=warm_bytes,
            hot=frozenset(names[u] for u in self.hot),
            warm=frozenset(names[u] for u in self.warm - self.hot),
            in_flight=MappingProxyType(
                {names[u]: 1 for u in self.hot if busy.get(u, 0.0) > now}),
        )
        stats = {names[v]: s.view() for v, s in enumerate(self.stats) if s.view().requests}
        return Snapshot.build(self.metas, [worker], stats, self.bw, ranks=ranks)

    # -- the events, to both sides
    def on_request(self, i: int, v: int, now: float) -> None:
        super().on_request(i, v, now)
        cls = REQUEST_CLASSES[self.trace.classes[i]]
        self.stats[v].record_request(now, cls)
        self.ranking.arrived(self.names[v], W, cls, PRIORITIES[self.trace.priorities[i]],
                             bool(self.trace.canary[i]), now)

    def on_served(self, g: int, w: int, v: int, now: float) -> None:
        super().on_served(g, w, v, now)
        self.ranking.served()

    def on_insert_hot(self, g: int, v: int, now: float) -> None:
        super().on_insert_hot(g, v, now)
        self.hot.add(v)

    def on_remove_hot(self, g: int, v: int) -> None:
        super().on_remove_hot(g, v)
        self.hot.discard(v)

    def on_insert_warm(self, w: int, v: int, now: float) -> None:
        super().on_insert_warm(w, v, now)
        self.warm.add(v)
        self._sync()

    def on_remove_warm(self, w: int, v: int) -> None:
        super().on_remove_warm(w, v)
        self.warm.discard(v)
        self._sync()  # the worker's report: the ranking's L rises as the simulator's did

    # -- the checks
    def hot_victim(self, g: int, now: float, busy: Mapping[int, float]) -> int | None:
        ranks = self._ranks()
        victim = super().hot_victim(g, now, busy)
        if ranks is None or victim is None:
            return victim
        names = self.names
        free = [u for u in self.hot if busy.get(u, 0.0) <= now]
        lowest = min(free, key=lambda u: (ranks.hot_key(names[u]), names[u]))
        assert lowest == victim, (names[lowest], names[victim])
        self.checks["hot " + self.hot_expert(g)] += 1
        # the worker's request path, told the round's HOT order (HotOrder / hot_keep)
        members = [
            HotMember(self.metas[u], self.stats[u].view(), self.stats[u].view().last_access or 0.0,
                      busy=busy.get(u, 0.0) > now, keep=ranks.hot_key(names[u]))
            for u in sorted(self.hot)
        ]
        worker = hot_victim(members, now, self.cfg, self.bw)
        assert worker.victim == names[victim], (worker, names[victim])
        self.checks["hot worker"] += 1
        plan = HeatPolicy(self.cfg).plan(self._snapshot(ranks, busy, now, HOST), now)
        demoted = [a.version_id for a in plan if a.kind is ActionKind.DEMOTE]
        if demoted:
            first = min(demoted, key=lambda vid: (ranks.hot_key(vid), vid))
            assert first == names[victim], (demoted, names[victim])
            self.checks["hot plan"] += 1
        return victim

    def warm_victim(self, w: int, now: float, hot: Container[int]) -> int | None:
        ranks = self._ranks()
        used = sum(self.trace.version_size[u] for u in self.warm)
        victim = super().warm_victim(w, now, hot)
        if ranks is None or victim is None:
            return victim
        names = self.names
        lowest = min((u for u in self.warm if u not in hot),
                     key=lambda u: (ranks.warm_key(W, names[u]), names[u]))
        assert lowest == victim, (names[lowest], names[victim])
        self.checks["warm " + self.warm_expert(w)] += 1
        # one byte too many: the plan evicts exactly one version, its lowest-ranked
        plan = HeatPolicy(self.cfg).plan(self._snapshot(ranks, {}, now, used - 1), now)
        if not _changes_hot(plan):
            evicted = [a.version_id for a in plan if a.kind is ActionKind.EVICT]
            assert evicted == [names[victim]], (evicted, names[victim])
            self.checks["warm plan"] += 1
        return victim


def _changes_hot(plan: Plan) -> bool:
    return any(a.kind in (ActionKind.PROMOTE, ActionKind.DEMOTE) for a in plan)


class _Policy(HeatPolicy):
    def __init__(self, cfg: PolicyConfig, trace: Trace) -> None:
        super().__init__(cfg)
        self.trace = trace
        self.last: _CrossChecked | None = None

    def online(self, ctx: OnlineContext) -> _CrossChecked:  # type: ignore[override]
        self.last = _CrossChecked(ctx, self.config, self.trace)
        return self.last


def _config() -> PolicyConfig:
    cfg = PolicyConfig()
    # the simulator has no idle demotion: the plan's wall-clock rule stays out of the way
    return replace(cfg, demote=replace(cfg.demote, idle_minutes=1e9))


RUNS = [(1, False), (2, True), (3, True), (4, False)]
"""Steady popularity (frequency wins) and a drifting working set (recency wins)."""


@functools.cache
def _checked_run(seed: int, moving: bool) -> tuple[int, int, Counter[str]]:
    trace = _trace(_rows(seed, 1500, moving))
    policy = _Policy(_config(), trace)
    result = simulate(trace, policy, Capacities(SLOTS, HOST, 1), CostModel())
    assert policy.last is not None
    return result.hot_evictions, result.warm_evictions, policy.last.checks


@pytest.mark.parametrize(("seed", "moving"), RUNS)
def test_the_plan_takes_the_simulators_victims(seed: int, moving: bool) -> None:
    hot_evictions, warm_evictions, checks = _checked_run(seed, moving)
    assert hot_evictions > 0 and warm_evictions > 0
    # the victims after the warm-up were checked, on the ranking and in the plan
    hot = sum(n for k, n in checks.items()
              if k.startswith("hot ") and k not in ("hot plan", "hot worker"))
    warm = sum(n for k, n in checks.items() if k.startswith("warm ") and k != "warm plan")
    assert hot > 0.8 * hot_evictions - 2 * SLOTS and checks["hot plan"] > 0.3 * hot, checks
    assert checks["hot worker"] == hot  # the worker's request path took every one of them
    assert warm > 0.5 * warm_evictions and checks["warm plan"] > 0.05 * warm, checks


def test_both_experts_of_each_tier_were_cross_checked() -> None:
    seen: Counter[str] = Counter()
    for seed, moving in RUNS:
        seen.update(_checked_run(seed, moving)[2])
    assert seen["hot lru"] and seen["hot heat"], seen
    assert seen["warm reuse"] and seen["warm heat"], seen


def test_ranks_wait_for_one_hot_time_constant_then_follow_the_experts() -> None:
    cfg = PolicyConfig()
    ranking = AdaptiveRanking(cfg, Bandwidths())
    universe = [RankedVersion(f"t/a{k}@1", 10 * MB, f"t/a{k}", "t", "bm") for k in range(6)]
    ranking.update(universe, [RankedWorker(W, {"bm": 2}, HOST)])
    need = int(cfg.adaptive.hot_tau_per_slot * 2)
    for i in range(need - 1):
        ranking.observe(f"t/a{i % 3}@1", W, RequestClass.INTERACTIVE, Priority.SILVER, False,
                        float(i))
    assert ranking.ranks([]) is None  # a new leader ranks by the stored plain score first
    ranking.observe("t/a5@1", W, RequestClass.INTERACTIVE, Priority.SILVER, False, float(need))
    ranks = ranking.ranks([])
    assert ranks is not None
    assert ranks.hot_experts == {f"{W}/bm": "heat"}
    # never requested: last; requested: above
    assert ranks.hot_key("t/a4@1") < min(ranks.hot_key(f"t/a{k}@1") for k in range(3))


def test_a_new_version_rebuilds_the_experts_from_the_kept_requests() -> None:
    cfg = PolicyConfig()
    requests = [(f"t/a{(i * 7) % 5}@1", float(i)) for i in range(400)]
    universe = [RankedVersion(f"t/a{k}@1", 10 * MB, f"t/a{k}", "t", "bm") for k in range(5)]
    workers = [RankedWorker(W, {"bm": 2}, HOST)]
    grown = AdaptiveRanking(cfg)
    grown.update(universe, workers)
    for vid, at in requests:
        grown.observe(vid, W, RequestClass.INTERACTIVE, Priority.SILVER, False, at)
    extra = RankedVersion("t/a9@1", 10 * MB, "t/a9", "t", "bm")
    grown.update([*universe, extra], workers)  # admitted later: rebuilt and replayed
    fresh = AdaptiveRanking(cfg)
    fresh.update([*universe, extra], workers)
    for vid, at in requests:
        fresh.observe(vid, W, RequestClass.INTERACTIVE, Priority.SILVER, False, at)
    a, b = grown.ranks([]), fresh.ranks([])
    assert a is not None and a == b


def test_the_same_versions_tuple_again_keeps_the_experts_and_a_new_one_is_compared() -> None:
    """A caller passing the very tuple of its last update is not compared at all; another
    tuple is, so a changed universe still rebuilds (and one equal to it does not)."""
    cfg = PolicyConfig()
    universe = tuple(RankedVersion(f"t/a{k}@1", 10 * MB, f"t/a{k}", "t", "bm") for k in range(5))
    workers = [RankedWorker(W, {"bm": 2}, HOST)]
    ranking = AdaptiveRanking(cfg)
    ranking.update(universe, workers)
    for i in range(100):
        ranking.observe(f"t/a{i % 5}@1", W, RequestClass.INTERACTIVE, Priority.SILVER, False,
                        float(i))
    experts = ranking._online
    ranking.update(universe, workers)
    ranking.update(tuple(universe), workers)  # tuple() of a tuple: the same object
    ranking.update((*universe,), workers)  # an equal copy: compared, the same
    assert ranking._online is experts  # not rebuilt
    extra = RankedVersion("t/a9@1", 10 * MB, "t/a9", "t", "bm")
    ranking.update((*universe, extra), workers)  # a new version: rebuilt, history replayed
    assert ranking._online is not experts
    fresh = AdaptiveRanking(cfg)
    fresh.update((*universe, extra), workers)
    for i in range(100):
        fresh.observe(f"t/a{i % 5}@1", W, RequestClass.INTERACTIVE, Priority.SILVER, False,
                      float(i))
    assert ranking.ranks([]) == fresh.ranks([])


def test_history_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="history must be >= 0"):
        AdaptiveRanking(PolicyConfig(), history=-1)
