"""Protobuf messages the worker sends: ``WorkerReport`` (cache.state) and ``WorkerState``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from loraplane.shared.topics import new_meta
from loraplane.v1 import common_pb2, events_pb2
from loraplane.worker.errors import WorkerError, load_error_code
from loraplane.worker.host_tier import ArtifactSpec
from loraplane.worker.manager import AdapterManager, EvictOutcome, LoadOutcome

Clock = Callable[[], datetime]


def adapter_ref(spec: ArtifactSpec) -> common_pb2.AdapterRef:
    """The protobuf reference of a version."""
    return common_pb2.AdapterRef(
        tenant_id=spec.tenant_id, adapter_name=spec.adapter_name, version=spec.version,
        base_model=spec.base_model,
    )


def spec_from_load(cmd: events_pb2.CacheCommand) -> ArtifactSpec:
    """The :class:`ArtifactSpec` of a ``LoadAdapter`` command."""
    ref, load = cmd.meta.adapter, cmd.load
    return ArtifactSpec(
        engine_id=load.engine_id, tenant_id=ref.tenant_id, adapter_name=ref.adapter_name,
        version=ref.version, base_model=ref.base_model, artifact_uri=load.artifact_uri,
        sha256=load.sha256, size_bytes=load.size_bytes, rank=load.rank,
    )


@dataclass(frozen=True)
class ReportContext:
    """Who reports, and what caused the report."""

    worker_id: str
    clock: Clock
    command: events_pb2.CacheCommand | None = None

    @property
    def producer(self) -> str:
        """``worker/<id>``."""
        return f"worker/{self.worker_id}"

    def report(self, adapter: common_pb2.AdapterRef | None) -> events_pb2.WorkerReport:
        """An empty report with its envelope."""
        cmd = self.command
        meta = new_meta(
            self.producer, adapter, clock=self.clock,
            causation_id=cmd.meta.event_id if cmd is not None else "",
            correlation_id=cmd.meta.correlation_id if cmd is not None else "",
        )
        return events_pb2.WorkerReport(
            meta=meta, worker_id=self.worker_id,
            command_id=cmd.command_id if cmd is not None else "",
        )


def loaded(ctx: ReportContext, outcome: LoadOutcome) -> events_pb2.WorkerReport:
    """``AdapterLoaded`` for a load outcome."""
    msg = ctx.report(adapter_ref(outcome.spec))
    msg.loaded.CopyFrom(
        events_pb2.AdapterLoaded(
            tier=outcome.tier, duration_ms=outcome.duration_s * 1000.0,
            bytes=outcome.bytes_read, source_tier=outcome.source_tier,
            engine_id=outcome.spec.engine_id, pinned=outcome.pinned,
        )
    )
    return msg


def evicted(
    ctx: ReportContext, outcome: EvictOutcome, ref: common_pb2.AdapterRef | None = None
) -> events_pb2.WorkerReport:
    """``AdapterEvicted`` for an eviction outcome."""
    adapter = adapter_ref(outcome.spec) if outcome.spec is not None else ref
    msg = ctx.report(adapter)
    msg.evicted.CopyFrom(
        events_pb2.AdapterEvicted(
            from_tier=outcome.from_tier, to_tier=outcome.to_tier, reason=outcome.reason,
            engine_id=outcome.engine_id,
        )
    )
    return msg


def failed(
    ctx: ReportContext, exc: BaseException, engine_id: int, ref: common_pb2.AdapterRef | None
) -> events_pb2.WorkerReport:
    """``LoadFailed`` classifying ``exc``."""
    msg = ctx.report(ref)
    retriable = bool(getattr(exc, "retriable", False)) if isinstance(exc, WorkerError) else True
    text = exc.message if isinstance(exc, WorkerError) else f"{type(exc).__name__}: {exc}"
    msg.failed.CopyFrom(
        events_pb2.LoadFailed(
            code=load_error_code(exc), message=text, retriable=retriable, engine_id=engine_id,
        )
    )
    return msg


def worker_state(
    manager: AdapterManager,
    *,
    worker_id: str,
    grpc_address: str,
    started_at: datetime,
    seq: int,
    ready: bool,
    tokenizer_revision: str = "",
) -> events_pb2.WorkerState:
    """Full snapshot of the worker (also the ``GetState`` answer)."""
    limits = manager.engine.limits
    state = events_pb2.WorkerState(
        worker_id=worker_id, base_models=[manager.base_model],
        warm_bytes_capacity=manager.host.capacity_bytes,
        warm_bytes_used=manager.host.used_bytes, grpc_address=grpc_address, seq=seq,
        ready=ready,
    )
    state.started_at.FromDatetime(started_at)
    state.capacities.append(
        events_pb2.BaseModelCapacity(
            base_model=manager.base_model, hot_slots_capacity=manager.hot_capacity,
            hot_slots_used=manager.hot_count(), hot_slots_pinned=manager.pinned_count(),
            max_lora_rank=limits.max_lora_rank, tokenizer_revision=tokenizer_revision,
            gpu_slots=limits.max_loras, gpu_slots_used=len(manager.engine.slots.resident),
        )
    )
    for p in sorted(manager.placements.values(), key=lambda p: p.spec.engine_id):
        placement = events_pb2.AdapterPlacement(
            adapter=adapter_ref(p.spec), engine_id=p.spec.engine_id, tier=p.tier,
            pinned=p.pinned, in_flight=p.in_flight, size_bytes=p.host.size_bytes,
            sha256=p.spec.sha256, rank=p.host.rank,
            slot_resident=p.tier == common_pb2.TIER_HOT
            and p.spec.engine_id in manager.engine.slots.resident,
        )
        placement.loaded_at.FromDatetime(p.loaded_at)
        if p.last_used_at is not None:
            placement.last_used_at.FromDatetime(p.last_used_at)
        state.placements.append(placement)
    return state
