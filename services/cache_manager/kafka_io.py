"""Kafka I/O of the leader: one consumer of every input topic, one producer of commands.

The consumer **assigns every partition explicitly** (no group membership, so no
rebalance delay at takeover; only the leader consumes) and commits its
positions under the cache manager's group id, so a new leader resumes where
the previous one stopped. On the very first start (nothing committed) it reads
from the beginning: stale snapshots are superseded by newer ones and stale
heat decays with its event time, so a replay is harmless.

Broker loss: aiokafka can go silent after a broker restart (see
``shared/FACTS.md``), so :class:`EventSource` is recreated by the service on any
consumer error and when nothing arrived for ``stall_s`` while workers (which
report every few seconds) are known.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from google.protobuf.message import Message

from loraplane.shared import topics
from loraplane.shared.codec import CodecError, decode_record, encode, kafka_headers

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


class EventSource:
    """Manual-assignment consumer of :data:`INPUT_TOPICS`."""

    def __init__(
        self, bootstrap: str, group_id: str, *, topics_: Sequence[str] = INPUT_TOPICS,
        max_records: int = 5000, fetch_max_wait_ms: int = 50,
    ) -> None:
        """``fetch_max_wait_ms``: how long the broker may hold a fetch with no data; it bounds
        the delay before a new event is seen (aiokafka's default is 500 ms)."""
        self.bootstrap = bootstrap
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.group_id = group_id
        self.topics = tuple(topics_)
        self.max_records = max_records
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self, timeout_s: float = 15.0) -> None:
        """Connect and assign every partition of every input topic.

        A consumer learns the topics that exist when it connects, so one that misses an
        input topic is closed and a new one tried until ``timeout_s``.
        """
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=self.group_id,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                max_poll_records=self.max_records,
                fetch_max_wait_ms=self.fetch_max_wait_ms,
            )
            await consumer.start()
            try:
                partitions: list[TopicPartition] = []
                missing: list[str] = []
                for topic in self.topics:
                    parts = consumer.partitions_for_topic(topic)
                    if parts:
                        partitions.extend(TopicPartition(topic, p) for p in sorted(parts))
                    else:
                        missing.append(topic)
                if not missing:
                    consumer.assign(partitions)
                    self._consumer = consumer
                    return
            except BaseException:
                await consumer.stop()
                raise
            await consumer.stop()
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"topics {missing} have no partitions (not created?)")
            await asyncio.sleep(0.5)

    async def poll(self, timeout_ms: int = 500) -> list[Received]:
        """The next records (possibly none), decoded."""
        consumer = self._consumer
        if consumer is None:
            raise RuntimeError("EventSource not started")
        batches = await consumer.getmany(timeout_ms=timeout_ms, max_records=self.max_records)
        out: list[Received] = []
        for tp in sorted(batches, key=lambda tp: self.topics.index(tp.topic)):
            for record in batches[tp]:
                try:
                    out.append(Received(tp.topic, decode_record(record)))
                except CodecError as exc:
                    log.warning("undecodable record %s[%d]@%d: %s", tp.topic, tp.partition,
                                record.offset, exc)
                    out.append(Received(tp.topic, None, str(exc)))
        return out

    async def commit(self) -> None:
        """Commit the positions of everything returned so far."""
        if self._consumer is not None:
            await self._consumer.commit()

    async def stop(self) -> None:
        """Disconnect (without committing)."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                await asyncio.wait_for(consumer.stop(), timeout=5.0)
            except Exception as exc:  # noqa: BLE001 - a dead broker must not block shutdown
                log.info("consumer stop: %s", exc)


class CommandSink:
    """Producer of ``cache.commands`` (keyed by worker id, acks=all)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        """Connect."""
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all", linger_ms=1,
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
            try:
                await asyncio.wait_for(producer.stop(), timeout=5.0)
            except Exception as exc:  # noqa: BLE001
                log.info("producer stop: %s", exc)
