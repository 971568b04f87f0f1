"""Consume ``adapter.releases``, publish one verdict per release, commit after the publish.

Per record: decode → :meth:`Admitter.decide` (stored verdict) → publish the
``AdmissionEvent`` keyed by adapter id (acks=all) → commit the record's offset. Partitions
are handled concurrently (bounded by ``admission_concurrency``), records of one partition
in order. Any failure of Kafka, S3 or Postgres abandons the records in flight without
committing; the consumer and producer are recreated after a backoff and the release is
decided (or its stored verdict republished) again.

The loop (start, restart with backoff, the broker-lost probe every
``admission_probe_interval_s``, commits, readiness) is
:class:`loraplane.shared.consumer.ConsumerLoop`; this module is the handler.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from aiokafka import AIOKafkaProducer

from loraplane.admission.admitter import Admitter, DependencyDown
from loraplane.admission.metrics import AdmissionMetrics
from loraplane.admission.settings import AdmissionSettings
from loraplane.shared.aio import close_within
from loraplane.shared.codec import CodecError, decode_as, encode, kafka_headers
from loraplane.shared.consumer import Consumer, ConsumerLoop, group_consumer
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
        consumer_factory: Callable[[], Consumer] | None = None,
        producer_factory: Callable[[], VerdictProducer] | None = None,
    ) -> None:
        """Factories default to real aiokafka clients built from ``settings``."""
        self.admitter = admitter
        self.settings = settings
        self.metrics = metrics
        self._producer_factory = producer_factory or self._default_producer
        self._producer: VerdictProducer | None = None
        self.outcomes: dict[str, int] = {}
        """Count of record outcomes: ``decided``, ``replayed``, ``skipped`` (tests)."""
        self.loop = ConsumerLoop(
            "release", factory=consumer_factory or self._default_consumer,
            on_record=self._decide, lane=lambda tp, _record: tp,
            concurrency=settings.admission_concurrency, max_pending=50, max_records=50,
            cancel_in_flight=True,
            on_open=self._open, on_close=self._close, on_error=self._failed,
            probe_interval_s=settings.admission_probe_interval_s,
        )
        self.ready = self.loop.ready
        """Set once a consumer has joined and fetched at least once."""

    @property
    def consumers_started(self) -> int:
        """Consumers started so far (more than one after a restart)."""
        return self.loop.consumers_started

    def _default_consumer(self) -> Consumer:
        s = self.settings
        return group_consumer(s.admission_releases_topic, kafka=s.kafka(),
                              group_id=s.admission_consumer_group,
                              client_id="loraplane-admission", max_poll_interval_ms=600_000)

    def _default_producer(self) -> VerdictProducer:
        producer: VerdictProducer = AIOKafkaProducer(
            **self.settings.kafka().client_args(), acks="all",
            client_id="loraplane-admission", request_timeout_ms=10_000)
        return producer

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set; survives broker, S3 and database outages."""
        await self.loop.run(stop)

    async def _open(self, _consumer: object) -> None:
        # kept before its start, so a start that fails or times out is still closed
        self._producer = self._producer_factory()
        await self._producer.start()

    async def _close(self, _consumer: object) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await close_within(producer.stop(), 5, "verdict producer stop")

    def _failed(self, exc: BaseException) -> None:
        self.metrics.consumer_restarts.inc()
        if isinstance(exc, DependencyDown):
            self.metrics.retries.labels(exc.dependency).inc()

    async def _decide(self, record: Any) -> None:
        assert self._producer is not None
        await self.handle(record, self._producer)

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

