"""Kafka I/O of the leader: one consumer of every input topic, one producer of commands.

The consumer **assigns every partition explicitly** (no group membership, so no
rebalance delay at takeover; only the leader consumes) and commits its
positions under the cache manager's group id, so a new leader resumes where
the previous one stopped. On the very first start (nothing committed) it reads
from the beginning: stale snapshots are superseded by newer ones and stale
heat decays with its event time, so a replay is harmless.

Broker loss: aiokafka can go silent after a broker restart (see
``shared/FACTS.md``), so the service's :class:`loraplane.shared.consumer.ConsumerLoop`
recreates the consumer on any error and when nothing arrived for ``stall_s`` while
workers (which report every few seconds) are known.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from google.protobuf.message import Message

from loraplane.shared import topics
from loraplane.shared.aio import close_within
from loraplane.shared.codec import CodecError, decode_record, encode, kafka_headers
from loraplane.shared.kafka_client import KafkaConnection

log = logging.getLogger(__name__)

INPUT_TOPICS: tuple[str, ...] = (
    topics.CACHE_STATE,
    topics.ADAPTER_ADMISSIONS,
    topics.ADAPTER_LIFECYCLE,
    topics.ADAPTER_PREWARM,
    topics.ADAPTER_HEAT,
)
"""What the cache manager consumes (worker reports first: they answer commands)."""


@dataclass(frozen=True, slots=True)
class Received:
    """One consumed record: its topic and decoded message (None when undecodable)."""

    topic: str
    message: Message | None
    error: str = ""


class MissingTopics(RuntimeError):
    """An input topic has no partitions yet (not created?): the consumer is tried again."""


def new_consumer(kafka: KafkaConnection, group_id: str, *, max_records: int = 5000,
                 fetch_max_wait_ms: int = 50) -> AIOKafkaConsumer:
    """An unstarted consumer that commits under ``group_id`` but joins no group.

    ``fetch_max_wait_ms``: how long the broker may hold a fetch with no data; it bounds the
    delay before a new event is seen (aiokafka's default is 500 ms)."""
    return AIOKafkaConsumer(
        **kafka.client_args(),
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=max_records,
        fetch_max_wait_ms=fetch_max_wait_ms,
    )


def assign_every_partition(consumer: AIOKafkaConsumer, topics_: Sequence[str]) -> None:
    """Assign every partition of ``topics_`` to a started consumer. A consumer learns the
    topics that exist when it connects, so one that misses an input topic raises
    :class:`MissingTopics` (the caller closes it and tries a new one)."""
    partitions: list[TopicPartition] = []
    missing: list[str] = []
    for topic in topics_:
        parts = consumer.partitions_for_topic(topic)
        if parts:
            partitions.extend(TopicPartition(topic, p) for p in sorted(parts))
        else:
            missing.append(topic)
    if missing:
        raise MissingTopics(f"topics {missing} have no partitions (not created?)")
    consumer.assign(partitions)


def decode_batch(batches: Mapping[Any, Sequence[Any]], topics_: Sequence[str]
                 ) -> list[Received]:
    """The records of one poll, decoded, in the order of ``topics_`` (worker reports first)."""
    out: list[Received] = []
    for tp in sorted(batches, key=lambda tp: topics_.index(tp.topic)):
        for record in batches[tp]:
            try:
                out.append(Received(tp.topic, decode_record(record)))
            except CodecError as exc:
                log.warning("undecodable record %s[%d]@%d: %s", tp.topic, tp.partition,
                            record.offset, exc)
                out.append(Received(tp.topic, None, str(exc)))
    return out


class EventSource:
    """A bare manual-assignment reader of ``topics_`` (benchmarks: the broker's own read
    rate); the service reads through :class:`loraplane.shared.consumer.ConsumerLoop` with
    :func:`new_consumer`, :func:`assign_every_partition` and :func:`decode_batch`."""

    def __init__(self, kafka: KafkaConnection, group_id: str, *,
                 topics_: Sequence[str] = INPUT_TOPICS, max_records: int = 5000) -> None:
        self.kafka = kafka
        self.group_id = group_id
        self.topics = tuple(topics_)
        self.max_records = max_records
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self, timeout_s: float = 15.0) -> None:
        """Connect and assign every partition; retries a consumer missing a topic until
        ``timeout_s``."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            consumer = new_consumer(self.kafka, self.group_id, max_records=self.max_records)
            await consumer.start()
            try:
                assign_every_partition(consumer, self.topics)
                self._consumer = consumer
                return
            except MissingTopics:
                await close_within(consumer.stop(), 5.0, "event consumer stop")
                if asyncio.get_running_loop().time() > deadline:
                    raise
            except BaseException:
                await close_within(consumer.stop(), 5.0, "event consumer stop")
                raise
            await asyncio.sleep(0.5)

    async def poll(self, timeout_ms: int = 500) -> list[Received]:
        """The next records (possibly none), decoded."""
        if self._consumer is None:
            raise RuntimeError("EventSource not started")
        batches = await self._consumer.getmany(timeout_ms=timeout_ms,
                                               max_records=self.max_records)
        return decode_batch(batches, self.topics)

    async def stop(self) -> None:
        """Disconnect (without committing)."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await close_within(consumer.stop(), 5.0, "event consumer stop")


class CommandSink:
    """Producer of ``cache.commands`` (keyed by worker id, acks=all)."""

    def __init__(self, kafka: KafkaConnection) -> None:
        self.kafka = kafka
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        """Connect."""
        producer = AIOKafkaProducer(**self.kafka.client_args(), acks="all", linger_ms=1,
                                    request_timeout_ms=10_000)
        await producer.start()
        self._producer = producer

    async def publish(self, messages: Sequence[Message], topic: str = topics.CACHE_COMMANDS
                      ) -> list[BaseException | None]:
        """Send every message; returns per message ``None`` (acked) or the error."""
        producer = self._producer
        if producer is None:
            raise RuntimeError("CommandSink not started")
        futures: list[asyncio.Future[object] | BaseException] = []
        for msg in messages:
            body, headers = encode(msg)
            try:
                fut = await producer.send(topic, body, key=topics.key_for(topic, msg),
                                          headers=kafka_headers(headers))
                futures.append(fut)
            except Exception as exc:  # noqa: BLE001 - reported per message
                futures.append(exc)
        out: list[BaseException | None] = []
        for f in futures:
            if isinstance(f, BaseException):
                out.append(f)
                continue
            try:
                await f
                out.append(None)
            except Exception as exc:  # noqa: BLE001 - reported per message
                out.append(exc)
        return out

    async def stop(self) -> None:
        """Flush and disconnect."""
        producer, self._producer = self._producer, None
        if producer is not None:
            await close_within(producer.stop(), 5.0, "command producer stop")
