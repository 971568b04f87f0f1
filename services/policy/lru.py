"""Least recently used: what vLLM's and SGLang's adapter caches do.

Online: one recency list per HOT slot group and per worker's WARM tier; the
victim is the least recently requested member that is not busy. Plan: demote
/ evict by last access (oldest first) when over capacity.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Container, Mapping

from .online import OnlineContext
from .plan import Plan
from .planner import KeyFn, enforce_capacity
from .snapshot import Snapshot, WorkerState


class LruOnline:
    """Online LRU state for one simulated run."""

    def __init__(self, ctx: OnlineContext) -> None:
        self._hot: list[OrderedDict[int, None]] = [
            OrderedDict() for _ in range(ctx.n_workers * ctx.n_base_models)
        ]
        self._warm: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(ctx.n_workers)]

    def on_request(self, i: int, v: int, now: float) -> None:
        """Nothing to do before placement."""

    def on_served(self, g: int, w: int, v: int, now: float) -> None:
        """Mark ``v`` most recently used in its group and on its worker."""
        self._hot[g].move_to_end(v)
        self._warm[w].move_to_end(v)

    def on_insert_hot(self, g: int, v: int, now: float) -> None:
        """Track ``v`` in the group."""
        self._hot[g][v] = None

    def on_remove_hot(self, g: int, v: int) -> None:
        """Forget ``v`` in the group."""
        del self._hot[g][v]

    def on_insert_warm(self, w: int, v: int, now: float) -> None:
        """Track ``v`` on the worker."""
        self._warm[w][v] = None

    def on_remove_warm(self, w: int, v: int) -> None:
        """Forget ``v`` on the worker."""
        del self._warm[w][v]

    def hot_victim(self, g: int, now: float, busy: Mapping[int, float]) -> int | None:
        """Least recently used member that is not busy."""
        for v in self._hot[g]:
            if busy.get(v, 0.0) <= now:
                return v
        return None

    def warm_victim(self, w: int, now: float, hot: Container[int]) -> int | None:
        """Least recently used WARM member that is not HOT."""
        for v in self._warm[w]:
            if v not in hot:
                return v
        return None


def _last_access(snapshot: Snapshot) -> KeyFn:
    def key(v: str, w: WorkerState) -> tuple[float, float]:
        last = snapshot.stats_of(v).last_access
        return (-math.inf if last is None else last, 0.0)

    return key


class LruPolicy:
    """Least recently used, for HOT and WARM alike."""

    name = "lru"

    def plan(self, snapshot: Snapshot, now: float) -> Plan:
        """Make room by demoting / evicting the least recently used versions."""
        key = _last_access(snapshot)
        return enforce_capacity(snapshot, key, key)

    def online(self, ctx: OnlineContext) -> LruOnline:
        """Fresh online state."""
        return LruOnline(ctx)

