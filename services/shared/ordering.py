"""Service order of waiting requests: class, then tenant priority, with ageing.

One implementation, used by every queue a request can wait in: the gateway's admission
queue per worker (:mod:`loraplane.gateway.flow`), the worker's queue for a HOT slot
(:mod:`loraplane.worker.slot_queue`) and, through :func:`engine_priority`, vLLM's own
waiting queue (``scheduling_policy="priority"``).

A request's **band** is ``class_rank * 4 + priority_rank``: interactive before canary
before background, and within a class platinum → gold → silver → bronze (0 is served
first; 12 bands)::

    band  0..3   interactive  platinum, gold, silver, bronze
    band  4..7   canary       platinum, gold, silver, bronze
    band  8..11  background   platinum, gold, silver, bronze

**Ageing.** A waiter's order key is ``enqueued_at + band * age_step_s``: each band is a
head start of ``age_step_s`` seconds over the next. So a request of band ``b`` that
arrived at ``t`` is overtaken only by requests of a better band ``b' < b`` that arrive
by ``t + (b - b') * age_step_s``; anything arriving later queues behind it. The
longest a request can be overtaken is therefore ``b * age_step_s`` (11 s for a bronze
background request with the default 1 s step), after which only requests already
ahead of it are served first — nothing starves. Equal keys go to the better band.

Pure code: the caller passes the arrival times (its clock); nothing here reads one.
"""

from __future__ import annotations

from loraplane.v1 import common_pb2

CLASS_RANK: dict[int, int] = {
    common_pb2.REQUEST_CLASS_UNSPECIFIED: 0,
    common_pb2.REQUEST_CLASS_INTERACTIVE: 0,
    common_pb2.REQUEST_CLASS_CANARY: 1,
    common_pb2.REQUEST_CLASS_BACKGROUND: 2,
}
"""Rank of each request class (lower goes first; unspecified = interactive)."""

PRIORITY_RANK: dict[int, int] = {
    common_pb2.PRIORITY_PLATINUM: 0,
    common_pb2.PRIORITY_GOLD: 1,
    common_pb2.PRIORITY_SILVER: 2,
    common_pb2.PRIORITY_BRONZE: 3,
    common_pb2.PRIORITY_UNSPECIFIED: 3,
}
"""Rank of each tenant priority (unspecified = bronze, as the registry's default)."""

PRIORITIES_PER_CLASS = 4
"""Priority ranks within one class."""
BANDS = 3 * PRIORITIES_PER_CLASS
"""Number of bands."""
DEFAULT_AGE_STEP_S = 1.0
"""Head start of one band over the next, in seconds of waiting."""

PRIORITY_NAMES: dict[int, str] = {
    common_pb2.PRIORITY_PLATINUM: "platinum",
    common_pb2.PRIORITY_GOLD: "gold",
    common_pb2.PRIORITY_SILVER: "silver",
    common_pb2.PRIORITY_BRONZE: "bronze",
    common_pb2.PRIORITY_UNSPECIFIED: "bronze",
}
"""Priority enum value → name."""


def class_rank(request_class: int) -> int:
    """Rank of a request class (unknown classes rank as background)."""
    return CLASS_RANK.get(request_class, CLASS_RANK[common_pb2.REQUEST_CLASS_BACKGROUND])


def band(request_class: int, priority: int) -> int:
    """Band of a request (0 = served first)."""
    return class_rank(request_class) * PRIORITIES_PER_CLASS + PRIORITY_RANK.get(
        priority, PRIORITY_RANK[common_pb2.PRIORITY_BRONZE]
    )


def aged_key(band_: int, enqueued_at: float, age_step_s: float = DEFAULT_AGE_STEP_S) -> float:
    """Order key of a waiter (smaller is served first): arrival plus the band's handicap."""
    return enqueued_at + band_ * age_step_s


def overtaking_bound_s(band_: int, age_step_s: float = DEFAULT_AGE_STEP_S) -> float:
    """Longest time newcomers can overtake a waiter of ``band_`` (see the module doc)."""
    return band_ * age_step_s


def engine_priority(request_class: int, priority: int) -> int:
    """vLLM's per-request ``priority`` (lower is scheduled first, ties by arrival): the band."""
    return band(request_class, priority)
