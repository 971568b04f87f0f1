"""Consume ``adapter.releases``, publish one verdict per release, commit after the publish.

Per record: decode → :meth:`Admitter.decide` (stored verdict) → publish the
``AdmissionEvent`` keyed by adapter id (acks=all) → commit the record's offset. Partitions
are handled concurrently (bounded by ``admission_concurrency``), records of one partition
in order. Any failure of Kafka, S3 or Postgres abandons the batch without committing; the
consumer and producer are recreated after a backoff and the release is decided (or its
stored verdict republished) again.

aiokafka consumers must be recreated after a broker loss (a rejoined consumer may silently
receive nothing, see FACTS.md): a probe asks the broker for metadata every
``admission_probe_interval_s``; after a failed probe, the next successful one restarts the
consumer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from loraplane.admission.metrics import AdmissionMetrics
from loraplane.admission.service import Admitter, DependencyDown
from loraplane.admission.settings import AdmissionSettings
from loraplane.shared.codec import CodecError, decode_as, encode, kafka_headers
from loraplane.shared.consumer import BrokerLost, backoff_delay, interruptible_sleep
from loraplane.shared.kafka_admin import GROUP_TUNING
from loraplane.shared.topics import ADAPTER_ADMISSIONS, topic_spec
from loraplane.v1 import events_pb2

log = logging.getLogger(__name__)

class VerdictProducer(Protocol):
    """The part of ``AIOKafkaProducer`` used to publish verdicts."""

    async def start(self) -> None:
        """Connect."""

    async def stop(self) -> None:
        """Flush and disconnect."""

    async def send_and_wait(self, topic: str, value: bytes | None = None,
                            key: bytes | None = None, *,
                            headers: list[tuple[str, bytes]] | None = None) -> Any:
        """Send one record and wait for the broker's acknowledgement."""


class ReleaseConsumer:
    """Reads release events and publishes one verdict for each."""

    def __init__(
        self,
        *,
        admitter: Admitter,
        settings: AdmissionSettings,
        metrics: AdmissionMetrics,
        consumer_factory: Callable[[], AIOKafkaConsumer] | None = None,
        producer_factory: Callable[[], VerdictProducer] | None = None,
    ) -> None:
        """Factories default to real aiokafka clients built from ``settings``."""
        self.admitter = admitter
        self.settings = settings
        self.metrics = metrics
        self._consumer_factory = consumer_factory or self._default_consumer
        self._producer_factory = producer_factory or self._default_producer
        self._slots = asyncio.Semaphore(settings.admission_concurrency)
        self.consumers_started = 0
        """Consumers started so far (more than one after a restart)."""
        self.outcomes: dict[str, int] = {}
        """Count of record outcomes: ``decided``, ``replayed``, ``skipped`` (tests)."""
        self.ready = asyncio.Event()
        """Set once a consumer has joined and fetched at least once."""

    def _default_consumer(self) -> AIOKafkaConsumer:
        s = self.settings
        return AIOKafkaConsumer(
            s.admission_releases_topic,
            bootstrap_servers=s.kafka_bootstrap,
            group_id=s.admission_consumer_group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            client_id="loraplane-admission",
            max_poll_interval_ms=600_000,
            **GROUP_TUNING,
        )

    def _default_producer(self) -> VerdictProducer:
        producer: VerdictProducer = AIOKafkaProducer(
            bootstrap_servers=self.settings.kafka_bootstrap, acks="all",
            client_id="loraplane-admission", request_timeout_ms=10_000)
        return producer

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set; survives broker, S3 and database outages."""
        attempt = 0
        while not stop.is_set():
            consumer = self._consumer_factory()
            producer = self._producer_factory()
            try:
                await producer.start()
                await consumer.start()
                self.consumers_started += 1
                await self._consume(consumer, producer, stop)
                attempt = 0
            except asyncio.CancelledError:
                raise
            except BrokerLost:
                log.info("release consumer: broker is back, recreating the consumer")
                self.metrics.consumer_restarts.inc()
                attempt = 0
            except Exception as exc:  # noqa: BLE001 - outage: back off, recreate
                if isinstance(exc, ExceptionGroup):  # from the per-partition task group
                    exc = exc.exceptions[0]
                delay = backoff_delay(attempt)
                attempt += 1
                self.metrics.consumer_restarts.inc()
                if isinstance(exc, DependencyDown):
                    self.metrics.retries.labels(exc.dependency).inc()
                log.warning("release consumer: %s: %s; restarting in %.1fs",
                            type(exc).__name__, exc, delay)
                await interruptible_sleep(stop, None, delay)
            finally:
                for client in (consumer, producer):
                    try:
                        await asyncio.wait_for(client.stop(), 5)
                    except Exception as exc:  # noqa: BLE001
                        log.debug("client stop failed: %s", exc)

    async def _consume(self, consumer: AIOKafkaConsumer, producer: VerdictProducer,
                       stop: asyncio.Event) -> None:
        lost = False
        next_probe = time.monotonic() + self.settings.admission_probe_interval_s
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=300, max_records=50)
            self.ready.set()
            if batch:
                async with asyncio.TaskGroup() as group:
                    for tp, records in batch.items():
                        group.create_task(self._partition(consumer, producer, tp, records))
            if time.monotonic() >= next_probe:
                next_probe = time.monotonic() + self.settings.admission_probe_interval_s
                try:
                    await asyncio.wait_for(consumer.topics(), 3)
                except Exception as exc:  # noqa: BLE001 - the broker is unreachable
                    if not lost:
                        log.warning("release consumer: broker unreachable (%s)", exc)
                    lost = True
                    continue
                if lost:
                    raise BrokerLost()

    async def _partition(self, consumer: AIOKafkaConsumer, producer: VerdictProducer,
                         tp: Any, records: list[Any]) -> None:
        for record in records:
            async with self._slots:
                await self.handle(record, producer)
            await consumer.commit({tp: record.offset + 1})

    async def handle(self, record: Any, producer: VerdictProducer) -> str:
        """Decide one record and publish its verdict; returns the outcome."""
        try:
            release = decode_as(events_pb2.AdapterReleased, record.value, record.headers)
        except CodecError as exc:
            log.warning("release consumer: skipping undecodable record at %s:%s: %s",
                        record.partition, record.offset, exc)
            return self._skip("undecodable")
        ref = release.meta.adapter
        if not (ref.tenant_id and ref.adapter_name and ref.version and release.meta.event_id):
            log.warning("release consumer: skipping release without a full adapter ref at "
                        "%s:%s", record.partition, record.offset)
            return self._skip("incomplete")
        event, new = await self.admitter.decide(release)
        await self.publish(producer, event)
        outcome = "decided" if new else "replayed"
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        return outcome

    async def publish(self, producer: VerdictProducer, event: events_pb2.AdmissionEvent) -> None:
        """Send ``event`` keyed by adapter id and wait for the acknowledgement."""
        key = topic_spec(ADAPTER_ADMISSIONS).key_bytes(event)
        body, headers = encode(event)
        await producer.send_and_wait(self.settings.admission_admissions_topic, body, key,
                                     headers=kafka_headers(headers))

    def _skip(self, reason: str) -> str:
        self.metrics.skipped.labels(reason).inc()
        self.outcomes["skipped"] = self.outcomes.get("skipped", 0) + 1
        return "skipped"

