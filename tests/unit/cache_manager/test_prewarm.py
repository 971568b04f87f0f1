"""Canary prewarm schedules: WARM on every target worker before the first share (issue 19)."""

from __future__ import annotations

import pytest

from loraplane.cache_manager import prewarm
from loraplane.cache_manager.canary_analysis import (
    Action,
    AnalysisRules,
    CanarySnapshot,
    Reason,
    VersionFigures,
    decide,
)
from loraplane.cache_manager.canary_runner import CanaryRunner
from loraplane.cache_manager.canary_window import CanaryWindow
from loraplane.cache_manager.core import CacheCore
from loraplane.cache_manager.messages import build_command
from loraplane.cache_manager.model import Tier
from loraplane.cache_manager.rules import CanaryPrewarm, RulesConfigError, rules_from_mapping
from loraplane.cache_manager.state import State
from loraplane.v1 import common_pb2
from tests.support import eventgen as ev
from tests.unit.cache_manager.test_canary_runner import FakeRegistry, MemStore
from tests.unit.cache_manager.test_core import T0, kinds, make_core, setup

V1, V2 = ev.ref("code", "v1"), ev.ref("code", "v2")
OTHER = ev.ref("other")
SCHEDULE = {
    "canary": {"warm_replicas": 1, "prewarm": {"start_percent": 10}},
    "demand": {"enabled": False},
    "commands": {"timeout_s": 10},
}


def test_rules_schedule_per_tenant_and_adapter_and_bad_keys_refused() -> None:
    r = rules_from_mapping(
        {
            "canary": {
                "prewarm": {"start_percent": 5},
                "prewarm_overrides": {
                    "acme": {"start_percent": 10, "workers": 2},
                    "acme/code": {"start_percent": 0},
                },
            }
        }
    )
    assert r.canary.prewarm_for("globex", "x") == CanaryPrewarm(start_percent=5)
    assert r.canary.prewarm_for("acme", "chat") == CanaryPrewarm(start_percent=10, workers=2)
    assert r.canary.prewarm_for("acme", "code").start_percent == 0
    with pytest.raises(RulesConfigError, match="start_percent"):
        rules_from_mapping({"canary": {"prewarm": {"start_percent": 101}}})
    with pytest.raises(RulesConfigError, match="'a/b/c' is not 'tenant' or 'tenant/adapter'"):
        rules_from_mapping({"canary": {"prewarm_overrides": {"a/b/c": {}}}})


def _core_with_stable_on_w2() -> tuple[CacheCore, State]:
    core = make_core(rules=rules_from_mapping(SCHEDULE))
    setup(
        core,
        ev.WorkerSpec("w1"),
        ev.WorkerSpec("w2", held=[ev.Held(V1)]),
        ev.WorkerSpec("w3"),
        versions=(V1, V2, OTHER),
    )
    core.apply(ev.promoted(V1, T0), T0)
    core.apply(ev.canary(V2, 0, T0), T0)
    return core, core.state


def test_targets_put_the_workers_holding_stable_first_then_by_id() -> None:
    _, state = _core_with_stable_on_w2()
    rec = state.versions[V2.version_id]
    assert prewarm.targets(state, rec, CanaryPrewarm(start_percent=10)) == ["w2", "w1", "w3"]
    assert prewarm.targets(state, rec, CanaryPrewarm(start_percent=10, workers=2)) == ["w2", "w1"]
    assert prewarm.targets(state, rec, CanaryPrewarm()) == []  # no schedule


def test_a_staged_canary_is_prefetched_warm_to_every_target_and_reported_ready() -> None:
    core, state = _core_with_stable_on_w2()
    rec = state.versions[V2.version_id]
    schedule = core.rules.canary.prewarm_for("acme", "code")
    res = core.round(T0 + 1)
    # HOT on one worker (warm_replicas), WARM on the two others
    assert sorted(kinds(res)) == [
        ("load_hot", "w1", V2.version_id),
        ("load_warm", "w2", V2.version_id),
        ("load_warm", "w3", V2.version_id),
    ]
    warm = [i for i in res.issued if i.pending.spec.kind.value == "load_warm"]
    assert {i.decision.reason for i in warm} == {"canary_prewarm"}
    # commands sent but not answered: projected, not ready
    assert prewarm.status(state, rec, schedule).ready == ()
    for i in res.issued[:2]:
        core.apply(ev.answer(build_command(i, "cm/test"), T0 + 2), T0 + 2)
    st = prewarm.status(state, rec, schedule)
    assert len(st.ready) == 2 and not st.done
    for i in res.issued[2:]:
        core.apply(ev.answer(build_command(i, "cm/test"), T0 + 3), T0 + 3)
    st = prewarm.status(state, rec, schedule)
    assert st.done and st.targets == ("w2", "w1", "w3")
    assert state.workers["w3"].tier_of(V2.version_id) is Tier.WARM
    assert core.round(T0 + 4).issued == []  # nothing more to do


def test_no_prefetch_without_host_bytes_and_a_note_says_so() -> None:
    core = make_core(rules=rules_from_mapping(SCHEDULE))
    setup(
        core,
        ev.WorkerSpec("w1"),
        ev.WorkerSpec("w2", warm_bytes=1_000_000, held=[ev.Held(OTHER, tier=common_pb2.TIER_WARM)]),
        versions=(V1, V2, OTHER),
    )
    core.apply(ev.canary(V2, 0, T0), T0)
    res = core.round(T0 + 1)
    assert kinds(res) == [("load_hot", "w1", V2.version_id)]
    assert any("canary prewarm on w2 short of host bytes" in n for n in res.round.notes)


def _snap(
    percent: int,
    targets: tuple[str, ...],
    ready: tuple[str, ...],
    *,
    paused: bool = False,
    golden: bool = False,
    start: int = 10,
) -> CanarySnapshot:
    return CanarySnapshot(
        "acme/code",
        "v2",
        "v1",
        percent,
        T0,
        VersionFigures(),
        VersionFigures(),
        paused,
        golden,
        start,
        targets,
        ready,
    )


@pytest.mark.parametrize(
    ("snap", "action", "reason", "to"),
    [
        (_snap(0, ("w1", "w2"), ("w1",)), Action.HOLD, Reason.PREWARMING, 0),
        (_snap(0, (), ()), Action.HOLD, Reason.PREWARMING, 0),
        (_snap(0, ("w1", "w2"), ("w1", "w2")), Action.ADVANCE, Reason.PREWARMED, 10),
        (_snap(0, ("w1",), ("w1",), paused=True), Action.HOLD, Reason.PAUSED, 0),
        (_snap(0, ("w1",), ("w1",), golden=True), Action.HOLD, Reason.GOLDEN_PENDING, 0),
        (_snap(0, ("w1",), ("w1",), start=0), Action.HOLD, Reason.NOT_RUNNING, 0),
    ],
)
def test_decide_sets_the_first_share_only_once_every_target_is_warm(
    snap: CanarySnapshot,
    action: Action,
    reason: Reason,
    to: int,
) -> None:
    d = decide(snap, AnalysisRules(stages=(10, 50, 100)), T0 + 1)
    assert (d.action, d.reason, d.to_percent) == (action, reason, to)
    if action is Action.ADVANCE:
        assert d.figures()["checks"]["prewarm"] == {"targets": ["w1", "w2"], "ready": ["w1", "w2"]}


async def test_runner_sets_the_share_through_the_registry_when_the_workers_report_warm() -> None:
    core, state = _core_with_stable_on_w2()
    reg, store = FakeRegistry(canary="v2", percent=0), MemStore()
    runner = CanaryRunner(
        lambda _t, _a: AnalysisRules(stages=(10, 50, 100)), reg, store, CanaryWindow()
    )
    schedule = core.rules.canary.prewarm_for("acme", "code")
    runner.prewarm = lambda s, vid: prewarm.status(s, s.versions[vid], schedule)
    await runner.start()
    res = core.round(T0 + 1)
    assert await runner.tick(state, T0 + 1) == []
    assert runner.last["acme/code"].reason is Reason.PREWARMING
    for i in res.issued:
        core.apply(ev.answer(build_command(i, "cm/test"), T0 + 2), T0 + 2)
    taken = await runner.tick(state, T0 + 2)
    assert [(d.action, d.to_percent) for d in taken] == [(Action.ADVANCE, 10)]
    assert reg.calls[0][:3] == ("set_share", "v2", "10")
    assert await runner.tick(state, T0 + 2.5) == []  # never twice


def test_a_worker_that_joined_gets_the_hottest_versions_warm() -> None:
    """join_prewarm: a worker started within the window gets the top requested versions of
    its base model WARM (free bytes), hottest first; an old worker and cold versions do not."""
    rules = rules_from_mapping(
        {"join_prewarm": {"top": 2, "window_s": 300}, "demand": {"enabled": False}}
    )
    core = make_core(rules=rules)
    hot_a, hot_b, cool = ev.ref("a"), ev.ref("b"), ev.ref("c")
    setup(
        core,
        ev.WorkerSpec("old", slots=3, held=[ev.Held(hot_a), ev.Held(hot_b), ev.Held(cool)]),
        ev.WorkerSpec("new", started_at=T0 - 10),
        versions=(hot_a, hot_b, cool, V1),
    )
    core.apply(ev.heat(hot_a, 50, T0), T0)
    core.apply(ev.heat(hot_b, 20, T0), T0)
    core.apply(ev.heat(cool, 1, T0), T0)
    res = core.round(T0 + 1)
    warm = sorted(k for k in kinds(res) if k[0] == "load_warm")
    assert warm == [("load_warm", "new", hot_a.version_id), ("load_warm", "new", hot_b.version_id)]
    assert {
        i.pending.spec.source for i in res.issued if i.pending.spec.kind.value == "load_warm"
    } == {"rule:join_prewarm"}
    for i in res.issued:
        core.apply(ev.answer(build_command(i, "cm/test"), T0 + 2), T0 + 2)
    assert core.state.workers["new"].tier_of(hot_a.version_id) in (Tier.WARM, Tier.HOT)
    assert not [k for k in kinds(core.round(T0 + 3)) if k[0] == "load_warm"]
    # after the window the rule leaves a worker to the policy
    late = make_core(rules=rules)
    setup(late, ev.WorkerSpec("new", started_at=T0 - 400), versions=(hot_a,))
    late.apply(ev.heat(hot_a, 50, T0), T0)
    assert not [k for k in kinds(late.round(T0 + 1)) if k[0] == "load_warm"]


def test_join_prewarm_ranks_by_the_warm_value_not_the_hot_liveness() -> None:
    """A joining worker's engine takes seconds to start: by its first round the versions'
    request streams may look ended to the HOT heat (idle for many of their own gaps, so
    its liveness factor is ~0 for every version with a gap, and 1 for a version of one
    request), which would rank them by a version with a single request first and then by
    name. The rule loads WARM, so it ranks by the WARM value (request rate over the WARM
    window, no liveness): the most requested first, whatever their names and idle times."""
    rules = rules_from_mapping(
        {"join_prewarm": {"top": 2, "window_s": 300}, "demand": {"enabled": False}}
    )
    core = make_core(rules=rules)
    most, second, once = ev.ref("zz-most"), ev.ref("yy-second"), ev.ref("aa-once")
    setup(core, versions=(most, second, once))
    t = T0
    for r, n in ((once, 1), (second, 6), (most, 8)):  # back to back, as a client sends them
        for _ in range(n):
            core.apply(ev.heat(r, 1, t), t)
            t += 0.3
    for w in (ev.WorkerSpec("old", slots=3,
                            held=[ev.Held(most), ev.Held(second), ev.Held(once)]),
              ev.WorkerSpec("new", started_at=T0 + 25)):
        core.apply(ev.snapshot(w, 1, T0 + 29), T0 + 29)
    res = core.round(T0 + 30)  # ~25 s idle: ~85 gaps of 0.3 s
    warm = sorted(k for k in kinds(res) if k[0] == "load_warm" and k[1] == "new")
    assert warm == sorted(
        [("load_warm", "new", most.version_id), ("load_warm", "new", second.version_id)]
    )
