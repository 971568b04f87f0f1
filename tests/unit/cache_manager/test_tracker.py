"""Command tracker: one command per key, timeouts, backoff, worker restarts."""

from __future__ import annotations

import pytest

from loraplane.cache_manager.model import CommandKind, CommandSpec
from loraplane.cache_manager.tracker import CommandTracker, backoff_s, contradicts


@pytest.mark.parametrize(
    ("failures", "expected"),
    [(0, 0.0), (1, 1.0), (2, 2.0), (3, 4.0), (6, 32.0), (7, 60.0), (1000, 60.0)],
)
def test_backoff_doubles_and_caps(failures: int, expected: float) -> None:
    assert backoff_s(failures, base_s=1.0, max_s=60.0) == expected


def spec(kind: CommandKind = CommandKind.LOAD_HOT, w: str = "w1", v: str = "a@v1") -> CommandSpec:
    return CommandSpec(kind, w, v, "heat")


def tracker() -> CommandTracker:
    return CommandTracker(timeout_s=10, base_backoff_s=1, max_backoff_s=60)


def test_one_command_in_flight_per_key_no_contradiction() -> None:
    t = tracker()
    t.issue(spec(), "c1", 0)
    assert not t.can_issue("w1", "a@v1", 0)
    with pytest.raises(ValueError):
        t.issue(spec(CommandKind.EVICT), "c2", 0)
    assert t.can_issue("w2", "a@v1", 0) and t.can_issue("w1", "b@v1", 0)
    res = t.resolve("c1", ok=True, now=1)
    assert res is not None and res.ok and res.latency_s == 1
    assert t.can_issue("w1", "a@v1", 1)
    assert t.resolve("c1", ok=True, now=2) is None  # late duplicate answer


def test_failures_back_off_and_attempts_count() -> None:
    t = tracker()
    t.issue(spec(), "c1", 0)
    t.resolve("c1", ok=False, now=0, retriable=True, code="NO_CAPACITY")
    assert not t.can_issue("w1", "a@v1", 0.5) and t.can_issue("w1", "a@v1", 1.0)
    p = t.issue(spec(), "c2", 1.0)
    assert p.attempt == 2
    t.resolve("c2", ok=False, now=1.0, retriable=True)
    assert t.blocked_until("w1", "a@v1") == 3.0
    t.issue(spec(), "c3", 3.0)
    t.resolve("c3", ok=True, now=3.5)
    assert t.failures("w1", "a@v1") == 0


def test_non_retriable_failure_blocks_for_the_max() -> None:
    t = tracker()
    t.issue(spec(), "c1", 0)
    t.resolve("c1", ok=False, now=0, retriable=False, code="DIGEST_MISMATCH")
    assert t.blocked_until("w1", "a@v1") == 60.0


def test_timeouts_expire_and_back_off() -> None:
    t = tracker()
    t.issue(spec(), "c1", 0)
    assert t.expire(9.9) == []
    [res] = t.expire(10)
    assert res.result == "timeout" and not res.ok
    assert t.pending() == [] and not t.can_issue("w1", "a@v1", 10.5)
    assert t.resolve("c1", ok=True, now=11) is None


def test_forget_worker_voids_its_commands_without_backoff() -> None:
    t = tracker()
    t.issue(spec(), "c1", 0)
    t.issue(spec(w="w2"), "c2", 0)
    [res] = t.forget_worker("w1", 1)
    assert res.result == "void" and t.can_issue("w1", "a@v1", 1)
    assert len(t) == 1


def test_issue_refuses_a_reused_command_id() -> None:
    t = tracker()
    t.issue(spec(), "c1", 0)
    with pytest.raises(ValueError):
        t.issue(spec(w="w2"), "c1", 0)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (CommandKind.LOAD_HOT, CommandKind.EVICT, True),
        (CommandKind.PIN, CommandKind.UNPIN, True),
        (CommandKind.DEMOTE, CommandKind.LOAD_WARM, True),
        (CommandKind.LOAD_HOT, CommandKind.PIN, False),
        (CommandKind.DEMOTE, CommandKind.EVICT, False),
    ],
)
def test_contradictions(a: CommandKind, b: CommandKind, expected: bool) -> None:
    assert contradicts(a, b) is expected and contradicts(b, a) is expected
