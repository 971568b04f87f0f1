"""Property tests of ``plan(snapshot, now)`` for every policy (hypothesis)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from loraplane.policy.config import PolicyConfig
from loraplane.policy.factory import POLICIES, make_policy
from loraplane.policy.heat import HeatPolicy
from loraplane.policy.plan import ActionKind, Plan, Reason
from loraplane.policy.predicates import demotion_reason, hot_share_limit, max_pins, protection_of
from loraplane.policy.snapshot import Snapshot

from .helpers import apply_plan, snapshots

CFG = PolicyConfig()
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(snapshots())
def test_every_policy_keeps_capacities_at_every_step(case: tuple[Snapshot, float]) -> None:
    snapshot, now = case
    for name in POLICIES:
        plan = make_policy(name, CFG).plan(snapshot, now)
        apply_plan(snapshot, plan)  # asserts preconditions and capacities after each action


@SETTINGS
@given(snapshots())
def test_in_flight_versions_are_never_demoted_or_evicted(case: tuple[Snapshot, float]) -> None:
    snapshot, now = case
    workers = {w.worker_id: w for w in snapshot.workers}
    for name in POLICIES:
        for a in make_policy(name, CFG).plan(snapshot, now):
            if a.kind in (ActionKind.DEMOTE, ActionKind.EVICT):
                assert not workers[a.worker_id].busy(a.version_id), (name, a)


@SETTINGS
@given(snapshots())
def test_plans_are_deterministic(case: tuple[Snapshot, float]) -> None:
    snapshot, now = case
    shuffled = Snapshot.build(
        reversed(list(snapshot.versions.values())),
        reversed(snapshot.workers),
        dict(reversed(list(snapshot.stats.items()))),
        snapshot.bandwidths,
    )
    for name in POLICIES:
        first = make_policy(name, CFG).plan(snapshot, now)
        assert make_policy(name, CFG).plan(snapshot, now) == first
        assert make_policy(name, CFG).plan(shuffled, now) == first


@SETTINGS
@given(snapshots())
def test_heat_never_evicts_protected_versions_from_warm_unless_they_overflow(
    case: tuple[Snapshot, float],
) -> None:
    snapshot, now = case
    plan = HeatPolicy(CFG).plan(snapshot, now)
    final = apply_plan(snapshot, plan)
    workers = {w.worker_id: w for w in snapshot.workers}
    for a in plan.of_kind(ActionKind.EVICT):
        m = snapshot.versions[a.version_id]
        if protection_of(m, CFG) is None or m.superseded:
            continue
        assert a.reason is Reason.PROTECTION_OVERFLOW, a
        # overflow is real: putting it back would not fit
        w = workers[a.worker_id]
        used = sum(snapshot.versions[v].size_bytes for v in final[a.worker_id].warm)
        assert used + m.size_bytes > w.warm_bytes, a


@SETTINGS
@given(snapshots())
def test_heat_keeps_protected_hot_versions_within_their_share(
    case: tuple[Snapshot, float],
) -> None:
    """A protected HOT version is demoted only when a demotion predicate applies, or its kind
    already fills its share of that worker's slots, or the pins are at their maximum."""
    snapshot, now = case
    plan = HeatPolicy(CFG).plan(snapshot, now)
    final = apply_plan(snapshot, plan)
    workers = {w.worker_id: w for w in snapshot.workers}
    for a in plan.of_kind(ActionKind.DEMOTE):
        m = snapshot.versions[a.version_id]
        kind = protection_of(m, CFG)
        if kind is None or m.superseded:
            continue
        if demotion_reason(m, snapshot.stats_of(a.version_id), now, CFG) is not None:
            continue
        w = workers[a.worker_id]
        slots = w.hot_slots[m.base_model]
        same_bm = [v for v in final[a.worker_id].hot
                   if snapshot.versions[v].base_model == m.base_model]
        same_kind = [v for v in same_bm if protection_of(snapshot.versions[v], CFG) is kind]
        pinned = [v for v in final[a.worker_id].pinned
                  if snapshot.versions[v].base_model == m.base_model]
        assert (
            len(same_kind) >= hot_share_limit(kind, slots, CFG)
            or len(pinned) >= max_pins(slots)
        ), (a, same_kind, pinned)


@SETTINGS
@given(snapshots())
def test_heat_pins_only_protected_versions_and_never_every_slot(
    case: tuple[Snapshot, float],
) -> None:
    snapshot, now = case
    plan = HeatPolicy(CFG).plan(snapshot, now)
    final = apply_plan(snapshot, plan)
    for w in snapshot.workers:
        for bm, slots in w.hot_slots.items():
            pins = [v for v in final[w.worker_id].pinned if snapshot.versions[v].base_model == bm]
            assert len(pins) <= max_pins(slots)
    for a in plan.of_kind(ActionKind.PIN):
        assert protection_of(snapshot.versions[a.version_id], CFG) is not None


@SETTINGS
@given(snapshots())
def test_every_action_has_a_reason_and_plans_are_ordered(case: tuple[Snapshot, float]) -> None:
    snapshot, now = case
    for name in POLICIES:
        plan = make_policy(name, CFG).plan(snapshot, now)
        assert plan == Plan.of(list(plan.actions))
        for a in plan:
            assert isinstance(a.reason, Reason)
