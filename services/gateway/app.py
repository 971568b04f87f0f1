"""The gateway process: views, consumers, bootstrap, the gRPC and HTTP servers, metrics.

:func:`build_gateway` wires the request path (:class:`~.request_path.Gateway`) from
settings; :class:`GatewayApp` runs everything in one asyncio loop::

    app = GatewayApp(settings)
    await app.start()          # bootstrap, consumers, servers
    ...
    await app.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import uvicorn
from prometheus_client import REGISTRY, CollectorRegistry

from loraplane.gateway.auth import AuthView
from loraplane.gateway.bootstrap import VersionRepair, bootstrap_catalog, bootstrap_placement
from loraplane.gateway.catalog import AdapterCatalog
from loraplane.gateway.consumers import ViewFeeder
from loraplane.gateway.emit import (
    EventPublisher,
    HeatEmitter,
    KafkaPublisher,
    PrewarmRequester,
    run_flusher,
)
from loraplane.gateway.flow import FlowController, FlowMetrics
from loraplane.gateway.grpc_api import build_grpc_server
from loraplane.gateway.http_api import create_app
from loraplane.gateway.liveness import WorkerProber
from loraplane.gateway.metrics import GatewayMetrics
from loraplane.gateway.placement import LocalLoad, PlacementView
from loraplane.gateway.quotas import Quota, QuotaBook, TenantPolicies
from loraplane.gateway.request_path import Gateway, Limits
from loraplane.gateway.settings import GatewaySettings
from loraplane.gateway.workers import WorkerPool
from loraplane.shared import topics
from loraplane.shared.grpcutil import GrpcServer
from loraplane.shared.metrics import start_metrics_server
from loraplane.shared.tls import (
    CACHE_MANAGER,
    REGISTRY_ID,
    CertExpiry,
    EdgeCertificate,
    edge_server_credentials,
    secure_or_insecure_aio_channel,
)
from loraplane.v1.events_pb2 import TenantEvent

log = logging.getLogger(__name__)


def build_gateway(
    settings: GatewaySettings,
    publisher: EventPublisher,
    *,
    metrics: GatewayMetrics,
    workers: WorkerPool | None = None,
) -> Gateway:
    """The request path with empty views, publishing heat and prewarms through ``publisher``."""
    placement = PlacementView(
        stale_after_s=settings.worker_stale_after_s,
        down_after_failures=settings.worker_down_after_failures,
        warm_load_ms=settings.warm_load_estimate_ms,
        cold_load_ms=settings.cold_load_estimate_ms,
        ewma_alpha=settings.load_estimate_alpha,
    )
    return Gateway(
        auth=AuthView(),
        catalog=AdapterCatalog(shares=settings.shares),
        placement=placement,
        local=LocalLoad(settings.max_cold_loads_per_worker),
        workers=workers or WorkerPool(tls=settings.tls_files()),
        heat=HeatEmitter(
            publisher, producer=settings.producer_id, source_id=settings.producer_id,
            max_batch=settings.heat_max_batch, max_pending=settings.heat_max_pending,
        ),
        prewarm=PrewarmRequester(
            publisher, producer=settings.producer_id, dedupe_s=settings.prewarm_dedupe_s
        ),
        metrics=metrics,
        budgets=settings.budgets,
        limits=Limits(
            max_tokens=settings.max_tokens_limit,
            max_prompt_chars=settings.max_prompt_chars,
            default_deadline_s=settings.default_deadline_s,
            worker_suspect_s=settings.worker_suspect_s,
        ),
        default_base_model=settings.default_base_model,
        flow=FlowController(settings.process_flow(), metrics=FlowMetrics.for_registry(metrics.registry)),
        quotas=QuotaBook(TenantPolicies(Quota(settings.default_max_in_flight,
                                              settings.default_tokens_per_s))),
    )


def _tenant_events(
    auth: AuthView, catalog: AdapterCatalog, policies: TenantPolicies | None = None
) -> Callable[[TenantEvent], None]:
    """``tenant.events`` feed the views: keys and tenants (auth), shares (catalog), tiers
    and quotas (policies)."""

    def apply(event: TenantEvent) -> None:
        auth.apply(event)
        catalog.apply_tenant_event(event)
        if policies is not None:
            policies.apply(event)

    return apply


def listen_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A bound TCP socket for the HTTP listener (``SO_REUSEPORT`` with ``reuse_port``: every
    gateway process of the host binds the same port and the kernel spreads connections);
    raises ``OSError`` when the port is taken (by a process that did not set it too)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock


class _Uvicorn(uvicorn.Server):
    """uvicorn inside our loop: the process's signal handling stays ours."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class _Tasks:
    feeder: asyncio.Task[None] | None = None
    flusher: asyncio.Task[None] | None = None
    http: asyncio.Task[None] | None = None
    bootstrap: asyncio.Task[None] | None = None
    prober: asyncio.Task[None] | None = None
    keys: asyncio.Task[None] | None = None
    edge_https: asyncio.Task[None] | None = None


class GatewayApp:
    """Everything the gateway process runs (see the module doc)."""

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        publisher: EventPublisher | None = None,
        registry: CollectorRegistry = REGISTRY,
        serve_metrics: bool = True,
    ) -> None:
        """``publisher``: where events go (default: Kafka, ``settings.kafka()``)."""
        self.settings = settings
        self._own_publisher = publisher is None
        self.publisher: EventPublisher = publisher or KafkaPublisher(
            settings.kafka(), client_id=settings.producer_id.replace("/", "-")
        )
        self.metrics = GatewayMetrics.for_registry(registry)
        self.gateway = build_gateway(settings, self.publisher, metrics=self.metrics)
        self.metrics.views.placement = self.gateway.placement
        self.metrics.views.catalog = self.gateway.catalog  # retired versions' series go
        self.metrics.views.heat = self.gateway.heat
        self.metrics.views.prewarm = self.gateway.prewarm
        self.prober: WorkerProber | None = None
        if settings.worker_probe_interval_s > 0:
            probes = self.metrics.probes
            self.prober = WorkerProber(
                self.gateway.placement, self.gateway.workers,
                interval_s=settings.worker_probe_interval_s,
                timeout_s=settings.worker_probe_timeout_s,
                on_result=lambda worker, result: probes.labels(worker, result).inc(),
            )
        self._serve_metrics = serve_metrics
        self._tasks = _Tasks()
        self._channels: list[grpc.aio.Channel] = []
        self.grpc: GrpcServer | None = None
        self.http: _Uvicorn | None = None
        self.edge_https: EdgeCertificate | None = None
        """The HTTPS listener's certificate, reloaded when its files change (edge TLS)."""
        self.feeder: ViewFeeder | None = None
        self.bootstrapped = asyncio.Event()
        """Set once the first bootstrap attempt ended (successfully or not)."""

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start publisher, consumers, bootstrap, servers; returns once they listen."""
        s = self.settings
        g = self.gateway
        if self._serve_metrics and s.metrics_port:
            start_metrics_server(s.metrics_port)
        if self._own_publisher:
            assert isinstance(self.publisher, KafkaPublisher)
            from loraplane.shared.kafka_admin import ensure_topics

            await ensure_topics(s.kafka())
            await self.publisher.start()
        if s.bootstrap:
            registry = secure_or_insecure_aio_channel(
                s.registry_addr, s.tls_files(), server=REGISTRY_ID)
            self._channels.append(registry)
            g._on_incomplete = VersionRepair(registry, g.catalog, token=s.registry_token)
            self._tasks.bootstrap = asyncio.create_task(self._bootstrap(registry))
        else:
            self.bootstrapped.set()
        if s.consume_events:
            self.feeder = ViewFeeder(
                s.kafka(),
                {
                    topics.TENANT_EVENTS: _tenant_events(
                        g.auth, g.catalog, g.quotas.policies if g.quotas else None),
                    topics.ADAPTER_ADMISSIONS: g.catalog.apply_admission,
                    topics.ADAPTER_LIFECYCLE: g.catalog.apply_lifecycle,
                    topics.CACHE_STATE: g.placement.apply_report,
                },
                client_id=s.producer_id.replace("/", "-"),
                on_event=lambda topic: self.metrics.view_events.labels(topic).inc(),
            )
            self._tasks.feeder = asyncio.create_task(self.feeder.run())
            g.auth.loaded = False  # until the replay of tenant.events caught up
            feeder = self.feeder

            async def keys_loaded() -> None:
                await feeder.caught_up.wait()
                g.auth.loaded = True

            self._tasks.keys = asyncio.create_task(keys_loaded())
        if self.prober is not None:
            self._tasks.prober = asyncio.create_task(self.prober.run())
        self._tasks.flusher = asyncio.create_task(
            run_flusher(g.heat, g.prewarm, interval_s=s.heat_flush_interval_s)
        )
        if s.reuse_port:  # join the shared ports once this process can answer
            with contextlib.suppress(TimeoutError):
                await self.wait_ready(s.join_ready_timeout_s)
        expiry = CertExpiry.for_registry(self.metrics.registry)
        edge = (edge_server_credentials(s.edge_tls_cert_file, s.edge_tls_key_file,
                                        expiry=expiry)
                if s.edge_tls_cert_file else None)
        self.grpc = build_grpc_server(g, port=s.grpc_port, host=s.bind_host, credentials=edge,
                                      reuse_port=s.reuse_port)
        await self.grpc.start()
        if s.http_port:
            config = uvicorn.Config(
                create_app(g), host=s.bind_host, port=s.http_port, log_level="warning",
                lifespan="off", access_log=False,
                # edge TLS: the same certificate as the gRPC listener (HTTPS)
                ssl_certfile=s.edge_tls_cert_file or None, ssl_keyfile=s.edge_tls_key_file or None,
            )
            config.load()  # builds the one SSLContext every connection is wrapped with
            if config.ssl is not None:
                self.edge_https = EdgeCertificate(
                    config.ssl, s.edge_tls_cert_file, s.edge_tls_key_file, expiry=expiry)
            self.http = _Uvicorn(config)
            # our own listening socket: SO_REUSEPORT when several processes share the port
            # (uvicorn's own bind sets only SO_REUSEADDR)
            sock = listen_socket(s.bind_host, s.http_port, reuse_port=s.reuse_port)
            self._tasks.http = asyncio.create_task(self.http.serve(sockets=[sock]))
            while not self.http.started:
                if self._tasks.http.done():
                    self._tasks.http.result()  # raises the bind error
                await asyncio.sleep(0.01)
            if self.edge_https is not None:  # watched once it serves (a failed bind leaves none)
                self._tasks.edge_https = asyncio.create_task(
                    self.edge_https.run(s.edge_tls_check_interval_s))

    async def _bootstrap(self, registry: grpc.aio.Channel) -> None:
        s = self.settings
        g = self.gateway
        delay = 0.5
        try:
            while True:
                try:
                    n = await bootstrap_catalog(
                        registry, g.catalog, token=s.registry_token, timeout_s=s.bootstrap_timeout_s
                    )
                    log.info("bootstrapped %d adapters from the registry", n)
                    break
                except grpc.aio.AioRpcError as err:
                    log.warning("registry bootstrap failed (%s); retrying", err.code().name)
                    self.bootstrapped.set()  # serve from events meanwhile
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 10.0)
            try:
                cache = secure_or_insecure_aio_channel(
                    s.cache_manager_addr, s.tls_files(), server=CACHE_MANAGER)
                self._channels.append(cache)
                n = await bootstrap_placement(cache, g.placement, timeout_s=s.bootstrap_timeout_s)
                log.info("bootstrapped %d workers from the cache manager", n)
            except grpc.aio.AioRpcError as err:
                log.warning("cache manager bootstrap failed (%s); placement from events only",
                            err.code().name)
        finally:
            self.bootstrapped.set()

    async def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Wait until bootstrap ended and the views replayed their topics."""
        async def ready() -> None:
            await self.bootstrapped.wait()
            if self.feeder is not None:
                await self.feeder.caught_up.wait()

        await asyncio.wait_for(ready(), timeout_s)

    @property
    def grpc_port(self) -> int:
        """Bound port of the gRPC API."""
        assert self.grpc is not None
        return self.grpc.port

    @property
    def http_port(self) -> int:
        """Bound port of the HTTP API."""
        assert self.http is not None
        return int(self.http.servers[0].sockets[0].getsockname()[1])

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop serving (running streams get ``grace_s``), flush events, close everything."""
        started = time.monotonic()
        if self.http is not None:
            self.http.should_exit = True
        if self.grpc is not None:
            await self.grpc.stop(grace_s)
        if self._tasks.http is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._tasks.http, max(0.1, grace_s - (time.monotonic()
                                                                             - started)))
        for task in (self._tasks.prober, self._tasks.keys, self._tasks.feeder,
                     self._tasks.bootstrap, self._tasks.flusher, self._tasks.edge_https):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        await self.gateway.workers.close()  # type: ignore[attr-defined]
        for ch in self._channels:
            await ch.close()
        if self._own_publisher:
            assert isinstance(self.publisher, KafkaPublisher)
            await self.publisher.stop()
