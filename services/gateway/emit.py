"""Events the gateway sends, off the request path: heat batches and prewarm requests.

The request path only calls :meth:`HeatEmitter.record` / :meth:`PrewarmRequester.request`
(synchronous, O(1), never blocking on Kafka); :func:`run_flusher` publishes what
accumulated every ``interval_s`` in a background task:

* ``adapter.heat``: one :class:`~loraplane.v1.events_pb2.HeatBatch` per adapter
  (``tenant/name``) with up to ``max_batch`` ``RequestCompleted`` items, oldest first;
* ``adapter.prewarm``: one ``PrewarmRequested`` per version and ``dedupe_s`` window.

When Kafka is slow the pending completions are bounded (``max_pending``); the
excess is dropped and counted (``dropped``), never queued without limit.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from google.protobuf.message import Message

from loraplane.shared import topics
from loraplane.shared.aio import close_within
from loraplane.shared.codec import encode, kafka_headers
from loraplane.shared.kafka_client import KafkaConnection
from loraplane.v1 import common_pb2, events_pb2

log = logging.getLogger(__name__)

Clock = Callable[[], float]
"""Seconds since the epoch."""


class EventPublisher(Protocol):
    """Publishes one protobuf event on its topic (keyed by the topic table)."""

    async def publish(self, topic: str, msg: Message) -> None:
        """Send ``msg`` on ``topic``; raises on failure."""


class KafkaPublisher:
    """:class:`EventPublisher` over an aiokafka producer (codec headers, topic keys)."""

    def __init__(self, kafka: KafkaConnection, client_id: str = "loraplane-gateway") -> None:
        """Producer on ``kafka`` (started by :meth:`start`)."""
        from aiokafka import AIOKafkaProducer

        self._producer = AIOKafkaProducer(
            **kafka.client_args(), client_id=client_id, acks=1, linger_ms=5
        )

    async def start(self) -> None:
        """Connect."""
        await self._producer.start()

    async def stop(self) -> None:
        """Flush and disconnect."""
        await close_within(self._producer.stop(), 5, "gateway event producer stop")

    async def publish(self, topic: str, msg: Message) -> None:
        """Send and wait for the broker's acknowledgement."""
        body, headers = encode(msg)
        await self._producer.send_and_wait(
            topic, body, key=topics.key_for(topic, msg), headers=kafka_headers(headers)
        )


@dataclass(slots=True)
class Completion:
    """One finished request, as recorded on the request path (not frozen: one is built per
    request, and a frozen dataclass's ``__init__`` costs ~1.2 µs more for its 13 fields;
    nothing changes one once recorded)."""

    adapter: common_pb2.AdapterRef
    """Resolved version (adapter_name empty for base-model requests)."""
    request_id: str
    """Gateway request id."""
    worker_id: str
    """Worker that served it ("" if none)."""
    request_class: int
    """RequestClass value."""
    tier_at_arrival: int
    """Tier value."""
    ttft_ms: float
    """Time to first token."""
    duration_ms: float
    """Total duration."""
    prompt_tokens: int
    """Prompt tokens."""
    output_tokens: int
    """Generated tokens."""
    status_code: int
    """Final grpc.StatusCode value (0 = OK)."""
    degraded_to_base: bool
    """Served by the base model because the adapter was cold."""
    engine_id: int
    """Engine id of the version (0 for base-model requests)."""
    at: float
    """When it finished (epoch seconds)."""


def uuid4_text() -> str:
    """A random UUID (version 4) in its canonical text form, as ``str(uuid.uuid4())`` at
    a third of its cost (one per heat completion)."""
    h = bytearray(os.urandom(16))
    h[6] = (h[6] & 0x0F) | 0x40  # version 4
    h[8] = (h[8] & 0x3F) | 0x80  # RFC 4122 variant
    x = h.hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


class HeatEmitter:
    """Batches completed requests per adapter into ``HeatBatch`` events."""

    def __init__(
        self,
        publisher: EventPublisher,
        *,
        producer: str,
        source_id: str,
        max_batch: int = 500,
        max_pending: int = 100_000,
    ) -> None:
        """``producer``: ``service/instance`` for the envelope; ``source_id``: batch source."""
        self._publisher = publisher
        self._producer = producer
        self._source_id = source_id
        self._max_batch = max_batch
        self._max_pending = max_pending
        self._pending: dict[tuple[str, str], list[Completion]] = {}
        self._count = 0
        self._in_flight = 0
        """Completions taken by a flush and not yet published or put back."""
        self.dropped = 0
        """Completions dropped because too many were pending."""
        self.published = 0
        """Completions published."""
        self.recorded = 0
        """Completions recorded."""

    @property
    def pending(self) -> int:
        """Completions waiting to be published (those a flush is publishing included)."""
        return self._count + self._in_flight

    def record(self, completion: Completion) -> None:
        """Remember a completion (O(1); drops and counts when too many are pending).

        Every completion recorded ends published or dropped: ``recorded == published +
        dropped + pending`` at all times."""
        self.recorded += 1
        self._keep(completion)

    def _keep(self, completion: Completion) -> None:
        if self._count >= self._max_pending:
            self.dropped += 1
            return
        key = (completion.adapter.tenant_id, completion.adapter.adapter_name)
        self._pending.setdefault(key, []).append(completion)
        self._count += 1

    def _batch(self, key: tuple[str, str], items: list[Completion]) -> events_pb2.HeatBatch:
        ref = common_pb2.AdapterRef(tenant_id=key[0], adapter_name=key[1])
        batch = events_pb2.HeatBatch(
            meta=topics.new_meta(self._producer, ref), source_id=self._source_id
        )
        for c in items:
            item = batch.completions.add(
                request_id=c.request_id,
                worker_id=c.worker_id,
                request_class=c.request_class,
                tier_at_arrival=c.tier_at_arrival,
                ttft_ms=c.ttft_ms,
                duration_ms=c.duration_ms,
                prompt_tokens=c.prompt_tokens,
                output_tokens=c.output_tokens,
                status_code=c.status_code,
                degraded_to_base=c.degraded_to_base,
                engine_id=c.engine_id,
            )
            meta = item.meta  # the envelope, built directly (new_meta costs ~2x more)
            meta.event_id = uuid4_text()
            meta.producer = self._producer
            meta.correlation_id = c.request_id
            meta.adapter.CopyFrom(c.adapter)
            at = meta.occurred_at  # set directly: Timestamp.FromNanoseconds is Python code
            at.seconds, at.nanos = divmod(int(c.at * 1e9), 1_000_000_000)
        return batch

    async def flush(self) -> int:
        """Publish everything pending; returns the number of completions published.

        A batch that fails to publish is put back (up to ``max_pending``) and the error
        re-raised after the other batches were tried.
        """
        pending, self._pending, self._count = self._pending, {}, 0
        chunks = [(key, items[start : start + self._max_batch])
                  for key, items in pending.items()
                  for start in range(0, len(items), self._max_batch)]
        self._in_flight += sum(len(items) for items in pending.values())
        sent = 0
        error: BaseException | None = None
        done = 0
        try:
            for key, chunk in chunks:
                try:
                    await self._publisher.publish(topics.ADAPTER_HEAT, self._batch(key, chunk))
                except Exception as exc:  # noqa: BLE001 - retried on the next flush
                    error = exc
                    self._in_flight -= len(chunk)
                    for c in chunk:
                        self._keep(c)
                    done += 1
                    continue
                self._in_flight -= len(chunk)
                self.published += len(chunk)
                sent += len(chunk)
                done += 1
        finally:
            for _key, chunk in chunks[done:]:  # cancelled mid-flush: kept for the next one
                self._in_flight -= len(chunk)
                for c in chunk:
                    self._keep(c)
        if error is not None:
            raise error
        return sent


class PrewarmRequester:
    """Asks the cache manager to make versions HOT (one request per version and window)."""

    def __init__(
        self,
        publisher: EventPublisher,
        *,
        producer: str,
        dedupe_s: float = 5.0,
        max_pending: int = 10_000,
        clock: Clock = time.time,
    ) -> None:
        """``dedupe_s``: at most one request per version within this many seconds;
        ``max_pending``: requests kept while Kafka is away (beyond, new ones are dropped
        and counted: a prewarm is a hint, the next cold request asks again)."""
        self._publisher = publisher
        self._max_pending = max_pending
        self.dropped = 0
        """Prewarm requests dropped because too many were pending."""
        self._producer = producer
        self._dedupe_s = dedupe_s
        self._clock = clock
        self._last: dict[tuple[str, str, str], float] = {}
        self._queue: list[events_pb2.PrewarmRequested] = []
        self._sending = 0
        """Requests of the flush in progress not published yet (taken off the queue)."""
        self.published = 0
        """Prewarm requests published."""

    def request(
        self,
        ref: common_pb2.AdapterRef,
        engine_id: int,
        request_class: int,
        reason: str,
        *,
        target_worker_id: str = "",
    ) -> bool:
        """Queue a prewarm of ``ref``; returns ``False`` when one was queued recently."""
        key = (ref.tenant_id, ref.adapter_name, ref.version)
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._dedupe_s:
            return False
        self._last[key] = now
        if self.pending >= self._max_pending:
            self.dropped += 1
            return False
        self._queue.append(
            events_pb2.PrewarmRequested(
                meta=topics.new_meta(self._producer, ref),
                request_class=request_class,  # type: ignore[arg-type]
                reason=reason,
                target_worker_id=target_worker_id,
                engine_id=engine_id,
            )
        )
        return True

    @property
    def pending(self) -> int:
        """Requests waiting to be published, those of a flush in progress included (so a
        request queued is always counted in ``pending`` or ``published``)."""
        return len(self._queue) + self._sending

    async def flush(self) -> int:
        """Publish the queued requests; a failed one is kept for the next flush."""
        queue, self._queue = self._queue, []
        self._sending = len(queue)
        sent = 0
        try:
            for i, msg in enumerate(queue):
                try:
                    await self._publisher.publish(topics.ADAPTER_PREWARM, msg)
                except BaseException:
                    self._queue[:0] = queue[i:]
                    raise
                sent += 1
                self._sending -= 1
                self.published += 1
        finally:
            self._sending = 0
        return sent


async def run_flusher(
    heat: HeatEmitter, prewarm: PrewarmRequester, *, interval_s: float = 1.0
) -> None:
    """Flush heat and prewarm events every ``interval_s`` until cancelled (then once more)."""
    try:
        while True:
            await asyncio.sleep(interval_s)
            await _flush_once(heat, prewarm)
    finally:
        await asyncio.shield(_flush_once(heat, prewarm))


async def _flush_once(heat: HeatEmitter, prewarm: PrewarmRequester) -> None:
    for flush in (prewarm.flush, heat.flush):
        try:
            await flush()
        except Exception:
            log.warning("publishing gateway events failed; will retry", exc_info=True)
