"""HOT's two levels (issue 19): a worker's registered and slot-resident versions reach the
cache manager's state and its read API (``loraplane cache status``)."""

from __future__ import annotations

from loraplane.cache_manager.messages import worker_state_proto
from loraplane.cache_manager.state import State
from tests.support import eventgen as ev

T0 = 1_800_000_000.0
V1, V2 = ev.ref("code", "v1"), ev.ref("code", "v2")


def test_the_cache_manager_keeps_both_hot_levels_of_a_worker_report() -> None:
    """``slot_resident`` and the GPU slots of a snapshot reach the state and the read API."""
    rep = ev.snapshot(ev.WorkerSpec("w1", held=[ev.Held(V1), ev.Held(V2)]), 1, T0)
    rep.state.capacities[0].gpu_slots, rep.state.capacities[0].gpu_slots_used = 1, 1
    rep.state.placements[0].slot_resident = True
    state = State()
    state.apply(rep, T0)
    w = state.workers["w1"]
    assert w.placements[V1.version_id].slot_resident
    assert not w.placements[V2.version_id].slot_resident
    cap = next(iter(w.capacities.values()))
    assert (cap.slots, cap.gpu_slots, cap.gpu_slots_used) == (2, 1, 1)
    out = worker_state_proto(w)
    assert {p.adapter.version: p.slot_resident for p in out.placements} == {"v1": True, "v2": False}
    assert (out.capacities[0].gpu_slots, out.capacities[0].gpu_slots_used) == (1, 1)
