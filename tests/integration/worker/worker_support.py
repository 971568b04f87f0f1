"""Helpers of the worker integration tests (imported by conftest and the tests)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from minio import Minio
from prometheus_client import CollectorRegistry

from loraplane.devkit.builder import DemoManifest
from loraplane.shared import codec, topics
from loraplane.shared.tls import GATEWAY, WORKER
from loraplane.stack.stack import Stack
from loraplane.v1 import common_pb2, events_pb2, worker_pb2_grpc
from loraplane.worker.app import WorkerApp
from loraplane.worker.host_tier import ArtifactSpec
from loraplane.worker.settings import WorkerSettings
from loraplane.worker.vllm_engine import VllmEngine
from tests.support.tls import internal_channel, tls_settings

PROMPT = "Hello, how can I help you today?"
MAX_TOKENS = 16
BUCKET = "loraplane-artifacts"


@dataclass
class Uploaded:
    """An adapter version in the test stack's S3, as a cache command describes it."""

    spec: ArtifactSpec
    source_dir: Path

    @property
    def ref(self) -> common_pb2.AdapterRef:
        s = self.spec
        return common_pb2.AdapterRef(tenant_id=s.tenant_id, adapter_name=s.adapter_name,
                                     version=s.version, base_model=s.base_model)


@dataclass
class Env:
    """Everything the worker tests share (module scope)."""

    stack: Stack
    demo: DemoManifest
    engine: VllmEngine
    run_id: str
    adapters: dict[str, Uploaded]
    """Demo adapters by ``name@version`` plus ``"big-rank"`` (rank 32, over the max)."""
    reference: dict[str, tuple[int, ...]]
    """Greedy token ids of PROMPT per adapter key (``"base"`` = no adapter), engine-direct."""
    host_dir: Path
    s3: Minio


def upload(s3: Minio, prefix: str, src: Path) -> None:
    for f in sorted(src.iterdir()):
        s3.fput_object(BUCKET, prefix + f.name, str(f))


def worker_settings(stack: Stack, demo: DemoManifest, host_dir: Path, run_id: str) -> WorkerSettings:
    s = stack.settings
    return WorkerSettings(
        worker_id=f"wtest-{run_id}",
        worker_grpc_port=0,
        worker_metrics_port=0,
        kafka_bootstrap=s.kafka_bootstrap,
        **s.s3_settings(),
        artifact_bucket=s.artifact_bucket,
        base_model=demo.base_model.name,
        base_model_dir=demo.base_model.dir,
        trusted_keys=str(demo.keys.public_key),
        tokenizer_revision=demo.base_model.tokenizer_revision,
        worker_host_dir=host_dir,
        worker_max_loras=4,
        worker_max_cpu_loras=8,
        worker_max_lora_rank=16,
        worker_state_interval_s=2.0,
        worker_heat_flush_s=0.5,
        worker_drain_timeout_s=60.0,
        **tls_settings(stack, WORKER),
    )


def gateway_channel(stack: Stack, app: WorkerApp) -> grpc.aio.Channel:
    """A channel to the worker as the gateway (who serves through it) would open it."""
    return internal_channel(stack, app.grpc_address, caller=GATEWAY, server=WORKER)


@dataclass
class Running:
    """The worker app under test (replaced by the restart test) and its clients."""

    env: Env
    settings: WorkerSettings
    app: WorkerApp
    registry: CollectorRegistry
    channel: grpc.aio.Channel
    stub: worker_pb2_grpc.WorkerInternalStub
    producer: AIOKafkaProducer
    watcher: ReportWatcher
    extra: dict[str, Any] = field(default_factory=dict)

    async def restart(self, before_start: Callable[[], None] | None = None) -> WorkerApp:
        """Stop the worker app (not the engine) and start a new one on the same host dir."""
        await self.channel.close()
        await self.app.stop()
        if before_start is not None:
            before_start()
        self.registry = CollectorRegistry()
        self.app = WorkerApp(self.settings, self.env.engine, registry=self.registry)
        await self.app.start()
        self.channel = gateway_channel(self.env.stack, self.app)
        self.stub = worker_pb2_grpc.WorkerInternalStub(self.channel)
        return self.app

    async def restart_watcher(self) -> None:
        """Recreate the report watcher (a consumer can go deaf after a broker restart)."""
        await self.watcher.stop()
        old = self.watcher
        self.watcher = ReportWatcher(old.bootstrap, old.worker_id, f"{old.group}-r{len(old.reports)}")
        self.watcher.reports.extend(old.reports)
        await self.watcher.start()

    async def send(self, cmd: events_pb2.CacheCommand) -> None:
        value, headers = codec.encode(cmd)
        await self.producer.send_and_wait(
            topics.CACHE_COMMANDS, value, key=topics.key_for(topics.CACHE_COMMANDS, cmd),
            headers=codec.kafka_headers(headers))


class ReportWatcher:
    """Collects this worker's ``WorkerReport``s from ``cache.state``."""

    def __init__(self, bootstrap: str, worker_id: str, group: str) -> None:
        self.bootstrap = bootstrap
        self.group = group
        self.worker_id = worker_id
        self.reports: list[events_pb2.WorkerReport] = []
        self._consumer = AIOKafkaConsumer(
            topics.CACHE_STATE, bootstrap_servers=bootstrap, group_id=group,
            auto_offset_reset="earliest", enable_auto_commit=False, session_timeout_ms=6000,
            heartbeat_interval_ms=500)
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    async def start(self) -> None:
        await self._consumer.start()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            batch = await self._consumer.getmany(timeout_ms=200)
            for records in batch.values():
                for rec in records:
                    msg = codec.decode_record(rec)
                    assert isinstance(msg, events_pb2.WorkerReport)
                    if msg.worker_id == self.worker_id:
                        self.reports.append(msg)
                        self._changed.set()

    async def wait_for(
        self, pred: Callable[[events_pb2.WorkerReport], bool], timeout: float = 30.0
    ) -> events_pb2.WorkerReport:
        async with asyncio.timeout(timeout):
            while True:
                for r in self.reports:
                    if pred(r):
                        return r
                self._changed.clear()
                await self._changed.wait()

    async def answer(self, command_id: str, timeout: float = 30.0) -> events_pb2.WorkerReport:
        return await self.wait_for(lambda r: r.command_id == command_id, timeout)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._consumer.stop()


