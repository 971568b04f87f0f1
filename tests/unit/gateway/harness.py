"""An in-process gateway over echo workers, fed by events (no Kafka, no registry)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import grpc
from prometheus_client import CollectorRegistry

from loraplane.gateway.app import GatewayApp, build_gateway
from loraplane.gateway.auth import key_hash
from loraplane.gateway.budget import BudgetConfig
from loraplane.gateway.grpc_api import build_grpc_server
from loraplane.gateway.metrics import GatewayMetrics
from loraplane.gateway.request_path import Gateway
from loraplane.gateway.settings import GatewaySettings
from loraplane.shared.grpcutil import GrpcServer
from loraplane.v1 import inference_pb2_grpc
from tests.support.echo_worker import EchoWorker, serve_echo_worker
from tests.support.ports import free_port

from . import events as ev
from .test_emit import Recorder

ACME_KEY = "lp_acme_secret"
GLOBEX_KEY = "lp_globex_secret"


class NullPublisher:
    """A gateway's event publisher that drops what it is given."""

    async def publish(self, topic: str, msg: object) -> None:
        return None


@asynccontextmanager
async def bare_gateway(instance_id: str, **settings: str) -> AsyncIterator[GatewayApp]:
    """A started gateway on free ports, no bootstrap, no events, no probes, no metrics
    port (``settings``: more of its settings, e.g. the edge TLS files); stopped after."""
    app = GatewayApp(
        GatewaySettings(grpc_port=free_port(), http_port=free_port(), metrics_port=0,
                        bootstrap=False, consume_events=False, worker_probe_interval_s=0,
                        instance_id=instance_id, **settings),  # type: ignore[arg-type]
        publisher=NullPublisher(), registry=CollectorRegistry(), serve_metrics=False)
    await app.start()
    try:
        yield app
    finally:
        await app.stop(0.5)


@dataclass
class Harness:
    gateway: Gateway
    workers: dict[str, EchoWorker]
    recorder: Recorder
    registry: CollectorRegistry
    server: GrpcServer | None = None
    seq: dict[str, int] = field(default_factory=dict)

    def report(self, worker_id: str) -> None:
        """Publish the worker's current state into the placement view."""
        w = self.workers[worker_id]
        self.seq[worker_id] = self.seq.get(worker_id, 0) + 1
        st = w.state(self.seq[worker_id])
        import time

        report = ev.state(worker_id, w.address, hot=tuple(sorted(w.hot)),
                          warm=tuple(sorted(w.warm)), seq=st.seq, at=time.time())
        self.gateway.placement.apply_report(report)

    def metric(self, name: str, labels: dict[str, str]) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def stub(self) -> inference_pb2_grpc.InferenceStub:
        assert self.server is not None
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.server.port}")
        return inference_pb2_grpc.InferenceStub(channel)


@asynccontextmanager
async def harness(
    *, n_workers: int = 2, budgets: BudgetConfig | None = None, grpc_server: bool = False,
    **settings: object,
) -> AsyncIterator[Harness]:
    """Two echo workers serving base model ``tiny``; acme/support v1 (11) stable,
    v2 (12) admitted; acme/code c1 (21) stable; globex/legal l1 (31) stable."""
    s = GatewaySettings(bootstrap=False, consume_events=False, metrics_port=0,
                        budgets=budgets or BudgetConfig(), **settings)  # type: ignore[arg-type]
    registry = CollectorRegistry()
    rec = Recorder()
    gw = build_gateway(s, rec, metrics=GatewayMetrics(registry))
    workers = {f"w{i}": EchoWorker(worker_id=f"w{i}") for i in range(n_workers)}
    servers = [await serve_echo_worker(w) for w in workers.values()]
    h = Harness(gw, workers, rec, registry)
    gw.auth.apply(ev.key_created("acme", "ka", key_hash(ACME_KEY)))
    gw.auth.apply(ev.key_created("globex", "kg", key_hash(GLOBEX_KEY)))
    for t, n, v, e in [("acme", "support", "v1", 11), ("acme", "support", "v2", 12),
                       ("acme", "code", "c1", 21), ("globex", "legal", "l1", 31)]:
        gw.catalog.apply_admission(ev.admitted(t, n, v, e))
    for t, n, v, e in [("acme", "support", "v1", 11), ("acme", "code", "c1", 21),
                       ("globex", "legal", "l1", 31)]:
        gw.catalog.apply_lifecycle(ev.promoted(t, n, v, e, at=1.0))
    for wid in workers:
        h.report(wid)
    if grpc_server:
        h.server = build_grpc_server(gw, port=0)
        await h.server.start()
    try:
        yield h
    finally:
        if h.server is not None:
            await h.server.stop(0)
        for srv in servers:
            await srv.stop(0)
        await gw.workers.close()  # type: ignore[attr-defined]
