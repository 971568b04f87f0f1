"""What the canary analysis took out stays out across a leader change: the loading block of an
aborted canary (or withdrawn stable version) rebuilt at takeover from what the registry keeps
(``CacheCore.restore_blocks``, ``store.taken_out_of``), when it ends, and that it is the block
the leader before had."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from loraplane.cache_manager import store
from loraplane.cache_manager.core import ABORTED, WITHDRAWN, CacheCore
from loraplane.cache_manager.messages import build_command
from loraplane.cache_manager.model import (
    ACTOR,
    REASON_PREFIX,
    CommandKind,
    Ref,
    Status,
    TakenOut,
    Tier,
)
from loraplane.cache_manager.rules import rules_from_mapping
from loraplane.policy.config import load_config
from loraplane.policy.factory import make_policy
from loraplane.v1 import common_pb2, events_pb2
from tests.support import eventgen as ev

REPO = Path(__file__).resolve().parents[3]
T0 = 1_800_000_000.0
BLOCK_S = 120.0  # commands.backoff_max_s (default)
STABLE, CANARY = ev.ref("support", "v1"), ev.ref("support", "v2")
GOLD = common_pb2.PRIORITY_GOLD
"""A gold tenant's version scores above ``promote_min_heat`` on its priority alone: the heat
plan promotes it into a free HOT slot whether or not it is requested (as the integration
tests' gold tenant's versions are)."""
LOADS = (CommandKind.LOAD_HOT, CommandKind.LOAD_WARM)


def heat_core() -> CacheCore:
    cfg = load_config(REPO / "config" / "policy.yaml")
    return CacheCore(policy=make_policy("heat", cfg), policy_config=cfg,
                     rules=rules_from_mapping({"demand": {"enabled": False}}),
                     worker_timeout_s=3600)


def aborted_event(r: Ref, t: float) -> events_pb2.LifecycleEvent:
    """The abort's ``CanaryChanged``: no canary, share 0 (``SetCanary("", 0)``)."""
    return ev.canary(replace(r, version=""), 0, t, previous=r.version)


def worker(*held: ev.Held, seq: int, t: float) -> events_pb2.WorkerReport:
    return ev.snapshot(ev.WorkerSpec("w1", slots=4, held=list(held)), seq, t)


def step(core: CacheCore, t: float) -> list[tuple[str, str, str]]:
    """One round at ``t``, every command answered as done; (kind, version, reason)."""
    res = core.round(t)
    for issued in res.issued:
        core.apply(ev.answer(build_command(issued, "test"), t), t)
    return [(i.pending.spec.kind.value, i.pending.spec.version_id, i.pending.spec.reason)
            for i in res.issued]


def loads_of(cmds: list[tuple[str, str, str]], r: Ref) -> list[tuple[str, str, str]]:
    return [c for c in cmds if c[1] == r.version_id and c[0] in ("load_hot", "load_warm")]


def leader_that_aborted(t_abort: float) -> CacheCore:
    """The leader before: stable and a gold canary HOT on w1, requests to both, the canary
    aborted at ``t_abort`` (its CanaryChanged applied, then the runner's ``on_abort``) and
    demoted."""
    core = heat_core()
    for i, r in enumerate((STABLE, CANARY), start=1):
        core.apply(ev.admitted(r, i, T0, priority=GOLD), T0)
    core.apply(ev.promoted(STABLE, T0), T0)
    core.apply(ev.canary(CANARY, 50, T0), T0)
    core.apply(worker(ev.Held(STABLE), ev.Held(CANARY), seq=1, t=T0), T0)
    core.apply(ev.heat(STABLE, 30, T0 + 1), T0 + 1)
    core.apply(ev.heat(CANARY, 30, T0 + 1), T0 + 1)
    core.apply(aborted_event(CANARY, t_abort), t_abort)
    core.canary_aborted(CANARY.version_id, t_abort, detail="error_rate")
    assert ("demote", CANARY.version_id, ABORTED) in step(core, t_abort)
    assert core.state.workers["w1"].tier_of(CANARY.version_id) is Tier.WARM
    return core


def takeover(old: CacheCore, now: float, *, canary_tier: Any = common_pb2.TIER_WARM
             ) -> CacheCore:
    """A new leader from what the leader before leaves behind (``leader._lead``): the
    registry read (records, pointers), the saved statistics, the worker's state."""
    new = heat_core()
    new.state.load_registry(list(old.state.versions.values()), dict(old.state.pointers))
    new.state.stats.update(old.state.stats)
    new.apply(worker(ev.Held(STABLE), ev.Held(CANARY, tier=canary_tier), seq=2, t=now), now)
    return new


def abort_entry(r: Ref, at: float) -> TakenOut:
    return TakenOut(r.version_id, at, ABORTED, "error_rate")


def test_a_new_leader_keeps_an_aborted_canary_from_loading_as_the_leader_before_did() -> None:
    t_abort = T0 + 2
    old = leader_that_aborted(t_abort)
    now = t_abort + 5  # the leader is killed; its standby takes over
    # what the defect was: a new leader without the block loads the aborted canary back
    # (gold: promoted into a free HOT slot by the heat plan)
    bare = takeover(old, now)
    assert loads_of(step(bare, now), CANARY) == [("load_hot", CANARY.version_id, "heat")]
    # rebuilt from the registry's audit entry of the abort: the same block as the old one
    new = takeover(old, now)
    assert new.restore_blocks([abort_entry(CANARY, t_abort)], {}, now) == [CANARY.version_id]
    assert new.blocked[CANARY.version_id].until == old.blocked[CANARY.version_id].until
    for t in (now, now + 1, now + 30, t_abort + BLOCK_S - 1):
        assert loads_of(step(new, t), CANARY) == [], t
        assert loads_of(step(old, t), CANARY) == [], t
    # and it ends when the old one ends: both leaders may load it again
    after = t_abort + BLOCK_S + 1
    assert loads_of(step(new, after), CANARY) == loads_of(step(old, after), CANARY) != []


def test_a_new_leader_demotes_an_aborted_canary_the_leader_before_left_hot() -> None:
    """The leader died between the abort and its demotion: the new one demotes it."""
    t_abort = T0 + 2
    old = leader_that_aborted(t_abort)
    new = takeover(old, t_abort + 1, canary_tier=common_pb2.TIER_HOT)
    new.restore_blocks([abort_entry(CANARY, t_abort)], {}, t_abort + 1)
    cmds = step(new, t_abort + 1)
    assert ("demote", CANARY.version_id, ABORTED) in cmds and not loads_of(cmds, CANARY)


def test_no_block_once_the_time_is_over_or_the_version_was_released_again() -> None:
    t_abort = T0 + 2
    old = leader_that_aborted(t_abort)
    late = takeover(old, t_abort + BLOCK_S)
    assert late.restore_blocks([abort_entry(CANARY, t_abort)], {}, t_abort + BLOCK_S) == []
    # a person made it the canary again after the abort: the registry's pointers say so
    again = heat_core()
    again.state.load_registry(list(old.state.versions.values()), {
        STABLE.adapter_id: replace(old.state.pointers[STABLE.adapter_id], canary="v2",
                                   canary_percent=10)})
    assert again.restore_blocks([abort_entry(CANARY, t_abort)], {}, t_abort + 5) == []
    # promoted since
    promoted = heat_core()
    promoted.state.load_registry(list(old.state.versions.values()), {
        STABLE.adapter_id: replace(old.state.pointers[STABLE.adapter_id], stable="v2")})
    assert promoted.restore_blocks([abort_entry(CANARY, t_abort)], {}, t_abort + 5) == []


def test_the_latest_step_of_a_version_is_the_one_restored() -> None:
    """Aborted, made the canary again, aborted again: the block runs from the second abort
    (a replayed pointer change from between the two must not end it)."""
    t_abort = T0 + 2
    new = takeover(leader_that_aborted(t_abort), t_abort + 40)
    new.restore_blocks([abort_entry(CANARY, t_abort), abort_entry(CANARY, t_abort + 30)], {},
                       t_abort + 40)
    b = new.blocked[CANARY.version_id]
    assert (b.since, b.until) == (t_abort + 30, t_abort + 30 + BLOCK_S)
    new.apply(ev.canary(CANARY, 10, t_abort + 20), t_abort + 40)  # replayed, from before
    new.apply(aborted_event(CANARY, t_abort + 30), t_abort + 40)
    assert CANARY.version_id in new.blocked
    assert loads_of(step(new, t_abort + 41), CANARY) == []


def test_a_block_ends_when_the_version_is_made_the_canary_again() -> None:
    """Live: a person sets the aborted version as the canary again (a pointer change after
    the abort): it may load at once, on the leader that aborted it and on a new one alike."""
    t_abort = T0 + 2
    old = leader_that_aborted(t_abort)
    new = takeover(old, t_abort + 5)
    new.restore_blocks([abort_entry(CANARY, t_abort)], {}, t_abort + 5)
    for core in (old, new):
        core.apply(ev.canary(CANARY, 10, t_abort - 1), t_abort + 6)  # older: replayed
        assert CANARY.version_id in core.blocked
        core.apply(ev.canary(CANARY, 10, t_abort + 6), t_abort + 6)
        assert CANARY.version_id not in core.blocked
        assert loads_of(step(core, t_abort + 7), CANARY) != []


def test_withdrawn_versions_are_restored_while_the_registry_keeps_them_withdrawn() -> None:
    """A withdrawn stable version (no target) stays out while it is the stable pointer; the
    version a rollback withdrew stays out for the block time after the rollback, unless a
    person released it again (the registry then forgot the withdrawal)."""
    core = heat_core()
    bot, faq1, faq2 = ev.ref("bot", "v1"), ev.ref("faq", "v1"), ev.ref("faq", "v2")
    for i, r in enumerate((bot, faq1, faq2), start=1):
        core.apply(ev.admitted(r, i, T0, priority=GOLD), T0)
    core.apply(ev.promoted(bot, T0), T0)
    core.apply(ev.promoted(faq2, T0), T0)
    core.apply(ev.rolled_back(faq1, "v2", T0 + 5), T0 + 5)
    now = T0 + 100
    withdrawn = {bot.version_id: "canary-analysis {...}", faq2.version_id: "rolled back"}
    taken = [TakenOut(bot.version_id, T0 - 500, WITHDRAWN, "stable_error_rate"),
             TakenOut(faq2.version_id, T0 + 5, WITHDRAWN, "stable_error_rate")]
    assert core.restore_blocks(taken, withdrawn, now) == [bot.version_id, faq2.version_id]
    assert core.blocked[faq2.version_id].until == T0 + 5 + BLOCK_S
    assert core.blocked[bot.version_id].until == now + BLOCK_S  # renewed by each stable tick
    # promoted again by a person: the registry forgot the withdrawal, nothing to restore
    other = heat_core()
    other.state.load_registry(list(core.state.versions.values()), dict(core.state.pointers))
    assert other.restore_blocks(taken[1:], {}, now) == []


def test_foreign_and_unknown_versions_are_not_blocked_by_a_shard() -> None:
    core = heat_core()
    core.state.load_registry([], {})
    assert core.restore_blocks([abort_entry(CANARY, T0)], {CANARY.version_id: "x"}, T0 + 1) == []
    core.apply(ev.admitted(CANARY, 1, T0), T0)
    core.state.versions[CANARY.version_id] = core.state.versions[
        CANARY.version_id].with_status(Status.FOREIGN)
    assert core.restore_blocks([abort_entry(CANARY, T0)], {}, T0 + 1) == []


def _row(action: str, subject: str, before: dict[str, Any], after: dict[str, Any],
         at: float = T0) -> dict[str, Any]:
    # asyncpg hands jsonb over as text
    return {"at": at, "action": action, "subject": subject, "before": json.dumps(before),
            "after": json.dumps(after)}


def _reason(action: str, reason: str) -> str:
    return REASON_PREFIX + json.dumps({"action": action, "reason": reason, "detail": "d"})


def test_the_analysis_steps_that_take_a_version_out_are_read_from_its_audit_entries() -> None:
    abort = _row("release.canary", "acme/support",
                 {"stable_version": "v1", "canary_version": "v2", "canary_percent": 50},
                 {"stable_version": "v1", "canary_version": None, "canary_percent": 0,
                  "reason": _reason("abort", "error_rate")})
    assert store.taken_out_of(abort) == TakenOut(
        "acme/support@v2", T0, ABORTED, _reason("abort", "error_rate"))
    advance = _row("release.canary", "acme/support", {"canary_version": "v2"},
                   {"canary_version": "v2", "reason": _reason("advance", "passed")})
    assert store.taken_out_of(advance) is None
    by_hand = _row("release.canary", "acme/support", {"canary_version": "v2"},
                   {"canary_version": None, "reason": "operator abort"})
    assert store.taken_out_of(by_hand) is None
    rollback = _row("release.rollback", "acme/faq", {"stable_version": "v2"},
                    {"stable_version": "v1", "reason": _reason("rollback", "stable_error_rate")})
    taken = store.taken_out_of(rollback)
    assert taken is not None and (taken.version_id, taken.reason) == ("acme/faq@v2", WITHDRAWN)
    withdraw = _row("version.withdraw", "acme/bot", {"version": "v1", "withdrawn_reason": ""},
                    {"version": "v1", "withdrawn_reason": "r", "reason": "r"})
    assert store.taken_out_of(withdraw) == TakenOut("acme/bot@v1", T0, WITHDRAWN, "r")
    assert ACTOR == "system/canary-analysis"  # the actor the query reads
