"""Heat batches and prewarm requests: batching per adapter, bounds, retries, dedupe."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

from google.protobuf.message import Message

from loraplane.gateway.emit import Completion, HeatEmitter, PrewarmRequester
from loraplane.shared import topics
from loraplane.v1 import common_pb2, events_pb2


class Recorder:
    def __init__(self, fail: int = 0) -> None:
        self.sent: list[tuple[str, Message]] = []
        self.fail = fail

    async def publish(self, topic: str, msg: Message) -> None:
        if self.fail:
            self.fail -= 1
            raise ConnectionError("broker down")
        topics.key_for(topic, msg)  # the message must fit its topic
        self.sent.append((topic, msg))


def completion(name: str, i: int, version: str = "v1") -> Completion:
    return Completion(
        adapter=common_pb2.AdapterRef(tenant_id="acme", adapter_name=name, version=version,
                                      base_model="tiny"),
        request_id=f"r{i}", worker_id="w1", request_class=common_pb2.REQUEST_CLASS_INTERACTIVE,
        tier_at_arrival=common_pb2.TIER_HOT, ttft_ms=1.5, duration_ms=3.0, prompt_tokens=2,
        output_tokens=4, status_code=0, degraded_to_base=False, engine_id=11, at=1_700_000_000.5,
    )


async def test_one_batch_per_adapter_in_order() -> None:
    rec = Recorder()
    heat = HeatEmitter(rec, producer="gateway/t", source_id="g", max_batch=3)
    for i in range(5):
        heat.record(completion("support", i, version="v1" if i % 2 else "v2"))
    heat.record(completion("code", 9))
    assert heat.pending == 6
    assert await heat.flush() == 6
    batches = [m for _, m in rec.sent]
    assert all(t == topics.ADAPTER_HEAT for t, _ in rec.sent)
    assert all(isinstance(b, events_pb2.HeatBatch) for b in batches)
    support = [b for b in batches if b.meta.adapter.adapter_name == "support"]
    assert [len(b.completions) for b in support] == [3, 2]
    ids = [c.request_id for b in support for c in b.completions]
    assert ids == ["r0", "r1", "r2", "r3", "r4"]
    first = support[0].completions[0]
    assert first.meta.adapter.version == "v2" and first.engine_id == 11
    assert first.meta.occurred_at.seconds == 1_700_000_000
    assert uuid.UUID(first.meta.event_id).version == 4 and first.meta.correlation_id == "r0"
    assert first.meta.producer == "gateway/t"
    assert len({c.meta.event_id for b in support for c in b.completions}) == 5
    assert heat.pending == 0 and heat.published == 6


async def test_failed_publish_keeps_completions_for_the_next_flush() -> None:
    rec = Recorder(fail=1)
    heat = HeatEmitter(rec, producer="gateway/t", source_id="g")
    heat.record(completion("support", 1))
    try:
        await heat.flush()
    except ConnectionError:
        pass
    else:
        raise AssertionError("the publish error must surface")
    assert heat.pending == 1
    assert await heat.flush() == 1


async def test_pending_is_bounded_and_drops_are_counted() -> None:
    heat = HeatEmitter(Recorder(), producer="gateway/t", source_id="g", max_pending=2)
    for i in range(5):
        heat.record(completion("support", i))
    assert (heat.pending, heat.dropped) == (2, 3)


async def test_prewarm_is_deduplicated_per_version_and_window() -> None:
    now = [100.0]
    rec = Recorder()
    pre = PrewarmRequester(rec, producer="gateway/t", dedupe_s=5, clock=lambda: now[0])
    ref = common_pb2.AdapterRef(tenant_id="acme", adapter_name="support", version="v2",
                                base_model="tiny")
    other = common_pb2.AdapterRef(tenant_id="acme", adapter_name="support", version="v3")
    assert pre.request(ref, 12, common_pb2.REQUEST_CLASS_INTERACTIVE, "cold_miss")
    assert not pre.request(ref, 12, common_pb2.REQUEST_CLASS_INTERACTIVE, "cold_miss")
    assert pre.request(other, 13, common_pb2.REQUEST_CLASS_INTERACTIVE, "cold_miss")
    now[0] = 106.0
    assert pre.request(ref, 12, common_pb2.REQUEST_CLASS_CANARY, "canary_not_warm")
    assert await pre.flush() == 3
    msgs = [m for t, m in rec.sent if t == topics.ADAPTER_PREWARM]
    assert [(m.meta.adapter.version, m.reason) for m in msgs] == [
        ("v2", "cold_miss"), ("v3", "cold_miss"), ("v2", "canary_not_warm")]
    assert msgs[0].engine_id == 12


async def test_prewarm_publish_failure_keeps_the_queue() -> None:
    rec = Recorder(fail=1)
    pre = PrewarmRequester(rec, producer="gateway/t")
    pre.request(common_pb2.AdapterRef(tenant_id="acme", adapter_name="a", version="v"), 1, 1, "x")
    try:
        await pre.flush()
    except ConnectionError:
        pass
    assert pre.pending == 1
    assert await pre.flush() == 1


async def test_every_recorded_completion_ends_published_or_dropped() -> None:
    rec = Recorder(fail=3)  # the broker is away for three flushes
    heat = HeatEmitter(rec, producer="gateway/t", source_id="g", max_pending=4)
    for i in range(6):
        heat.record(completion("support", i))
    for _ in range(3):
        try:
            await heat.flush()
        except ConnectionError:
            pass
        assert heat.recorded == heat.published + heat.dropped + heat.pending
    assert await heat.flush() == 4
    assert (heat.recorded, heat.published, heat.dropped, heat.pending) == (6, 4, 2, 0)


class Gated(Recorder):
    """A publish that waits for the broker's answer until ``gate`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.waiting = 0

    async def publish(self, topic: str, msg: Message) -> None:
        self.waiting += 1
        await self.gate.wait()
        await super().publish(topic, msg)


async def flush_held_by_the_broker() -> tuple[Gated, HeatEmitter, asyncio.Task[int]]:
    """Five completions recorded (batches of two) and a flush of them started that waits for
    the broker's answer to its first batch (the broker answers once ``gate`` is set)."""
    rec = Gated()
    heat = HeatEmitter(rec, producer="gateway/t", source_id="g", max_batch=2)
    for i in range(5):
        heat.record(completion("support", i))
    flush = asyncio.create_task(heat.flush())
    while not rec.waiting:
        await asyncio.sleep(0)
    return rec, heat, flush


async def test_completions_a_flush_is_publishing_still_count_as_pending() -> None:
    """``recorded == published + dropped + pending`` holds while a flush waits on the
    broker too (the outage test saw pending 0 with 9 completions neither published nor
    dropped: the flush had taken them)."""
    rec, heat, flush = await flush_held_by_the_broker()
    heat.record(completion("code", 9))  # recorded while the flush runs
    assert heat.pending == 6 and heat.published == 0
    assert heat.recorded == heat.published + heat.dropped + heat.pending
    rec.gate.set()
    assert await flush == 5
    assert (heat.published, heat.pending) == (5, 1)
    assert heat.recorded == heat.published + heat.dropped + heat.pending


async def test_a_cancelled_flush_keeps_what_it_had_not_published() -> None:
    rec, heat, flush = await flush_held_by_the_broker()
    flush.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await flush
    assert (heat.pending, heat.published) == (5, 0)
    rec.gate.set()
    assert await heat.flush() == 5 and heat.pending == 0


async def test_prewarm_queue_is_bounded_while_kafka_is_away() -> None:
    rec = Recorder()
    pre = PrewarmRequester(rec, producer="gateway/t", dedupe_s=5, max_pending=2)
    refs = [common_pb2.AdapterRef(tenant_id="acme", adapter_name="a", version=f"v{i}")
            for i in range(3)]
    assert [pre.request(r, 10 + i, common_pb2.REQUEST_CLASS_INTERACTIVE, "cold_miss")
            for i, r in enumerate(refs)] == [True, True, False]
    assert (pre.pending, pre.dropped) == (2, 1)
    assert await pre.flush() == 2


async def test_prewarm_requests_a_flush_is_publishing_still_count_as_pending() -> None:
    """A prewarm request is always in ``pending`` or ``published``: while a flush waits on
    the broker, the ones it took are pending (the end-to-end test once read 0 + 0 right
    after a cold miss asked for one, the flusher holding it); a cancelled flush keeps what
    it had not published."""
    rec = Gated()
    pre = PrewarmRequester(rec, producer="gateway/t")
    for v in ("v1", "v2"):
        pre.request(common_pb2.AdapterRef(tenant_id="acme", adapter_name="a", version=v), 1,
                    common_pb2.REQUEST_CLASS_INTERACTIVE, "cold_miss")
    flush = asyncio.create_task(pre.flush())
    while not rec.waiting:
        await asyncio.sleep(0)
    assert (pre.pending, pre.published) == (2, 0)
    flush.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await flush
    assert (pre.pending, pre.published) == (2, 0)
    rec.gate.set()
    assert await pre.flush() == 2
    assert (pre.pending, pre.published) == (0, 2)
