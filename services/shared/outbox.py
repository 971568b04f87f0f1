"""Transactional outbox: events are written with the state change, a relay publishes them.

Writing (inside the caller's transaction, so the event exists iff the change commits)::

    async with transaction(pool) as conn:
        await conn.execute("update ...")
        await enqueue(conn, lifecycle_event, tenant_id="acme", base_model="tiny")

Publishing (one :class:`OutboxRelay` per service process; one of them is active)::

    relay = OutboxRelay(dsn=settings.postgres_dsn, kafka=settings.kafka())
    task = asyncio.create_task(relay.run(stop_event))

Guarantees and limits:

* **At-least-once.** A row is marked published only after the broker acknowledged it
  (``acks=all``). A crash between the ack and the mark sends it again: consumers
  deduplicate on ``meta.event_id`` (see :mod:`loraplane.shared.dedupe`). The
  producer is not idempotent (Tansu refuses ``enable_idempotence``).
* **Order per key.** Rows are sent in ``id`` order by a single active relay (a
  PostgreSQL advisory lock elects it; other replicas wait on standby). Writers that
  change the same entity lock it before enqueueing, so ``id`` order is commit order
  per key. When a send fails, only the rows before the first failure are marked;
  that row and every later one are sent again after a new producer is created.
* **Broker outage.** Rows wait in the table; the relay drops its producer after a
  failure, backs off (``backoff_delay``) and starts a fresh producer, as aiokafka
  clients must be recreated after a broker loss. Nothing is lost while the broker is
  down, and nothing blocks the writers.
* **Latency.** Writers ``NOTIFY`` the relay (delivered at commit), so events leave
  within milliseconds; the relay also polls every ``poll_interval_s`` in case a
  notification is missed.

Kafka record: value = serialized protobuf, key = the topic's key of the message
(:mod:`loraplane.shared.topics`), headers = the codec headers (``content-type``,
``x-proto-type``, ``x-event-id``) of :mod:`loraplane.shared.codec`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import asyncpg
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from google.protobuf.message import Message
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from loraplane.shared import db
from loraplane.shared.aio import close_within
from loraplane.shared.codec import (
    CONTENT_TYPE,
    HEADER_CONTENT_TYPE,
    HEADER_EVENT_ID,
    HEADER_PROTO_TYPE,
    encode,
)
from loraplane.shared.consumer import backoff_delay, interruptible_sleep
from loraplane.shared.kafka_admin import ensure_topics
from loraplane.shared.kafka_client import KafkaConnection
from loraplane.shared.metrics import PerRegistry
from loraplane.shared.topics import event_meta, topic_for, topic_spec

log = logging.getLogger(__name__)

NOTIFY_CHANNEL = "loraplane_outbox"
"""PostgreSQL channel notified (at commit) when rows are added."""
RELAY_LOCK_ID = 0x6C6F7261_6F757462  # "loraoutb": advisory lock held by the active relay
"""Advisory lock key electing the single active relay of a database."""

PUBLISH_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
)
"""Buckets (seconds) of the enqueue → broker-ack latency; outages reach minutes."""


class OutboxError(ValueError):
    """A message cannot be written to the outbox (no envelope / event id). A bug."""

    retriable = False


async def enqueue(
    conn: asyncpg.Connection,
    msg: Message,
    *,
    topic: str | None = None,
    topic_prefix: str = "",
    tenant_id: str = "",
    base_model: str = "",
) -> int:
    """Write ``msg`` to the outbox in the caller's transaction; returns the row id.

    ``topic`` defaults to the topic carrying the message type; the Kafka key is the
    topic's key of the message and the event id its ``meta.event_id`` (required).
    ``topic_prefix`` is prepended to the topic name (an isolated namespace, e.g. per
    test: ``"t1234."``). ``tenant_id`` / ``base_model`` only label the lag metrics.
    """
    spec = topic_spec(topic) if topic is not None else topic_for(msg)
    key = spec.key_bytes(msg).decode("utf-8")
    meta = event_meta(msg)
    if meta is None or not meta.event_id:
        raise OutboxError(f"{msg.DESCRIPTOR.full_name} has no meta.event_id")
    payload, _ = encode(msg)
    row_id = await conn.fetchval(
        """
        INSERT INTO outbox (topic, key, event_id, event_type, payload, created_at,
                            tenant_id, base_model)
        VALUES ($1, $2, $3, $4, $5, clock_timestamp(), $6, $7)
        RETURNING id
        """,
        topic_prefix + spec.name,
        key,
        uuid.UUID(meta.event_id),
        msg.DESCRIPTOR.full_name,
        payload,
        tenant_id,
        base_model,
    )
    await conn.execute("SELECT pg_notify($1, '')", NOTIFY_CHANNEL)
    return int(row_id)


def record_headers(event_type: str, event_id: str) -> list[tuple[str, bytes]]:
    """The codec headers of an outbox row, in aiokafka's form."""
    return [
        (HEADER_CONTENT_TYPE, CONTENT_TYPE.encode()),
        (HEADER_PROTO_TYPE, event_type.encode()),
        (HEADER_EVENT_ID, event_id.encode()),
    ]


class Producer(Protocol):
    """The part of ``AIOKafkaProducer`` the relay uses (tests may pass a fake)."""

    async def start(self) -> None:
        """Connect."""

    async def stop(self) -> None:
        """Flush and disconnect."""

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        *,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[Any]:
        """Queue one record; the future resolves at the broker's ack."""


ProducerFactory = Callable[[], Producer]


class OutboxMetrics(PerRegistry):
    """Outbox relay metrics (prefix ``loraplane_outbox_``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.published = Counter(
            "loraplane_outbox_published", "Outbox rows acknowledged by the broker.",
            ["topic"], registry=registry,
        )
        self.failures = Counter(
            "loraplane_outbox_publish_failures",
            "Failed publish attempts (the row stays and is sent again).",
            ["topic"], registry=registry,
        )
        self.broker_errors = Counter(
            "loraplane_outbox_broker_errors",
            "Relay rounds that failed on the broker (connect, metadata, send).",
            registry=registry,
        )
        self.producer_restarts = Counter(
            "loraplane_outbox_producer_restarts",
            "Kafka producers dropped and recreated after a failure.",
            registry=registry,
        )
        self.waiting = Gauge(
            "loraplane_outbox_rows_waiting", "Outbox rows not yet published.",
            ["topic", "tenant", "base_model"], registry=registry,
        )
        self.oldest_age = Gauge(
            "loraplane_outbox_oldest_age_seconds",
            "Age of the oldest unpublished outbox row (0 when none waits).",
            ["topic", "tenant", "base_model"], registry=registry,
        )
        self.latency = Histogram(
            "loraplane_outbox_publish_latency_seconds",
            "Time from enqueue (inside the writer's transaction) to the broker's ack.",
            ["topic"], buckets=PUBLISH_BUCKETS, registry=registry,
        )
        self.leader = Gauge(
            "loraplane_outbox_relay_leader",
            "1 while this process runs the active relay, 0 on standby.",
            registry=registry,
        )


@dataclass(frozen=True)
class PublishedRow:
    """A row the relay published (for callers that observe the relay)."""

    id: int
    topic: str
    event_id: str
    latency_s: float


class BrokerUnavailable(RuntimeError):
    """A publish failed; the relay recreates its producer and retries. Retriable."""

    retriable = True


class OutboxRelay:
    """Publishes unpublished outbox rows to Kafka, in id order, at least once."""

    def __init__(
        self,
        *,
        dsn: str,
        kafka: KafkaConnection,
        producer_factory: ProducerFactory | None = None,
        batch_size: int = 200,
        poll_interval_s: float = 1.0,
        lag_interval_s: float = 1.0,
        request_timeout_ms: int = 5000,
        backoff_base_s: float = 0.2,
        backoff_cap_s: float = 5.0,
        standby_poll_s: float = 2.0,
        registry: CollectorRegistry = REGISTRY,
        on_published: Callable[[PublishedRow], None] | None = None,
        ensure: Iterable[str] | None = (),
        ensure_prefix: str = "",
        retention_s: float = 7 * 24 * 3600,
        prune_interval_s: float = 600,
    ) -> None:
        """``dsn``: database holding ``outbox``; ``kafka``: the brokers.

        ``producer_factory`` builds a new (unstarted) producer; the default is an
        ``AIOKafkaProducer`` with ``acks="all"`` and ``request_timeout_ms``.
        ``on_published`` is called for every acknowledged row (benchmarks, tests).
        ``ensure``: topics created (if missing, see :func:`ensure_topics`) before each
        new producer starts; ``None`` = every topic of the table, ``()`` = none;
        ``ensure_prefix`` is prepended to their names. Published rows older than
        ``retention_s`` are deleted every ``prune_interval_s`` (the table stays small; the
        audit log, not the outbox, is the history).
        """
        self.dsn = dsn
        self.kafka = kafka
        self.batch_size = batch_size
        self.poll_interval_s = poll_interval_s
        self.lag_interval_s = lag_interval_s
        self.backoff_base_s = backoff_base_s
        self.backoff_cap_s = backoff_cap_s
        self.standby_poll_s = standby_poll_s
        self.metrics = OutboxMetrics.for_registry(registry)
        self.on_published = on_published
        self._request_timeout_ms = request_timeout_ms
        self._factory: ProducerFactory = producer_factory or self._default_producer
        self._ensure: list[str] | None = None if ensure is None else list(ensure)
        self._ensure_prefix = ensure_prefix
        self.retention_s = retention_s
        self.prune_interval_s = prune_interval_s
        self._last_prune = time.monotonic()
        self._producer: Producer | None = None
        self._wake = asyncio.Event()
        self._failures = 0
        self._last_lag = 0.0
        self._lag_keys: set[tuple[str, str, str]] = set()
        self.is_leader = False
        """Whether this relay holds the advisory lock (is the active one)."""
        self.published_total = 0
        """Rows this relay has published since it started."""
        self.producers_created = 0
        """Producers started so far (a restart after a failure adds one)."""
        self.broker_failures = 0
        """Relay rounds that failed on the broker since start."""

    # ------------------------------------------------------------------ producer

    def _default_producer(self) -> Producer:
        return AIOKafkaProducer(
            **self.kafka.client_args(),
            acks="all",
            request_timeout_ms=self._request_timeout_ms,
            retry_backoff_ms=100,
            linger_ms=0,
            client_id="loraplane-outbox-relay",
        )

    async def _ensure_producer(self) -> Producer:
        if self._producer is None:
            if self._ensure is None or self._ensure:
                await ensure_topics(self.kafka, self._ensure, prefix=self._ensure_prefix,
                                    timeout_s=self._request_timeout_ms / 1000)
            producer = self._factory()
            try:
                await asyncio.wait_for(producer.start(), self._request_timeout_ms / 1000 + 1)
            except BaseException:
                await self._stop_quietly(producer)
                raise
            self._producer = producer
            self.producers_created += 1
        return self._producer

    async def _drop_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            self.metrics.producer_restarts.inc()
            await self._stop_quietly(producer)

    @staticmethod
    async def _stop_quietly(producer: Producer) -> None:
        # a dead producer may fail to stop, or never finish a cancelled stop
        await close_within(producer.stop(), 5, "outbox producer stop")

    # ------------------------------------------------------------------ main loop

    def wake(self) -> None:
        """Ask the relay to look for rows now (also triggered by ``NOTIFY``)."""
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Relay until ``stop`` is set. Survives database and broker outages."""
        attempt = 0
        try:
            while not stop.is_set():
                try:
                    await self._run_once_connected(stop)
                    attempt = 0
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - outage: back off and reconnect
                    delay = backoff_delay(
                        attempt, base_s=self.backoff_base_s, cap_s=self.backoff_cap_s
                    )
                    attempt += 1
                    log.warning("outbox relay: %s: %s; retrying in %.1fs",
                                type(exc).__name__, exc, delay)
                    await interruptible_sleep(stop, None, delay)
        finally:
            self.is_leader = False
            self.metrics.leader.set(0)
            await self._drop_producer()

    async def _run_once_connected(self, stop: asyncio.Event) -> None:
        conn = await db.connect(self.dsn)
        try:
            while not await conn.fetchval("SELECT pg_try_advisory_lock($1)", RELAY_LOCK_ID):
                if await interruptible_sleep(stop, None, self.standby_poll_s):
                    return
            self.is_leader = True
            self.metrics.leader.set(1)
            await conn.add_listener(NOTIFY_CHANNEL, self._on_notify)
            while not stop.is_set():
                self._wake.clear()
                published = await self._publish_with_retry(conn, stop)
                await self._maybe_update_lag(conn)
                if time.monotonic() - self._last_prune >= self.prune_interval_s:
                    self._last_prune = time.monotonic()
                    await prune_published(conn, older_than_s=self.retention_s)
                if published >= self.batch_size:
                    continue
                await interruptible_sleep(stop, self._wake, self.poll_interval_s)
        finally:
            self.is_leader = False
            self.metrics.leader.set(0)
            try:
                await asyncio.wait_for(conn.close(), 5)
            except Exception:  # noqa: BLE001
                conn.terminate()

    def _on_notify(self, *_: object) -> None:
        self._wake.set()

    async def _publish_with_retry(self, conn: asyncpg.Connection, stop: asyncio.Event) -> int:
        """One batch; on a broker failure: drop the producer and back off (interruptible)."""
        try:
            published = await self.publish_batch(conn)
        except (BrokerUnavailable, KafkaError, TimeoutError, OSError) as exc:
            self.broker_failures += 1
            self.metrics.broker_errors.inc()
            await self._drop_producer()
            delay = backoff_delay(
                self._failures, base_s=self.backoff_base_s, cap_s=self.backoff_cap_s
            )
            self._failures += 1
            log.warning("outbox relay: broker unavailable (%s: %s); new producer in %.1fs",
                        type(exc).__name__, exc, delay)
            await self._maybe_update_lag(conn, force=True)
            await interruptible_sleep(stop, None, delay)
            return 0
        if self._failures:
            log.info("outbox relay: broker back after %d failed rounds", self._failures)
        self._failures = 0
        return published

    async def publish_batch(self, conn: asyncpg.Connection) -> int:
        """Send up to ``batch_size`` unpublished rows in id order; returns how many
        were acknowledged and marked. Raises :class:`BrokerUnavailable` after marking
        the acknowledged prefix when a send fails."""
        rows = await conn.fetch(
            "SELECT id, topic, key, event_id, event_type, payload FROM outbox "
            "WHERE published_at IS NULL ORDER BY id LIMIT $1",
            self.batch_size,
        )
        if not rows:
            return 0
        producer = await self._ensure_producer()
        futures: list[asyncio.Future[Any]] = []
        send_error: BaseException | None = None
        for row in rows:
            try:
                fut = await producer.send(
                    row["topic"],
                    bytes(row["payload"]),
                    key=row["key"].encode("utf-8"),
                    headers=record_headers(row["event_type"], str(row["event_id"])),
                )
            except Exception as exc:  # noqa: BLE001 - metadata timeout, broker gone
                send_error = exc
                break
            futures.append(fut)
        results = await asyncio.gather(*futures, return_exceptions=True)
        acked: list[int] = []
        failed_row: asyncpg.Record | None = None
        error: BaseException | None = None
        for row, result in zip(rows, results, strict=False):
            if isinstance(result, BaseException):
                failed_row, error = row, result
                break
            acked.append(row["id"])
        if failed_row is None and send_error is not None:
            failed_row, error = rows[len(futures)], send_error
        if acked:
            marked = await conn.fetch(
                "UPDATE outbox SET published_at = clock_timestamp(), attempts = attempts + 1, "
                "last_error = NULL WHERE id = ANY($1::bigint[]) "
                "RETURNING id, topic, event_id, "
                "extract(epoch FROM published_at - created_at)::float8 AS latency_s",
                acked,
            )
            for m in marked:
                self.metrics.published.labels(m["topic"]).inc()
                self.metrics.latency.labels(m["topic"]).observe(max(0.0, m["latency_s"]))
                if self.on_published is not None:
                    self.on_published(
                        PublishedRow(m["id"], m["topic"], str(m["event_id"]), m["latency_s"])
                    )
            self.published_total += len(marked)
        if failed_row is not None:
            assert error is not None
            self.metrics.failures.labels(failed_row["topic"]).inc()
            await conn.execute(
                "UPDATE outbox SET attempts = attempts + 1, last_error = $2 WHERE id = $1",
                failed_row["id"],
                f"{type(error).__name__}: {error}"[:500],
            )
            raise BrokerUnavailable(f"publish of outbox row {failed_row['id']} failed: {error}")
        return len(acked)

    # ------------------------------------------------------------------ lag metrics

    async def _maybe_update_lag(self, conn: asyncpg.Connection, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_lag < self.lag_interval_s:
            return
        self._last_lag = now
        rows = await conn.fetch(
            "SELECT topic, tenant_id, base_model, count(*) AS waiting, "
            "extract(epoch FROM clock_timestamp() - min(created_at))::float8 AS oldest_s "
            "FROM outbox WHERE published_at IS NULL GROUP BY 1, 2, 3"
        )
        seen: set[tuple[str, str, str]] = set()
        for r in rows:
            labels = (r["topic"], r["tenant_id"], r["base_model"])
            seen.add(labels)
            self.metrics.waiting.labels(*labels).set(r["waiting"])
            self.metrics.oldest_age.labels(*labels).set(max(0.0, r["oldest_s"]))
        for labels in self._lag_keys - seen:
            self.metrics.waiting.labels(*labels).set(0)
            self.metrics.oldest_age.labels(*labels).set(0)
        self._lag_keys |= seen


async def prune_published(conn: asyncpg.Connection, *, older_than_s: float) -> int:
    """Delete rows published more than ``older_than_s`` seconds ago; returns how many."""
    result = await conn.execute(
        "DELETE FROM outbox WHERE published_at IS NOT NULL "
        "AND published_at < clock_timestamp() - make_interval(secs => $1)",
        float(older_than_s),
    )
    return int(result.split()[-1])


async def outbox_lag(conn: asyncpg.Connection) -> tuple[int, float]:
    """``(rows waiting, age in seconds of the oldest)`` of the whole outbox."""
    row = await conn.fetchrow(
        "SELECT count(*) AS n, coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)"
        "::float8 AS age FROM outbox WHERE published_at IS NULL"
    )
    assert row is not None
    return int(row["n"]), float(row["age"])
