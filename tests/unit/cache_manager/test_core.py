"""Decision core with a scripted policy: merging, projection, rules, guards, retries."""

from __future__ import annotations

from collections.abc import Callable

from loraplane.cache_manager.core import CacheCore, RoundResult
from loraplane.cache_manager.messages import build_command
from loraplane.cache_manager.model import CommandKind, Ref, Tier
from loraplane.cache_manager.rules import RulesConfig, rules_from_mapping
from loraplane.policy.config import PolicyConfig
from loraplane.policy.online import OnlineContext, OnlinePolicy
from loraplane.policy.plan import Action, ActionKind, Plan, Reason
from loraplane.policy.snapshot import Snapshot
from loraplane.v1 import common_pb2, events_pb2
from tests.support import eventgen as ev

T0 = 1_800_000_000.0
A, B, C = ev.ref("a"), ev.ref("b"), ev.ref("c")


class ScriptedPolicy:
    """A policy whose plan is a function of the snapshot; remembers what it saw."""

    name = "scripted"

    def __init__(self, fn: Callable[[Snapshot, float], list[Action]] | None = None) -> None:
        self.fn = fn or (lambda s, n: [])
        self.seen: list[Snapshot] = []

    def plan(self, snapshot: Snapshot, now: float) -> Plan:
        self.seen.append(snapshot)
        return Plan.of(self.fn(snapshot, now))

    def online(self, ctx: OnlineContext) -> OnlinePolicy:
        raise NotImplementedError


def make_core(policy: ScriptedPolicy | None = None, rules: RulesConfig | None = None,
              timeout_s: float = 10.0) -> CacheCore:
    counter = iter(range(1, 1_000_000))
    return CacheCore(
        policy=policy or ScriptedPolicy(), policy_config=PolicyConfig(),
        rules=rules or rules_from_mapping({"demand": {"enabled": False},
                                           "commands": {"timeout_s": 10}}),
        worker_timeout_s=timeout_s, id_factory=lambda: f"cmd-{next(counter)}",
    )


def setup(core: CacheCore, *workers: ev.WorkerSpec, versions: tuple[Ref, ...] = (A, B, C),
          t: float = T0) -> None:
    for i, r in enumerate(versions, start=1):
        core.apply(ev.admitted(r, i, t), t)
    for w in workers:
        core.apply(ev.snapshot(w, 1, t), t)


def kinds(res: RoundResult) -> list[tuple[str, str, str]]:
    return [(i.pending.spec.kind.value, i.pending.spec.worker_id, i.pending.spec.version_id)
            for i in res.issued]


def answer_all(core: CacheCore, res: RoundResult, t: float) -> None:
    for i in res.issued:
        core.apply(ev.answer(build_command(i, "cache-manager/test"), t), t)


def act(kind: ActionKind, w: str, r: Ref, reason: Reason = Reason.HEAT) -> Action:
    return Action(kind, w, r.version_id, reason)


def test_promote_and_pin_become_one_pinned_load() -> None:
    core = make_core(ScriptedPolicy(lambda s, n: [act(ActionKind.PROMOTE, "w1", A),
                                                  act(ActionKind.PIN, "w1", A)]))
    setup(core, ev.WorkerSpec("w1", slots=2))
    res = core.round(T0 + 1)
    assert kinds(res) == [("load_hot", "w1", A.version_id)]
    cmd = build_command(res.issued[0], "cache-manager/test")
    assert cmd.load.pin and cmd.load.target_tier == common_pb2.TIER_HOT
    assert cmd.load.engine_id == 1 and cmd.load.artifact_uri.startswith("s3://")
    assert cmd.worker_id == "w1" and cmd.command_id == "cmd-1"
    assert cmd.deadline.ToSeconds() - cmd.issued_at.ToSeconds() == core.rules.commands.timeout_s


def test_pending_load_is_seen_by_the_policy_as_done() -> None:
    policy = ScriptedPolicy(lambda s, n: [] if any(A.version_id in w.hot for w in s.workers)
                            else [act(ActionKind.PROMOTE, "w1", A)])
    core = make_core(policy)
    setup(core, ev.WorkerSpec("w1"), ev.WorkerSpec("w2"))
    assert kinds(core.round(T0 + 1)) == [("load_hot", "w1", A.version_id)]
    assert kinds(core.round(T0 + 2)) == []
    assert A.version_id in policy.seen[-1].workers[0].hot  # projected, not yet confirmed


def test_timeout_then_retry_with_backoff() -> None:
    core = make_core(ScriptedPolicy(
        lambda s, n: [] if A.version_id in s.workers[0].hot else [act(ActionKind.PROMOTE, "w1", A)]
    ))
    setup(core, ev.WorkerSpec("w1"))
    first = core.round(T0)
    assert len(first.issued) == 1
    core.apply(ev.snapshot(ev.WorkerSpec("w1"), 2, T0 + 5), T0 + 5)
    timed_out = core.round(T0 + 10)
    assert [r.result for r in timed_out.resolutions] == ["timeout"] and timed_out.issued == []
    core.apply(ev.snapshot(ev.WorkerSpec("w1"), 3, T0 + 10.5), T0 + 10.5)
    retry = core.round(T0 + 11)
    assert kinds(retry) == [("load_hot", "w1", A.version_id)]
    assert retry.issued[0].pending.attempt == 2
    # The late answer of the first command changes the placement but resolves nothing.
    late = core.apply(ev.loaded("w1", A, T0 + 12, command_id=first.issued[0].pending.command_id),
                      T0 + 12)
    assert late.resolutions == []
    assert core.tracker.pending_for("w1", A.version_id) is not None


def test_failed_load_backs_off_and_non_retriable_blocks_longer() -> None:
    core = make_core(ScriptedPolicy(lambda s, n: [act(ActionKind.PROMOTE, "w1", A)]))
    setup(core, ev.WorkerSpec("w1"))
    res = core.round(T0)
    cid = res.issued[0].pending.command_id
    core.apply(ev.failed("w1", A, T0 + 1, command_id=cid,
                         code=events_pb2.LOAD_ERROR_CODE_DIGEST_MISMATCH, retriable=False), T0 + 1)
    assert core.tracker.blocked_until("w1", A.version_id) == T0 + 1 + 120
    core.apply(ev.snapshot(ev.WorkerSpec("w1"), 2, T0 + 59), T0 + 59)
    assert core.round(T0 + 60).issued == []
    core.apply(ev.snapshot(ev.WorkerSpec("w1"), 3, T0 + 120), T0 + 120)
    assert len(core.round(T0 + 121).issued) == 1


def test_retired_version_drains_then_is_evicted_and_never_loaded() -> None:
    core = make_core(ScriptedPolicy(lambda s, n: [act(ActionKind.PROMOTE, "w2", A)]))
    setup(core, ev.WorkerSpec("w1", held=[ev.Held(A, in_flight=2)]), ev.WorkerSpec("w2"))
    core.apply(ev.retired(A, T0), T0)
    res = core.round(T0 + 1)
    assert res.issued == []
    assert any("draining" in n for n in res.round.notes)
    core.apply(ev.snapshot(ev.WorkerSpec("w1", held=[ev.Held(A, in_flight=0)]), 2, T0 + 2), T0 + 2)
    res = core.round(T0 + 3)
    assert kinds(res) == [("evict", "w1", A.version_id)]
    assert res.issued[0].decision.reason == "retired"
    assert res.issued[0].decision.policy == "rule:drop"
    cmd = build_command(res.issued[0], "cm")
    assert cmd.evict.to_tier == common_pb2.TIER_COLD


def test_staged_canary_is_warmed_on_a_free_slot() -> None:
    core = make_core()
    setup(core, ev.WorkerSpec("w1", slots=1, held=[ev.Held(B)]), ev.WorkerSpec("w2", slots=1))
    core.apply(ev.canary(A, 0, T0), T0)
    res = core.round(T0 + 1)
    assert kinds(res) == [("load_hot", "w2", A.version_id)]
    assert res.issued[0].decision.reason == "canary_warmup"
    answer_all(core, res, T0 + 2)
    assert core.state.workers["w2"].tier_of(A.version_id) is Tier.HOT
    assert core.round(T0 + 3).issued == []


def test_canary_displaces_the_coolest_unprotected_idle_version() -> None:
    core = make_core()
    w1 = ev.WorkerSpec("w1", slots=2, held=[ev.Held(B), ev.Held(C)])
    setup(core, w1)
    core.apply(ev.heat(C, 50, T0), T0)  # C is hot, B is cold
    core.apply(ev.canary(A, 5, T0), T0)
    res = core.round(T0 + 1)
    assert kinds(res) == [("demote", "w1", B.version_id), ("load_hot", "w1", A.version_id)]
    assert res.issued[0].decision.reason == "displaced"


def test_loads_of_protected_versions_tell_the_worker_never_to_evict_them() -> None:
    plat = ev.ref("plat")
    core = make_core(ScriptedPolicy(lambda s, n: [act(ActionKind.PROMOTE, "w2", B),
                                                  act(ActionKind.PROMOTE, "w2", plat)]))
    setup(core, ev.WorkerSpec("w1", slots=2), ev.WorkerSpec("w2", slots=3))
    core.apply(ev.admitted(plat, 9, T0, priority=common_pb2.PRIORITY_PLATINUM), T0)
    core.apply(ev.canary(A, 5, T0), T0)  # active canary: protected
    res = core.round(T0 + 1)
    by_version = {i.pending.spec.version_id: build_command(i, "cm") for i in res.issued}
    assert by_version[A.version_id].load.never_evict
    assert by_version[plat.version_id].load.never_evict
    assert by_version[A.version_id].load.target_tier == common_pb2.TIER_HOT
    assert not by_version[B.version_id].load.never_evict  # plain version: the worker may demote
    assert by_version[B.version_id].WhichOneof("command") == "load"


def test_canary_never_displaces_pinned_or_busy_versions() -> None:
    core = make_core()
    setup(core, ev.WorkerSpec("w1", slots=2, held=[ev.Held(B, pinned=True),
                                                    ev.Held(C, in_flight=1)]))
    core.apply(ev.canary(A, 5, T0), T0)
    res = core.round(T0 + 1)
    assert res.issued == []
    assert any("short" in n for n in res.round.notes)


def test_policy_may_not_demote_what_a_rule_requires() -> None:
    core = make_core(ScriptedPolicy(lambda s, n: [act(ActionKind.DEMOTE, "w1", A, Reason.IDLE)]))
    setup(core, ev.WorkerSpec("w1", held=[ev.Held(A)]))
    core.apply(ev.canary(A, 0, T0), T0)
    assert core.round(T0 + 1).issued == []


def test_guards_capacity_pins_rank_base_model_artifact() -> None:
    big = ev.ref("big")
    other_bm = ev.ref("other", bm="other/model")
    unknown = ev.ref("ghost")
    core = make_core(ScriptedPolicy(lambda s, n: [
        act(ActionKind.PROMOTE, "w1", C),                       # full: 2 slots held
        act(ActionKind.PROMOTE, "w2", A), act(ActionKind.PIN, "w2", A),  # 2nd pin of 2 slots
        act(ActionKind.PROMOTE, "w2", big),                      # rank 32 > 16
        act(ActionKind.PROMOTE, "w2", other_bm),                 # not served
        act(ActionKind.PROMOTE, "w3", unknown),                  # no artifact known
    ]))
    setup(core, ev.WorkerSpec("w1", slots=2, held=[ev.Held(A), ev.Held(B)]),
          ev.WorkerSpec("w2", slots=2, held=[ev.Held(B, pinned=True)]),
          ev.WorkerSpec("w3"))
    core.apply(ev.admitted(big, 10, T0, rank=32), T0)
    core.apply(ev.admitted(other_bm, 11, T0), T0)
    core.apply(ev.heat(unknown, 1, T0), T0)
    res = core.round(T0 + 1)
    assert kinds(res) == [("load_hot", "w2", A.version_id)]
    assert not res.issued[0].pending.spec.pin  # pinning it would leave no unpinned slot
    notes = " | ".join(res.round.notes)
    for why in ("no free", "rank 32 > max_lora_rank 16", "does not serve", "may not be loaded"):
        assert why in notes, notes


def test_pins_count_gpu_slots_on_a_worker_planning_hot_beyond_them() -> None:
    """A worker at ``worker_hot_level`` ``registered`` reports 4 HOT (registered) slots and 2
    GPU slots: a second pin would pin every GPU slot (vLLM dies on the next adapter), so it
    is dropped; the load beyond the GPU slots is not (4 registered is its HOT capacity)."""
    core = make_core(ScriptedPolicy(lambda s, n: [
        act(ActionKind.PROMOTE, "w1", C), act(ActionKind.PIN, "w1", A)]))
    setup(core, ev.WorkerSpec("w1", slots=4, gpu_slots=2,
                              held=[ev.Held(A), ev.Held(B, pinned=True)]))
    res = core.round(T0 + 1)
    assert kinds(res) == [("load_hot", "w1", C.version_id)]
    assert "would leave no unpinned slot" in " | ".join(res.round.notes)
    # the same worker planning to its GPU slots only (no gpu_slots reported): 2 of 4 pinned
    core = make_core(ScriptedPolicy(lambda s, n: [act(ActionKind.PIN, "w1", A)]))
    setup(core, ev.WorkerSpec("w1", slots=4, held=[ev.Held(A), ev.Held(B, pinned=True)]))
    assert kinds(core.round(T0 + 1)) == [("pin", "w1", A.version_id)]


def test_worker_gone_its_versions_are_placed_elsewhere() -> None:
    core = make_core(rules=RulesConfig(), timeout_s=5)
    setup(core, ev.WorkerSpec("w1", held=[ev.Held(A)]), ev.WorkerSpec("w2"))
    core.apply(ev.heat(A, 10, T0), T0)
    core.apply(ev.snapshot(ev.WorkerSpec("w2"), 2, T0 + 4), T0 + 4)
    res = core.round(T0 + 6)
    assert res.gone_workers == ["w1"]
    assert kinds(res) == [("load_hot", "w2", A.version_id)]
    assert res.issued[0].decision.reason == "demand"


def test_unsynced_worker_gets_no_commands() -> None:
    core = make_core(ScriptedPolicy(lambda s, n: [act(ActionKind.PROMOTE, "w9", A)]))
    setup(core)
    core.apply(ev.loaded("w9", B, T0), T0)  # a report, but no snapshot yet
    res = core.round(T0 + 1)
    assert res.issued == [] and "w9" not in {w.worker_id for w in res.round.snapshot.workers}


def test_worker_restart_voids_pending_commands_and_replans() -> None:
    core = make_core(ScriptedPolicy(
        lambda s, n: [] if A.version_id in s.workers[0].hot else [act(ActionKind.PROMOTE, "w1", A)]
    ))
    setup(core, ev.WorkerSpec("w1"))
    assert len(core.round(T0).issued) == 1
    out = core.apply(ev.snapshot(ev.WorkerSpec("w1", started_at=5000.0), 0, T0 + 1), T0 + 1)
    assert [r.result for r in out.resolutions] == ["void"]
    res = core.round(T0 + 2)
    assert kinds(res) == [("load_hot", "w1", A.version_id)]


def test_removal_cap_per_round() -> None:
    versions = tuple(ev.ref(f"v{i}") for i in range(40))
    core = make_core(ScriptedPolicy(lambda s, n: [act(ActionKind.EVICT, "w1", r, Reason.CAPACITY)
                                                  for r in versions]))
    setup(core, ev.WorkerSpec("w1", held=[ev.Held(r, tier=common_pb2.TIER_WARM)
                                          for r in versions]), versions=versions)
    res = core.round(T0 + 1)
    assert len(res.issued) == 32 and all(k == "evict" for k, _, _ in kinds(res))


def test_not_present_on_evict_counts_as_done() -> None:
    core = make_core(ScriptedPolicy(lambda s, n: [act(ActionKind.EVICT, "w1", A, Reason.IDLE)]))
    setup(core, ev.WorkerSpec("w1", held=[ev.Held(A, tier=common_pb2.TIER_WARM)]))
    res = core.round(T0 + 1)
    cid = res.issued[0].pending.command_id
    out = core.apply(ev.failed("w1", A, T0 + 2, command_id=cid,
                               code=events_pb2.LOAD_ERROR_CODE_NOT_PRESENT, retriable=False),
                     T0 + 2)
    assert out.resolutions[0].ok
    assert core.state.workers["w1"].tier_of(A.version_id) is Tier.COLD
    assert core.tracker.blocked_until("w1", A.version_id) == 0.0


def test_publish_failure_backs_off() -> None:
    core = make_core(ScriptedPolicy(lambda s, n: [act(ActionKind.PROMOTE, "w1", A)]))
    setup(core, ev.WorkerSpec("w1"))
    res = core.round(T0)
    core.publish_failed(res.issued[0].pending.command_id, T0)
    assert core.round(T0 + 0.5).issued == []
    assert len(core.round(T0 + 1.0).issued) == 1


def test_rollback_target_made_hot_where_the_old_version_was() -> None:
    v1, v2 = ev.ref("s", "v1"), ev.ref("s", "v2")
    core = make_core()
    setup(core, ev.WorkerSpec("w1", held=[ev.Held(v2)]), ev.WorkerSpec("w2", held=[ev.Held(v2)]),
          ev.WorkerSpec("w3"), versions=(v1, v2))
    core.apply(ev.promoted(v2, T0, previous="v1"), T0)
    core.apply(ev.rolled_back(v1, "v2", T0 + 1), T0 + 1)
    res = core.round(T0 + 2)
    loads = [k for k in kinds(res) if k[0] == "load_hot"]
    assert len(loads) == 2 and all(v == v1.version_id for _, _, v in loads)
    assert {d.decision.reason for d in res.issued} == {"rollback"}


def test_rollback_target_is_kept_warm_beside_the_stable_version() -> None:
    v1, v2 = ev.ref("s", "v1"), ev.ref("s", "v2")
    core = make_core()
    setup(core, ev.WorkerSpec("w1", held=[ev.Held(v2)]), ev.WorkerSpec("w2"), versions=(v1, v2))
    core.apply(ev.promoted(v1, T0), T0)
    core.apply(ev.promoted(v2, T0, previous="v1"), T0)
    res = core.round(T0 + 1)
    assert kinds(res) == [("load_warm", "w1", v1.version_id)]
    assert res.issued[0].decision.reason == "rollback_target"


def test_prewarm_goes_to_the_requested_worker() -> None:
    core = make_core()
    setup(core, ev.WorkerSpec("w1"), ev.WorkerSpec("w2"))
    core.apply(ev.prewarm(A, T0, target="w2"), T0)
    assert kinds(core.round(T0 + 1)) == [("load_hot", "w2", A.version_id)]


def test_decisions_are_logged_with_tiers_and_filters() -> None:
    core = make_core(ScriptedPolicy(lambda s, n: [act(ActionKind.PROMOTE, "w1", A),
                                                  act(ActionKind.DEMOTE, "w2", B, Reason.IDLE)]))
    setup(core, ev.WorkerSpec("w1"), ev.WorkerSpec("w2", held=[ev.Held(B)]))
    core.round(T0 + 1)
    entries = core.decisions.recent(10)
    assert [(e.kind, e.from_tier, e.to_tier) for e in entries] == [
        (CommandKind.LOAD_HOT, Tier.COLD, Tier.HOT), (CommandKind.DEMOTE, Tier.HOT, Tier.WARM)]
    assert [e.reason for e in core.decisions.recent(10, worker_id="w2")] == ["idle"]
    assert core.decisions.recent(10, adapter_name="b")[0].policy == "scripted"


def test_policy_warmup_load_of_a_canary_is_explained_as_canary_warmup() -> None:
    core = make_core(ScriptedPolicy(lambda s, n: [act(ActionKind.PROMOTE, "w1", A,
                                                      Reason.SCHEDULED_WARMUP)]))
    setup(core, ev.WorkerSpec("w1"))
    core.apply(ev.canary(A, 0, T0), T0)
    res = core.round(T0 + 1)
    assert kinds(res) == [("load_hot", "w1", A.version_id)]
    d = res.issued[0].decision
    assert d.reason == "canary_warmup" and "scheduled_warmup" in d.detail and d.policy == "scripted"


def test_scheduled_window_requires_hot_replicas_only_while_open() -> None:
    rules = rules_from_mapping({
        "demand": {"enabled": False},
        "schedules": [{"name": "office", "tenant": "acme", "adapter": "a", "start": "08:00",
                       "end": "10:00", "timezone": "UTC", "hot_replicas": 2,
                       "lead_minutes": 0}],
    })
    core = make_core(rules=rules)
    day = T0 - T0 % 86400  # midnight UTC
    before, during = day + 7 * 3600, day + 8 * 3600 + 60
    setup(core, ev.WorkerSpec("w1"), ev.WorkerSpec("w2"), t=before)
    core.apply(ev.promoted(A, before), before)  # stable: what a schedule without version warms
    assert core.round(before).issued == []
    for i, w in enumerate(("w1", "w2")):
        core.apply(ev.snapshot(ev.WorkerSpec(w), 2 + i, during), during)
    res = core.round(during)
    assert sorted(kinds(res)) == [("load_hot", "w1", A.version_id),
                                  ("load_hot", "w2", A.version_id)]
    assert {i.decision.reason for i in res.issued} == {"scheduled_warmup"}


def test_canary_failing_its_golden_set_is_demoted_and_placed_elsewhere() -> None:
    core = make_core()
    setup(core, ev.WorkerSpec("w1"), ev.WorkerSpec("w2"))
    core.apply(ev.canary(A, 0, T0), T0)
    first = core.round(T0 + 1)
    [load] = first.issued
    bad = load.pending.spec.worker_id
    answer_all(core, first, T0 + 1)
    core.shadow_failed(bad, A.version_id, T0 + 2, "2 of 2 failed")
    res = core.round(T0 + 3)
    assert ("demote", bad, A.version_id) in kinds(res)
    assert res.issued[0].decision.reason == "golden_set_failed"
    answer_all(core, res, T0 + 3)
    other = "w2" if bad == "w1" else "w1"
    res = core.round(T0 + 4)
    assert kinds(res) == [("load_hot", other, A.version_id)]
    answer_all(core, res, T0 + 4)
    assert all(s.kind.value != "load_hot" or s.worker_id != bad
               for s in (i.pending.spec for i in core.round(T0 + 5).issued))


def test_an_aborted_canary_is_demoted_wherever_hot_and_not_loaded_again() -> None:
    core = make_core()
    setup(core, ev.WorkerSpec("w1"), ev.WorkerSpec("w2"))
    core.apply(ev.canary(A, 10, T0), T0)
    first = core.round(T0 + 1)
    [load] = first.issued
    hot_on = load.pending.spec.worker_id
    answer_all(core, first, T0 + 1)
    core.apply(ev.canary(A, 0, T0 + 2), T0 + 2)  # the abort's CanaryChanged (share 0)
    core.canary_aborted(A.version_id, T0 + 2)
    res = core.round(T0 + 3)
    assert kinds(res) == [("demote", hot_on, A.version_id)]
    assert res.issued[0].decision.reason == "canary_aborted"
    assert res.issued[0].decision.policy == "rule:canary_analysis"
    answer_all(core, res, T0 + 3)
    for t in (T0 + 4, T0 + 5):  # still a staged canary pointer: no worker may reload it
        assert all(s.version_id != A.version_id or s.kind.value != "load_hot"
                   for s in (i.pending.spec for i in core.round(t).issued))
