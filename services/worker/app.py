"""The worker process assembled: engine guard, host tier, manager, gRPC, Kafka loops.

The engine is built outside :class:`WorkerApp` (it takes ~20 s on the CPU) and handed
in, so a test can restart the worker's host-tier and control layers around one running
engine. On start the app clears whatever the engine had registered, writes and
registers its all-zero adapter, re-verifies the host tier, serves gRPC, consumes
``cache.commands`` and publishes snapshots and heat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry

from loraplane.policy.config import load_config
from loraplane.shared import topics
from loraplane.shared.grpcutil import GrpcServer, Service, build_server
from loraplane.shared.metrics import RpcMetrics
from loraplane.shared.tls import CACHE_MANAGER, GATEWAY, OPERATOR, allow, server_security
from loraplane.v1 import events_pb2, worker_pb2_grpc
from loraplane.worker import reports
from loraplane.worker.commands import CommandExecutor
from loraplane.worker.engine import Engine, EngineAdapter
from loraplane.worker.grpc_api import WorkerService
from loraplane.worker.guard import SafeEngine
from loraplane.worker.host_tier import HostTier, RescanResult
from loraplane.worker.kafka import CommandConsumer, HeatBatcher, Publisher
from loraplane.worker.lora_files import LlamaDims, write_lora
from loraplane.worker.manager import AdapterManager, EvictOutcome, LoadOutcome
from loraplane.worker.metrics import WorkerMetrics
from loraplane.worker.settings import ZERO_ADAPTER_ENGINE_ID, WorkerSettings
from loraplane.worker.store import MinioStore, ObjectStore

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
ZERO_ADAPTER_RANK = 8
ZERO_ADAPTER_MODULES = ("q_proj", "v_proj")
ENGINE_WATCH_S = 1.0
"""Period of the engine liveness check."""
AUTHZ_RULES = {
    # serving is the gateway's (a direct call would bypass tenant auth, quotas and
    # accounting); the cache manager's shadow runs before a canary (shadow.py) too
    "/loraplane.v1.WorkerInternal/Generate": allow(GATEWAY, CACHE_MANAGER),
    # the gateway's liveness probes, the cache manager's snapshots, an operator looking
    "/loraplane.v1.WorkerInternal/GetState": allow(GATEWAY, CACHE_MANAGER, OPERATOR),
}
"""Who may call the worker's ``WorkerInternal`` API (mutual TLS on, ``shared.tls``)."""


def _now() -> datetime:
    return datetime.now(UTC)


def write_zero_adapter(model_dir: Path, out_dir: Path, *, base_model: str, rank: int) -> Path:
    """The all-zero adapter for ``model_dir`` (rewritten at every start: it is ours)."""
    dims = LlamaDims.from_model_dir(model_dir)
    return write_lora(out_dir, dims, base_model=base_model, rank=rank,
                      modules=ZERO_ADAPTER_MODULES)


class WorkerApp:
    """One worker: everything but the engine's construction."""

    def __init__(
        self,
        settings: WorkerSettings,
        engine: Engine,
        *,
        store: ObjectStore | None = None,
        registry: CollectorRegistry = REGISTRY,
        clock: Clock = _now,
        kafka: bool = True,
    ) -> None:
        """``settings`` must name the served model (``base_model``, ``base_model_dir``)."""
        if settings.base_model_dir is None or not settings.base_model:
            raise ValueError("no base model: LORAPLANE_BASE_MODEL or LORAPLANE_BASE_MODEL_DIR "
                             "unset")
        self.settings = settings
        self.clock = clock
        self.kafka_enabled = kafka
        self.metrics = WorkerMetrics.for_registry(registry)
        self.rpc_metrics = RpcMetrics.for_registry(registry)
        self.metrics_registry = registry
        self.engine = SafeEngine(engine)
        self.store = store or MinioStore(
            settings.s3_endpoint, settings.s3_access_key, settings.s3_secret_key,
            secure=settings.s3_secure, ca_file=settings.s3_ca_file,
        )
        self.host = HostTier(
            settings.host_dir / "warm",
            capacity_bytes=settings.worker_host_bytes,
            store=self.store,
            trusted_keys=settings.trusted_key_paths(),
            bucket=settings.artifact_bucket,
            prefix=settings.artifact_prefix,
            max_lora_rank=settings.worker_max_lora_rank,
            clock=clock,
        )
        zero_dir = settings.host_dir / "system" / "zero"
        self.zero_adapter = EngineAdapter(
            engine_id=ZERO_ADAPTER_ENGINE_ID,
            name=f"_system/zero@{settings.base_model}",
            path=zero_dir,
            rank=min(ZERO_ADAPTER_RANK, settings.worker_max_lora_rank),
        )
        self.manager = AdapterManager(
            self.engine, self.host, base_model=settings.base_model,
            zero_adapter=self.zero_adapter, metrics=self.metrics, clock=clock,
            drain_timeout_s=settings.worker_drain_timeout_s, on_event=self._on_event,
            policy=load_config(settings.worker_policy_file),
            slot_queue_depth=settings.worker_slot_queue_depth,
            slot_retry_after_s=settings.worker_slot_retry_after_s,
            hot_level=settings.worker_hot_level,
        )
        manager = self.manager
        self.metrics.versions_placed = lambda: [  # gone versions' series are removed
            manager.labels(p.spec) for p in list(manager.placements.values())]
        self.executor = CommandExecutor(self.manager, worker_id=settings.worker_id, clock=clock,
                                        slot_wait_s=settings.worker_command_slot_wait_s)
        self.publisher = Publisher(settings.kafka(), on_recovered=self._broker_recovered,
                                   on_dropped=self.metrics.reports_dropped.inc)
        self.consumer = CommandConsumer(
            settings.kafka(), self.executor, self.publisher,
            group_id=f"loraplane-worker-{settings.worker_id}",
            max_concurrency=settings.worker_max_concurrent_commands,
            on_restart=self.metrics.consumer_restarts.inc,
        )
        self.heat = HeatBatcher(
            self.publisher, source_id=f"worker/{settings.worker_id}",
            flush_interval_s=settings.worker_heat_flush_s, clock=clock,
        )
        self.service = WorkerService(
            self.manager, self.engine, worker_id=settings.worker_id,
            heat=self._heat_sink, state=self.state,
            default_max_tokens=settings.worker_default_max_tokens,
            default_temperature=settings.worker_default_temperature, clock=clock,
            background_stream_tokens=settings.worker_background_stream_tokens,
        )
        self.server: GrpcServer | None = None
        self.started_at = clock()
        self.ready = False
        self.rescan: RescanResult | None = None
        self._seq = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._stop_snapshots = asyncio.Event()
        self.engine_failed = asyncio.Event()
        """Set when the engine died; the process should exit so it is restarted."""

    # ------------------------------------------------------------------ state

    @property
    def grpc_address(self) -> str:
        """``host:port`` the gateway dials."""
        port = self.server.port if self.server is not None else self.settings.worker_grpc_port
        return f"{self.settings.worker_advertise_host}:{port}"

    def state(self) -> events_pb2.WorkerState:
        """A fresh snapshot (each one with the next ``seq``)."""
        self._seq += 1
        return reports.worker_state(
            self.manager, worker_id=self.settings.worker_id, grpc_address=self.grpc_address,
            started_at=self.started_at, seq=self._seq, ready=self.ready,
            tokenizer_revision=self.settings.tokenizer_revision,
        )

    def _ctx(self) -> reports.ReportContext:
        return reports.ReportContext(self.settings.worker_id, self.clock)

    async def publish_state(self) -> bool:
        """Publish a WorkerState snapshot on cache.state."""
        msg = self._ctx().report(None)
        msg.state.CopyFrom(self.state())
        return await self.publisher.publish(topics.CACHE_STATE, msg)

    async def _on_event(self, outcome: LoadOutcome | EvictOutcome) -> None:
        """Report loads / evictions the worker did on its own (request path)."""
        if not self.kafka_enabled:
            return
        ctx = self._ctx()
        msg = (reports.loaded(ctx, outcome) if isinstance(outcome, LoadOutcome)
               else reports.evicted(ctx, outcome))
        await self.publisher.publish(topics.CACHE_STATE, msg)

    def _heat_sink(self, completed: events_pb2.RequestCompleted) -> None:
        if self.kafka_enabled:
            self.heat.add(completed)

    def _broker_recovered(self) -> None:
        log.warning("broker is back: recreating the command consumer")
        self.consumer.request_restart()

    # ------------------------------------------------------------------ lifecycle

    async def _reset_engine(self) -> None:
        """Forget whatever an earlier worker left registered in a reused engine."""
        for engine_id in sorted(await self.engine.inner.list()):
            await self.engine.inner.unregister(engine_id)

    async def start(self) -> None:
        """Verify the host tier, register the zero adapter, serve, consume, report."""
        s = self.settings
        assert s.base_model_dir is not None
        await self._reset_engine()
        await asyncio.to_thread(
            write_zero_adapter, s.base_model_dir, self.zero_adapter.path,
            base_model=s.base_model, rank=self.zero_adapter.rank,
        )
        self.rescan = await self.manager.start()
        if self.rescan.dropped:
            log.warning("host tier: %d entries failed re-verification and were deleted: %s",
                        len(self.rescan.dropped), self.rescan.dropped)
        credentials, interceptors = server_security(
            s.tls_files(), AUTHZ_RULES, registry=self.metrics_registry)
        self.server = build_server(
            [Service(worker_pb2_grpc.add_WorkerInternalServicer_to_server, self.service,
                     "loraplane.v1.WorkerInternal")],
            port=s.worker_grpc_port, host=s.worker_grpc_host, metrics=self.rpc_metrics,
            credentials=credentials, interceptors=interceptors,
        )
        await self.server.start()
        self.ready = True
        if self.kafka_enabled:
            with contextlib.suppress(Exception):
                await self.publisher.start()
            self._tasks = [
                asyncio.create_task(self.consumer.run(), name="worker-commands"),
                asyncio.create_task(self.heat.run(), name="worker-heat"),
                asyncio.create_task(self._snapshots(), name="worker-snapshots"),
            ]
        self._tasks.append(asyncio.create_task(self._watch_engine(), name="worker-engine"))
        log.info("worker %s ready on %s (%d WARM versions kept, %d dropped)", s.worker_id,
                 self.grpc_address, len(self.rescan.kept), len(self.rescan.dropped))

    async def _watch_engine(self) -> None:
        """Mark the worker not ready (and set :attr:`engine_failed`) once the engine died."""
        while not self._stop_snapshots.is_set():
            if self.engine.dead:
                log.error("the engine died: worker %s is not ready any more",
                          self.settings.worker_id)
                self.ready = False
                self.metrics.engine_up.labels(self.settings.base_model).set(0)
                self.engine_failed.set()
                if self.kafka_enabled:
                    with contextlib.suppress(Exception):
                        await self.publish_state()
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_snapshots.wait(), ENGINE_WATCH_S)

    async def _snapshots(self) -> None:
        while not self._stop_snapshots.is_set():
            try:
                await self.publish_state()
            except Exception:
                log.exception("state snapshot failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._stop_snapshots.wait(), self.settings.worker_state_interval_s
                )

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop serving (running streams get ``grace_s``), stop the loops, report not ready."""
        self.ready = False
        if self.server is not None:
            await self.server.stop(grace_s)
        self.consumer.stop()
        self.heat.stop()
        self._stop_snapshots.set()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.kafka_enabled:
            with contextlib.suppress(Exception):
                await self.publish_state()
        await self.publisher.stop()
