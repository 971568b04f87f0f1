"""The worker's Kafka side: commands in, reports and heat out (aiokafka).

* :class:`Publisher` sends protobuf events with their topic key and codec headers
  (``acks=all``, bounded retries). A failed send marks the broker as lost; the first
  success after a loss calls ``on_recovered`` (the worker restarts its consumer then:
  after a broker restart a running aiokafka consumer can rejoin and receive nothing).
* :class:`CommandConsumer` reads ``cache.commands`` in the worker's own consumer group,
  runs the commands addressed to this worker (in order per adapter version, several
  versions at once), publishes each report and commits an offset only once every
  command up to it has been executed and reported. It is the handler of a
  :class:`loraplane.shared.consumer.ConsumerLoop`, which recreates the consumer on any
  broker error and when asked (:meth:`CommandConsumer.request_restart`).
* :class:`HeatBatcher` groups ``RequestCompleted`` per adapter into ``HeatBatch``
  events on ``adapter.heat``, flushed periodically.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from google.protobuf.message import Message

from loraplane.shared import codec, topics
from loraplane.shared.aio import close_within
from loraplane.shared.consumer import Consumer, ConsumerLoop, Ready, group_consumer
from loraplane.shared.errors import InvalidArgument
from loraplane.shared.kafka_client import KafkaConnection
from loraplane.v1 import common_pb2, events_pb2
from loraplane.worker.commands import CommandExecutor

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


def _now() -> datetime:
    return datetime.now(UTC)


class Publisher:
    """Publishes loraplane events; tracks broker loss and recovery."""

    def __init__(
        self,
        kafka: KafkaConnection,
        *,
        attempts: int = 3,
        retry_backoff_s: float = 0.5,
        on_recovered: Callable[[], None] | None = None,
        on_dropped: Callable[[], None] | None = None,
    ) -> None:
        """``on_recovered`` runs after the first successful send that follows a failure,
        ``on_dropped`` when a message is given up after every attempt."""
        self.kafka = kafka
        self.attempts = attempts
        self.retry_backoff_s = retry_backoff_s
        self.on_recovered = on_recovered
        self.on_dropped = on_dropped
        self.broker_lost = False
        self.sent = 0
        self.dropped = 0
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Connect the producer (retries until the broker answers)."""
        await self._ensure()

    async def _ensure(self) -> AIOKafkaProducer:
        async with self._lock:  # concurrent publishers share one producer
            return await self._ensure_locked()

    async def _ensure_locked(self) -> AIOKafkaProducer:
        if self._producer is None:
            producer = AIOKafkaProducer(
                **self.kafka.client_args(), acks="all", request_timeout_ms=10_000,
                linger_ms=5,
            )
            try:
                await producer.start()
            except BaseException:
                await close_within(producer.stop(), 5, "event producer stop")
                raise
            self._producer = producer
        return self._producer

    async def _reset(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await close_within(producer.stop(), 5, "event producer stop")

    async def publish(self, topic: str, msg: Message) -> bool:
        """Send ``msg`` on ``topic`` and wait for the broker; False if it was dropped."""
        key = topics.key_for(topic, msg)
        value, headers = codec.encode(msg)
        for attempt in range(1, self.attempts + 1):
            try:
                producer = await self._ensure()
                await producer.send_and_wait(
                    topic, value, key=key, headers=codec.kafka_headers(headers)
                )
            except (TimeoutError, KafkaError, OSError) as exc:
                self.broker_lost = True
                log.warning("publish to %s failed (attempt %d): %s", topic, attempt, exc)
                await self._reset()
                await asyncio.sleep(self.retry_backoff_s * attempt)
                continue
            self.sent += 1
            if self.broker_lost:
                self.broker_lost = False
                if self.on_recovered is not None:
                    self.on_recovered()
            return True
        self.dropped += 1
        if self.on_dropped is not None:
            self.on_dropped()
        return False

    async def stop(self) -> None:
        """Flush and close the producer."""
        await self._reset()


class CommandConsumer:
    """Consumes ``cache.commands`` for one worker, executes them, reports, commits."""

    def __init__(
        self,
        kafka: KafkaConnection,
        executor: CommandExecutor,
        publisher: Publisher,
        *,
        group_id: str,
        max_concurrency: int = 8,
        restart_backoff_s: float = 1.0,
        on_restart: Callable[[], None] | None = None,
    ) -> None:
        """``group_id``: one consumer group per worker (every worker reads every command
        and keeps those addressed to it); ``on_restart`` runs whenever a consumer is
        recreated."""
        self.kafka = kafka
        self.executor = executor
        self.publisher = publisher
        self.group_id = group_id
        self.executed = 0
        self._sem = asyncio.Semaphore(max_concurrency)  # executions, not report publishes
        self.loop = ConsumerLoop(
            "command", factory=self._new_consumer, on_record=self._handle,
            lane=_lane, concurrency=None, max_records=None,
            on_restart=on_restart, backoff=lambda _attempt: restart_backoff_s,
            ready_when=Ready.ASSIGNED,
        )
        self.assigned = self.loop.ready
        """Set once a consumer of the current generation has partitions."""

    @property
    def restarts(self) -> int:
        """Consumers recreated so far."""
        return self.loop.restarts

    def request_restart(self) -> None:
        """Recreate the consumer (called after a broker loss)."""
        self.loop.request_restart()

    def stop(self) -> None:
        """Ask :meth:`run` to return."""
        self.loop.stop()

    def _new_consumer(self) -> Consumer:
        return group_consumer(topics.CACHE_COMMANDS, kafka=self.kafka,
                              group_id=self.group_id, client_id="loraplane-worker",
                              max_poll_records=100)

    async def run(self) -> None:
        """Consume until :meth:`stop`; recreate the consumer on errors and on request."""
        await self.loop.run()

    async def _handle(self, record: object) -> None:
        """Execute one command addressed to this worker and publish its report. A command
        that crashes is logged and counted done (its report says nothing: the cache manager
        times it out); only Kafka failures restart the consumer."""
        try:
            cmd = codec.decode_record(record)  # type: ignore[arg-type]
        except InvalidArgument as exc:
            log.warning("skipping undecodable command at %s@%s: %s",
                        getattr(record, "partition", "?"), getattr(record, "offset", "?"), exc)
            return
        assert isinstance(cmd, events_pb2.CacheCommand)
        if not self.executor.is_mine(cmd):
            return
        try:
            async with self._sem:
                report = await self.executor.execute(cmd)
            if report is not None:
                await self.publisher.publish(topics.CACHE_STATE, report)
            self.executed += 1
        except Exception:
            log.exception("command %s crashed", cmd.command_id)


def _lane(_tp: object, record: object) -> int:
    """Commands of one engine adapter id run in the order of the log, others at once."""
    try:
        cmd = codec.decode_record(record)  # type: ignore[arg-type]
    except InvalidArgument:
        return 0
    return _command_engine_id(cmd) if isinstance(cmd, events_pb2.CacheCommand) else 0


def _command_engine_id(cmd: events_pb2.CacheCommand) -> int:
    kind = cmd.WhichOneof("command")
    if kind is None or kind == "hot_order":  # a HOT order is for no one adapter: lane 0
        return 0
    return int(getattr(cmd, kind).engine_id)


class HeatBatcher:
    """Collects ``RequestCompleted`` per adapter and publishes ``HeatBatch`` events."""

    def __init__(
        self,
        publisher: Publisher,
        *,
        source_id: str,
        flush_interval_s: float = 2.0,
        max_batch: int = 200,
        clock: Clock = _now,
    ) -> None:
        """``source_id``: ``HeatBatch.source_id`` (the worker instance)."""
        self.publisher = publisher
        self.source_id = source_id
        self.flush_interval_s = flush_interval_s
        self.max_batch = max_batch
        self.clock = clock
        self._buffers: dict[str, tuple[common_pb2.AdapterRef, list[events_pb2.RequestCompleted]]]
        self._buffers = {}
        self._stopped = asyncio.Event()
        self.published = 0

    def add(self, completed: events_pb2.RequestCompleted) -> None:
        """Queue one completion (dropped when it names no tenant: nothing to key it by)."""
        ref = completed.meta.adapter
        if not ref.tenant_id:
            return
        key = topics.adapter_id(ref)
        entry = self._buffers.get(key)
        if entry is None:
            entry = self._buffers[key] = (common_pb2.AdapterRef(), [])
        entry[0].CopyFrom(ref)
        entry[1].append(completed)
        if len(entry[1]) >= self.max_batch:
            asyncio.get_running_loop().create_task(self.flush_key(key))

    async def flush_key(self, key: str) -> None:
        """Publish the batch of one adapter."""
        entry = self._buffers.pop(key, None)
        if entry is None or not entry[1]:
            return
        ref, completions = entry
        batch = events_pb2.HeatBatch(
            meta=topics.new_meta(self.source_id, ref, clock=self.clock),
            completions=completions, source_id=self.source_id,
        )
        if await self.publisher.publish(topics.ADAPTER_HEAT, batch):
            self.published += 1

    async def flush(self) -> None:
        """Publish every pending batch."""
        for key in list(self._buffers):
            await self.flush_key(key)

    async def run(self) -> None:
        """Flush every ``flush_interval_s`` until :meth:`stop`, then once more."""
        while not self._stopped.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), self.flush_interval_s)
            await self.flush()

    def stop(self) -> None:
        """Ask :meth:`run` to flush and return."""
        self._stopped.set()
