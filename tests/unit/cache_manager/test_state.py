"""State: idempotency, worker snapshots and restarts, reports, lifecycle, liveness."""

from __future__ import annotations

import pytest

from loraplane.cache_manager.model import Status, Tier
from loraplane.cache_manager.state import State
from loraplane.v1 import common_pb2, events_pb2
from tests.support import eventgen as ev

T0 = 1_800_000_000.0
A = ev.ref("support")


def test_heat_is_idempotent_on_event_id() -> None:
    st = State()
    batch = ev.heat(A, 3, T0)
    first = st.apply(batch, T0)
    again = st.apply(batch, T0 + 1)
    assert not first.duplicate and again.duplicate
    assert st.stats[A.version_id].requests == 3
    assert st.hits[(A.version_id, Tier.COLD)] == 3
    assert st.duplicates == 1


def test_burst_on_version_hot_nowhere_triggers_and_asks_registry() -> None:
    st = State()
    applied = st.apply(ev.heat(A, 5, T0), T0)
    assert "burst" in applied.triggers
    assert applied.unresolved == [A.version_id]
    assert st.versions[A.version_id].status is Status.UNKNOWN


def test_no_burst_when_hot_somewhere() -> None:
    st = State()
    st.apply(ev.snapshot(ev.WorkerSpec("w1", held=[ev.Held(A)]), 1, T0), T0)
    assert "burst" not in st.apply(ev.heat(A, 5, T0), T0).triggers


def test_failed_requests_count_towards_error_rate_after_load() -> None:
    st = State()
    st.apply(ev.heat(A, 4, T0, status=14), T0)
    st.apply(ev.heat(A, 6, T0), T0)
    view = st.stats[A.version_id].view()
    assert view.requests_after_load == 10 and view.errors_after_load == 4


def test_snapshot_order_and_restart() -> None:
    st = State()
    w = ev.WorkerSpec("w1", held=[ev.Held(A), ev.Held(ev.ref("b"), tier=common_pb2.TIER_WARM)])
    joined = st.apply(ev.snapshot(w, 5, T0), T0)
    assert "worker_joined" in joined.triggers
    assert st.workers["w1"].synced and st.workers["w1"].commandable()
    assert st.workers["w1"].tier_of(A.version_id) is Tier.HOT

    older = ev.WorkerSpec("w1", held=[])
    st.apply(ev.snapshot(older, 4, T0 + 1), T0 + 1)  # older seq: ignored
    assert st.workers["w1"].tier_of(A.version_id) is Tier.HOT

    restarted = ev.WorkerSpec("w1", started_at=2000.0, held=[
        ev.Held(ev.ref("b"), tier=common_pb2.TIER_WARM)])
    applied = st.apply(ev.snapshot(restarted, 0, T0 + 2), T0 + 2)
    assert applied.restarted_workers == ["w1"]
    assert st.workers["w1"].tier_of(A.version_id) is Tier.COLD
    assert st.workers["w1"].tier_of(ev.ref("b").version_id) is Tier.WARM


def test_reports_update_placement_and_answer_commands() -> None:
    st = State()
    st.apply(ev.snapshot(ev.WorkerSpec("w1"), 1, T0), T0)
    out = st.apply(ev.loaded("w1", A, T0, command_id="c1", pinned=True), T0)
    assert [o.command_id for o in out.outcomes] == ["c1"] and out.outcomes[0].ok
    p = st.workers["w1"].placements[A.version_id]
    assert p.tier is Tier.HOT and p.pinned
    assert st.stats[A.version_id].loads == 1
    st.apply(ev.evicted("w1", A, T0, command_id="c2", to_tier=common_pb2.TIER_WARM), T0)
    p = st.workers["w1"].placements[A.version_id]
    assert p.tier is Tier.WARM and not p.pinned
    st.apply(ev.evicted("w1", A, T0, command_id="c3"), T0)
    assert A.version_id not in st.workers["w1"].placements
    out = st.apply(ev.failed("w1", A, T0, command_id="c4",
                             code=events_pb2.LOAD_ERROR_CODE_NO_CAPACITY, retriable=True), T0)
    assert out.outcomes[0].code == "LOAD_ERROR_CODE_NO_CAPACITY" and not out.outcomes[0].ok


def test_reports_before_any_snapshot_leave_worker_unsynced() -> None:
    st = State()
    st.apply(ev.loaded("w9", A, T0), T0)
    assert not st.workers["w9"].synced and not st.workers["w9"].commandable()


def test_workers_that_stop_reporting_are_gone_and_come_back() -> None:
    st = State()
    st.apply(ev.snapshot(ev.WorkerSpec("w1"), 1, T0), T0)
    st.apply(ev.snapshot(ev.WorkerSpec("w2"), 1, T0 + 8), T0 + 8)
    assert st.expire_workers(T0 + 10, timeout_s=5) == ["w1"]
    assert not st.workers["w1"].alive and not st.workers["w1"].synced
    assert st.expire_workers(T0 + 11, timeout_s=5) == []
    back = st.apply(ev.snapshot(ev.WorkerSpec("w1"), 2, T0 + 12), T0 + 12)
    assert "worker_back" in back.triggers and st.workers["w1"].commandable()


def test_snapshot_seeds_last_access_after_restart_of_the_manager() -> None:
    st = State()
    st.apply(ev.snapshot(ev.WorkerSpec("w1", held=[ev.Held(A, last_used=T0 - 30)]), 1, T0), T0)
    assert st.stats[A.version_id].last_access == pytest.approx(T0 - 30)


def test_lifecycle_canary_promote_rollback_retire() -> None:
    st = State()
    v1, v2 = ev.ref("support", "v1"), ev.ref("support", "v2")
    st.apply(ev.admitted(v1, 1, T0), T0)
    st.apply(ev.admitted(v2, 2, T0), T0)
    st.apply(ev.promoted(v1, T0), T0)
    assert st.versions[v1.version_id].status is Status.ACTIVE

    out = st.apply(ev.canary(v2, 0, T0), T0)
    assert "canary" in out.triggers
    rec2 = st.versions[v2.version_id]
    assert st.is_staged_canary(rec2) and not st.is_canary(rec2)
    st.apply(ev.canary(v2, 10, T0), T0)
    assert st.is_canary(st.versions[v2.version_id])

    st.apply(ev.promoted(v2, T0, previous="v1"), T0)
    assert st.versions[v2.version_id].status is Status.ACTIVE
    assert st.versions[v1.version_id].status is Status.ADMITTED
    assert st.is_rollback_target(st.versions[v1.version_id])
    assert not st.is_staged_canary(st.versions[v2.version_id])

    w = ev.WorkerSpec("w1", held=[ev.Held(v2)])
    st.apply(ev.snapshot(w, 1, T0), T0)
    st.apply(ev.snapshot(ev.WorkerSpec("w2", held=[ev.Held(v2)]), 1, T0), T0)
    out = st.apply(ev.rolled_back(v1, "v2", T0), T0)
    assert "rollback" in out.triggers
    assert st.boosts[v1.version_id].replicas == 2
    assert st.pointers[v1.adapter_id].stable == "v1"

    st.apply(ev.retired(v2, T0), T0)
    assert st.versions[v2.version_id].status is Status.RETIRED
    # A later admission of a retired version does not resurrect it.
    st.apply(ev.admitted(v2, 2, T0), T0)
    assert st.versions[v2.version_id].status is Status.RETIRED


def test_admission_records_artifact_and_rejection_blocks_loading() -> None:
    st = State()
    st.apply(ev.admitted(A, 7, T0, priority=common_pb2.PRIORITY_PLATINUM), T0)
    rec = st.versions[A.version_id]
    assert rec.engine_id == 7 and rec.artifact_uri.startswith("s3://") and rec.status.loadable
    assert rec.priority.value == "platinum"
    b = ev.ref("bad")
    st.apply(events_pb2.AdmissionEvent(rejected=events_pb2.AdapterRejected(
        meta=ev.meta(b, T0), engine_id=9)), T0)
    assert st.versions[b.version_id].status is Status.REJECTED
    assert not st.versions[b.version_id].status.loadable


def test_prewarm_boost_expires() -> None:
    st = State(prewarm_ttl_s=10)
    out = st.apply(ev.prewarm(A, T0, target="w2"), T0)
    assert "prewarm" in out.triggers and st.boosts[A.version_id].target_worker == "w2"
    st.expire_boosts(T0 + 11)
    assert A.version_id not in st.boosts


def test_reports_older_than_the_snapshot_do_not_change_placement() -> None:
    st = State()
    st.apply(ev.snapshot(ev.WorkerSpec("w1", held=[]), 9, T0 + 10), T0 + 10)
    out = st.apply(ev.loaded("w1", A, T0 + 5, command_id="old"), T0 + 11)
    assert st.workers["w1"].tier_of(A.version_id) is Tier.COLD
    assert out.outcomes[0].version_id == A.version_id  # the command is still answered


def test_a_request_reported_by_gateway_and_worker_counts_once() -> None:
    st = State()
    from_gateway = ev.heat(A, 2, T0)
    from_worker = events_pb2.HeatBatch(meta=ev.meta(A, T0), source_id="worker/w1")
    from_worker.completions.extend(from_gateway.completions)  # same request ids, new event id
    st.apply(from_gateway, T0)
    st.apply(from_worker, T0)
    assert st.stats[A.version_id].requests == 2
