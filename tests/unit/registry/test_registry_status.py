"""Status machine and release planning (pure)."""

from __future__ import annotations

import pytest

from loraplane.registry.status import (
    TRANSITIONS,
    Pointers,
    Status,
    can_transition,
    check_transition,
    plan_canary,
    plan_promote,
    plan_retire,
    plan_rollback,
)
from loraplane.shared.errors import FailedPrecondition, InvalidArgument, NotFound

S = Status
SUBJ = "acme/bot"


@pytest.mark.parametrize(
    ("current", "target", "ok"),
    [
        (S.PENDING, S.ADMITTED, True), (S.PENDING, S.REJECTED, True),
        (S.PENDING, S.ACTIVE, False), (S.PENDING, S.CANARY, False),
        (S.REJECTED, S.ADMITTED, False), (S.REJECTED, S.ACTIVE, False),
        (S.ADMITTED, S.ACTIVE, True), (S.ADMITTED, S.CANARY, True),
        (S.ADMITTED, S.PENDING, False), (S.ACTIVE, S.RETIRED, False),
        (S.RETIRED, S.ACTIVE, False), (S.RETIRED, S.ADMITTED, False),
        (S.CANARY, S.ACTIVE, True),
    ],
)
def test_transitions(current: Status, target: Status, ok: bool) -> None:
    assert can_transition(current, target) is ok
    if not ok:
        with pytest.raises(FailedPrecondition):
            check_transition(current, target, "x")


def test_retired_is_terminal_and_every_status_has_a_row() -> None:
    assert set(TRANSITIONS) == set(Status)
    assert TRANSITIONS[S.RETIRED] == frozenset()


def test_promote_first_version() -> None:
    plan = plan_promote(Pointers(), "v1", {"v1": S.ADMITTED}, SUBJ)
    assert plan.pointers == Pointers(stable="v1")
    assert plan.status_changes == {"v1": S.ACTIVE}


def test_promote_records_previous_stable_as_rollback_target() -> None:
    ptr = Pointers(stable="v1")
    plan = plan_promote(ptr, "v2", {"v1": S.ACTIVE, "v2": S.ADMITTED}, SUBJ)
    assert plan.pointers.stable == "v2"
    assert plan.pointers.rollback_to == "v1"
    assert plan.pointers.history == ("v1",)
    assert plan.status_changes == {"v2": S.ACTIVE, "v1": S.ADMITTED}


@pytest.mark.parametrize("status", [S.PENDING, S.REJECTED, S.RETIRED])
def test_only_admitted_versions_can_be_promoted(status: Status) -> None:
    with pytest.raises(FailedPrecondition):
        plan_promote(Pointers(), "v1", {"v1": status}, SUBJ)


def test_promote_unknown_version_is_not_found() -> None:
    with pytest.raises(NotFound):
        plan_promote(Pointers(), "v9", {}, SUBJ)


def test_promote_stable_again_is_a_noop() -> None:
    ptr = Pointers(stable="v1")
    assert not plan_promote(ptr, "v1", {"v1": S.ACTIVE}, SUBJ).changed


def test_promote_canary_clears_the_canary() -> None:
    ptr = Pointers(stable="v1", canary="v2", canary_percent=10)
    plan = plan_promote(ptr, "v2", {"v1": S.ACTIVE, "v2": S.CANARY}, SUBJ)
    assert (plan.pointers.stable, plan.pointers.canary, plan.pointers.canary_percent) == (
        "v2", None, 0)


@pytest.mark.parametrize("percent", [-1, 101, 1000])
def test_canary_percent_out_of_range(percent: int) -> None:
    with pytest.raises(InvalidArgument):
        plan_canary(Pointers(stable="v1"), "v2", percent, {"v2": S.ADMITTED}, SUBJ)


@pytest.mark.parametrize("status", [S.PENDING, S.REJECTED, S.RETIRED])
def test_only_admitted_versions_can_be_canaried(status: Status) -> None:
    with pytest.raises(FailedPrecondition):
        plan_canary(Pointers(stable="v1"), "v2", 10, {"v1": S.ACTIVE, "v2": status}, SUBJ)


def test_canary_cannot_be_the_stable_version() -> None:
    with pytest.raises(FailedPrecondition):
        plan_canary(Pointers(stable="v1"), "v1", 10, {"v1": S.ACTIVE}, SUBJ)


def test_canary_set_change_and_clear() -> None:
    st = {"v1": S.ACTIVE, "v2": S.ADMITTED, "v3": S.ADMITTED}
    p1 = plan_canary(Pointers(stable="v1"), "v2", 10, st, SUBJ)
    assert (p1.pointers.canary, p1.pointers.canary_percent) == ("v2", 10)
    assert p1.status_changes == {"v2": S.CANARY}
    st2 = {**st, "v2": S.CANARY}
    p2 = plan_canary(p1.pointers, "v2", 50, st2, SUBJ)
    assert p2.pointers.canary_percent == 50 and p2.status_changes == {}
    p3 = plan_canary(p1.pointers, "v3", 5, st2, SUBJ)
    assert p3.status_changes == {"v3": S.CANARY, "v2": S.ADMITTED}
    cleared = plan_canary(p1.pointers, "", 0, st2, SUBJ)
    assert (cleared.pointers.canary, cleared.pointers.canary_percent) == (None, 0)
    assert cleared.status_changes == {"v2": S.ADMITTED}
    with pytest.raises(InvalidArgument):
        plan_canary(p1.pointers, "", 10, st2, SUBJ)


def test_rollback_without_stable_or_target() -> None:
    with pytest.raises(FailedPrecondition):
        plan_rollback(Pointers(), "", {}, SUBJ)
    with pytest.raises(FailedPrecondition, match="no rollback target"):
        plan_rollback(Pointers(stable="v1"), "", {"v1": S.ACTIVE}, SUBJ)


def test_rollback_to_recorded_target_then_to_older_history() -> None:
    st = {"v1": S.ADMITTED, "v2": S.ADMITTED, "v3": S.ACTIVE}
    ptr = Pointers(stable="v3", rollback_to="v2", history=("v1", "v2"))
    plan = plan_rollback(ptr, "", st, SUBJ)
    assert plan.pointers.stable == "v2"
    assert plan.status_changes == {"v2": S.ACTIVE, "v3": S.ADMITTED}
    # v3 (rolled back from) is not a rollback target; v1 is.
    assert plan.pointers.rollback_to == "v1"
    assert plan.pointers.history == ("v1",)
    st2 = {**st, **plan.status_changes}
    again = plan_rollback(plan.pointers, "", st2, SUBJ)
    assert again.pointers.stable == "v1"
    assert again.pointers.rollback_to is None


def test_rollback_target_must_be_admitted() -> None:
    st = {"v1": S.RETIRED, "v2": S.ACTIVE, "v0": S.REJECTED}
    with pytest.raises(FailedPrecondition, match="must be admitted"):
        plan_rollback(Pointers(stable="v2"), "v1", st, SUBJ)
    with pytest.raises(FailedPrecondition):
        plan_rollback(Pointers(stable="v2"), "v0", st, SUBJ)
    with pytest.raises(FailedPrecondition):
        plan_rollback(Pointers(stable="v2"), "v2", st, SUBJ)


def test_retire_rules() -> None:
    st = {"v1": S.ACTIVE, "v2": S.CANARY, "v3": S.ADMITTED, "v4": S.RETIRED}
    ptr = Pointers(stable="v1", canary="v2", canary_percent=20, rollback_to="v3",
                   history=("v3",))
    with pytest.raises(FailedPrecondition):
        plan_retire(ptr, "v1", st, SUBJ)
    canary = plan_retire(ptr, "v2", st, SUBJ)
    assert (canary.pointers.canary, canary.pointers.canary_percent) == (None, 0)
    assert canary.status_changes == {"v2": S.RETIRED}
    target = plan_retire(ptr, "v3", st, SUBJ)
    assert target.pointers.rollback_to is None and target.pointers.history == ()
    assert not plan_retire(ptr, "v4", st, SUBJ).changed
