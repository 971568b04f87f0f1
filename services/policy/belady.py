"""Belady's offline optimum for the HOT tier: evict the version needed furthest in the future.

With unit-size slots and demand loading this maximises HOT hits (MIN, Belady
1966); it needs the future, so it exists for the simulator and the benchmark
only. Busy versions (in-flight requests) are skipped like in every policy.
For WARM (variable sizes, where the optimum is NP-hard) it uses the same
furthest-next-use rule as a strong heuristic. Plan: uses
``Snapshot.next_access`` (versions without a next access go first).
"""

from __future__ import annotations

import math
from collections.abc import Container, Mapping

from ._lazyheap import LazyHeap
from .online import OnlineContext
from .plan import Plan
from .planner import enforce_capacity
from .snapshot import Snapshot, WorkerState


class BeladyOnline:
    """Online Belady state: a max-heap of next use per group and per worker."""

    def __init__(self, ctx: OnlineContext) -> None:
        self._next_use = ctx.next_use()
        self._next_of = [len(ctx.versions)] * ctx.n_versions
        self._hot = [LazyHeap() for _ in range(ctx.n_workers * ctx.n_base_models)]
        self._warm = [LazyHeap() for _ in range(ctx.n_workers)]

    def on_request(self, i: int, v: int, now: float) -> None:
        """Learn when ``v`` is needed next."""
        self._next_of[v] = self._next_use[i]

    def on_served(self, g: int, w: int, v: int, now: float) -> None:
        """Re-key ``v`` by its next use (negated: the heap pops the furthest)."""
        key = -float(self._next_of[v])
        self._hot[g].push(v, key)
        self._warm[w].push(v, key)

    def on_insert_hot(self, g: int, v: int, now: float) -> None:
        """Track ``v`` in the group."""
        self._hot[g].push(v, -float(self._next_of[v]))

    def on_remove_hot(self, g: int, v: int) -> None:
        """Forget ``v`` in the group."""
        self._hot[g].discard(v)

    def on_insert_warm(self, w: int, v: int, now: float) -> None:
        """Track ``v`` on the worker."""
        self._warm[w].push(v, -float(self._next_of[v]))

    def on_remove_warm(self, w: int, v: int) -> None:
        """Forget ``v`` on the worker."""
        self._warm[w].discard(v)

    def hot_victim(self, g: int, now: float, busy: Mapping[int, float]) -> int | None:
        """The member needed furthest in the future that is not busy."""
        return self._hot[g].pop_min(lambda u: busy.get(u, 0.0) <= now)

    def warm_victim(self, w: int, now: float, hot: Container[int]) -> int | None:
        """The WARM member needed furthest in the future that is not HOT."""
        return self._warm[w].pop_min(lambda u: u not in hot)


class BeladyPolicy:
    """Offline optimum (needs the future: ``Snapshot.next_access`` or the simulated trace)."""

    name = "belady"

    def plan(self, snapshot: Snapshot, now: float) -> Plan:
        """Make room by demoting / evicting the versions needed furthest in the future."""
        future = snapshot.next_access or {}

        def key(v: str, w: WorkerState) -> tuple[float, float]:
            return (-future.get(v, math.inf), 0.0)

        return enforce_capacity(snapshot, key, key)

    def online(self, ctx: OnlineContext) -> BeladyOnline:
        """Fresh online state."""
        return BeladyOnline(ctx)
