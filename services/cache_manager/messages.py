"""Protobuf builders: commands to publish, decisions and workers for the read API."""

from __future__ import annotations

from datetime import UTC, datetime

from loraplane.cache_manager.core import DecisionEntry, Issued
from loraplane.cache_manager.model import CommandKind, Tier
from loraplane.cache_manager.planner import HotOrder
from loraplane.cache_manager.state import WorkerView
from loraplane.shared.topics import new_meta
from loraplane.shared.vocab import tier_to_proto
from loraplane.v1 import cache_pb2, common_pb2, events_pb2

_DECISION_ACTION = {
    CommandKind.LOAD_WARM: cache_pb2.DECISION_ACTION_LOAD_WARM,
    CommandKind.LOAD_HOT: cache_pb2.DECISION_ACTION_LOAD_HOT,
    CommandKind.DEMOTE: cache_pb2.DECISION_ACTION_DEMOTE,
    CommandKind.EVICT: cache_pb2.DECISION_ACTION_EVICT,
    CommandKind.PIN: cache_pb2.DECISION_ACTION_PIN,
    CommandKind.UNPIN: cache_pb2.DECISION_ACTION_UNPIN,
}


def _dt(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def build_command(issued: Issued, producer: str) -> events_pb2.CacheCommand:
    """The ``CacheCommand`` for a decided command (deadline = the tracker's timeout)."""
    p = issued.pending
    spec = p.spec
    rec = issued.record
    meta = new_meta(producer, rec.ref.proto(), clock=lambda: _dt(p.issued_at),
                    correlation_id=p.command_id)
    reason = spec.reason if not spec.detail else f"{spec.reason}: {spec.detail}"
    cmd = events_pb2.CacheCommand(
        meta=meta, command_id=p.command_id, worker_id=spec.worker_id, reason=reason
    )
    cmd.issued_at.FromDatetime(_dt(p.issued_at))
    cmd.deadline.FromDatetime(_dt(p.deadline))
    if spec.kind in (CommandKind.LOAD_HOT, CommandKind.LOAD_WARM):
        cmd.load.CopyFrom(events_pb2.LoadAdapter(
            target_tier=common_pb2.TIER_HOT if spec.kind is CommandKind.LOAD_HOT
            else common_pb2.TIER_WARM,
            pin=spec.pin and spec.kind is CommandKind.LOAD_HOT,
            engine_id=rec.engine_id,
            artifact_uri=rec.artifact_uri,
            sha256=rec.sha256,
            size_bytes=rec.size_bytes,
            rank=rec.rank,
            never_evict=spec.never_evict,
            hot_keep=spec.hot_keep,
        ))
    elif spec.kind in (CommandKind.DEMOTE, CommandKind.EVICT):
        cmd.evict.CopyFrom(events_pb2.EvictAdapter(
            to_tier=common_pb2.TIER_WARM if spec.kind is CommandKind.DEMOTE
            else common_pb2.TIER_COLD,
            reason=spec.reason,
            engine_id=rec.engine_id,
        ))
    elif spec.kind is CommandKind.PIN:
        cmd.pin.CopyFrom(events_pb2.PinAdapter(engine_id=rec.engine_id))
    else:
        cmd.unpin.CopyFrom(events_pb2.UnpinAdapter(engine_id=rec.engine_id))
    return cmd


def build_hot_order(worker_id: str, order: HotOrder, producer: str, command_id: str,
                    now: float) -> events_pb2.CacheCommand:
    """The ``CacheCommand`` carrying a worker's HOT order (:meth:`CacheCore.hot_orders`)."""
    cmd = events_pb2.CacheCommand(
        meta=new_meta(producer, clock=lambda: _dt(now)), command_id=command_id,
        worker_id=worker_id, reason="hot_order",
        hot_order=events_pb2.HotOrder(
            keeps=[events_pb2.HotKeep(engine_id=eid, keep=keep) for eid, keep in order]),
    )
    cmd.issued_at.FromDatetime(_dt(now))
    return cmd


def decision_proto(e: DecisionEntry) -> cache_pb2.Decision:
    """A decision for ``ListDecisions``."""
    d = cache_pb2.Decision(
        id=e.id,
        action=_DECISION_ACTION[e.kind],
        adapter=e.ref.proto(),
        worker_id=e.worker_id,
        from_tier=tier_to_proto(e.from_tier),
        to_tier=tier_to_proto(e.to_tier),
        reason=e.reason if not e.detail else f"{e.reason}: {e.detail}",
        heat_score=e.heat,
        command_id=e.command_id,
        policy=e.policy,
    )
    d.at.FromDatetime(_dt(e.at))
    return d


def worker_state_proto(w: WorkerView) -> events_pb2.WorkerState:
    """The worker's last snapshot with the reports received since applied."""
    s = events_pb2.WorkerState(
        worker_id=w.worker_id,
        base_models=sorted(w.capacities),
        warm_bytes_capacity=w.warm_bytes_capacity,
        warm_bytes_used=sum(p.size_bytes for p in w.placements.values()),
        grpc_address=w.grpc_address,
        seq=max(w.seq, 0),
        ready=w.ready,
    )
    if w.started_at:
        s.started_at.FromDatetime(_dt(w.started_at))
    for bm in sorted(w.capacities):
        cap = w.capacities[bm]
        hot = [p for p in w.placements.values() if p.tier is Tier.HOT and p.ref.base_model == bm]
        s.capacities.append(events_pb2.BaseModelCapacity(
            base_model=bm, hot_slots_capacity=cap.slots, hot_slots_used=len(hot),
            hot_slots_pinned=sum(1 for p in hot if p.pinned), max_lora_rank=cap.max_lora_rank,
            tokenizer_revision=cap.tokenizer_revision, gpu_slots=cap.gpu_slots,
            gpu_slots_used=cap.gpu_slots_used,
        ))
    for vid in sorted(w.placements, key=lambda v: (w.placements[v].tier is not Tier.HOT, v)):
        s.placements.append(placement_proto(w, vid))
    return s


def placement_proto(w: WorkerView, vid: str) -> events_pb2.AdapterPlacement:
    """One version's placement on one worker."""
    p = w.placements[vid]
    ap = events_pb2.AdapterPlacement(
        adapter=p.ref.proto(), engine_id=p.engine_id, tier=tier_to_proto(p.tier), pinned=p.pinned,
        in_flight=p.in_flight, size_bytes=p.size_bytes, sha256=p.sha256, rank=p.rank,
        slot_resident=p.slot_resident,
    )
    if p.loaded_at:
        ap.loaded_at.FromDatetime(_dt(p.loaded_at))
    if p.last_used_at:
        ap.last_used_at.FromDatetime(_dt(p.last_used_at))
    return ap


def worker_info(w: WorkerView) -> cache_pb2.WorkerInfo:
    """A worker for ``ListWorkers`` / ``GetWorker``."""
    info = cache_pb2.WorkerInfo(state=worker_state_proto(w), alive=w.alive)
    if w.last_seen:
        info.last_seen.FromDatetime(_dt(w.last_seen))
    return info
