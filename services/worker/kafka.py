"""The worker's Kafka side: commands in, reports and heat out (aiokafka).

* :class:`Publisher` sends protobuf events with their topic key and codec headers
  (``acks=all``, bounded retries). A failed send marks the broker as lost; the first
  success after a loss calls ``on_recovered`` (the worker restarts its consumer then:
  after a broker restart a running aiokafka consumer can rejoin and receive nothing).
* :class:`CommandConsumer` reads ``cache.commands`` in the worker's own consumer group,
  runs the commands addressed to this worker (in order per adapter version, several
  versions at once), publishes each report and commits an offset only once every
  command up to it has been executed and reported. It recreates its consumer on any
  broker error and when asked (:meth:`CommandConsumer.request_restart`).
* :class:`HeatBatcher` groups ``RequestCompleted`` per adapter into ``HeatBatch``
  events on ``adapter.heat``, flushed periodically.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata, TopicPartition
from google.protobuf.message import Message

from loraplane.shared import codec, topics
from loraplane.shared.errors import InvalidArgument
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
        bootstrap: str,
        *,
        attempts: int = 3,
        retry_backoff_s: float = 0.5,
        on_recovered: Callable[[], None] | None = None,
        on_dropped: Callable[[], None] | None = None,
    ) -> None:
        """``on_recovered`` runs after the first successful send that follows a failure,
        ``on_dropped`` when a message is given up after every attempt."""
        self.bootstrap = bootstrap
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
                bootstrap_servers=self.bootstrap, acks="all", request_timeout_ms=10_000,
                linger_ms=5,
            )
            try:
                await producer.start()
            except BaseException:
                with contextlib.suppress(Exception):
                    await producer.stop()
                raise
            self._producer = producer
        return self._producer

    async def _reset(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(Exception):
                await producer.stop()

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


class OffsetTracker:
    """Commit points of records processed out of order: the lowest unfinished offset."""

    def __init__(self) -> None:
        self._pending: dict[TopicPartition, set[int]] = defaultdict(set)
        self._next: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}

    def started(self, tp: TopicPartition, offset: int) -> None:
        """A record is being processed."""
        self._pending[tp].add(offset)
        self._next[tp] = max(self._next.get(tp, 0), offset + 1)

    def finished(self, tp: TopicPartition, offset: int) -> None:
        """A record's effect is done (and reported)."""
        self._pending[tp].discard(offset)

    def pending(self) -> int:
        """Records still being processed."""
        return sum(len(v) for v in self._pending.values())

    def commit_points(self) -> dict[TopicPartition, int]:
        """Offsets to commit now (only those that moved since the last call)."""
        out: dict[TopicPartition, int] = {}
        for tp, nxt in self._next.items():
            pending = self._pending.get(tp)
            point = min(pending) if pending else nxt
            if point > self._committed.get(tp, -1):
                out[tp] = point
        return out

    def committed(self, points: dict[TopicPartition, int]) -> None:
        """Record a successful commit."""
        self._committed.update(points)


class CommandConsumer:
    """Consumes ``cache.commands`` for one worker, executes them, reports, commits."""

    def __init__(
        self,
        bootstrap: str,
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
        self.bootstrap = bootstrap
        self.executor = executor
        self.publisher = publisher
        self.group_id = group_id
        self.max_concurrency = max_concurrency
        self.restart_backoff_s = restart_backoff_s
        self.on_restart = on_restart
        self.assigned = asyncio.Event()
        """Set once a consumer of the current generation has partitions."""
        self.restarts = 0
        self.executed = 0
        self._restart = asyncio.Event()
        self._stopped = asyncio.Event()
        self._chains: dict[int, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._sem = asyncio.Semaphore(max_concurrency)

    def request_restart(self) -> None:
        """Recreate the consumer (called after a broker loss)."""
        self._restart.set()

    def stop(self) -> None:
        """Ask :meth:`run` to return."""
        self._stopped.set()
        self._restart.set()

    def _new_consumer(self) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            topics.CACHE_COMMANDS,
            bootstrap_servers=self.bootstrap,
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
            rebalance_timeout_ms=1000,
            max_poll_records=100,
        )

    async def run(self) -> None:
        """Consume until :meth:`stop`; recreate the consumer on errors and on request."""
        while not self._stopped.is_set():
            self._restart.clear()
            self.assigned.clear()
            consumer = self._new_consumer()
            tracker = OffsetTracker()
            try:
                await consumer.start()
                while not self._restart.is_set():
                    batch = await consumer.getmany(timeout_ms=300)
                    if consumer.assignment():
                        self.assigned.set()
                    for tp, records in batch.items():
                        for record in records:
                            self._dispatch(tp, record, tracker)
                    await self._commit(consumer, tracker)
            except (TimeoutError, KafkaError, OSError) as exc:
                log.warning("command consumer failed, recreating it: %s", exc)
            finally:
                with contextlib.suppress(Exception):
                    await self._commit(consumer, tracker)
                with contextlib.suppress(Exception):
                    await consumer.stop()
            if not self._stopped.is_set():
                self.restarts += 1
                if self.on_restart is not None:
                    self.on_restart()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopped.wait(), self.restart_backoff_s)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _commit(self, consumer: AIOKafkaConsumer, tracker: OffsetTracker) -> None:
        points = {tp: off for tp, off in tracker.commit_points().items()
                  if tp in consumer.assignment()}
        if points:
            await consumer.commit({tp: OffsetAndMetadata(off, "") for tp, off in points.items()})
            tracker.committed(points)

    def _dispatch(self, tp: TopicPartition, record: object, tracker: OffsetTracker) -> None:
        offset = int(getattr(record, "offset"))  # noqa: B009 - ConsumerRecord field
        tracker.started(tp, offset)
        try:
            cmd = codec.decode_record(record)  # type: ignore[arg-type]
        except InvalidArgument as exc:
            log.warning("skipping undecodable command at %s@%d: %s", tp, offset, exc)
            tracker.finished(tp, offset)
            return
        assert isinstance(cmd, events_pb2.CacheCommand)
        if not self.executor.is_mine(cmd):
            tracker.finished(tp, offset)
            return
        engine_id = _command_engine_id(cmd)
        previous = self._chains.get(engine_id)
        task = asyncio.create_task(self._execute(cmd, previous, tp, offset, tracker))
        self._chains[engine_id] = task
        self._tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            if self._chains.get(engine_id) is t:
                del self._chains[engine_id]

        task.add_done_callback(done)

    async def _execute(
        self,
        cmd: events_pb2.CacheCommand,
        previous: asyncio.Task[None] | None,
        tp: TopicPartition,
        offset: int,
        tracker: OffsetTracker,
    ) -> None:
        if previous is not None:  # same version: keep the order of the log
            await asyncio.gather(previous, return_exceptions=True)
        try:
            async with self._sem:
                report = await self.executor.execute(cmd)
            if report is not None:
                await self.publisher.publish(topics.CACHE_STATE, report)
            self.executed += 1
        except Exception:
            log.exception("command %s crashed", cmd.command_id)
        finally:
            tracker.finished(tp, offset)


def _command_engine_id(cmd: events_pb2.CacheCommand) -> int:
    kind = cmd.WhichOneof("command")
    return int(getattr(cmd, kind).engine_id) if kind else 0


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
