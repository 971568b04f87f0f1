"""The decision core with the real heat policy (config/policy.yaml), demand rule off."""

from __future__ import annotations

from pathlib import Path

from loraplane.cache_manager.core import CacheCore, RoundResult
from loraplane.cache_manager.messages import build_command
from loraplane.cache_manager.model import CommandKind, Tier
from loraplane.cache_manager.rules import rules_from_mapping
from loraplane.policy.config import load_config
from loraplane.policy.factory import make_policy
from loraplane.v1 import common_pb2
from tests.support import eventgen as ev

REPO = Path(__file__).resolve().parents[3]
T0 = 1_800_000_000.0
MB = 1_000_000


def heat_core() -> CacheCore:
    cfg = load_config(REPO / "config" / "policy.yaml")
    return CacheCore(policy=make_policy("heat", cfg), policy_config=cfg,
                     rules=rules_from_mapping({"demand": {"enabled": False}}),
                     worker_timeout_s=3600)


def settle(core: CacheCore, t: float, rounds: int = 6) -> list[RoundResult]:
    out = []
    for i in range(rounds):
        res = core.round(t + i)
        out.append(res)
        for issued in res.issued:
            core.apply(ev.answer(build_command(issued, "test"), t + i), t + i)
    return out


def test_burst_on_a_cold_version_is_promoted_by_the_policy() -> None:
    core = heat_core()
    a = ev.ref("support")
    core.apply(ev.admitted(a, 1, T0), T0)
    core.apply(ev.snapshot(ev.WorkerSpec("w1", slots=4), 1, T0), T0)
    assert core.round(T0).issued == []
    core.apply(ev.heat(a, 30, T0 + 1), T0 + 1)
    res = core.round(T0 + 1)
    loads = [i for i in res.issued if i.pending.spec.kind is CommandKind.LOAD_HOT]
    assert [i.pending.spec.version_id for i in loads] == [a.version_id]
    assert loads[0].decision.policy == "heat" and loads[0].decision.heat > 0


def test_host_pressure_evicts_in_policy_order_and_keeps_platinum_and_canary() -> None:
    core = heat_core()
    plat, canary = ev.ref("plat"), ev.ref("canary")
    cold, warm_ish, hot = ev.ref("cold"), ev.ref("warmish"), ev.ref("hot")
    core.apply(ev.admitted(plat, 1, T0, size=30 * MB, priority=common_pb2.PRIORITY_PLATINUM), T0)
    core.apply(ev.admitted(canary, 2, T0, size=30 * MB), T0)
    core.apply(ev.canary(canary, 10, T0), T0)
    for i, r in enumerate((cold, warm_ish, hot), start=3):
        core.apply(ev.admitted(r, i, T0, size=30 * MB, priority=common_pb2.PRIORITY_BRONZE), T0)
    # 4 versions resident in 120 MB of host bytes: full. Slots are plenty.
    w = ev.WorkerSpec("w1", slots=8, warm_bytes=120 * MB, held=[
        ev.Held(r, tier=common_pb2.TIER_WARM, size=30 * MB)
        for r in (plat, canary, cold, warm_ish)])
    core.apply(ev.snapshot(w, 1, T0), T0)
    core.apply(ev.heat(warm_ish, 5, T0 - 600), T0)
    core.apply(ev.heat(cold, 1, T0 - 3000), T0)
    core.apply(ev.heat(hot, 80, T0), T0)  # needs room
    results = settle(core, T0 + 1)
    issued = [i.pending.spec for r in results for i in r.issued]
    evicted = [s.version_id for s in issued if s.kind is CommandKind.EVICT]
    assert evicted and evicted[0] == cold.version_id, issued
    worker = core.state.workers["w1"]
    for protected in (plat, canary):
        assert worker.tier_of(protected.version_id) is not Tier.COLD
        assert protected.version_id not in evicted
    assert worker.tier_of(hot.version_id) is Tier.HOT
    used = sum(p.size_bytes for p in worker.placements.values())
    assert used <= 120 * MB


def test_platinum_and_hottest_versions_get_min_hot_replicas() -> None:
    core = heat_core()
    plat, hot, lukewarm = ev.ref("plat"), ev.ref("hot"), ev.ref("luke")
    core.apply(ev.admitted(plat, 1, T0, priority=common_pb2.PRIORITY_PLATINUM), T0)
    core.apply(ev.admitted(hot, 2, T0), T0)
    core.apply(ev.admitted(lukewarm, 3, T0), T0)
    for w in ("w1", "w2", "w3"):
        core.apply(ev.snapshot(ev.WorkerSpec(w, slots=4), 1, T0), T0)
    core.apply(ev.heat(plat, 2, T0), T0)
    core.apply(ev.heat(hot, 200, T0), T0)
    core.apply(ev.heat(lukewarm, 1, T0 - 500), T0)
    settle(core, T0 + 1)
    replicas = {r.adapter_name: sum(w.tier_of(r.version_id) is Tier.HOT
                                    for w in core.state.workers.values())
                for r in (plat, hot, lukewarm)}
    assert replicas["plat"] >= 2 and replicas["hot"] >= 2, replicas  # min_hot_replicas: 2


def test_a_protected_versions_last_hot_replica_is_kept_until_another_is_hot() -> None:
    """Make before break: the canary seen moved (demote here, load there) in make stress
    was COLD everywhere when the load failed for lack of a slot."""
    from loraplane.cache_manager.model import CommandSpec

    core = heat_core()
    canary, other = ev.ref("canary"), ev.ref("other")
    core.apply(ev.admitted(canary, 1, T0), T0)
    core.apply(ev.canary(canary, 10, T0), T0)
    core.apply(ev.admitted(other, 2, T0), T0)
    core.apply(ev.snapshot(ev.WorkerSpec("w1", slots=4, held=[ev.Held(canary)]), 1, T0), T0)
    core.apply(ev.snapshot(ev.WorkerSpec("w2", slots=4, held=[ev.Held(other)]), 1, T0), T0)
    demote = CommandSpec(CommandKind.DEMOTE, "w1", canary.version_id, "displaced")
    res = core.planner.plan(core.state, core.tracker, T0 + 1, extra=[demote])
    assert not [s for s in res.commands
                if s.kind is CommandKind.DEMOTE and s.version_id == canary.version_id]
    assert any("last confirmed HOT replica of a protected version" in n for n in res.notes)
    # once a second replica is HOT, the first may go
    core.apply(ev.snapshot(ev.WorkerSpec("w2", slots=4, held=[ev.Held(other), ev.Held(canary)]),
                           2, T0 + 2), T0 + 2)
    res = core.planner.plan(core.state, core.tracker, T0 + 3, extra=[demote])
    assert [s.worker_id for s in res.commands
            if s.kind is CommandKind.DEMOTE and s.version_id == canary.version_id] == ["w1"]
    # an unprotected version may lose its only replica (it is the policy's choice)
    plain = CommandSpec(CommandKind.DEMOTE, "w2", other.version_id, "displaced")
    res = core.planner.plan(core.state, core.tracker, T0 + 4, extra=[plain])
    assert other.version_id in [s.version_id for s in res.commands
                                if s.kind is CommandKind.DEMOTE]


def _three_versions(core: CacheCore, requests: tuple[int, int, int]) -> float:
    """a and b HOT in w1's two slots, c WARM; requests of a, then b (1,000 s later), then c."""
    a, b, c = ev.ref("a"), ev.ref("b"), ev.ref("c")
    for i, r in enumerate((a, b, c), start=1):
        core.apply(ev.admitted(r, i, T0), T0)
    core.apply(ev.snapshot(ev.WorkerSpec("w1", slots=2, held=[
        ev.Held(a), ev.Held(b), ev.Held(c, tier=common_pb2.TIER_WARM)]), 1, T0), T0)
    t = T0
    for r, n, dt in zip((a, b, c), requests, (0.0, 1000.0, 10.0), strict=True):
        t += dt
        core.apply(ev.heat(r, n, t), t)
    return t + 1


def _demoted(core: CacheCore, now: float) -> list[str]:
    rnd = core.planner.plan(core.state, core.tracker, now)
    return [s.version_id for s in rnd.commands if s.kind is CommandKind.DEMOTE]


def test_the_heat_plan_ranks_by_the_adaptive_experts_the_simulator_measures() -> None:
    """a: 40 requests long ago, b: 3, c: 10 now (needs a slot). On the request clock a is the
    busiest stream (the adaptive heat expert keeps it, b goes); the plain score in seconds
    decays a for 1,000 s and would demote it."""
    core = heat_core()
    now = _three_versions(core, (40, 3, 10))
    rnd = core.planner.plan(core.state, core.tracker, now)
    # the ranking learnt its universe in the round and replayed the 53 requests seen before
    ranking = core.state.ranking
    assert ranking is not None and ranking.ready and ranking.seen == 53
    ranks = rnd.snapshot.ranks
    assert ranks is not None and ranks.hot_experts == {"w1/loraplane/tiny-llama": "heat"}
    members = ("acme/a@v1", "acme/b@v1")
    lowest = min(members, key=lambda v: (ranks.hot_key(v), v))
    assert lowest == "acme/b@v1"
    assert [(s.kind, s.version_id) for s in rnd.commands] == [
        (CommandKind.DEMOTE, lowest), (CommandKind.LOAD_HOT, "acme/c@v1")]
    core.state.ranking = None  # the plain score on the same state: a different victim
    assert _demoted(core, now) == ["acme/a@v1"]


def test_a_new_leader_ranks_by_the_stored_score_until_the_experts_have_seen_enough() -> None:
    """The experts live in memory: a takeover starts them empty (the heat events before the
    committed offsets are not replayed); the stored statistics rank until one HOT time
    constant of requests (25 per slot) has been seen."""
    old = heat_core()
    now = _three_versions(old, (40, 3, 10))
    assert _demoted(old, now) == ["acme/b@v1"]
    new = heat_core()
    for vid, st in old.state.stats.items():  # what store.load_stats gives the new leader
        new.state.stats[vid] = st
    new.state.versions = dict(old.state.versions)
    new.state.workers = old.state.workers
    assert _demoted(new, now) == ["acme/a@v1"]
    assert new.state.ranking is not None and not new.state.ranking.ready
    assert new.planner.plan(new.state, new.tracker, now).snapshot.ranks is None


def test_a_canary_that_failed_its_golden_set_loses_its_protection_at_a_share_above_0() -> None:
    """The shadow check's demotion of a failing canary's last HOT replica goes through while
    its share is still above 0 % (before the analysis' abort reaches the pointers)."""
    core = heat_core()
    canary = ev.ref("canary")
    core.apply(ev.admitted(canary, 1, T0), T0)
    core.apply(ev.canary(canary, 50, T0), T0)
    core.apply(ev.snapshot(ev.WorkerSpec("w1", slots=4, held=[ev.Held(canary)]), 1, T0), T0)
    assert core.state.is_canary(core.state.versions[canary.version_id])
    core.shadow_failed("w1", canary.version_id, T0 + 1, "answer diverges")
    res = core.round(T0 + 1)
    demoted = [i.pending.spec for i in res.issued if i.pending.spec.kind is CommandKind.DEMOTE]
    assert [(s.worker_id, s.version_id, s.reason) for s in demoted] == [
        ("w1", canary.version_id, "golden_set_failed")]
    assert not any("last confirmed HOT replica" in n for n in res.round.notes), res.round.notes
    # and it is not loaded back there by the canary rules while it is blocked
    for issued in res.issued:
        core.apply(ev.answer(build_command(issued, "test"), T0 + 1), T0 + 1)
    later = [i.pending.spec for r in settle(core, T0 + 2) for i in r.issued]
    assert not [s for s in later if s.kind in (CommandKind.LOAD_HOT, CommandKind.LOAD_WARM)
                and s.worker_id == "w1" and s.version_id == canary.version_id], later


def test_an_aborted_canarys_demotion_dropped_for_a_request_in_flight_is_asked_again() -> None:
    """The abort's demotion is not one-shot: while a request is still in flight in the last
    report the guard drops it; the next round (the request done) asks again."""
    core = heat_core()
    canary = ev.ref("canary")
    core.apply(ev.admitted(canary, 1, T0), T0)
    core.apply(ev.snapshot(ev.WorkerSpec("w1", slots=4, held=[ev.Held(canary, in_flight=1)]),
                           1, T0), T0)
    core.canary_aborted(canary.version_id, T0 + 1)
    res = core.round(T0 + 1)
    assert not [i for i in res.issued if i.pending.spec.kind is CommandKind.DEMOTE]
    assert any("request(s) in flight" in n for n in res.round.notes), res.round.notes
    core.apply(ev.snapshot(ev.WorkerSpec("w1", slots=4, held=[ev.Held(canary)]), 2, T0 + 2),
               T0 + 2)
    res = core.round(T0 + 2)
    assert [(i.pending.spec.worker_id, i.pending.spec.reason) for i in res.issued
            if i.pending.spec.kind is CommandKind.DEMOTE] == [("w1", "canary_aborted")]
    for issued in res.issued:
        core.apply(ev.answer(build_command(issued, "test"), T0 + 2), T0 + 2)
    assert core.state.workers["w1"].tier_of(canary.version_id) is not Tier.HOT
    # gone: not asked again
    assert not [i for i in core.round(T0 + 3).issued
                if i.pending.spec.kind is CommandKind.DEMOTE]


def test_a_hot_rollback_target_the_plan_displaces_goes_warm_and_the_new_version_loads() -> None:
    """The rollback rule keeps a rollback target *resident* (WARM where its stable version is
    HOT); it does not require it HOT. A HOT rollback target the heat plan displaces is demoted
    to WARM in the same round the plan loads the hotter version into its slot. (It used to
    veto that demotion while the load went ahead and was dropped for want of a slot, round
    after round: a version requested twice a second stayed COLD for minutes —
    ``test_canary_analysis.py`` (e), faq, 4 slots, the rollback target code@v1 the coolest.)"""
    core = heat_core()
    code1, code2 = ev.ref("code", "v1"), ev.ref("code", "v2")
    alpha, beta, new = ev.ref("alpha"), ev.ref("beta"), ev.ref("new")
    for i, r in enumerate((code1, code2, alpha, beta, new), start=1):
        core.apply(ev.admitted(r, i, T0), T0)
    core.apply(ev.promoted(code1, T0), T0)
    core.apply(ev.promoted(code2, T0, previous="v1"), T0)  # code@v1: the rollback target
    assert core.state.pointers["acme/code"].rollback_target == "v1"
    core.apply(ev.heat(code1, 1, T0 - 1000), T0 - 1000)  # long idle: the coolest
    for k in range(10):  # alpha and beta: requests every 10 s until T0
        t = T0 - 100 + 10 * k
        core.apply(ev.heat(alpha, 1, t), t)
        core.apply(ev.heat(beta, 1, t), t)
    core.apply(ev.snapshot(ev.WorkerSpec("w1", slots=3, held=[
        ev.Held(code1), ev.Held(alpha), ev.Held(beta)]), 1, T0 + 1), T0 + 1)
    now = T0 + 2
    core.apply(ev.heat(new, 4, now), now)
    res = core.round(now)
    assert [(i.pending.spec.kind, i.pending.spec.version_id) for i in res.issued] == [
        (CommandKind.DEMOTE, code1.version_id), (CommandKind.LOAD_HOT, new.version_id)]
    assert not any(n.startswith("dropped") for n in res.round.notes), res.round.notes
    # still resident: the rule never evicts it while code@v2 is the stable version
    for issued in res.issued:
        core.apply(ev.answer(build_command(issued, "test"), now), now)
    assert core.state.workers["w1"].tier_of(code1.version_id) is Tier.WARM
    later = core.round(now + 1)
    assert not any(i.pending.spec.kind is CommandKind.EVICT for i in later.issued)
