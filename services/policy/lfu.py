"""Least frequently used (perfect LFU: counts survive eviction; ties go to the older access).

Online: a lazily updated min-heap per HOT slot group and per worker's WARM
tier keyed by (request count, last access). Plan: demote / evict the versions
with the fewest requests when over capacity.
"""

from __future__ import annotations

import math
from collections.abc import Container, Mapping

from ._lazyheap import LazyHeap
from .online import OnlineContext
from .plan import Plan
from .planner import enforce_capacity
from .snapshot import Snapshot, WorkerState


class LfuOnline:
    """Online LFU state for one simulated run."""

    def __init__(self, ctx: OnlineContext) -> None:
        self._count = [0] * ctx.n_versions
        self._last = [0.0] * ctx.n_versions
        self._hot = [LazyHeap() for _ in range(ctx.n_workers * ctx.n_base_models)]
        self._warm = [LazyHeap() for _ in range(ctx.n_workers)]

    def on_request(self, i: int, v: int, now: float) -> None:
        """Count the request."""
        self._count[v] += 1
        self._last[v] = now

    def on_served(self, g: int, w: int, v: int, now: float) -> None:
        """Refresh ``v``'s key in its group and on its worker."""
        c, t = self._count[v], self._last[v]
        self._hot[g].push(v, c, t)
        self._warm[w].push(v, c, t)

    def on_insert_hot(self, g: int, v: int, now: float) -> None:
        """Track ``v`` in the group."""
        self._hot[g].push(v, self._count[v], self._last[v])

    def on_remove_hot(self, g: int, v: int) -> None:
        """Forget ``v`` in the group."""
        self._hot[g].discard(v)

    def on_insert_warm(self, w: int, v: int, now: float) -> None:
        """Track ``v`` on the worker."""
        self._warm[w].push(v, self._count[v], self._last[v])

    def on_remove_warm(self, w: int, v: int) -> None:
        """Forget ``v`` on the worker."""
        self._warm[w].discard(v)

    def hot_victim(self, g: int, now: float, busy: Mapping[int, float]) -> int | None:
        """Fewest requests among members that are not busy."""
        return self._hot[g].pop_min(lambda v: busy.get(v, 0.0) <= now)

    def warm_victim(self, w: int, now: float, hot: Container[int]) -> int | None:
        """Fewest requests among WARM members that are not HOT."""
        return self._warm[w].pop_min(lambda v: v not in hot)


class LfuPolicy:
    """Least frequently used, for HOT and WARM alike."""

    name = "lfu"

    def plan(self, snapshot: Snapshot, now: float) -> Plan:
        """Make room by demoting / evicting the least requested versions."""

        def key(v: str, w: WorkerState) -> tuple[float, float]:
            s = snapshot.stats_of(v)
            return (float(s.requests), -math.inf if s.last_access is None else s.last_access)

        return enforce_capacity(snapshot, key, key)

    def online(self, ctx: OnlineContext) -> LfuOnline:
        """Fresh online state."""
        return LfuOnline(ctx)
