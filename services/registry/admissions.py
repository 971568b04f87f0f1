"""Admission verdicts in the registry: :func:`apply_verdict` (the domain operation) and
the consumer of ``adapter.admissions`` that applies each one.

Each verdict is applied in one transaction together with its event id
(:mod:`loraplane.shared.dedupe`), and the offset is committed only afterwards, so a
redelivered or duplicated verdict changes nothing. A database failure stops the
batch without committing; the consumer is recreated and reads the verdicts again.
Start, restart with backoff, the broker-lost probe (every ``probe_interval_s``) and the
commits are :class:`loraplane.shared.consumer.ConsumerLoop`'s; this module is the handler.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC
from typing import Any

import asyncpg

from loraplane.registry import audit
from loraplane.registry.convert import reasons_json
from loraplane.registry.metrics import RegistryMetrics
from loraplane.registry.status import Status
from loraplane.registry.versions import version_json, version_row
from loraplane.shared.codec import CodecError, decode_as
from loraplane.shared.consumer import Consumer, ConsumerLoop, group_consumer
from loraplane.shared.db import transaction
from loraplane.shared.dedupe import claim
from loraplane.shared.errors import InvalidArgument
from loraplane.shared.kafka_client import KafkaConnection
from loraplane.shared.topics import ADAPTER_ADMISSIONS, event_meta
from loraplane.v1 import events_pb2

log = logging.getLogger(__name__)

ADMISSIONS_CONSUMER = "registry.admissions"
"""``processed_events.consumer`` of the admission verdict consumer."""


async def apply_verdict(
    conn: asyncpg.Connection, *, event: events_pb2.AdmissionEvent, actor: str = "system/admission"
) -> str:
    """Apply an admission verdict idempotently; returns what happened:

    ``applied``, ``duplicate`` (event id seen before), ``unknown_version``,
    ``digest_mismatch`` (verdict about other content), ``not_pending`` (already
    decided or retired), ``empty`` (no verdict set). Only ``applied`` changes state.
    """
    arm = event.WhichOneof("verdict")
    if arm is None:
        return "empty"
    verdict = getattr(event, arm)
    meta = verdict.meta
    if not await claim(conn, ADMISSIONS_CONSUMER, meta.event_id):
        return "duplicate"
    ref = meta.adapter
    adapter_id = f"{ref.tenant_id}/{ref.adapter_name}"
    if not await conn.fetchval("SELECT 1 FROM adapters WHERE adapter_id = $1", adapter_id):
        return "unknown_version"
    await conn.execute("SELECT 1 FROM adapters WHERE adapter_id = $1 FOR UPDATE", adapter_id)
    row = await version_row(conn, ref.tenant_id, ref.adapter_name, ref.version)
    if row is None:
        return "unknown_version"
    if row["sha256"] != verdict.sha256:
        return "digest_mismatch"
    if row["status"] != Status.PENDING.value:
        return "not_pending"
    if arm == "admitted":
        await conn.execute(
            "UPDATE adapter_versions SET status = 'admitted', admitted_at = coalesce($3, now()), "
            "reasons = '[]' WHERE adapter_id = $1 AND version = $2",
            adapter_id, ref.version,
            meta.occurred_at.ToDatetime(tzinfo=UTC) if meta.HasField("occurred_at") else None,
        )
        action = "version.admit"
    else:
        await conn.execute(
            "UPDATE adapter_versions SET status = 'rejected', reasons = $3 "
            "WHERE adapter_id = $1 AND version = $2",
            adapter_id, ref.version, reasons_json(verdict.reasons),
        )
        action = "version.reject"
    after = await version_row(conn, ref.tenant_id, ref.adapter_name, ref.version)
    await audit.write(conn, actor=actor, action=action,
                      subject=audit.subject_version(ref.tenant_id, ref.adapter_name, ref.version),
                      before=version_json(row),
                      after={**version_json(after), "event_id": meta.event_id})
    return "applied"


class AdmissionConsumer:
    """Reads ``adapter.admissions`` and applies each verdict exactly once."""

    def __init__(
        self,
        *,
        pool: asyncpg.Pool,
        kafka: KafkaConnection,
        group_id: str,
        metrics: RegistryMetrics | None = None,
        consumer_factory: Callable[[], Consumer] | None = None,
        probe_interval_s: float = 2.0,
        actor: str = "system/admission",
        topic: str = ADAPTER_ADMISSIONS,
    ) -> None:
        """``group_id``: the consumer group (all registry replicas share one); ``topic``:
        where verdicts arrive (``adapter.admissions``, prefixed in isolated tests)."""
        self.pool = pool
        self.kafka = kafka
        self.group_id = group_id
        self.metrics = metrics or RegistryMetrics.for_registry()
        self.probe_interval_s = probe_interval_s
        self.actor = actor
        self.topic = topic
        self.outcomes: dict[str, int] = {}
        """Count of :func:`apply_verdict` outcomes (tests, debugging)."""
        self.loop = ConsumerLoop(
            "admission", factory=consumer_factory or self._default_consumer,
            on_record=self._apply, probe_interval_s=probe_interval_s,
            on_error=lambda _exc: self.metrics.consumer_restarts.inc(),
        )
        self.ready = self.loop.ready
        """Set once a consumer has joined and fetched at least once."""

    @property
    def consumers_started(self) -> int:
        """Consumers started so far (more than one after a restart)."""
        return self.loop.consumers_started

    def _default_consumer(self) -> Consumer:
        return group_consumer(self.topic, kafka=self.kafka, group_id=self.group_id,
                              client_id="loraplane-registry-admissions")

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set; survives broker and database outages."""
        await self.loop.run(stop)

    async def _apply(self, record: Any) -> None:
        await self.handle(record)

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
                outcome = await apply_verdict(conn, event=event, actor=self.actor)
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
