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
head start of ``age_step_s`` seconds over the next (earliest key first: a deadline order).
Equal keys go to the better band. What that guarantees, for a request of band ``b`` that
arrived at ``t`` (tested in ``tests/unit/gateway/test_flow.py`` with an injected clock):

* **Overtaking** (:func:`overtaking_bound_s`): it is overtaken only by requests of a
  better band ``b' < b`` that arrive by ``t + (b - b') * age_step_s``; anything arriving
  later is served after it. The window is at most ``b * age_step_s`` (11 s for a bronze
  background request with the default 1 s step).
* **Wait** (:func:`wait_bound_s`): the window bounds who may go first, not the wait
  itself: when the window closes, the requests that arrived in it and still wait are
  ahead of it and are served first. So its wait is the window plus the time those take
  to get a slot: at most ``(b - b') * age_step_s + ceil((ahead + 1) / slots) *
  longest_s``, with ``ahead`` the most requests that can wait ahead of it then (under
  ``clients`` closed-loop streams on ``slots`` slots: ``clients - slots``) and
  ``longest_s`` the longest a request holds a slot. Nothing starves: it is bounded
  whatever the load, and the class's longest queue wait refuses it before it is spent.

Pure code: the caller passes the arrival times (its clock); nothing here reads one.
"""

from __future__ import annotations

import math

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


def wait_bound_s(
    band_: int, *, overtaker_band: int, ahead: int, slots: int, longest_s: float,
    age_step_s: float = DEFAULT_AGE_STEP_S,
) -> float:
    """Longest queue wait of a waiter of ``band_`` while requests of ``overtaker_band``
    (the best band arriving) keep coming (see the module doc): its overtaking window, then
    one slot for each of the ``ahead`` requests that can still wait ahead of it when the
    window closes and one for itself, ``slots`` at a time, each held at most
    ``longest_s``."""
    if slots < 1 or ahead < 0:
        raise ValueError(f"wait bound needs slots >= 1 and ahead >= 0 (got slots {slots}, "
                         f"ahead {ahead})")
    window = max(0, band_ - overtaker_band) * age_step_s
    return window + math.ceil((ahead + 1) / slots) * longest_s


def engine_priority(request_class: int, priority: int) -> int:
    """vLLM's per-request ``priority`` (lower is scheduled first, ties by arrival): the band."""
    return band(request_class, priority)
