"""First in, first out: the oldest load goes first, whatever its traffic.

Online: insertion-ordered lists per HOT slot group and per worker's WARM tier.
Plan: demote / evict by load time (``WorkerState.loaded_at``, oldest first).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Container, Mapping

from .online import OnlineContext
from .plan import Plan
from .planner import enforce_capacity
from .snapshot import Snapshot, WorkerState


class FifoOnline:
    """Online FIFO state for one simulated run."""

    def __init__(self, ctx: OnlineContext) -> None:
        self._hot: list[OrderedDict[int, None]] = [
            OrderedDict() for _ in range(ctx.n_workers * ctx.n_base_models)
        ]
        self._warm: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(ctx.n_workers)]

    def on_request(self, i: int, v: int, now: float) -> None:
        """FIFO ignores requests."""

    def on_served(self, g: int, w: int, v: int, now: float) -> None:
        """FIFO ignores hits."""

    def on_insert_hot(self, g: int, v: int, now: float) -> None:
        """Append ``v`` to the group's queue."""
        self._hot[g][v] = None

    def on_remove_hot(self, g: int, v: int) -> None:
        """Drop ``v`` from the group's queue."""
        del self._hot[g][v]

    def on_insert_warm(self, w: int, v: int, now: float) -> None:
        """Append ``v`` to the worker's queue."""
        self._warm[w][v] = None

    def on_remove_warm(self, w: int, v: int) -> None:
        """Drop ``v`` from the worker's queue."""
        del self._warm[w][v]

    def hot_victim(self, g: int, now: float, busy: Mapping[int, float]) -> int | None:
        """Oldest load that is not busy."""
        for v in self._hot[g]:
            if busy.get(v, 0.0) <= now:
                return v
        return None

    def warm_victim(self, w: int, now: float, hot: Container[int]) -> int | None:
        """Oldest fetch that is not HOT."""
        for v in self._warm[w]:
            if v not in hot:
                return v
        return None


class FifoPolicy:
    """First in, first out, for HOT and WARM alike."""

    name = "fifo"

    def plan(self, snapshot: Snapshot, now: float) -> Plan:
        """Make room by demoting / evicting the oldest loads."""

        def key(v: str, w: WorkerState) -> tuple[float, float]:
            return (w.loaded_at.get(v, -math.inf), 0.0)

        return enforce_capacity(snapshot, key, key)

    def online(self, ctx: OnlineContext) -> FifoOnline:
        """Fresh online state."""
        return FifoOnline(ctx)
