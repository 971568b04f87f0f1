"""The registry process: gRPC admin server, outbox relay and admission consumer.

:class:`RegistryApp` wires them together so that ``__main__`` and the tests run the
same thing::

    app = RegistryApp(RegistrySettings())
    await app.start()          # pool, topics, gRPC server, relay, consumer
    ...
    await app.stop()           # NOT_SERVING, drain RPCs, stop relay and consumer
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress

import asyncpg
from prometheus_client import REGISTRY, CollectorRegistry

from loraplane.registry.admissions import AdmissionConsumer
from loraplane.registry.auth import ADMIN_SERVICE, OperatorAuth, admin_rules
from loraplane.registry.grpc_api import RegistryAdminServicer
from loraplane.registry.metrics import RegistryMetrics
from loraplane.registry.settings import RegistrySettings
from loraplane.shared.db import create_pool
from loraplane.shared.grpcutil import (
    GrpcServer,
    Service,
    build_server,
)
from loraplane.shared.kafka_admin import ensure_topics
from loraplane.shared.metrics import RpcMetrics, start_metrics_server
from loraplane.shared.outbox import OutboxRelay, PublishedRow
from loraplane.shared.tls import AuthzInterceptor, CertExpiry
from loraplane.shared.topics import ADAPTER_ADMISSIONS, Clock, utc_now
from loraplane.v1 import registry_pb2_grpc

log = logging.getLogger(__name__)


class RegistryApp:
    """One registry process."""

    def __init__(
        self,
        settings: RegistrySettings,
        *,
        registry: CollectorRegistry = REGISTRY,
        clock: Clock = utc_now,
        serve_metrics: bool = True,
        on_published: list[PublishedRow] | None = None,
    ) -> None:
        """``serve_metrics``: start the ``/metrics`` HTTP server (off in tests);
        ``on_published``: a list the relay appends published rows to (bench, tests)."""
        token = settings.registry_operator_token.get_secret_value()
        if not token:
            raise ValueError("LORAPLANE_REGISTRY_OPERATOR_TOKEN is not set")
        self.settings = settings
        self.registry = registry
        self.clock = clock
        self.serve_metrics = serve_metrics
        self._auth = OperatorAuth(token)
        self._published_sink = on_published
        self.metrics = RegistryMetrics.for_registry(registry)
        self.pool: asyncpg.Pool | None = None
        self.server: GrpcServer | None = None
        self.relay: OutboxRelay | None = None
        self.consumer: AdmissionConsumer | None = None
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def port(self) -> int:
        """Bound gRPC port."""
        assert self.server is not None
        return self.server.port

    @property
    def address(self) -> str:
        """``host:port`` clients dial."""
        host = self.settings.registry_bind
        return f"{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{self.port}"

    async def start(self) -> None:
        """Open the pool, create missing topics, start serving and the background loops."""
        s = self.settings
        self.pool = await create_pool(s.postgres_dsn)
        try:
            await ensure_topics(s.kafka(), prefix=s.registry_topic_prefix, timeout_s=5)
        except Exception as exc:  # noqa: BLE001 - the relay retries before publishing
            log.warning("could not create topics now (%s); the relay will retry", exc)
        servicer = RegistryAdminServicer(
            pool=self.pool, bucket=s.artifact_bucket, producer=s.producer,
            metrics=self.metrics, clock=self.clock, topic_prefix=s.registry_topic_prefix,
            canary_clearance=s.registry_canary_clearance,
        )
        files = s.tls_files()
        credentials = (files.server_credentials(CertExpiry.for_registry(self.registry))
                       if files is not None else None)
        self.server = build_server(
            [Service(registry_pb2_grpc.add_RegistryAdminServicer_to_server, servicer,
                     ADMIN_SERVICE)],
            port=s.registry_grpc_port,
            host=s.registry_bind,
            interceptors=[AuthzInterceptor(admin_rules(self._auth), registry=self.registry)],
            metrics=RpcMetrics.for_registry(self.registry),
            credentials=credentials,
        )
        await self.server.start()
        sink = self._published_sink
        self.relay = OutboxRelay(
            dsn=s.postgres_dsn,
            kafka=s.kafka(),
            batch_size=s.registry_relay_batch,
            poll_interval_s=s.registry_relay_poll_s,
            registry=self.registry,
            on_published=sink.append if sink is not None else None,
            ensure=None,
            ensure_prefix=s.registry_topic_prefix,
        )
        self.consumer = AdmissionConsumer(
            pool=self.pool, kafka=s.kafka(), group_id=s.registry_consumer_group,
            metrics=self.metrics, topic=s.registry_topic_prefix + ADAPTER_ADMISSIONS,
        )
        self._tasks = [
            asyncio.create_task(self.relay.run(self._stop), name="outbox-relay"),
            asyncio.create_task(self.consumer.run(self._stop), name="admission-consumer"),
        ]
        if self.serve_metrics:
            start_metrics_server(s.registry_metrics_port, addr=s.registry_bind,
                                 registry=self.registry)
        log.info("registry serving on %s:%s", s.registry_bind, self.server.port)

    async def stop(self) -> None:
        """Graceful stop: NOT_SERVING, finish in-flight RPCs, stop relay and consumer."""
        if self.server is not None:
            await self.server.stop(self.settings.registry_grace_s)
        self._stop.set()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=15)
            for task in pending:
                task.cancel()
                with suppress(asyncio.CancelledError, Exception):
                    await task
        if self.pool is not None:
            await self.pool.close()
        log.info("registry stopped")
