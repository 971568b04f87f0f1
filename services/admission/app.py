"""The admission process: release consumer + verdict store + metrics server.

:class:`AdmissionApp` wires everything so that ``__main__`` and the tests run the same
thing::

    app = AdmissionApp(AdmissionSettings())
    await app.start()          # pool, topics, quarantine cleanup, consumer, /metrics
    ...
    await app.stop()
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress

import asyncpg
from prometheus_client import REGISTRY, CollectorRegistry

from loraplane.admission.admitter import Admitter
from loraplane.admission.consumer import ReleaseConsumer
from loraplane.admission.metrics import AdmissionMetrics
from loraplane.admission.settings import AdmissionSettings
from loraplane.admission.trust import TrustStore
from loraplane.admission.verdicts import PostgresVerdictStore, VerdictStore
from loraplane.shared.catalogue import load_catalogue
from loraplane.shared.db import create_pool
from loraplane.shared.kafka_admin import create_missing
from loraplane.shared.metrics import start_metrics_server
from loraplane.shared.objectstore import MinioStore, ObjectStore
from loraplane.shared.topics import ADAPTER_ADMISSIONS, ADAPTER_RELEASES, Clock, topic_spec, utc_now

log = logging.getLogger(__name__)


async def ensure_admission_topics(settings: AdmissionSettings, timeout_s: float = 10.0) -> None:
    """Create the release and verdict topics if missing (partition counts and configs of the
    topic table, also for renamed test topics)."""
    await create_missing(settings.kafka(), {
        settings.admission_releases_topic: topic_spec(ADAPTER_RELEASES),
        settings.admission_admissions_topic: topic_spec(ADAPTER_ADMISSIONS),
    }, timeout_s=timeout_s)


class AdmissionApp:
    """One admission process."""

    def __init__(
        self,
        settings: AdmissionSettings,
        *,
        registry: CollectorRegistry = REGISTRY,
        clock: Clock = utc_now,
        serve_metrics: bool = True,
        store: ObjectStore | None = None,
        verdicts: VerdictStore | None = None,
    ) -> None:
        """``serve_metrics``: start the ``/metrics`` HTTP server (off in tests); ``store`` /
        ``verdicts`` replace the S3 client / Postgres verdict table (tests)."""
        self.settings = settings
        self.registry = registry
        self.clock = clock
        self.serve_metrics = serve_metrics
        self.metrics = AdmissionMetrics.for_registry(registry)
        self._store = store
        self._verdicts = verdicts
        self.pool: asyncpg.Pool | None = None
        self.admitter: Admitter | None = None
        self.consumer: ReleaseConsumer | None = None
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Load the catalogue, open the pool, create topics, start consuming."""
        s = self.settings
        catalogue = load_catalogue(s.admission_catalogue_path)  # fail fast on a bad file
        verdicts = self._verdicts
        if verdicts is None:
            self.pool = await create_pool(s.postgres_dsn, max_size=4)
            verdicts = PostgresVerdictStore(self.pool)
        store = self._store or MinioStore(s.s3_endpoint, s.s3_access_key, s.s3_secret_key,
                                          secure=s.s3_secure, ca_file=s.s3_ca_file)
        self.admitter = Admitter(
            settings=s, store=store, verdicts=verdicts, catalogue=catalogue,
            trust=TrustStore(s.admission_platform_keys_dir, s.admission_tenant_keys_dir),
            metrics=self.metrics, clock=self.clock,
        )
        self.admitter.clear_quarantine()
        try:
            await ensure_admission_topics(s)
        except Exception as exc:  # noqa: BLE001 - the consumer retries until the broker is up
            log.warning("could not create topics now (%s); consuming anyway", exc)
        self.consumer = ReleaseConsumer(admitter=self.admitter, settings=s, metrics=self.metrics)
        self._tasks = [asyncio.create_task(self.consumer.run(self._stop),
                                           name="release-consumer")]
        if self.serve_metrics:
            start_metrics_server(s.admission_metrics_port, addr=s.admission_bind,
                                 registry=self.registry)
        keys = self.admitter.trust.keys_for("")
        if not keys:
            log.warning("no platform signing key in %s: only tenant keys are trusted "
                        "(`loraplane demo build` writes the dev key)",
                        s.admission_platform_keys_dir)
        log.info("admission consuming %s as %s; %d platform key(s), catalogue: %s",
                 s.admission_releases_topic, s.admission_consumer_group, len(keys),
                 ", ".join(sorted(catalogue.base_models)))

    async def stop(self) -> None:
        """Stop consuming (the verdict in progress is finished or abandoned uncommitted)."""
        self._stop.set()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=15)
            for task in pending:
                task.cancel()
                with suppress(asyncio.CancelledError, Exception):
                    await task
        if self.pool is not None:
            await self.pool.close()
        log.info("admission stopped")
