"""Flow control at the gateway: an admission limit per worker, priority bands with ageing,
and fair share between tenants within a band.

Without this the engine's own FIFO decides: every request sent to a worker runs at once
in vLLM's batch, so one tenant's 48 background streams slow every other tenant's tokens.
Here each worker takes at most ``max_in_flight_per_worker`` requests from this gateway;
the others wait in that worker's :class:`FlowQueue`.

**Who goes next** (:meth:`FlowQueue.pop_next`, pure: the caller passes the clock's
readings):

1. *Band* — class then tenant priority (:mod:`loraplane.shared.ordering`): the band whose
   next waiter (the one its fair share picks, step 3) has the smallest aged key
   ``enqueued_at + band * age_step_s``. So a better band goes first, but a request is
   overtaken only by requests that arrived at most ``(band - their band) *
   age_step_s`` after it (at most 11 s for bronze background with the default 1 s step);
   whatever arrives later is served after it.
2. *Headroom* — room groups: canary and background together may hold at most
   ``limit - platinum_reserve - interactive_reserve`` slots of a worker; non-platinum
   interactive plus those at most ``limit - platinum_reserve``; platinum interactive up to
   the limit. So a flood of lower bands always leaves slots for the bands above it (an
   interactive request never waits for a 64-token background request to finish: the
   engine cannot preempt a running one for compute), and background keeps its own slots
   under any interactive load; while interactive requests run on the worker, canary and
   background are admitted only up to ``background_slots_with_interactive`` (2) in
   flight, so fewer of their sequences share the engine's batch (each slows every step of
   the interactive ones), and for ``interactive_hold_s`` after the last interactive
   request on the worker ended (the hold window: a quiet stream's next request follows
   its last one within a few tens of milliseconds, and without the window background
   refills its whole room in that gap, so the next interactive request starts beside
   4 flood sequences, not 2). The cap holds a request back at most
   ``background_cap_max_hold_s`` (10 s) from its arrival, so it never takes one to its
   wait limit; the caller re-dispatches when the window closes or a waiter reaches that
   bound (:meth:`FlowQueue.cap_changes_at`). One level up the same: while platinum
   interactive requests run on the worker (and for the same hold window after), every
   other band together is admitted only up to ``others_slots_with_platinum`` (2) in
   flight (:class:`BesideCap`), however long a request waits (``platinum_cap_max_hold_s``
   may bound it; unbounded by default).
   The first band in turn order that fits is served: a flood
   at its cap never delays the bands above it, and a band whose turn has come but does
   not fit waits for a room that every band after it in its group needs too, so it gets
   the next slot that room frees (nothing starves).
3. *Tenant* — deficit round robin within the band: each tenant with waiters gets a
   quantum of ``quantum_tokens * weight`` tokens per round (weight by tenant tier:
   platinum 8, gold 4, silver 2, bronze 1), a request costs its ``max_tokens``; FIFO
   within a tenant. A tenant with 48 streams thus gets its weight's share of the band's
   admissions while another tenant waits in the band, not 48 / 49 of them.

A waiter never waits past its class's ``max_wait_s`` (the caller's timer; it is then
refused with RESOURCE_EXHAUSTED, ``queue_wait_exceeded``, and a retry hint).

:class:`FlowController` is the asyncio side (futures, timers, metrics); it only executes
what the queue decides.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from pydantic import BaseModel, ConfigDict, Field, model_validator

from loraplane.shared.errors import ResourceExhausted
from loraplane.shared.metrics import PerRegistry
from loraplane.shared.ordering import (
    BANDS,
    DEFAULT_AGE_STEP_S,
    PRIORITIES_PER_CLASS,
    PRIORITY_NAMES,
    aged_key,
    band,
)
from loraplane.v1 import common_pb2

T = TypeVar("T")

CLASS_OF_RANK = ("interactive", "canary", "background")
"""Class name of each class rank."""

WAIT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)
"""Queue-wait buckets (seconds)."""


class FlowConfig(BaseModel):
    """Admission limit, headroom, ageing and fair-share weights (gateway settings ``flow``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_in_flight_per_worker: int = Field(default=8, ge=0)
    """Requests this gateway runs on one worker at once (0 = no limit, no queue: the
    engine's FIFO decides)."""
    platinum_reserve: int = Field(default=2, ge=0)
    """Slots of a worker only platinum interactive requests may take."""
    interactive_reserve: int = Field(default=2, ge=0)
    """Further slots only interactive requests may take (canary / background never)."""
    background_slots_with_interactive: int = Field(default=2, ge=0)
    """Most canary / background requests admitted to a worker while interactive requests
    run on it (0 = no such cap; running ones finish, only admissions stop). Every request
    in the engine's batch slows each step of the others and the engine cannot preempt for
    compute, so while interactive requests are being served the lower classes keep fewer
    sequences in the batch; with none running they use their whole room."""
    interactive_hold_s: float = Field(default=0.5, ge=0)
    """Hold window: seconds the ``background_slots_with_interactive`` cap stays in force
    after the last interactive request on the worker ended (0 = released the instant it
    ends). Between a quiet tenant's requests the worker had no interactive request for
    6-10 ms (median) and at most 71 ms (also at load 9) in the isolation bench; released
    at once, background refilled its whole room in those gaps and the next interactive
    request shared the batch with all of it. 0.5 s covers the longest gap measured 7 times
    over and costs background at most half a second at its reduced cap once interactive
    traffic really stops (``services/gateway/README.md``, "Isolation measured")."""
    background_cap_max_hold_s: float = Field(default=10.0, ge=0)
    """Longest the ``background_slots_with_interactive`` cap (and its hold window) holds a
    canary / background request back, counted from its arrival (0 = no bound); older, only
    its room decides. The cap keeps fewer of them running while a quiet tenant's stream
    goes on, so a waiter behind it waits for one of those to end; when they are slow (a
    64-token request took 40-120 s at load 30 on the 2-core box) that wait would reach
    its class's ``max_wait_s`` (30 s) and be refused. 10 s leaves 20 s of that budget for
    the room itself."""
    others_slots_with_platinum: int = Field(default=2, ge=0)
    """Most requests of every other band together (non-platinum interactive, canary,
    background) admitted to a worker while platinum interactive requests run on it, and
    for ``interactive_hold_s`` after the last one ended (0 = no such cap). The same reason
    as ``background_slots_with_interactive`` one level up: every sequence in the batch
    slows each step of the others, so with a gold interactive flood at its room (6 of 8)
    and background at its cap (2), a platinum stream shared the batch with 6 other
    sequences and its p99 rose 3.4 x (isolation bench, 22:57 UTC); the reserves keep a
    platinum request from waiting for a slot, not from sharing the batch. On a GPU a
    batch of 8 costs about what a batch of 2 does: raise it there."""
    platinum_cap_max_hold_s: float = Field(default=0.0, ge=0)
    """Longest the ``others_slots_with_platinum`` cap holds a request back, counted from
    its arrival (0 = no bound, the default); older, only its room decides. Unbounded, the
    others keep their ``others_slots_with_platinum`` slots (never starved) and a waiter
    beyond them is refused at its class's wait limit (429 naming it). A bound lets every
    waiter that reaches it past the cap, so under a sustained flood (every waiter gets that
    old) the cap is gone: at 5 s, with a gold interactive flood and a background flood
    beside a platinum stream, 32 % of the platinum requests started beside more than 2
    others (up to 6, mean 3.0), and 4.5 others on average once the floods ran in their
    own processes (isolation bench, 2026-12-02)."""
    age_step_s: float = Field(default=DEFAULT_AGE_STEP_S, gt=0)
    """Head start of one band over the next, in seconds waited (bounds overtaking)."""
    quantum_tokens: int = Field(default=64, ge=1)
    """Deficit-round-robin quantum per unit of weight, in tokens."""
    weights: dict[str, int] = Field(
        default_factory=lambda: {"platinum": 8, "gold": 4, "silver": 2, "bronze": 1}
    )
    """Fair-share weight by tenant tier."""
    max_wait_s: dict[str, float] = Field(
        default_factory=lambda: {"interactive": 10.0, "canary": 30.0, "background": 30.0}
    )
    """Longest wait in the queue by class (background and canary: their 30 s budget)."""

    @model_validator(mode="after")
    def _check(self) -> FlowConfig:
        problems = []
        limit = self.max_in_flight_per_worker
        if limit and limit - self.platinum_reserve - self.interactive_reserve < 1:
            problems.append(
                f"max_in_flight_per_worker {limit} leaves no slot for canary/background after "
                f"platinum_reserve {self.platinum_reserve} + interactive_reserve "
                f"{self.interactive_reserve}"
            )
        missing = {"platinum", "gold", "silver", "bronze"} - set(self.weights)
        if missing or any(w < 1 for w in self.weights.values()):
            problems.append(f"weights needs platinum, gold, silver, bronze >= 1 (missing "
                            f"{sorted(missing)})")
        missing = set(CLASS_OF_RANK) - set(self.max_wait_s)
        if missing or any(s <= 0 for s in self.max_wait_s.values()):
            problems.append(f"max_wait_s needs interactive, canary, background > 0 (missing "
                            f"{sorted(missing)})")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def cap(self, band_: int) -> int:
        """Most requests of ``band_``'s room group and worse groups in flight on a worker
        with which a request of ``band_`` is still admitted (see :func:`room_group`)."""
        limit = self.max_in_flight_per_worker
        return (limit, limit - self.platinum_reserve,
                limit - self.platinum_reserve - self.interactive_reserve)[room_group(band_)]

    def weight(self, priority: int) -> int:
        """Fair-share weight of a tenant of ``priority``."""
        return self.weights[PRIORITY_NAMES.get(priority, "bronze")]

    def wait_limit_s(self, request_class: int) -> float:
        """Longest wait in the queue of a request of ``request_class``."""
        return self.max_wait_s[class_name(request_class)]


ROOM_GROUP_START = (0, 1, PRIORITIES_PER_CLASS)
"""First band of each room group: 0 platinum interactive, 1 other interactive, 2 canary
and background."""


def room_group(band_: int) -> int:
    """Room group of a band (0 platinum interactive, 1 other interactive, 2 the rest)."""
    return 0 if band_ == 0 else 1 if band_ < PRIORITIES_PER_CLASS else 2


def class_name(request_class: int) -> str:
    """Class name of a request class value (unspecified = interactive)."""
    return CLASS_OF_RANK[band(request_class, common_pb2.PRIORITY_PLATINUM) // PRIORITIES_PER_CLASS]


@dataclass(frozen=True)
class BesideCap:
    """A cap on how many requests of worse bands run on a worker beside a guarded group:
    while requests of bands ``[0, guarded)`` run, and for ``interactive_hold_s`` after the
    last of them ended, the requests of bands ``[guarded, BANDS)`` together are admitted
    only up to ``limit`` in flight (0 = no cap); a request held back ``max_hold_s`` from
    its arrival (0 = no bound) is then judged by its room alone."""

    guarded: int
    limit: int
    max_hold_s: float


def beside_caps(config: FlowConfig) -> tuple[BesideCap, BesideCap]:
    """The two caps of ``config``: canary / background beside interactive, then every other
    band beside platinum interactive (the ``ended_at`` pairs of :class:`FlowQueue` follow
    this order)."""
    return (
        BesideCap(PRIORITIES_PER_CLASS, config.background_slots_with_interactive,
                  config.background_cap_max_hold_s),
        BesideCap(1, config.others_slots_with_platinum, config.platinum_cap_max_hold_s),
    )


@dataclass(eq=False)
class Waiter(Generic[T]):
    """One request waiting for admission to a worker."""

    tenant: str
    band: int
    weight: int
    cost: int
    """Tokens the request may produce (its ``max_tokens``): its deficit-round-robin cost."""
    enqueued_at: float
    seq: int
    payload: T = field(repr=False)

    @property
    def klass(self) -> str:
        """Class name."""
        return CLASS_OF_RANK[self.band // PRIORITIES_PER_CLASS]


@dataclass
class _Band(Generic[T]):
    """Waiters of one band: FIFO per tenant, deficit round robin between tenants."""

    queues: dict[str, deque[Waiter[T]]] = field(default_factory=dict)
    active: deque[str] = field(default_factory=deque)
    deficit: dict[str, float] = field(default_factory=dict)
    turn_started: bool = False

    def push(self, w: Waiter[T]) -> None:
        q = self.queues.get(w.tenant)
        if q is None:
            q = self.queues[w.tenant] = deque()
            self.active.append(w.tenant)
            self.deficit[w.tenant] = 0.0
        q.append(w)

    def _drop_tenant(self, tenant: str) -> None:
        if self.active and self.active[0] == tenant:
            self.turn_started = False
        del self.queues[tenant]
        self.active.remove(tenant)
        del self.deficit[tenant]

    def remove(self, w: Waiter[T]) -> bool:
        q = self.queues.get(w.tenant)
        if q is None or w not in q:
            return False
        q.remove(w)
        if not q:
            self._drop_tenant(w.tenant)
        return True

    def peek(self, quantum_tokens: int) -> Waiter[T]:
        """The waiter deficit round robin serves next (advances the rounds to it; calling
        again returns the same waiter)."""
        while True:
            tenant = self.active[0]
            q = self.queues[tenant]
            if not self.turn_started:
                self.deficit[tenant] += quantum_tokens * q[0].weight
                self.turn_started = True
            if q[0].cost <= self.deficit[tenant]:
                return q[0]
            self.active.rotate(-1)  # its turn is over; the deficit is kept for the next
            self.turn_started = False

    def pop(self, quantum_tokens: int) -> Waiter[T]:
        head = self.peek(quantum_tokens)
        q = self.queues[head.tenant]
        q.popleft()
        self.deficit[head.tenant] -= head.cost
        if not q:
            self._drop_tenant(head.tenant)  # an idle tenant keeps no credit
        return head


class FlowQueue(Generic[T]):
    """The waiters for one worker, in service order (see the module doc). Pure."""

    def __init__(self, config: FlowConfig) -> None:
        """An empty queue under ``config``."""
        self.config = config
        self._caps = beside_caps(config)
        self._bands: list[_Band[T]] = [_Band() for _ in range(BANDS)]
        self._seq = itertools.count()
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Waiter[T]]:
        """Every waiter (band by band, tenant by tenant; not service order)."""
        for b in self._bands:
            for q in b.queues.values():
                yield from q

    def push(
        self, *, tenant: str, request_class: int, priority: int, cost: int, now: float,
        payload: T,
    ) -> Waiter[T]:
        """Queue a request of ``tenant`` (its tier ``priority``) that arrived at ``now``."""
        b = band(request_class, priority)
        w = Waiter(tenant, b, self.config.weight(priority), max(1, cost), now,
                   next(self._seq), payload)
        self._bands[b].push(w)
        self._len += 1
        return w

    def remove(self, w: Waiter[T]) -> bool:
        """Take a waiter out (False when it is no longer queued)."""
        if self._bands[w.band].remove(w):
            self._len -= 1
            return True
        return False

    def _turns(self) -> list[int]:
        """Bands with waiters, in turn order: the aged key of the waiter each band would
        serve next (its fair-share choice), smallest first."""
        keyed = []
        for i, b in enumerate(self._bands):
            if b.queues:
                nxt = b.peek(self.config.quantum_tokens)
                keyed.append((aged_key(i, nxt.enqueued_at, self.config.age_step_s), i))
        return [i for _, i in sorted(keyed)]

    def head_band(self) -> int | None:
        """The band whose turn it is, if any."""
        turns = self._turns()
        return turns[0] if turns else None

    def _held(self, cap: BesideCap, running: Sequence[int], now: float,
              ended_at: float | None) -> bool:
        """Whether ``cap`` is in force at ``now``: its guarded bands run (``running``), or
        the last of them ended at ``ended_at``, less than ``interactive_hold_s`` before."""
        if not cap.limit:
            return False
        if sum(running[:cap.guarded]):
            return True
        # the same sum as _hold_ends, so held <=> now < the time it says the window closes
        return ended_at is not None and now < ended_at + self.config.interactive_hold_s

    def _hold_ends(self, cap: BesideCap, running: Sequence[int],
                   ended_at: float | None) -> float | None:
        """When the hold window alone keeps ``cap`` in force, the time it closes; None
        while its guarded bands run, or without a window."""
        if (not cap.limit or not self.config.interactive_hold_s or ended_at is None
                or any(running[:cap.guarded])):
            return None
        return ended_at + self.config.interactive_hold_s

    def background_held(
        self, running: Sequence[int], *, now: float = 0.0,
        interactive_ended_at: float | None = None,
    ) -> bool:
        """Whether the ``background_slots_with_interactive`` cap is in force at ``now``:
        interactive requests run (``running``), or the last one on the worker ended at
        ``interactive_ended_at``, less than ``interactive_hold_s`` before ``now``."""
        return self._held(self._caps[0], running, now, interactive_ended_at)

    def hold_ends_at(
        self, running: Sequence[int], interactive_ended_at: float | None,
    ) -> float | None:
        """When the hold window alone keeps the background cap in force, the time it closes
        (the caller admits again then); None while interactive requests run, or without a
        window."""
        return self._hold_ends(self._caps[0], running, interactive_ended_at)

    def cap_changes_at(
        self, running: Sequence[int], *, now: float, interactive_ended_at: float | None,
        platinum_ended_at: float | None = None,
    ) -> float | None:
        """The next time after ``now`` at which a cap beside a guarded group (background
        beside interactive, the others beside platinum) stops holding a waiter back
        without anything else changing: its hold window closes, or the next waiter of a
        band it holds reaches the cap's ``max_hold_s`` (the caller admits again then);
        None when no such time is due."""
        due = []
        for cap, ended in zip(self._caps, (interactive_ended_at, platinum_ended_at),
                              strict=True):
            if not self._held(cap, running, now, ended):
                continue
            ends = self._hold_ends(cap, running, ended)
            if ends is not None:
                due.append(ends)
            if cap.max_hold_s:
                for i in range(cap.guarded, BANDS):
                    b = self._bands[i]
                    if b.queues:
                        due.append(b.peek(self.config.quantum_tokens).enqueued_at
                                   + cap.max_hold_s)
        later = [t for t in due if t > now]
        return min(later) if later else None

    def fits(
        self, band_: int, running: Sequence[int], *, now: float = 0.0,
        interactive_ended_at: float | None = None, waited_s: float = 0.0,
        platinum_ended_at: float | None = None,
    ) -> bool:
        """Whether a request of ``band_`` may start at ``now`` with ``running[b]`` requests
        of each band ``b`` in flight, the last interactive (platinum interactive) request on
        the worker having ended at ``interactive_ended_at`` (``platinum_ended_at``; None:
        none since it had none running): for its room group and every better one, the
        requests of that group and worse groups are fewer than the group's cap (so the
        platinum group's cap is the worker's limit, and every reserve stays free of worse
        groups); and for each cap beside a guarded group that holds its band, the held
        bands' requests are fewer than the cap's limit while it is in force, unless the
        request has waited ``waited_s`` >= the cap's ``max_hold_s``."""
        if not self.config.max_in_flight_per_worker:
            return True
        for cap, ended in zip(self._caps, (interactive_ended_at, platinum_ended_at),
                              strict=True):
            if (band_ >= cap.guarded and cap.limit
                    and sum(running[cap.guarded:]) >= cap.limit
                    and not (cap.max_hold_s and waited_s >= cap.max_hold_s)
                    and self._held(cap, running, now, ended)):
                return False
        return all(sum(running[ROOM_GROUP_START[h]:]) < self.config.cap(ROOM_GROUP_START[h])
                   for h in range(room_group(band_) + 1))

    def pop_next(
        self, running: Sequence[int], *, now: float = 0.0,
        interactive_ended_at: float | None = None, platinum_ended_at: float | None = None,
    ) -> Waiter[T] | None:
        """The waiter to admit at ``now`` (taken out of the queue): the first band in turn
        order that :meth:`fits`; None when none does.

        No starvation: a band whose turn it is but does not fit is kept out by a room or a
        cap it shares with every band after it in the same or a worse group, so none of
        those fits either; the next request to end frees it and it is served first."""
        for b in self._turns():
            nxt = self._bands[b].peek(self.config.quantum_tokens)
            if self.fits(b, running, now=now, interactive_ended_at=interactive_ended_at,
                         waited_s=now - nxt.enqueued_at, platinum_ended_at=platinum_ended_at):
                self._len -= 1
                return self._bands[b].pop(self.config.quantum_tokens)
        return None


# --------------------------------------------------------------------------- asyncio side


class QueueWaitExceeded(ResourceExhausted):
    """A request waited its class's longest queue wait for a worker slot."""

    code = "queue_wait_exceeded"


class FlowMetrics(PerRegistry):
    """Queue depth and wait per tenant and class, worker time per tenant, quota refusals."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        """Register the families in ``registry``."""
        super().__init__(registry)
        self.depth = Gauge(
            "loraplane_gateway_queue_depth", "Requests waiting for a worker slot at this "
            "gateway.", ["tenant", "class"], registry=registry,
        )
        self.wait = Histogram(
            "loraplane_gateway_queue_wait_seconds", "Time a request waited for a worker slot "
            "(admitted or refused).", ["tenant", "class"], buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.timeouts = Counter(
            "loraplane_gateway_queue_timeouts", "Requests refused after waiting their class's "
            "longest queue wait.", ["tenant", "class"], registry=registry,
        )
        self.worker_seconds = Counter(
            "loraplane_gateway_worker_seconds", "Seconds requests of a tenant held a worker "
            "slot (share of worker time: rate over the sum of rates).", ["tenant", "class"],
            registry=registry,
        )
        self.quota_refused = Counter(
            "loraplane_gateway_quota_refused", "Requests refused (429) because the tenant "
            "was over a quota, by quota (max_in_flight, tokens_per_s).", ["tenant", "quota"],
            registry=registry,
        )


@dataclass
class _WorkerFlow:
    queue: FlowQueue[asyncio.Future[float]]
    running: list[int] = field(default_factory=lambda: [0] * BANDS)
    interactive_ended_at: float | None = None
    """When the last interactive request on the worker ended (its hold window)."""
    platinum_ended_at: float | None = None
    """When the last platinum interactive request on the worker ended (its hold window)."""
    hold_timer: asyncio.TimerHandle | None = None
    """The dispatch due when the background cap's hold changes (window closes, a waiter
    reaches ``background_cap_max_hold_s``)."""

    @property
    def in_flight(self) -> int:
        return sum(self.running)


class Permit:
    """A request's slot on a worker; :meth:`release` it when the stream ends."""

    __slots__ = ("_done", "_flow", "_worker", "admitted_at", "band", "klass", "tenant",
                 "waited_s")

    def __init__(self, flow: FlowController, worker: str, band_: int, tenant: str, klass: str,
                 admitted_at: float, waited_s: float) -> None:
        self._flow = flow
        self._worker = worker
        self.band = band_
        self.tenant = tenant
        self.klass = klass
        self.admitted_at = admitted_at
        self.waited_s = waited_s
        """Seconds the request waited in the queue."""
        self._done = False

    def release(self) -> None:
        """Give the slot back (idempotent) and admit who is next."""
        if self._done:
            return
        self._done = True
        self._flow._release(self)


class FlowController:
    """Per-worker admission queues of this gateway (executes :class:`FlowQueue`'s order)."""

    def __init__(
        self,
        config: FlowConfig,
        *,
        metrics: FlowMetrics | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``monotonic``: the clock of arrivals, waits and worker time."""
        self.config = config
        self.metrics = metrics
        self._now = monotonic
        self._workers: dict[str, _WorkerFlow] = {}
        self._worker_seconds: dict[tuple[str, str], Counter] = {}
        """``metrics.worker_seconds`` children by (tenant, class), bound once (a ``labels()``
        lookup per request costs a lock and the label checks)."""

    def _worker(self, worker_id: str) -> _WorkerFlow:
        wf = self._workers.get(worker_id)
        if wf is None:
            wf = self._workers[worker_id] = _WorkerFlow(FlowQueue(self.config))
        return wf

    def in_flight(self, worker_id: str) -> int:
        """Requests admitted to ``worker_id`` and not released."""
        wf = self._workers.get(worker_id)
        return wf.in_flight if wf is not None else 0

    def waiting(self, worker_id: str) -> int:
        """Requests waiting for ``worker_id``."""
        wf = self._workers.get(worker_id)
        return len(wf.queue) if wf is not None else 0

    async def admit(
        self, worker_id: str, *, tenant: str, request_class: int, priority: int, cost: int,
    ) -> Permit:
        """Wait for a slot on ``worker_id`` (raises :class:`QueueWaitExceeded`)."""
        b = band(request_class, priority)
        klass = CLASS_OF_RANK[b // PRIORITIES_PER_CLASS]  # class_name(request_class)
        if not self.config.max_in_flight_per_worker:
            return Permit(self, worker_id, b, tenant, klass, self._now(), 0.0)
        wf = self._worker(worker_id)
        arrived = self._now()
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        waiter = wf.queue.push(tenant=tenant, request_class=request_class, priority=priority,
                               cost=cost, now=arrived, payload=fut)
        depth = self.metrics.depth.labels(tenant, klass) if self.metrics else None
        if depth is not None:
            depth.inc()
        self._dispatch(wf)
        if not fut.done():
            limit = self.config.wait_limit_s(request_class)
            try:
                await asyncio.wait({fut}, timeout=limit)
            except asyncio.CancelledError:
                if not wf.queue.remove(waiter) and fut.done():
                    self._end(wf, b)  # admitted as the caller left: give the slot back
                    self._dispatch(wf)
                elif depth is not None:
                    depth.dec()
                raise
            if not fut.done():
                wf.queue.remove(waiter)
                waited = self._now() - arrived
                if self.metrics is not None:
                    depth.dec()  # type: ignore[union-attr]
                    self.metrics.wait.labels(tenant, klass).observe(waited)
                    self.metrics.timeouts.labels(tenant, klass).inc()
                raise QueueWaitExceeded(
                    f"waited {waited:.1f} s for a slot on worker {worker_id} (the {klass} "
                    f"class waits at most {limit:g} s; {len(wf.queue)} requests still "
                    f"queued, {wf.in_flight} running)",
                    retry_after_s=max(1.0, min(limit, 5.0)),
                )
        admitted_at = fut.result()
        waited = admitted_at - arrived
        if self.metrics is not None:
            self.metrics.wait.labels(tenant, klass).observe(waited)
        return Permit(self, worker_id, b, tenant, klass, admitted_at, waited)

    def _end(self, wf: _WorkerFlow, band_: int) -> None:
        """One request of ``band_`` left the worker (the last interactive one opens the
        hold window)."""
        wf.running[band_] = max(0, wf.running[band_] - 1)
        if band_ < PRIORITIES_PER_CLASS and not sum(wf.running[:PRIORITIES_PER_CLASS]):
            wf.interactive_ended_at = self._now()
        if band_ == 0 and not wf.running[0]:
            wf.platinum_ended_at = self._now()

    def _dispatch(self, wf: _WorkerFlow) -> None:
        while True:
            now = self._now()
            w = wf.queue.pop_next(wf.running, now=now,
                                  interactive_ended_at=wf.interactive_ended_at,
                                  platinum_ended_at=wf.platinum_ended_at)
            if w is None:
                break
            wf.running[w.band] += 1
            if self.metrics is not None:
                self.metrics.depth.labels(w.tenant, w.klass).dec()
            w.payload.set_result(now)
        if wf.hold_timer is not None:
            wf.hold_timer.cancel()
            wf.hold_timer = None
        ends = wf.queue.cap_changes_at(wf.running, now=now,
                                       interactive_ended_at=wf.interactive_ended_at,
                                       platinum_ended_at=wf.platinum_ended_at)
        if ends is not None and len(wf.queue):
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # released outside the loop: the next change dispatches
                return
            wf.hold_timer = loop.call_later(ends - now, self._dispatch, wf)

    def _release(self, permit: Permit) -> None:
        if self.metrics is not None:
            key = (permit.tenant, permit.klass)
            child = self._worker_seconds.get(key)
            if child is None:
                child = self._worker_seconds[key] = self.metrics.worker_seconds.labels(*key)
            child.inc(max(0.0, self._now() - permit.admitted_at))
        if not self.config.max_in_flight_per_worker:
            return
        wf = self._worker(permit._worker)
        self._end(wf, permit.band)
        self._dispatch(wf)
