"""``python -m loraplane.cache_manager``: one cache-manager instance (leader or standby).

Environment: ``LORAPLANE_CACHE_MANAGER_*`` (see :mod:`loraplane.cache_manager.settings`)
plus the common ``LORAPLANE_POSTGRES_DSN`` / ``LORAPLANE_KAFKA_BOOTSTRAP``. Start two
for failover: the second stands by until the first dies. ``--help`` lists every
variable (generated from :class:`CacheManagerSettings`) and where the rules, policy and
migrations resolve; no other argument is taken (:mod:`loraplane.shared.service_cli`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Sequence

from loraplane.cache_manager.grpc_api import AUTHZ_RULES, CacheManagerApi
from loraplane.cache_manager.leaders import ShardedCacheManager
from loraplane.cache_manager.metrics import CacheMetrics
from loraplane.cache_manager.page import create_page_app, page_server
from loraplane.cache_manager.rules import DEFAULT_RULES_PATH, RulesConfig, load_rules
from loraplane.cache_manager.settings import CacheManagerSettings
from loraplane.policy.config import DEFAULT_CONFIG_PATH, PolicyConfig, load_config
from loraplane.shared.grpcutil import Service, build_server
from loraplane.shared.kafka_admin import ensure_topics
from loraplane.shared.metrics import start_metrics_server
from loraplane.shared.resources import migrations_dir
from loraplane.shared.service_cli import ShippedFile, parse_service_args
from loraplane.shared.tls import count_handshake_refusals, server_security
from loraplane.v1 import cache_pb2_grpc

log = logging.getLogger("loraplane.cache_manager")

SUMMARY = """The cache manager: plans which adapter versions are HOT, WARM or COLD on which
worker (the cache policy plus the business rules) and commands the workers over Kafka.
One leader per deployment, or per base model with LORAPLANE_CACHE_MANAGER_SHARDS
(PostgreSQL advisory locks); further instances stand by."""


async def serve(
    settings: CacheManagerSettings, rules: RulesConfig, policy_config: PolicyConfig
) -> None:
    """Serve ``/metrics`` and the read API, and stand by / lead until SIGINT or SIGTERM."""
    start_metrics_server(settings.cache_manager_metrics_port, addr=settings.cache_manager_bind)
    service = ShardedCacheManager(settings, rules, policy_config)
    api = CacheManagerApi(lambda: service.core, settings.instance, cores=service.cores)
    credentials, interceptors = server_security(settings.tls_files(), AUTHZ_RULES)
    server = build_server(
        [Service(cache_pb2_grpc.add_CacheManagerServicer_to_server, api,
                 "loraplane.v1.CacheManager")],
        port=settings.cache_manager_grpc_port, host=settings.cache_manager_bind,
        credentials=credentials, interceptors=interceptors,
    )
    await server.start()
    page_task: asyncio.Task[None] | None = None
    page = None
    if settings.cache_manager_page_port:
        requests = CacheMetrics.for_registry().page_requests
        page = page_server(
            create_page_app(lambda: service.core,
                            token=settings.registry_operator_token.get_secret_value(),
                            instance=settings.instance,
                            count=lambda path, code: requests.labels(path, str(code)).inc()),
            settings.cache_manager_bind, settings.cache_manager_page_port)
        page_task = asyncio.create_task(page.serve())
        while not page.started:
            if page_task.done():
                page_task.result()  # raises the bind error
                raise RuntimeError(f"placement page did not start on port "
                                   f"{settings.cache_manager_page_port}")
            await asyncio.sleep(0.01)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("cache manager %s: gRPC on %s:%d, metrics on %d, placement page on %s, policy %s",
             settings.instance, settings.cache_manager_bind, server.port,
             settings.cache_manager_metrics_port,
             settings.cache_manager_page_port or "off", rules.policy)
    try:
        while not stop.is_set():
            try:
                await ensure_topics(settings.kafka())
                break
            except Exception as exc:  # noqa: BLE001 - broker not up yet: retry
                log.info("waiting for Kafka: %s", exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=1.0)
        await service.run(stop)
    finally:
        if page is not None and page_task is not None:
            page.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(page_task, 5)
        await server.stop(settings.cache_manager_grace_s)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point; exit 2 on an argument (``--help`` aside)."""
    parse_service_args(
        argv, prog="python -m loraplane.cache_manager", summary=SUMMARY,
        settings=CacheManagerSettings,
        files=[ShippedFile("rules", DEFAULT_RULES_PATH,
                           "when LORAPLANE_CACHE_MANAGER_RULES_FILE is unset"),
               ShippedFile("policy", DEFAULT_CONFIG_PATH,
                           "when the rules' policy_config is null"),
               ShippedFile("migrations", migrations_dir(),
                           "its schema, applied by `loraplane db migrate` with dbmate")],
    )
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    settings = CacheManagerSettings()
    if settings.tls_cert_file:  # it also dials the workers and the registry over mTLS
        count_handshake_refusals("cache-manager", dials_tls=True)
    rules = load_rules(settings.cache_manager_rules_file)
    policy_config = load_config(rules.policy_config)
    asyncio.run(serve(settings, rules, policy_config))


if __name__ == "__main__":
    main()
