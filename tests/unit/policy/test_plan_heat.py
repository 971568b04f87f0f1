"""Table tests of ``HeatPolicy.plan``: promotions, demotions, pins, prewarm, placement."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import pytest

from loraplane.policy.config import PlacementConfig, PolicyConfig
from loraplane.policy.heat import HeatPolicy, SnapshotError
from loraplane.policy.model import Priority, RequestClass
from loraplane.policy.plan import Action, ActionKind, Plan, Reason
from loraplane.policy.snapshot import Snapshot, WorkerState

from .helpers import apply_plan, meta, requested, worker

NOW = 10_000.0
HEAT = HeatPolicy()


def hot_stats(n: int = 20) -> list[float]:
    """``n`` requests over the last minutes."""
    return [NOW - 10.0 * k for k in range(n)]


def kinds(plan: Plan, kind: ActionKind) -> set[tuple[str, str, Reason]]:
    return {(a.worker_id, a.version_id, a.reason) for a in plan.of_kind(kind)}


def test_promotes_the_hottest_into_free_slots_and_not_the_lukewarm() -> None:
    snap = Snapshot.build(
        [meta("t/hot@v1"), meta("t/cold@v1")],
        [worker("w0", slots=2)],
        {"t/hot@v1": requested(hot_stats()), "t/cold@v1": requested([NOW - 3500.0])},
    )
    plan = HEAT.plan(snap, NOW)
    assert kinds(plan, ActionKind.PROMOTE) == {("w0", "t/hot@v1", Reason.HEAT)}


def test_displaces_the_coolest_resident_only_beyond_hysteresis() -> None:
    versions = [meta("t/a@v1"), meta("t/b@v1"), meta("t/new@v1")]
    stats = {
        "t/a@v1": requested(hot_stats(20)),
        "t/b@v1": requested(hot_stats(5)),
        "t/new@v1": requested(hot_stats(30)),
    }
    snap = Snapshot.build(versions, [worker("w0", slots=2, hot={"t/a@v1", "t/b@v1"})], stats)
    plan = HEAT.plan(snap, NOW)
    assert kinds(plan, ActionKind.DEMOTE) == {("w0", "t/b@v1", Reason.DISPLACED)}
    assert kinds(plan, ActionKind.PROMOTE) == {("w0", "t/new@v1", Reason.HEAT)}
    # barely hotter than the resident: the resident stays (no churn)
    stats["t/new@v1"] = requested([t + 2.0 for t in hot_stats(5)])
    snap = Snapshot.build(versions, [worker("w0", slots=2, hot={"t/a@v1", "t/b@v1"})], stats)
    assert len(HEAT.plan(snap, NOW)) == 0


def test_idle_and_failing_versions_are_demoted_but_in_flight_ones_stay() -> None:
    versions = [meta("t/idle@v1"), meta("t/bad@v1"), meta("t/busy@v1"),
                meta("t/plat@v1", priority=Priority.PLATINUM)]
    stats = {
        "t/idle@v1": requested([NOW - 2 * 3600.0]),
        "t/busy@v1": requested([NOW - 2 * 3600.0]),
        "t/bad@v1": requested(hot_stats(), errors=5, finished=40),
        "t/plat@v1": requested([NOW - 2 * 3600.0]),
    }
    w = worker("w0", slots=4, hot=set(stats), in_flight={"t/busy@v1": 1})
    plan = HEAT.plan(Snapshot.build(versions, [w], stats), NOW)
    assert kinds(plan, ActionKind.DEMOTE) == {
        ("w0", "t/idle@v1", Reason.IDLE),
        ("w0", "t/bad@v1", Reason.ERROR_RATE),
        ("w0", "t/plat@v1", Reason.IDLE),
    }
    # demoted, not evicted: platinum and the others stay WARM (there is room)
    assert not plan.of_kind(ActionKind.EVICT)


def test_protected_versions_are_pinned_within_their_share_never_every_slot() -> None:
    plats = [f"t/p{i}@v1" for i in range(4)]
    versions = [meta(v, priority=Priority.PLATINUM) for v in plats]
    stats = {v: requested(hot_stats(10 + i)) for i, v in enumerate(plats)}
    # 16 slots, share 0.125: two pins for platinum
    snap = Snapshot.build(versions, [worker("w0", slots=16, hot=set(plats))], stats)
    plan = HEAT.plan(snap, NOW)
    assert kinds(plan, ActionKind.PIN) == {("w0", "t/p3@v1", Reason.PROTECTED),
                                           ("w0", "t/p2@v1", Reason.PROTECTED)}
    # 2 slots: share rounds to 0, nothing pinned, and an existing pin is lifted
    snap = Snapshot.build(versions[:2], [worker("w0", slots=2, hot=set(plats[:2]),
                                                pinned={plats[0]})], stats)
    plan = HEAT.plan(snap, NOW)
    assert kinds(plan, ActionKind.UNPIN) == {("w0", plats[0], Reason.UNPROTECTED)}
    assert not plan.of_kind(ActionKind.PIN)


def test_active_canary_is_prefetched_before_traffic() -> None:
    snap = Snapshot.build(
        [meta("t/a@v2", canary=True), meta("t/a@v1")],
        [worker("w0", slots=2, warm_mb=200), worker("w1", slots=2, warm_mb=200, warm={"t/a@v1"})],
        {"t/a@v1": requested(hot_stats(2))},
    )
    plan = HEAT.plan(snap, NOW)
    prefetched = plan.of_kind(ActionKind.PREFETCH)
    assert [(a.version_id, a.reason) for a in prefetched] == [("t/a@v2", Reason.CANARY_PREWARM)]
    # and nothing else is prefetched: unrequested non-canary versions wait for traffic
    snap = Snapshot.build([meta("t/x@v1")], [worker("w0")], {})
    assert not HEAT.plan(snap, NOW).of_kind(ActionKind.PREFETCH)


def test_platinum_stays_warm_under_pressure_and_gives_way_only_when_alone_too_big() -> None:
    versions = [meta("t/p@v1", priority=Priority.PLATINUM, size_mb=60),
                meta("t/b@v1", size_mb=60), meta("t/hot@v1", size_mb=60)]
    stats = {"t/p@v1": requested([NOW - 3000.0]), "t/b@v1": requested(hot_stats(3)),
             "t/hot@v1": requested(hot_stats(30))}
    # room for two 60 MB versions: the hot one must come in, b (unprotected) goes
    w = worker("w0", slots=1, warm_mb=120, warm={"t/p@v1", "t/b@v1"})
    plan = HEAT.plan(Snapshot.build(versions, [w], stats), NOW)
    assert kinds(plan, ActionKind.EVICT) == {("w0", "t/b@v1", Reason.DISPLACED)}
    assert kinds(plan, ActionKind.PROMOTE) == {("w0", "t/hot@v1", Reason.HEAT)}
    # two platinum versions and room for one next to the HOT one: the coolest gives way
    versions[1] = meta("t/b@v1", priority=Priority.PLATINUM, size_mb=60)
    plan = HEAT.plan(Snapshot.build(versions, [w], stats), NOW)
    assert kinds(plan, ActionKind.EVICT) == {("w0", "t/p@v1", Reason.PROTECTION_OVERFLOW)}


def test_hottest_versions_get_min_replicas_and_load_gets_spread() -> None:
    versions = [meta("t/top@v1"), meta("t/mid@v1"), meta("t/low@v1")]
    stats = {
        # ~20 req/s: four replicas at 5 req/s each, capped by the three workers
        "t/top@v1": requested([NOW - 0.05 * k for k in range(12_000)]),
        "t/mid@v1": requested(hot_stats(30)),
        "t/low@v1": requested(hot_stats(10)),
    }
    ws = [worker(f"w{i}", slots=2) for i in range(3)]
    plan = HEAT.plan(Snapshot.build(versions, ws, stats), NOW)
    promoted: dict[str, list[tuple[str, Reason]]] = {}
    for a in plan.of_kind(ActionKind.PROMOTE):
        promoted.setdefault(a.version_id, []).append((a.worker_id, a.reason))
    assert len(promoted["t/top@v1"]) == 3
    assert {r for _, r in promoted["t/top@v1"]} == {Reason.HEAT, Reason.MIN_REPLICAS,
                                                     Reason.LOAD_SPREAD}
    assert len(promoted["t/mid@v1"]) == 2  # second hottest: min_hot_replicas = 2
    assert len(promoted["t/low@v1"]) == 1
    # load spread: the single-replica version lands on the least loaded worker
    top_workers = {w for w, _ in promoted["t/top@v1"]}
    mid_workers = {w for w, _ in promoted["t/mid@v1"]}
    loads = {w.worker_id: (w.worker_id in top_workers) * 20 + (w.worker_id in mid_workers)
             for w in ws}
    assert promoted["t/low@v1"][0][0] == min(loads, key=lambda k: (loads[k], k))


def test_affinity_keeps_a_version_where_it_is_and_prefers_warm_workers() -> None:
    single = HeatPolicy(replace(PolicyConfig(), placement=PlacementConfig(hottest_top_n=0)))
    versions = [meta("t/a@v1"), meta("t/b@v1")]
    stats = {"t/a@v1": requested(hot_stats(5)), "t/b@v1": requested(hot_stats(5))}
    ws = [worker("w0", slots=2), worker("w1", slots=2, hot={"t/a@v1"}, warm={"t/b@v1"}),
          worker("w2", slots=2)]
    plan = single.plan(Snapshot.build(versions, ws, stats), NOW)
    assert not plan.of_kind(ActionKind.DEMOTE)
    assert kinds(plan, ActionKind.PROMOTE) == {("w1", "t/b@v1", Reason.HEAT)}


def test_surplus_replicas_and_superseded_versions_go() -> None:
    versions = [meta("t/a@v1", superseded=True), meta("t/a@v2"), meta("t/c@v1")]
    stats = {"t/a@v1": requested(hot_stats(50)), "t/a@v2": requested(hot_stats(5)),
             "t/c@v1": requested(hot_stats(3))}
    ws = [worker("w0", slots=3, hot={"t/a@v1", "t/c@v1"}, warm={"t/a@v2"}),
          worker("w1", slots=3, hot={"t/c@v1"})]
    plan = HEAT.plan(Snapshot.build(versions, ws, stats), NOW)
    assert ("w0", "t/a@v1", Reason.SUPERSEDED) in kinds(plan, ActionKind.DEMOTE)
    assert ("w0", "t/a@v1", Reason.SUPERSEDED) in kinds(plan, ActionKind.EVICT)
    assert ("w0", "t/a@v2", Reason.HEAT) in kinds(plan, ActionKind.PROMOTE)


def test_scheduled_warmup_promotes_an_unrequested_version() -> None:
    snap = Snapshot.build([meta("t/launch@v1", warmup=1.0)], [worker("w0", slots=2)], {})
    plan = HEAT.plan(snap, NOW)
    assert kinds(plan, ActionKind.PROMOTE) == {("w0", "t/launch@v1", Reason.SCHEDULED_WARMUP)}


def test_actions_run_in_a_safe_order() -> None:
    versions = [meta("t/a@v1", size_mb=100), meta("t/b@v1", size_mb=100)]
    stats = {"t/a@v1": requested([NOW - 3 * 3600.0]), "t/b@v1": requested(hot_stats(40))}
    w = worker("w0", slots=1, warm_mb=200, hot={"t/a@v1"}, pinned=set())
    plan = HEAT.plan(Snapshot.build(versions, [w], stats), NOW)
    order = [a.kind for a in plan]
    assert order == sorted(order, key=list(ActionKind).index)
    apply_plan(Snapshot.build(versions, [w], stats), plan)


def test_rejects_an_inconsistent_snapshot() -> None:
    snap = Snapshot.build([meta("t/a@v1")], [worker("w0", hot={"t/ghost@v1"},
                                                    pinned={"t/a@v1"})], {})
    with pytest.raises(SnapshotError) as err:
        HEAT.plan(snap, NOW)
    assert len(err.value.problems) == 2


def test_action_sort_key_and_plan_helpers() -> None:
    a = Action(ActionKind.PIN, "w0", "v", Reason.PROTECTED)
    b = Action(ActionKind.UNPIN, "w1", "v", Reason.UNPROTECTED)
    plan = Plan.of([a, b])
    assert plan.actions == (b, a)
    assert plan.for_worker("w0").actions == (a,)
    assert len(plan) == 2 and list(plan) == [b, a]


def test_background_only_traffic_still_promotes_by_rate() -> None:
    snap = Snapshot.build(
        [meta("t/batch@v1")], [worker("w0", slots=1)],
        {"t/batch@v1": requested(hot_stats(10), RequestClass.BACKGROUND)},
    )
    assert kinds(HEAT.plan(snap, NOW), ActionKind.PROMOTE) == {("w0", "t/batch@v1", Reason.HEAT)}


def test_an_ended_burst_gets_no_replicas_for_its_old_rate() -> None:
    versions = [meta("t/burst@v1"), meta("t/steady@v1")] + [meta(f"t/l{i}@v1") for i in range(3)]
    stats = {
        # 100 req/s for two minutes that stopped a minute ago (6,000 of its own gaps): its
        # decayed count still says ~30 req/s, but the stream has most likely ended
        "t/burst@v1": requested(sorted(NOW - 60.0 - 0.01 * k for k in range(12_000))),
        "t/steady@v1": requested(sorted(NOW - 10.0 * k for k in range(30))),
        **{f"t/l{i}@v1": requested(sorted(NOW - 30.0 * k for k in range(5))) for i in range(3)},
    }
    ws = [worker(f"w{i}", slots=2) for i in range(3)]
    no_liveness = HeatPolicy(replace(PolicyConfig(), score=replace(PolicyConfig().score,
                                                                   liveness_scale=0.0)))

    def promoted(policy: HeatPolicy) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in policy.plan(Snapshot.build(versions, ws, stats), NOW).of_kind(
                ActionKind.PROMOTE):
            out[a.version_id] = out.get(a.version_id, 0) + 1
        return out

    # the raw rate buys the burst a replica on every worker (hottest + rate-based replicas)
    assert promoted(no_liveness).get("t/burst@v1") == 3
    # the discounted rate drives replicas, the hottest set and load like the heat does
    with_liveness = promoted(HEAT)
    assert "t/burst@v1" not in with_liveness
    assert with_liveness["t/steady@v1"] >= 2


def test_a_version_loaded_for_a_request_is_not_demoted_before_its_heat_arrives() -> None:
    """A worker loads a version on the request path, and reports it HOT, before that
    request's heat reaches the planner. Counted as never requested (idle), it was demoted
    and, its heat in, promoted again the next round - the wobble that refused the requests
    meeting the demotion (helper 33's join-prewarm runs, min_hot_replicas 1). Its idle time
    counts from its load; a version idle for longer than demote.idle_minutes since its last
    request and its load is still demoted."""
    policy = HeatPolicy(replace(PolicyConfig(), placement=replace(PlacementConfig(),
                                                                  min_hot_replicas=1)))
    chat, old = "t/chat@v1", "t/old@v1"
    versions = [meta(chat), meta(old), meta("t/other@v1")]
    idle_s = PolicyConfig().demote.idle_minutes * 60.0

    def w0(hot: set[str], loaded: dict[str, float]) -> WorkerState:
        return replace(worker("w0", slots=2, hot=hot), loaded_at=MappingProxyType(loaded))

    # round 1: loaded a second ago on the request path, its heat not in yet
    first = policy.plan(Snapshot.build(versions, [w0({chat}, {chat: NOW - 1.0})], {}), NOW)
    assert not [a for a in first if a.version_id == chat], list(first)
    # round 2: its heat is in: kept where it is, as the placement would have promoted it
    heat_in = {chat: requested([NOW - 1.2])}
    kept = policy.plan(Snapshot.build(versions, [w0({chat}, {chat: NOW - 1.0})], heat_in),
                       NOW + 0.5)
    assert not [a for a in kept if a.version_id == chat], list(kept)
    demoted = policy.plan(Snapshot.build(versions, [w0(set(), {})], heat_in), NOW + 0.5)
    assert kinds(demoted, ActionKind.PROMOTE) == {("w0", chat, Reason.HEAT)}
    # idle counts from the later of the last request and the load
    stale = {old: requested([NOW - 2 * idle_s])}
    reloaded = policy.plan(Snapshot.build(versions, [w0({old}, {old: NOW - 1.0})], stale), NOW)
    assert not [a for a in reloaded if a.version_id == old], list(reloaded)
    for loads, stats in (({chat: NOW - idle_s - 1.0}, {}),
                         ({old: NOW - idle_s - 1.0}, stale)):
        vid = next(iter(loads))
        plan = policy.plan(Snapshot.build(versions, [w0({vid}, loads)], stats), NOW)
        assert kinds(plan, ActionKind.DEMOTE) == {("w0", vid, Reason.IDLE)}
    # without a load time (a snapshot that carries none) as before: never requested is idle
    plan = policy.plan(Snapshot.build(versions, [w0({chat}, {})], {}), NOW)
    assert kinds(plan, ActionKind.DEMOTE) == {("w0", chat, Reason.IDLE)}
