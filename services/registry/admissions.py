"""Consumer of ``adapter.admissions``: applies admission verdicts to the registry.

Each verdict is applied in one transaction together with its event id
(:mod:`loraplane.shared.dedupe`), and the offset is committed only afterwards, so a
redelivered or duplicated verdict changes nothing. A database failure stops the
batch without committing; the consumer is recreated and reads the verdicts again.

aiokafka consumers must be recreated after a broker loss (a rejoined consumer may
silently receive nothing): a probe asks the broker for metadata every
``probe_interval_s``; after a failed probe, the next successful one restarts the
consumer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer

from loraplane.registry import service
from loraplane.registry.metrics import RegistryMetrics
from loraplane.shared.codec import CodecError, decode_as
from loraplane.shared.db import transaction
from loraplane.shared.errors import InvalidArgument
from loraplane.shared.kafka_admin import GROUP_TUNING, BrokerLost
from loraplane.shared.outbox import backoff_delay, interruptible_sleep
from loraplane.shared.topics import ADAPTER_ADMISSIONS, event_meta
from loraplane.v1 import events_pb2

log = logging.getLogger(__name__)

class AdmissionConsumer:
    """Reads ``adapter.admissions`` and applies each verdict exactly once."""

    def __init__(
        self,
        *,
        pool: asyncpg.Pool,
        bootstrap: str,
        group_id: str,
        metrics: RegistryMetrics | None = None,
        consumer_factory: Callable[[], AIOKafkaConsumer] | None = None,
        probe_interval_s: float = 2.0,
        actor: str = "system/admission",
        topic: str = ADAPTER_ADMISSIONS,
    ) -> None:
        """``group_id``: the consumer group (all registry replicas share one); ``topic``:
        where verdicts arrive (``adapter.admissions``, prefixed in isolated tests)."""
        self.pool = pool
        self.bootstrap = bootstrap
        self.group_id = group_id
        self.metrics = metrics or RegistryMetrics.for_registry()
        self.probe_interval_s = probe_interval_s
        self.actor = actor
        self.topic = topic
        self._factory = consumer_factory or self._default_consumer
        self.consumers_started = 0
        """Consumers started so far (more than one after a restart)."""
        self.outcomes: dict[str, int] = {}
        """Count of :func:`service.apply_verdict` outcomes (tests, debugging)."""
        self.ready = asyncio.Event()
        """Set once a consumer has joined and fetched at least once."""

    def _default_consumer(self) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            self.topic,
            bootstrap_servers=self.bootstrap,
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            client_id="loraplane-registry-admissions",
            **GROUP_TUNING,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set; survives broker and database outages."""
        attempt = 0
        while not stop.is_set():
            consumer = self._factory()
            try:
                await consumer.start()
                self.consumers_started += 1
                await self._consume(consumer, stop)
                attempt = 0
            except asyncio.CancelledError:
                raise
            except BrokerLost:
                log.info("admission consumer: broker is back, recreating the consumer")
                self.metrics.consumer_restarts.inc()
                attempt = 0
            except Exception as exc:  # noqa: BLE001 - outage: back off, recreate
                delay = backoff_delay(attempt)
                attempt += 1
                self.metrics.consumer_restarts.inc()
                log.warning("admission consumer: %s: %s; restarting in %.1fs",
                            type(exc).__name__, exc, delay)
                await interruptible_sleep(stop, None, delay)
            finally:
                try:
                    await asyncio.wait_for(consumer.stop(), 5)
                except Exception as exc:  # noqa: BLE001
                    log.debug("consumer stop failed: %s", exc)

    async def _consume(self, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> None:
        lost = False
        next_probe = time.monotonic() + self.probe_interval_s
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=300, max_records=100)
            self.ready.set()
            for tp, records in batch.items():
                for record in records:
                    await self.handle(record)
                await consumer.commit({tp: records[-1].offset + 1})
            if time.monotonic() >= next_probe:
                next_probe = time.monotonic() + self.probe_interval_s
                try:
                    await asyncio.wait_for(consumer.topics(), 3)
                except Exception as exc:  # noqa: BLE001 - the broker is unreachable
                    if not lost:
                        log.warning("admission consumer: broker unreachable (%s)", exc)
                    lost = True
                    continue
                if lost:
                    raise BrokerLost()

    async def handle(self, record: Any) -> str:
        """Apply one record; returns the outcome (also counted in metrics)."""
        try:
            event = decode_as(events_pb2.AdmissionEvent, record.value, record.headers)
        except CodecError as exc:
            log.warning("admission consumer: skipping undecodable record at %s:%s: %s",
                        record.partition, record.offset, exc)
            return self._count("malformed")
        try:
            async with transaction(self.pool) as conn:
                outcome = await service.apply_verdict(conn, event=event, actor=self.actor)
        except InvalidArgument as exc:
            log.warning("admission consumer: invalid verdict: %s", exc)
            return self._count("invalid")
        if outcome == "applied":
            meta = event_meta(event)
            action = "version.admit" if event.WhichOneof("verdict") == "admitted" else \
                "version.reject"
            ref = meta.adapter if meta is not None else None
            if ref is not None:
                log.info("%s %s/%s@%s", action, ref.tenant_id, ref.adapter_name, ref.version)
            self.metrics.state_changes.labels(
                action, ref.tenant_id if ref else "", ref.base_model if ref else ""
            ).inc()
        elif outcome not in ("duplicate",):
            log.info("admission verdict ignored: %s", outcome)
        return self._count(outcome)

    def _count(self, outcome: str) -> str:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        self.metrics.verdicts.labels(outcome).inc()
        return outcome
