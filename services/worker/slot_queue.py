"""The per-worker queue of requests waiting for a HOT slot (pure ordering, clock passed in).

Order: **class, then tenant priority, with ageing** — the shared order of every queue a
request waits in (:mod:`loraplane.shared.ordering`): interactive before canary before
background, platinum before gold before silver before bronze within a class, each band a
head start of ``age_step_s`` seconds over the next, so a waiter is overtaken only by
requests that arrive within its bound (``band * age_step_s``) and then keeps its place;
equal keys in arrival order (sequence number). A newcomer goes straight to the slot decision only when no waiter is
ahead of it (:meth:`SlotQueue.ahead_of`); otherwise it queues, so a later request never
takes a freed slot from an earlier one of the same or a higher class. Bounded: a full
queue refuses (:class:`QueueFull`). Each waiter has a deadline (what is left of its class
budget), kept with it for the caller's timers.

The asyncio side (futures, wake-ups) lives in :class:`~loraplane.worker.manager.AdapterManager`;
this module only decides order and bound. A request that needs the version a queued load
is for *joins* it (:meth:`SlotQueue.inherit`): the load moves up to where that request
would queue, never down.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from loraplane.shared.ordering import (
    CLASS_RANK,
    DEFAULT_AGE_STEP_S,
    PRIORITIES_PER_CLASS,
    aged_key,
    band,
)
from loraplane.v1 import common_pb2

T = TypeVar("T")

__all__ = ["CLASS_RANK", "QueueFull", "SlotQueue", "Ticket"]


class QueueFull(Exception):
    """The queue holds ``max_depth`` waiters already."""


@dataclass(eq=False)
class Ticket(Generic[T]):
    """One waiter: its class rank, arrival sequence, deadline, payload, band and order key."""

    rank: int
    """Class rank (0 interactive, 1 canary, 2 background)."""
    seq: int
    enqueued_at: float
    deadline: float
    payload: T = field(repr=False)
    order: float = 0.0
    """Aged order key: ``enqueued_at + band * age_step_s``."""
    band: int = 0
    """Band (class, then tenant priority; :func:`loraplane.shared.ordering.band`)."""

    @property
    def key(self) -> tuple[float, int, int]:
        """Sort key: aged key, then band, then arrival."""
        return (self.order, self.band, self.seq)


class SlotQueue(Generic[T]):
    """Waiters for a HOT slot, in service order."""

    def __init__(self, max_depth: int, *, age_step_s: float = DEFAULT_AGE_STEP_S) -> None:
        """``max_depth``: most waiters at once (> 0); ``age_step_s``: head start of a band."""
        if max_depth < 1:
            raise ValueError(f"max_depth must be > 0, got {max_depth}")
        self.max_depth = max_depth
        self.age_step_s = age_step_s
        self._tickets: list[Ticket[T]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._tickets)

    def __iter__(self) -> Iterator[Ticket[T]]:
        """Waiters in service order."""
        return iter(self._tickets)

    @staticmethod
    def rank_of(request_class: int,
                priority: int = common_pb2.PRIORITY_UNSPECIFIED) -> int:
        """Band of a request (unknown classes rank as background)."""
        return band(request_class, priority)

    def _key(self, request_class: int, priority: int, now: float) -> tuple[float, int]:
        b = self.rank_of(request_class, priority)
        return aged_key(b, now, self.age_step_s), b

    def ahead_of(self, request_class: int, now: float,
                 priority: int = common_pb2.PRIORITY_UNSPECIFIED) -> int:
        """How many waiters a newcomer of ``request_class`` / ``priority`` arriving at
        ``now`` would queue behind."""
        key = self._key(request_class, priority, now)
        return sum(1 for t in self._tickets if (t.order, t.band) <= key)

    def push(self, request_class: int, now: float, deadline: float, payload: T,
             priority: int = common_pb2.PRIORITY_UNSPECIFIED) -> Ticket[T]:
        """Queue a waiter (raises :class:`QueueFull`)."""
        if len(self._tickets) >= self.max_depth:
            raise QueueFull(f"{len(self._tickets)} requests already wait for a HOT slot "
                            f"(queue depth {self.max_depth})")
        order, b = self._key(request_class, priority, now)
        ticket = Ticket(b // PRIORITIES_PER_CLASS, next(self._seq), now, deadline, payload,
                        order, b)
        self._tickets.append(ticket)
        self._tickets.sort(key=lambda t: t.key)
        return ticket

    def inherit(self, ticket: Ticket[T], request_class: int, now: float,
                priority: int = common_pb2.PRIORITY_UNSPECIFIED) -> bool:
        """A request of ``request_class`` joins the load ``ticket`` waits for (same version):
        the ticket takes the place that request would get as a newcomer when that place
        is earlier (no priority inversion: an interactive request never waits behind the
        background one whose load it needs). Returns whether the ticket moved."""
        if ticket not in self._tickets:
            return False
        order, b = self._key(request_class, priority, now)
        seq = next(self._seq)
        if (order, b, seq) >= ticket.key:
            return False
        ticket.order, ticket.band, ticket.seq = order, b, seq
        ticket.rank = b // PRIORITIES_PER_CLASS
        self._tickets.sort(key=lambda t: t.key)
        return True

    def remove(self, ticket: Ticket[T]) -> None:
        """Take a waiter out (no-op if it is not queued)."""
        try:
            self._tickets.remove(ticket)
        except ValueError:
            pass

    def position(self, ticket: Ticket[T]) -> int:
        """0-based place of ``ticket`` in service order (-1: not queued)."""
        for i, t in enumerate(self._tickets):
            if t is ticket:
                return i
        return -1
