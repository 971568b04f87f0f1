"""The placement view: snapshot ordering, deltas, staleness, load estimates, options."""

from __future__ import annotations

from loraplane.gateway.budget import TIER_COLD, TIER_HOT, TIER_WARM
from loraplane.gateway.placement import LocalLoad, PlacementView, worker_options

from .events import evicted, loaded, state


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_snapshot_then_deltas() -> None:
    view = PlacementView(clock=Clock(2001))
    view.apply_report(state("w1", "h:1", hot=(11,), warm=(12,), at=2000))
    assert view.tier("w1", 11) == TIER_HOT and view.tier("w1", 12) == TIER_WARM
    assert view.tier("w1", 13) == TIER_COLD
    view.apply_report(loaded("w1", 13, TIER_HOT, at=2000.5))
    view.apply_report(evicted("w1", 11, TIER_WARM, at=2000.6))
    view.apply_report(evicted("w1", 12, TIER_COLD, at=2000.7))
    assert (view.tier("w1", 13), view.tier("w1", 11), view.tier("w1", 12)) == (
        TIER_HOT, TIER_WARM, TIER_COLD)


def test_older_snapshot_and_older_delta_are_ignored() -> None:
    view = PlacementView(clock=Clock(2001))
    view.apply_report(state("w1", "h:1", hot=(11,), seq=5, at=2000))
    view.apply_report(state("w1", "h:1", hot=(99,), seq=4, at=1990))  # replayed, older
    assert view.tier("w1", 11) == TIER_HOT and view.tier("w1", 99) == TIER_COLD
    view.apply_report(evicted("w1", 11, TIER_COLD, at=1995))  # before the snapshot
    assert view.tier("w1", 11) == TIER_HOT


def test_restarted_worker_snapshot_replaces_higher_seq() -> None:
    view = PlacementView(clock=Clock(3001))
    view.apply_report(state("w1", "h:1", hot=(11,), seq=50, started=1000, at=2000))
    view.apply_report(state("w1", "h:2", hot=(), seq=1, started=2500, at=3000))
    assert view.tier("w1", 11) == TIER_COLD
    w = view.worker("w1")
    assert w is not None and w.address == "h:2"


def test_routable_excludes_not_ready_stale_and_other_base_models() -> None:
    clock = Clock(2000)
    view = PlacementView(clock=clock, stale_after_s=30)
    view.apply_report(state("w1", "h:1", at=2000))
    view.apply_report(state("w2", "h:2", at=2000, ready=False))
    view.apply_report(state("w3", "h:3", at=2000, base="other"))
    view.apply_report(state("w4", "", at=2000))
    assert [w.worker_id for w in view.routable("tiny")] == ["w1"]
    clock.now = 2031
    assert view.routable("tiny") == []
    view.apply_report(loaded("w1", 5, TIER_HOT, at=2030))  # any report refreshes
    assert [w.worker_id for w in view.routable("tiny")] == ["w1"]
    view.mark_down("w1")
    assert view.routable("tiny") == []


def test_is_warm_means_hot_or_warm_on_a_routable_worker() -> None:
    view = PlacementView(clock=Clock(2000))
    view.apply_report(state("w1", "h:1", warm=(12,), at=2000))
    view.apply_report(state("w2", "h:2", hot=(13,), at=2000, ready=False))
    assert view.is_warm("tiny", 12)
    assert not view.is_warm("tiny", 13)
    assert not view.is_warm("tiny", 14)


def test_load_estimates_learn_from_reports() -> None:
    view = PlacementView(clock=Clock(2000), warm_load_ms=50, cold_load_ms=2000, ewma_alpha=0.5)
    view.apply_report(state("w1", "h:1", at=1999))
    view.apply_report(loaded("w1", 1, TIER_HOT, at=2000, source=TIER_COLD, duration_ms=1000))
    view.apply_report(loaded("w1", 2, TIER_HOT, at=2000, source=TIER_WARM, duration_ms=10))
    view.apply_report(loaded("w1", 3, TIER_WARM, at=2000, source=TIER_COLD, duration_ms=99999))
    est = view.estimates()
    assert (est.cold_ms, est.warm_ms) == (1500, 30)


def test_change_listeners_fire() -> None:
    view = PlacementView(clock=Clock(2000))
    calls = []
    view.on_change(lambda: calls.append(1))
    view.apply_report(state("w1", "h:1", at=2000))
    view.apply_report(loaded("w1", 1, TIER_HOT, at=2001))
    assert len(calls) == 2


def test_worker_options_combine_local_and_reported_load() -> None:
    view = PlacementView(clock=Clock(2000))
    view.apply_report(state("w1", "h:1", hot=(11,), in_flight=3, at=2000))
    view.apply_report(state("w2", "h:2", at=2000))
    local = LocalLoad(max_cold_loads_per_worker=1)
    local.begin("w2")
    local.start_load("w2", 12)
    opts = {o.worker_id: o for o in worker_options(view.routable("tiny"), local, 12)}
    assert opts["w1"].load == 3 and opts["w1"].tier == TIER_COLD
    assert opts["w2"].load == 1 and opts["w2"].loading and opts["w2"].cold_slots_free == 0
    base = worker_options(view.routable("tiny"), local, 0, exclude=frozenset({"w1"}))
    assert [(o.worker_id, o.tier) for o in base] == [("w2", TIER_HOT)]
    freed = []
    local.on_slot_freed(lambda: freed.append(1))
    local.finish_load("w2", 12)
    local.end("w2")
    assert local.cold_slots_free("w2") == 1 and not local.loading("w2", 12) and freed
    assert local.in_flight["w2"] == 0
