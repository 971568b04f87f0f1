"""The shared consumer loop with in-memory consumers: commit after the effect, restart with
backoff, the broker-lost probe, lanes and readiness (the real broker: tests/integration/
stack/test_events_over_tansu.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from loraplane.shared.consumer import ConsumerLoop, OffsetTracker, Ready, backoff_delay


@dataclass(frozen=True)
class TP:
    topic: str
    partition: int


@dataclass
class Rec:
    partition: int
    offset: int
    value: str
    topic: str = "t"


@dataclass
class FakeConsumer:
    """Serves the records of a shared log from its committed offsets, one poll at a time."""

    log: dict[TP, list[Rec]]
    committed: dict[TP, int]
    commits: list[dict[TP, int]]
    probe_fails: list[bool] = field(default_factory=list)
    position: dict[TP, int] = field(default_factory=dict)
    started: bool = False

    async def start(self) -> None:
        self.started = True
        self.position = {tp: self.committed.get(tp, 0) for tp in self.log}

    async def stop(self) -> None:
        self.started = False

    async def getmany(self, *_: Any, timeout_ms: int = 0, max_records: int | None = None
                      ) -> dict[TP, list[Rec]]:
        out = {tp: recs[self.position[tp]:] for tp, recs in self.log.items()
               if recs[self.position[tp]:]}
        for tp, recs in out.items():
            self.position[tp] = recs[-1].offset + 1
        if not out:
            await asyncio.sleep(timeout_ms / 1000)
        return out

    async def commit(self, offsets: Any = None) -> None:
        offsets = dict(offsets if offsets is not None else self.position)
        self.commits.append(offsets)
        self.committed.update(offsets)

    async def topics(self) -> set[str]:
        if self.probe_fails and self.probe_fails.pop(0):
            raise ConnectionError("broker unreachable")
        return {"t"}

    def assignment(self) -> set[TP]:
        return set(self.log)


def _log(*counts: int) -> dict[TP, list[Rec]]:
    return {TP("t", p): [Rec(p, o, f"{p}:{o}") for o in range(n)] for p, n in enumerate(counts)}


class Rig:
    def __init__(self, log: dict[TP, list[Rec]], probe_fails: list[bool] | None = None) -> None:
        self.log = log
        self.committed: dict[TP, int] = {}
        self.commits: list[dict[TP, int]] = []
        self.made: list[FakeConsumer] = []
        self.probe_fails = probe_fails or []

    def factory(self) -> FakeConsumer:
        c = FakeConsumer(self.log, self.committed, self.commits, self.probe_fails)
        self.made.append(c)
        return c

    def first_with(self, **methods: Callable[[], Awaitable[None]]) -> Callable[[], FakeConsumer]:
        """A factory whose first consumer has ``methods`` (``start``, ``stop``) replaced: a
        client misbehaving in a broker outage; the consumers made after it are plain."""

        def factory() -> FakeConsumer:
            c = self.factory()
            if len(self.made) == 1:
                for name, method in methods.items():
                    setattr(c, name, method)
            return c

        return factory


def failing_once(value: str, seen: list[str], error: Exception) -> Callable[[Rec], Awaitable[None]]:
    """A handler that raises ``error`` for the record ``value`` the first time only and
    appends every record it handles to ``seen``."""
    fail = {value}

    async def handle(rec: Rec) -> None:
        if rec.value in fail:
            fail.discard(rec.value)
            raise error
        seen.append(rec.value)

    return handle


async def _until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.005)


async def test_a_failed_record_is_not_committed_and_is_read_again_after_a_backoff() -> None:
    rig = Rig(_log(3))
    seen: list[str] = []
    errors: list[BaseException] = []
    handle = failing_once("0:1", seen, ConnectionError("database down"))
    loop = ConsumerLoop("t", factory=rig.factory, on_record=handle, on_error=errors.append,
                        backoff=lambda attempt: 0.01 * (attempt + 1), poll_timeout_ms=5)
    task = asyncio.create_task(loop.run())
    await _until(lambda: rig.committed.get(TP("t", 0)) == 3)
    loop.stop()
    await task
    # 0:0 handled once, 0:1 failed then handled by the second consumer, nothing skipped
    assert seen == ["0:0", "0:0", "0:1", "0:2"]
    assert [type(e) for e in errors] == [ConnectionError]
    assert len(rig.made) == 2 and loop.consumers_started == 2 and loop.restarts == 1
    assert rig.commits == [{TP("t", 0): 3}]  # the first consumer committed nothing


async def test_lanes_keep_log_order_within_a_lane_and_commit_below_the_oldest_unfinished() -> None:
    rig = Rig(_log(4))
    gates = {f"0:{o}": asyncio.Event() for o in range(4)}
    order: list[str] = []

    async def handle(rec: Rec) -> None:
        await gates[rec.value].wait()
        order.append(rec.value)

    # lanes: even offsets in one, odd in the other
    loop = ConsumerLoop("t", factory=rig.factory, on_record=handle, concurrency=None,
                        lane=lambda _tp, rec: rec.offset % 2, poll_timeout_ms=5)
    task = asyncio.create_task(loop.run())
    gates["0:1"].set()  # 0:1 may run before 0:0 (other lane); 0:3 waits behind 0:1 only
    gates["0:3"].set()
    await _until(lambda: order == ["0:1", "0:3"])
    await asyncio.sleep(0.05)
    assert rig.commits == []  # 0:0 is unfinished: nothing can be committed
    gates["0:2"].set()  # still behind 0:0 in its lane
    await asyncio.sleep(0.05)
    assert order == ["0:1", "0:3"]
    gates["0:0"].set()
    await _until(lambda: rig.committed.get(TP("t", 0)) == 4)
    loop.stop()
    await task
    assert order == ["0:1", "0:3", "0:0", "0:2"]


async def test_a_stop_lets_records_in_flight_finish_and_commits_them() -> None:
    """A clean shutdown commits what it did (the next consumer of the group is not handed it
    again); a restart does not wait, and one stuck past ``drain_timeout_s`` is not
    committed."""
    rig = Rig(_log(3))
    gate = asyncio.Event()
    done: list[str] = []

    async def handle(rec: Rec) -> None:
        if rec.offset == 1:
            await gate.wait()
        done.append(rec.value)

    loop = ConsumerLoop("t", factory=rig.factory, on_record=handle, concurrency=None,
                        lane=lambda _tp, rec: rec.offset, poll_timeout_ms=5,
                        drain_timeout_s=5.0)
    task = asyncio.create_task(loop.run())
    await _until(lambda: sorted(done) == ["0:0", "0:2"])
    await asyncio.sleep(0.05)
    assert rig.committed.get(TP("t", 0)) == 1  # 0:1 unfinished: the commit stops below it
    loop.stop()
    await asyncio.sleep(0.05)
    assert not task.done()  # waiting for 0:1
    gate.set()
    await asyncio.wait_for(task, 5)
    assert rig.committed[TP("t", 0)] == 3

    stuck = Rig(_log(2))
    never = asyncio.Event()

    async def hang(rec: Rec) -> None:
        if rec.offset == 1:
            await never.wait()

    loop = ConsumerLoop("t", factory=stuck.factory, on_record=hang, concurrency=None,
                        lane=lambda _tp, rec: rec.offset, poll_timeout_ms=5,
                        drain_timeout_s=0.05, cancel_in_flight=False)
    task = asyncio.create_task(loop.run())
    await _until(lambda: stuck.committed.get(TP("t", 0)) == 1)
    loop.stop()
    await asyncio.sleep(0.2)  # the drain gave up: the consumer is closed, 0:1 uncommitted
    assert stuck.committed[TP("t", 0)] == 1 and not stuck.made[0].started
    never.set()
    await asyncio.wait_for(task, 5)
    assert stuck.committed[TP("t", 0)] == 1


async def test_the_probe_recreates_the_consumer_when_the_broker_is_back() -> None:
    rig = Rig(_log(1), probe_fails=[True, False])
    restarts: list[int] = []

    async def handle(rec: Rec) -> None:
        return None

    loop = ConsumerLoop("t", factory=rig.factory, on_record=handle, probe_interval_s=0.01,
                        poll_timeout_ms=5, on_restart=lambda: restarts.append(1),
                        backoff=lambda _a: 60.0)  # a probe restart does not back off
    task = asyncio.create_task(loop.run())
    await _until(lambda: loop.consumers_started == 2)
    loop.stop()
    await asyncio.wait_for(task, 2)
    assert restarts == [1]
    assert rig.commits == [{TP("t", 0): 1}]  # the record was not read again: it was committed


async def test_caught_up_waits_for_data_or_the_empty_grace() -> None:
    rig = Rig({TP("t", 0): []})
    loop = ConsumerLoop("t", factory=rig.factory, on_record=lambda _r: asyncio.sleep(0),
                        commit=False, poll_timeout_ms=5, ready_when=Ready.CAUGHT_UP,
                        empty_grace_s=60.0)
    task = asyncio.create_task(loop.run())
    await asyncio.sleep(0.1)
    assert not loop.ready.is_set()  # empty polls, within the grace: not caught up yet
    rig.log[TP("t", 0)].extend([Rec(0, 0, "a"), Rec(0, 1, "b")])
    await _until(loop.ready.is_set)
    loop.stop()
    await task
    assert rig.commits == []

    empty = Rig({TP("t", 0): []})
    graced = ConsumerLoop("t", factory=empty.factory, on_record=lambda _r: asyncio.sleep(0),
                          commit=False, poll_timeout_ms=5, ready_when=Ready.CAUGHT_UP,
                          empty_grace_s=0.05)
    task = asyncio.create_task(graced.run())
    await _until(graced.ready.is_set)
    graced.stop()
    await task


async def test_assigned_readiness_is_cleared_at_each_restart() -> None:
    rig = Rig(_log(1))
    states: list[bool] = []
    loop: ConsumerLoop

    def on_restart() -> None:
        states.append(loop.ready.is_set())

    loop = ConsumerLoop("t", factory=rig.factory, on_record=lambda _r: asyncio.sleep(0),
                        poll_timeout_ms=5, ready_when=Ready.ASSIGNED, on_restart=on_restart)
    task = asyncio.create_task(loop.run())
    await _until(loop.ready.is_set)
    loop.request_restart()
    await _until(lambda: loop.consumers_started == 2 and loop.ready.is_set())
    loop.stop()
    await task
    assert states == [True]  # set when the first consumer was closed, set again after


async def test_on_batch_owners_commit_positions_themselves() -> None:
    rig = Rig(_log(2, 1))
    batches: list[int] = []

    async def on_batch(batch: Any) -> None:
        batches.append(sum(len(v) for v in batch.values()))

    loop = ConsumerLoop("t", factory=rig.factory, on_batch=on_batch, poll_timeout_ms=5)
    task = asyncio.create_task(loop.run())
    await _until(lambda: 3 in batches and 0 in batches)  # empty polls are handed over too
    assert rig.commits == []
    await loop.commit_position()
    loop.stop()
    await task
    assert rig.commits == [{TP("t", 0): 2, TP("t", 1): 1}]


def test_a_loop_takes_one_handler_shape() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        ConsumerLoop("t", factory=lambda: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match="lane goes with on_record"):
        ConsumerLoop("t", factory=lambda: None,  # type: ignore[arg-type,return-value]
                     on_batch=lambda _b: asyncio.sleep(0), lane=lambda _t, _r: 0)


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [backoff_delay(a) for a in range(6)] == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0]
    assert backoff_delay(10_000) == 5.0


def test_offset_tracker_never_commits_the_position_it_read_from() -> None:
    tp = TP("t", 0)
    t = OffsetTracker()
    t.started(tp, 7)
    assert t.commit_points() == {}
    t.finished(tp, 7)
    assert t.commit_points() == {tp: 8}


@dataclass
class LaggingConsumer:
    """A slow broker: one record per poll, an empty poll between two, and the Kafka end
    offsets / positions the caught-up rule reads."""

    log: dict[TP, list[Rec]]
    at: dict[TP, int] = field(default_factory=dict)
    empty_next: bool = False

    async def start(self) -> None:
        self.at = {tp: 0 for tp in self.log}

    async def stop(self) -> None:
        return None

    async def getmany(self, *_: Any, timeout_ms: int = 0, max_records: int | None = None
                      ) -> dict[TP, list[Rec]]:
        await asyncio.sleep(0.001)
        self.empty_next = not self.empty_next
        if not self.empty_next:
            return {}
        for tp, recs in self.log.items():
            if self.at[tp] < len(recs):
                self.at[tp] += 1
                return {tp: [recs[self.at[tp] - 1]]}
        return {}

    async def commit(self, offsets: Any = None) -> None:
        return None

    async def topics(self) -> set[str]:
        return {"t"}

    def assignment(self) -> set[TP]:
        return set(self.log)

    async def end_offsets(self, partitions: list[TP]) -> dict[TP, int]:
        return {tp: len(self.log[tp]) for tp in partitions}

    async def position(self, tp: TP) -> int:
        return self.at[tp]


async def test_caught_up_means_the_end_offsets_read_not_the_first_empty_poll() -> None:
    log = _log(3, 2)
    applied: list[str] = []
    seen_when_ready: list[int] = []
    consumer = LaggingConsumer(log)

    async def on_record(record: Rec) -> None:
        applied.append(record.value)

    loop = ConsumerLoop("t", factory=lambda: consumer, on_record=on_record, commit=False,
                        poll_timeout_ms=5, ready_when=Ready.CAUGHT_UP, empty_grace_s=0.0)
    task = asyncio.create_task(loop.run())
    await _until(loop.ready.is_set)
    seen_when_ready.append(len(applied))
    loop.stop()
    await task
    # empty polls came between every record; ready only once all five were applied
    assert seen_when_ready == [5]

    empty = LaggingConsumer({TP("t", 0): []})
    graced = ConsumerLoop("t", factory=lambda: empty, on_record=on_record, commit=False,
                          poll_timeout_ms=5, ready_when=Ready.CAUGHT_UP, empty_grace_s=60.0)
    task = asyncio.create_task(graced.run())
    await _until(graced.ready.is_set)  # an empty topic is at its end at once, no grace
    graced.stop()
    await task


async def test_a_start_that_hangs_is_an_outage_and_the_consumer_is_recreated() -> None:
    rig = Rig(_log(2))
    hung = asyncio.Event()
    errors: list[BaseException] = []
    seen: list[str] = []

    async def never() -> None:  # the first start never returns (a half-restarted broker)
        hung.set()
        await asyncio.Event().wait()

    async def on_record(record: Rec) -> None:
        seen.append(record.value)

    loop = ConsumerLoop("t", factory=rig.first_with(start=never), on_record=on_record,
                        poll_timeout_ms=5, backoff=lambda _a: 0.0, start_timeout_s=0.1,
                        on_error=errors.append)
    task = asyncio.create_task(loop.run())
    await _until(lambda: seen == ["0:0", "0:1"])
    loop.stop()
    await task
    assert hung.is_set() and len(rig.made) == 2
    assert [type(e).__name__ for e in errors] == ["ConsumerStartTimeout"]


async def test_a_consumer_stop_that_never_finishes_does_not_hold_the_restart() -> None:
    """aiokafka's stop of a group consumer while the broker is down awaits its coordination
    task, which a cancel does not end: the admission release consumer hung in
    ``wait_for(consumer.stop(), 5)`` and consumed nothing more (registry e2e test)."""
    rig = Rig(_log(2))
    release = asyncio.Event()
    seen: list[str] = []

    async def stuck_stop() -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue

    loop = ConsumerLoop("t", factory=rig.first_with(stop=stuck_stop),
                        on_record=failing_once("0:0", seen, ConnectionError("broker down")),
                        poll_timeout_ms=5, backoff=lambda _a: 0.0, close_timeout_s=0.05)
    task = asyncio.create_task(loop.run())
    await _until(lambda: seen == ["0:0", "0:1"])
    loop.stop()
    await task
    assert len(rig.made) == 2 and loop.restarts == 1
    release.set()


async def test_a_cancelled_error_from_a_client_is_an_outage_not_the_end_of_the_loop() -> None:
    """aiokafka's stop() after a lost broker raises CancelledError (it awaits a task it had
    cancelled itself); the loop restarts instead of ending as if it had been cancelled."""
    rig = Rig(_log(2))
    seen: list[str] = []

    async def cancelled() -> None:
        raise asyncio.CancelledError()

    loop = ConsumerLoop("t", factory=rig.first_with(stop=cancelled, start=cancelled),
                        on_record=failing_once("0:0", seen, ConnectionError("broker down")),
                        poll_timeout_ms=5, backoff=lambda _a: 0.0)
    task = asyncio.create_task(loop.run())
    await _until(lambda: seen == ["0:1"] or seen == ["0:0", "0:1"])
    assert not task.done()
    loop.stop()
    await task
    assert len(rig.made) >= 2


async def test_cancelling_the_loop_still_ends_it() -> None:
    rig = Rig(_log(1))
    loop = ConsumerLoop("t", factory=rig.factory, on_record=lambda _r: asyncio.sleep(0),
                        poll_timeout_ms=5)
    task = asyncio.create_task(loop.run())
    await _until(lambda: rig.committed.get(TP("t", 0)) == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
