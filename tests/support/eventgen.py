"""Builders of the events the cache manager consumes (tests, benchmark, demos).

Every builder returns a ready-to-publish protobuf message with a fresh event id and
``occurred_at`` at the given epoch time.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from loraplane.cache_manager.model import Ref
from loraplane.v1 import common_pb2, events_pb2

BM = "loraplane/tiny-llama"


def ref(name: str, version: str = "v1", tenant: str = "acme", bm: str = BM) -> Ref:
    """A version reference."""
    return Ref(tenant, name, version, bm)


def meta(r: Ref | None, t: float, producer: str = "test/1") -> common_pb2.EventMeta:
    """An envelope with a fresh event id at epoch ``t``."""
    m = common_pb2.EventMeta(event_id=str(uuid.uuid4()), producer=producer)
    m.occurred_at.FromDatetime(datetime.fromtimestamp(t, UTC))
    if r is not None:
        m.adapter.CopyFrom(r.proto())
    return m


def _ts(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def heat(r: Ref, n: int, t: float, *, tier: common_pb2.Tier = common_pb2.TIER_COLD, status: int = 0,
         engine_id: int = 0, cls: common_pb2.RequestClass = common_pb2.REQUEST_CLASS_INTERACTIVE,
         ) -> events_pb2.HeatBatch:
    """A batch of ``n`` completed requests of ``r`` at ``t``."""
    b = events_pb2.HeatBatch(meta=meta(r, t), source_id="gw-1")
    for i in range(n):
        b.completions.append(events_pb2.RequestCompleted(
            meta=meta(r, t), request_id=str(uuid.uuid4()), worker_id="w1", request_class=cls,
            tier_at_arrival=tier, ttft_ms=10, duration_ms=20, status_code=status,
            engine_id=engine_id,
        ))
    return b


def admitted(r: Ref, engine_id: int, t: float, *, size: int = 1_000_000, rank: int = 8,
             priority: common_pb2.Priority = common_pb2.PRIORITY_SILVER,
             ) -> events_pb2.AdmissionEvent:
    """An ``AdapterAdmitted`` verdict."""
    return events_pb2.AdmissionEvent(admitted=events_pb2.AdapterAdmitted(
        meta=meta(r, t), engine_id=engine_id, sha256="ab" * 32,
        artifact_uri=f"s3://loraplane-artifacts/{r.tenant_id}/{r.adapter_name}/{r.version}/",
        size_bytes=size, rank=rank, priority=priority, target_modules=["q_proj", "v_proj"],
    ))


def canary(r: Ref, percent: int, t: float, engine_id: int = 0,
           previous: str = "") -> events_pb2.LifecycleEvent:
    """``CanaryChanged`` making ``r`` the canary at ``percent``."""
    return events_pb2.LifecycleEvent(canary_changed=events_pb2.CanaryChanged(
        meta=meta(r, t), canary_version=r.version, percent=percent, engine_id=engine_id,
        previous=previous,
    ))


def promoted(r: Ref, t: float, previous: str = "", engine_id: int = 0) -> events_pb2.LifecycleEvent:
    """``AdapterPromoted``: ``r`` becomes stable."""
    return events_pb2.LifecycleEvent(promoted=events_pb2.AdapterPromoted(
        meta=meta(r, t), previous_stable_version=previous, engine_id=engine_id))


def rolled_back(r_to: Ref, from_version: str, t: float) -> events_pb2.LifecycleEvent:
    """``RolledBack`` from ``from_version`` to ``r_to``."""
    return events_pb2.LifecycleEvent(rolled_back=events_pb2.RolledBack(
        meta=meta(r_to, t), from_version=from_version, to_version=r_to.version))


def retired(r: Ref, t: float) -> events_pb2.LifecycleEvent:
    """``AdapterRetired``."""
    return events_pb2.LifecycleEvent(retired=events_pb2.AdapterRetired(meta=meta(r, t)))


def prewarm(r: Ref, t: float, target: str = "") -> events_pb2.PrewarmRequested:
    """``PrewarmRequested``."""
    return events_pb2.PrewarmRequested(meta=meta(r, t), reason="cold_miss",
                                       target_worker_id=target)


@dataclass
class Held:
    """One placement in a snapshot."""

    ref: Ref
    tier: common_pb2.Tier = common_pb2.TIER_HOT
    pinned: bool = False
    in_flight: int = 0
    engine_id: int = 0
    size: int = 1_000_000
    last_used: float | None = None


@dataclass
class WorkerSpec:
    """What a snapshot says about a worker."""

    worker_id: str
    slots: int = 2
    warm_bytes: int = 100_000_000
    max_rank: int = 16
    started_at: float = 1000.0
    base_models: tuple[str, ...] = (BM,)
    held: list[Held] = field(default_factory=list)
    gpu_slots: int = 0
    """The engine's GPU slots (``max_loras``); 0: not reported (every HOT slot is one)."""


def snapshot(w: WorkerSpec, seq: int, t: float, *, ready: bool = True) -> events_pb2.WorkerReport:
    """A ``WorkerState`` report."""
    s = events_pb2.WorkerState(
        worker_id=w.worker_id, base_models=list(w.base_models),
        warm_bytes_capacity=w.warm_bytes, grpc_address=f"127.0.0.1:1{w.worker_id[-1]}",
        seq=seq, ready=ready,
    )
    s.started_at.FromDatetime(_ts(w.started_at))
    for bm in w.base_models:
        s.capacities.append(events_pb2.BaseModelCapacity(
            base_model=bm, hot_slots_capacity=w.slots, max_lora_rank=w.max_rank,
            gpu_slots=w.gpu_slots))
    for h in w.held:
        ap = events_pb2.AdapterPlacement(
            adapter=h.ref.proto(), engine_id=h.engine_id, tier=h.tier, pinned=h.pinned,
            in_flight=h.in_flight, size_bytes=h.size)
        if h.last_used is not None:
            ap.last_used_at.FromDatetime(_ts(h.last_used))
        s.placements.append(ap)
    return events_pb2.WorkerReport(meta=meta(None, t), worker_id=w.worker_id, state=s)


def loaded(worker_id: str, r: Ref, t: float, *, command_id: str = "",
           tier: common_pb2.Tier = common_pb2.TIER_HOT,
           pinned: bool = False, engine_id: int = 0) -> events_pb2.WorkerReport:
    """``AdapterLoaded`` report."""
    return events_pb2.WorkerReport(
        meta=meta(r, t), worker_id=worker_id, command_id=command_id,
        loaded=events_pb2.AdapterLoaded(tier=tier, pinned=pinned, engine_id=engine_id))


def evicted(worker_id: str, r: Ref, t: float, *, command_id: str = "",
            to_tier: common_pb2.Tier = common_pb2.TIER_COLD) -> events_pb2.WorkerReport:
    """``AdapterEvicted`` report."""
    return events_pb2.WorkerReport(
        meta=meta(r, t), worker_id=worker_id, command_id=command_id,
        evicted=events_pb2.AdapterEvicted(from_tier=common_pb2.TIER_HOT, to_tier=to_tier))


def failed(worker_id: str, r: Ref, t: float, *, command_id: str, code: events_pb2.LoadErrorCode,
           retriable: bool) -> events_pb2.WorkerReport:
    """``LoadFailed`` report."""
    return events_pb2.WorkerReport(
        meta=meta(r, t), worker_id=worker_id, command_id=command_id,
        failed=events_pb2.LoadFailed(code=code, retriable=retriable, message="test"))


def answer(cmd: events_pb2.CacheCommand, t: float) -> events_pb2.WorkerReport:
    """The success report a well-behaved worker sends for ``cmd``."""
    r = Ref.of(cmd.meta.adapter)
    arm = cmd.WhichOneof("command")
    if arm == "load":
        return loaded(cmd.worker_id, r, t, command_id=cmd.command_id, tier=cmd.load.target_tier,
                      pinned=cmd.load.pin, engine_id=cmd.load.engine_id)
    if arm == "evict":
        return evicted(cmd.worker_id, r, t, command_id=cmd.command_id, to_tier=cmd.evict.to_tier)
    return loaded(cmd.worker_id, r, t, command_id=cmd.command_id, tier=common_pb2.TIER_HOT,
                  pinned=arm == "pin")


def all_of(*batches: Iterable[object]) -> list[object]:
    """Flatten."""
    return [x for b in batches for x in b]
