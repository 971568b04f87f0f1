"""First in, first out: the oldest load goes first, whatever its traffic.

Online: insertion-ordered lists per HOT slot group and per worker's WARM tier.
Plan: demote / evict by load time (``WorkerState.loaded_at``, oldest first).
"""

from __future__ import annotations

import math

from .lru import LruOnline
from .online import OnlineContext
from .plan import Plan
from .planner import enforce_capacity
from .snapshot import Snapshot, WorkerState


class FifoOnline(LruOnline):
    """Online FIFO state for one simulated run: LRU's ordered lists, never reordered on a hit,
    so the oldest load is the first victim."""

    def on_served(self, g: int, w: int, v: int, now: float) -> None:
        """FIFO ignores hits."""


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
