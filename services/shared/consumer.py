"""The one Kafka consumer loop of every service: each service writes only its handler.

:class:`ConsumerLoop` owns what the five consumers used to write each on their own:

* **start**: a fresh aiokafka consumer from ``factory`` (plus ``on_open``, e.g. assigning
  partitions by hand), counted in :attr:`ConsumerLoop.consumers_started`;
* **restart with backoff**: any failure of the consumer or of a handler closes the consumer
  and opens a new one after ``backoff(attempt)`` (:func:`backoff_delay` by default); a
  restart that was asked for (:meth:`ConsumerLoop.request_restart`, a handler raising
  :class:`Restart`, the probe seeing the broker back) happens at once. aiokafka consumers
  must be recreated after a broker loss: a rejoined consumer may silently receive nothing
  (``shared/FACTS.md``);
* **the broker-lost probe**: with ``probe_interval_s`` set, the loop asks the broker for
  metadata that often; after a failed probe the next successful one restarts the consumer;
* **commit after the effect is durable**: an offset is committed only once the handler of
  its record (and of every earlier record of its partition) returned; a handler that raises
  fails the session, so the record is read again by the next consumer (handlers are
  idempotent: at-least-once with dedupe);
* **readiness**: :attr:`ConsumerLoop.ready` is set by the rule of ``ready_when``.

Handlers come in two shapes:

* ``on_record(record)`` (async): records of one *lane* are handled in log order. Without
  ``lane`` every record is handled in turn inside the loop and each partition's offset is
  committed after its records of a batch. With ``lane(record) -> key`` records of different
  lanes run concurrently (at most ``concurrency`` at once, ``max_pending`` read ahead) while
  the loop keeps polling, and the commit point of a partition is its lowest unfinished
  offset (:class:`OffsetTracker`). Records in flight when the consumer is recreated finish
  anyway (or are cancelled, with ``cancel_in_flight``); their offsets are committed by
  nobody, so they are delivered again. At :meth:`ConsumerLoop.stop` records in flight
  are given ``drain_timeout_s`` to finish and are committed with the rest.
* ``on_batch(batch)`` (async): called after every poll, empty ones included, with the
  records by partition; nothing is committed by the loop: the owner commits positions when
  its effect is durable (:meth:`ConsumerLoop.commit_position`).

Usage (the registry's verdict consumer)::

    loop = ConsumerLoop("admissions", factory=lambda: AIOKafkaConsumer(topic, ...),
                        on_record=apply_verdict, probe_interval_s=2.0)
    await loop.run(stop)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from enum import Enum
from typing import Any, Protocol

from loraplane.shared.aio import abandon, close_within
from loraplane.shared.kafka_client import KafkaConnection

log = logging.getLogger(__name__)

Batch = Mapping[Any, Sequence[Any]]
"""Records by topic-partition, as ``AIOKafkaConsumer.getmany`` returns them."""


def backoff_delay(attempt: int, *, base_s: float = 0.2, cap_s: float = 5.0) -> float:
    """Delay before retry number ``attempt`` (0-based): ``base * 2**attempt``, capped."""
    return float(min(cap_s, base_s * (2 ** max(0, min(attempt, 30)))))


async def interruptible_sleep(
    stop: asyncio.Event, wake: asyncio.Event | None, timeout: float
) -> bool:
    """Sleep up to ``timeout`` or until ``stop`` / ``wake`` is set; returns ``stop.is_set()``."""
    waiters = [asyncio.ensure_future(stop.wait())]
    if wake is not None:
        waiters.append(asyncio.ensure_future(wake.wait()))
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
    return stop.is_set()


class Restart(Exception):
    """Raised by a handler or a probe: recreate the consumer now (no backoff)."""


class ConsumerStartTimeout(Exception):
    """A consumer's start did not finish within its bound: an outage, retried after the
    backoff."""


class BrokerLost(Restart):
    """The broker came back after a loss: recreate the consumer."""


class Consumer(Protocol):
    """The part of ``AIOKafkaConsumer`` the loop uses."""

    async def start(self) -> None:
        """Connect (and join the group, if any)."""

    async def stop(self) -> None:
        """Leave and disconnect."""

    async def getmany(self, *partitions: Any, timeout_ms: int = 0,
                      max_records: int | None = None) -> dict[Any, list[Any]]:
        """The next records by partition (possibly none)."""

    async def commit(self, offsets: Any = None) -> None:
        """Commit ``offsets`` (or every position returned so far)."""

    async def topics(self) -> set[str]:
        """The broker's topics (a metadata request: the probe)."""

    def assignment(self) -> set[Any]:
        """The partitions this consumer holds."""


class Ready(Enum):
    """When :attr:`ConsumerLoop.ready` is set."""

    FETCHED = "fetched"
    """After the first poll of any consumer returned (the group joined)."""
    ASSIGNED = "assigned"
    """While the current consumer holds partitions (cleared at each restart)."""
    CAUGHT_UP = "caught_up"
    """Once every assigned partition's position reached the end offset it had when the
    consumer started (records up to there handled), so a slow broker's empty polls in the
    middle of a replay never count as the end; an empty topic is caught up at once. A
    consumer without ``end_offsets`` (an in-memory fake) falls back to an empty poll after
    data, and a consumer with nothing assigned to ``empty_grace_s`` of empty polls
    (topics not created yet). Never cleared."""


class OffsetTracker:
    """Commit points of records handled out of order: the lowest unfinished offset."""

    def __init__(self) -> None:
        self._pending: dict[Any, set[int]] = defaultdict(set)
        self._next: dict[Any, int] = {}
        self._committed: dict[Any, int] = {}

    def started(self, tp: Any, offset: int) -> None:
        """A record is being handled."""
        # Committing the first offset read would only repeat the position read from.
        self._committed.setdefault(tp, offset)
        self._pending[tp].add(offset)
        self._next[tp] = max(self._next.get(tp, 0), offset + 1)

    def finished(self, tp: Any, offset: int) -> None:
        """A record's effect is durable."""
        self._pending[tp].discard(offset)

    def pending(self) -> int:
        """Records still being handled."""
        return sum(len(v) for v in self._pending.values())

    def commit_points(self) -> dict[Any, int]:
        """Offsets to commit now (only those that moved since the last commit)."""
        out: dict[Any, int] = {}
        for tp, nxt in self._next.items():
            pending = self._pending.get(tp)
            point = min(pending) if pending else nxt
            if point > self._committed.get(tp, -1):
                out[tp] = point
        return out

    def committed(self, points: Mapping[Any, int]) -> None:
        """Record a successful commit."""
        self._committed.update(points)


class _Session:
    """One consumer generation: its tracker, its tasks and the first handler failure."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.tracker = OffsetTracker()
        self.tasks: set[asyncio.Task[None]] = set()
        self.failure: BaseException | None = None
        self.seen_data = False
        self.ends: dict[Any, int] | None = None
        """End offsets of the assigned partitions when first asked (``Ready.CAUGHT_UP``)."""
        self.started = time.monotonic()
        self.broker_back = False


def group_consumer(*topics: str, kafka: KafkaConnection, group_id: str, client_id: str,
                   **options: Any) -> Consumer:
    """An unstarted aiokafka consumer of ``topics`` in ``group_id`` on ``kafka``: manual
    commits, from the earliest offset when the group has none, group settings that join in
    ~2 s on Tansu (:data:`~loraplane.shared.kafka_admin.GROUP_TUNING`); ``options`` override
    them."""
    from aiokafka import AIOKafkaConsumer

    from loraplane.shared.kafka_admin import GROUP_TUNING

    settings: dict[str, Any] = {"enable_auto_commit": False, "auto_offset_reset": "earliest",
                                **GROUP_TUNING, **options}
    consumer: Consumer = AIOKafkaConsumer(*topics, **kafka.client_args(),
                                          group_id=group_id, client_id=client_id, **settings)
    return consumer


def _cancelled_from_outside() -> bool:
    """Whether the current task was asked to cancel (``Task.cancel``), as opposed to a
    ``CancelledError`` raised by awaiting some other task that was cancelled."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


class ConsumerLoop:
    """Start, restart with backoff, probe, commit after the effect, readiness (see module)."""

    def __init__(
        self,
        name: str,
        *,
        factory: Callable[[], Consumer],
        on_record: Callable[[Any], Awaitable[None]] | None = None,
        on_batch: Callable[[Batch], Awaitable[None]] | None = None,
        lane: Callable[[Any, Any], Hashable] | None = None,
        concurrency: int | None = 1,
        max_pending: int | None = None,
        commit: bool = True,
        cancel_in_flight: bool = False,
        on_open: Callable[[Consumer], Awaitable[None]] | None = None,
        on_close: Callable[[Consumer], Awaitable[None]] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        on_restart: Callable[[], None] | None = None,
        backoff: Callable[[int], float] = backoff_delay,
        probe_interval_s: float | None = None,
        poll_timeout_ms: int = 300,
        max_records: int | None = 100,
        ready_when: Ready = Ready.FETCHED,
        empty_grace_s: float = 10.0,
        start_timeout_s: float | None = 30.0,
        drain_timeout_s: float = 10.0,
        close_timeout_s: float = 5.0,
    ) -> None:
        """``name``: for logs. Exactly one of ``on_record`` / ``on_batch``. ``lane(tp,
        record)``: records of one lane in order, lanes concurrently (``on_record`` only).
        ``commit``: False for a consumer without a group (nothing to commit).
        ``cancel_in_flight``: records in flight when a consumer closes are cancelled (and
        read again) rather than left to finish.
        ``on_open(consumer)``: after each start (e.g. assign partitions; raising retries);
        ``on_close(consumer)``: before each consumer is closed (e.g. a last commit). ``on_error(exc)``: every failure
        that restarts the consumer (metrics); ``on_restart()``: every recreation, asked
        for or not. ``start_timeout_s``: a consumer start (with ``on_open``) that takes
        longer is an outage (aiokafka's ``start`` waits for metadata and the group's
        assignment without a bound: a broker that restarted half-way can hold it for
        minutes); the consumer is closed and recreated after the backoff.
        ``drain_timeout_s``: at :meth:`stop` (not at a restart) records in flight get this
        long to finish before the last commit, so a clean shutdown commits everything it
        did and the next consumer of the group is not handed it again.
        ``close_timeout_s``: the last commit, ``on_close`` and the consumer's stop each get
        this long; past it they are abandoned (:func:`~loraplane.shared.aio.close_within`),
        so a close that never ends during an outage does not hold the restart."""
        if (on_record is None) == (on_batch is None):
            raise ValueError("ConsumerLoop takes exactly one of on_record / on_batch")
        if lane is not None and on_record is None:
            raise ValueError("lane goes with on_record")
        self.name = name
        self._factory = factory
        self._on_record = on_record
        self._on_batch = on_batch
        self._lane = lane
        self._sem = asyncio.Semaphore(max(1, concurrency)) if concurrency else None
        self._max_pending = max_pending
        self._commit = commit
        self._cancel_in_flight = cancel_in_flight
        self._on_open = on_open
        self._on_close = on_close
        self._on_error = on_error
        self._on_restart = on_restart
        self._backoff = backoff
        self._probe_interval_s = probe_interval_s
        self._poll_ms = poll_timeout_ms
        self._max_records = max_records
        self._ready_when = ready_when
        self._empty_grace_s = empty_grace_s
        self._start_timeout_s = start_timeout_s
        self._drain_timeout_s = drain_timeout_s
        self._close_timeout_s = close_timeout_s
        self.ready = asyncio.Event()
        """Set by the rule of ``ready_when`` (:class:`Ready`)."""
        self.consumers_started = 0
        """Consumers started so far (more than one after a restart)."""
        self.restarts = 0
        """Consumers recreated, asked for or after a failure."""
        self._stop = asyncio.Event()
        self._restart = asyncio.Event()
        self._session: _Session | None = None
        self._chains: dict[Hashable, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ control

    def request_restart(self) -> None:
        """Recreate the consumer at the next poll (e.g. after the broker came back)."""
        self._restart.set()

    def stop(self) -> None:
        """Ask :meth:`run` to return."""
        self._stop.set()
        self._restart.set()

    async def commit_position(self) -> None:
        """Commit the positions of everything the current consumer returned (``on_batch``
        owners call this once the effect of what they were given is durable)."""
        session = self._session
        if session is not None:
            await session.consumer.commit()

    # ------------------------------------------------------------------ loop

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Consume until ``stop`` (or :meth:`stop`); survives broker and handler failures.
        Records in flight are awaited before it returns."""
        watcher = asyncio.create_task(self._watch(stop)) if stop is not None else None
        attempt = 0
        try:
            while not self._stop.is_set():
                self._restart.clear()
                if self._ready_when is Ready.ASSIGNED:
                    self.ready.clear()
                delay = 0.0
                consumer = self._factory()
                session = _Session(consumer)
                try:
                    await self._bounded(consumer.start(), "start")
                    if self._on_open is not None:
                        await self._bounded(self._on_open(consumer), "open hook")
                    self.consumers_started += 1
                    self._session = session
                    await self._consume(session)
                    attempt = 0
                except asyncio.CancelledError:
                    if _cancelled_from_outside():
                        raise
                    # a client's inner task was cancelled, not this loop: an outage
                    delay = self._backoff(attempt)
                    attempt += 1
                    log.warning("%s consumer: a client task was cancelled; restarting in "
                                "%.1fs", self.name, delay)
                except Restart as exc:
                    log.info("%s consumer: %s, recreating the consumer",
                             self.name, str(exc) or type(exc).__name__)
                    attempt = 0
                    if self._on_error is not None:
                        self._on_error(exc)
                except Exception as exc:  # noqa: BLE001 - outage: back off, recreate
                    if isinstance(exc, ExceptionGroup):
                        exc = exc.exceptions[0]
                    delay = self._backoff(attempt)
                    attempt += 1
                    if self._on_error is not None:
                        self._on_error(exc)
                    log.warning("%s consumer: %s: %s; restarting in %.1fs", self.name,
                                type(exc).__name__, exc, delay)
                finally:
                    await self._close(session)
                if self._stop.is_set():
                    break
                self.restarts += 1
                if self._on_restart is not None:
                    self._on_restart()
                if delay:
                    await interruptible_sleep(self._stop, None, delay)
        finally:
            if watcher is not None:
                watcher.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _bounded(self, step: Awaitable[None], what: str) -> None:
        if self._start_timeout_s is None:
            await step
            return
        # not wait_for: a cancelled aiokafka start may never finish cancelling (see
        # loraplane.shared.aio), so past the bound it is cancelled and left behind
        task = asyncio.ensure_future(step)
        try:
            done, _ = await asyncio.wait({task}, timeout=self._start_timeout_s)
        except asyncio.CancelledError:
            abandon(task)
            raise
        if task not in done:
            abandon(task)
            raise ConsumerStartTimeout(
                f"consumer {what} took over {self._start_timeout_s:g} s (broker or group "
                "not answering)")
        task.result()

    async def _watch(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.stop()

    async def _close(self, session: _Session) -> None:
        if self._session is session:
            self._session = None
        if self._lane is not None:
            if session.failure is not None or self._cancel_in_flight:
                for task in session.tasks:  # abandoned: read again by the next consumer
                    task.cancel()
                await asyncio.gather(*session.tasks, return_exceptions=True)
            elif self._stop.is_set() and session.tasks:
                # a clean stop: let what is in flight finish so its offsets are committed
                # below (a restart does not wait: its records are read again)
                await asyncio.wait(set(session.tasks), timeout=self._drain_timeout_s)
            # what did finish is durable: commit it
            await close_within(self._commit_points(session), self._close_timeout_s,
                               f"{self.name} last commit")
        if self._on_close is not None:
            await close_within(self._on_close(session.consumer), self._close_timeout_s,
                               f"{self.name} consumer close hook")
        # a dead broker must not block a restart (close_within does not wait on the
        # cancelled stop, which an aiokafka consumer in a group may never finish)
        await close_within(session.consumer.stop(), self._close_timeout_s,
                           f"{self.name} consumer stop")

    async def _consume(self, session: _Session) -> None:
        consumer = session.consumer
        probe = (asyncio.create_task(self._probe(session), name=f"{self.name}-probe")
                 if self._probe_interval_s else None)
        try:
            while not self._restart.is_set():
                if session.failure is not None:
                    raise session.failure
                if session.broker_back:
                    raise BrokerLost("broker is back")
                if self._max_pending is not None and \
                        session.tracker.pending() >= self._max_pending:
                    await asyncio.sleep(0.01)
                    continue
                batch = await consumer.getmany(timeout_ms=self._poll_ms,
                                               max_records=self._max_records)
                self._mark_ready(session, consumer, bool(batch))
                await self._handle(session, batch)
                if self._ready_when is Ready.CAUGHT_UP and not self.ready.is_set():
                    await self._mark_caught_up(session, consumer, bool(batch))
                if self._lane is not None:
                    await self._commit_points(session)
            if session.failure is not None:
                raise session.failure
        finally:
            if probe is not None:
                probe.cancel()
                await asyncio.gather(probe, return_exceptions=True)

    async def _probe(self, session: _Session) -> None:
        """Ask the broker for metadata every ``probe_interval_s`` (beside the poll loop, so a
        commit or a handler waiting on the broker does not hide the loss); once a probe
        failed, the next success marks the session for a restart."""
        assert self._probe_interval_s
        lost = False
        while not session.broker_back:
            await asyncio.sleep(self._probe_interval_s)
            try:
                await asyncio.wait_for(session.consumer.topics(), 3)
            except Exception as exc:  # noqa: BLE001 - the broker is unreachable
                if not lost:
                    log.warning("%s consumer: broker unreachable (%s)", self.name, exc)
                lost = True
                continue
            if lost:
                session.broker_back = True

    def _mark_ready(self, session: _Session, consumer: Consumer, data: bool) -> None:
        rule = self._ready_when
        if rule is Ready.FETCHED or (rule is Ready.ASSIGNED and consumer.assignment()):
            self.ready.set()

    async def _mark_caught_up(self, session: _Session, consumer: Consumer, data: bool) -> None:
        """``Ready.CAUGHT_UP`` after a batch was handled (see :class:`Ready`)."""
        ends_of = getattr(consumer, "end_offsets", None)
        if ends_of is None:  # in-memory fake: an empty poll after data
            if data:
                session.seen_data = True
            elif session.seen_data or time.monotonic() - session.started >= self._empty_grace_s:
                self.ready.set()
            return
        parts = consumer.assignment()
        if not parts:  # topics not there (yet): the grace decides
            if time.monotonic() - session.started >= self._empty_grace_s:
                self.ready.set()
            return
        if session.ends is None or not parts <= session.ends.keys():
            ends = await ends_of(sorted(parts, key=lambda tp: (tp.topic, tp.partition)))
            session.ends = {**ends, **(session.ends or {})}
        for tp in parts:
            if await consumer.position(tp) < session.ends[tp]:  # type: ignore[attr-defined]
                return
        self.ready.set()

    async def _handle(self, session: _Session, batch: Batch) -> None:
        if self._on_batch is not None:
            await self._on_batch(batch)
            return
        assert self._on_record is not None
        if self._lane is None:
            for tp, records in batch.items():
                for record in records:
                    await self._on_record(record)
                if records and self._commit:
                    await session.consumer.commit({tp: records[-1].offset + 1})
            return
        for tp, records in batch.items():
            for record in records:
                self._dispatch(session, tp, record)

    def _dispatch(self, session: _Session, tp: Any, record: Any) -> None:
        assert self._lane is not None
        offset = int(record.offset)
        session.tracker.started(tp, offset)
        lane = self._lane(tp, record)
        previous = self._chains.get(lane)
        task = asyncio.create_task(self._run_record(session, previous, tp, offset, record))
        self._chains[lane] = task
        self._tasks.add(task)
        session.tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            session.tasks.discard(t)
            if self._chains.get(lane) is t:
                del self._chains[lane]

        task.add_done_callback(done)

    async def _run_record(self, session: _Session, previous: asyncio.Task[None] | None,
                          tp: Any, offset: int, record: Any) -> None:
        if previous is not None:  # same lane: keep the order of the log
            await asyncio.gather(previous, return_exceptions=True)
        if session.failure is not None:
            return  # an earlier record failed: this one is read again by the next consumer
        assert self._on_record is not None
        try:
            if self._sem is None:
                await self._on_record(record)
            else:
                async with self._sem:
                    await self._on_record(record)
        except Exception as exc:  # noqa: BLE001 - fails the session (not committed)
            if session.failure is None:
                session.failure = exc
            return
        session.tracker.finished(tp, offset)

    async def _commit_points(self, session: _Session) -> None:
        if not self._commit:
            return
        consumer = session.consumer
        assigned = consumer.assignment()
        points = {tp: off for tp, off in session.tracker.commit_points().items()
                  if tp in assigned}
        if points:
            await consumer.commit(points)
            session.tracker.committed(points)


__all__ = [
    "Batch",
    "BrokerLost",
    "Consumer",
    "ConsumerLoop",
    "OffsetTracker",
    "Ready",
    "Restart",
    "backoff_delay",
    "group_consumer",
    "interruptible_sleep",
]
