"""The per-worker queue of requests waiting for a HOT slot (pure ordering, clock passed in).

Order: **interactive before canary before background**, FIFO within a class (arrival
sequence number). A newcomer goes straight to the slot decision only when no waiter is
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

from loraplane.v1 import common_pb2

T = TypeVar("T")

CLASS_RANK: dict[int, int] = {
    common_pb2.REQUEST_CLASS_UNSPECIFIED: 0,
    common_pb2.REQUEST_CLASS_INTERACTIVE: 0,
    common_pb2.REQUEST_CLASS_CANARY: 1,
    common_pb2.REQUEST_CLASS_BACKGROUND: 2,
}
"""Queue rank of each request class (lower goes first; unspecified = interactive)."""


class QueueFull(Exception):
    """The queue holds ``max_depth`` waiters already."""


@dataclass(eq=False)
class Ticket(Generic[T]):
    """One waiter: its class rank, arrival sequence, deadline and payload."""

    rank: int
    seq: int
    enqueued_at: float
    deadline: float
    payload: T = field(repr=False)

    @property
    def key(self) -> tuple[int, int]:
        """Sort key: class rank, then arrival."""
        return (self.rank, self.seq)


class SlotQueue(Generic[T]):
    """Waiters for a HOT slot, in service order."""

    def __init__(self, max_depth: int) -> None:
        """``max_depth``: most waiters at once (> 0)."""
        if max_depth < 1:
            raise ValueError(f"max_depth must be > 0, got {max_depth}")
        self.max_depth = max_depth
        self._tickets: list[Ticket[T]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._tickets)

    def __iter__(self) -> Iterator[Ticket[T]]:
        """Waiters in service order."""
        return iter(self._tickets)

    @staticmethod
    def rank_of(request_class: int) -> int:
        """Queue rank of a request class (unknown classes rank as background)."""
        return CLASS_RANK.get(request_class, CLASS_RANK[common_pb2.REQUEST_CLASS_BACKGROUND])

    def ahead_of(self, request_class: int) -> int:
        """How many waiters a newcomer of ``request_class`` would queue behind."""
        rank = self.rank_of(request_class)
        return sum(1 for t in self._tickets if t.rank <= rank)

    def push(self, request_class: int, now: float, deadline: float, payload: T) -> Ticket[T]:
        """Queue a waiter (raises :class:`QueueFull`)."""
        if len(self._tickets) >= self.max_depth:
            raise QueueFull(f"{len(self._tickets)} requests already wait for a HOT slot "
                            f"(queue depth {self.max_depth})")
        ticket = Ticket(self.rank_of(request_class), next(self._seq), now, deadline, payload)
        self._tickets.append(ticket)
        self._tickets.sort(key=lambda t: t.key)
        return ticket

    def inherit(self, ticket: Ticket[T], request_class: int) -> bool:
        """A request of ``request_class`` joins the load ``ticket`` waits for (same version):
        the ticket takes the place that request would get as a newcomer when that place
        is earlier (no priority inversion: an interactive request never waits behind the
        background one whose load it needs). Returns whether the ticket moved."""
        key = (self.rank_of(request_class), next(self._seq))
        if key >= ticket.key or ticket not in self._tickets:
            return False
        ticket.rank, ticket.seq = key
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
