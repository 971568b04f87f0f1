"""The one host ranking (``policy/placement.py``) both placement paths use: the heat plan's
replicas and the cache-manager's business rules."""

from __future__ import annotations

from loraplane.policy.placement import HostOption, host_key, rank_hosts, stable_hash


def _order(options: list[HostOption]) -> list[str]:
    return [o.worker_id for o in rank_hosts("t/a@v1", options)]


def test_each_criterion_in_turn() -> None:
    # preferred > already HOT > free slot without displacing > WARM there > least loaded
    assert _order([HostOption("w1", free_slots=3), HostOption("w2", preferred=True)]) == ["w2", "w1"]
    assert _order([HostOption("w1", free_slots=3, resident=True),
                   HostOption("w2", hot_here=True)]) == ["w2", "w1"]
    assert _order([HostOption("w1", free_slots=0, resident=True),
                   HostOption("w2", free_slots=1)]) == ["w2", "w1"]
    assert _order([HostOption("w1", free_slots=1, load=0.0),
                   HostOption("w2", free_slots=1, resident=True, load=9.0)]) == ["w2", "w1"]
    assert _order([HostOption("w1", free_slots=1, load=2.0),
                   HostOption("w2", free_slots=1, load=1.0)]) == ["w2", "w1"]


def test_ties_break_on_a_process_independent_hash() -> None:
    options = [HostOption(f"w{i}", free_slots=1) for i in range(6)]
    got = _order(options)
    assert got == _order(list(reversed(options)))  # input order does not matter
    assert got == sorted((o.worker_id for o in options),
                         key=lambda w: stable_hash("t/a@v1", w))
    assert host_key("t/a@v1", options[0])[-1] == stable_hash("t/a@v1", "w0")
