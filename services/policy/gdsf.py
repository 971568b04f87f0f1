"""Cost-aware baseline: Greedy-Dual-Size-Frequency, in the spirit of Chameleon.

Each cached version has ``H = L + frequency * reload_cost / size``; the victim is
the smallest ``H`` and ``L`` (the "inflation" value) becomes the victim's ``H``,
so versions that stop being requested age out. In HOT the size is one slot
and the reload cost is WARM→HOT; in WARM the size is bytes and the reload
cost is COLD→WARM (both from :class:`~loraplane.policy.cost.Bandwidths`).
"""

from __future__ import annotations

from collections.abc import Container, Mapping

from ._lazyheap import LazyHeap
from .online import OnlineContext
from .plan import Plan
from .planner import enforce_capacity
from .snapshot import Snapshot, WorkerState


class GdsfOnline:
    """Online GDSF state for one simulated run."""

    def __init__(self, ctx: OnlineContext) -> None:
        bw = ctx.bandwidths
        n_groups = ctx.n_workers * ctx.n_base_models
        self._hot_value = [bw.warm_to_hot_s(s) for s in ctx.sizes]
        self._warm_value = [bw.cold_to_warm_s(s) / max(s, 1) for s in ctx.sizes]
        self._hot = [LazyHeap() for _ in range(n_groups)]
        self._warm = [LazyHeap() for _ in range(ctx.n_workers)]
        self._hot_freq: list[dict[int, int]] = [{} for _ in range(n_groups)]
        self._warm_freq: list[dict[int, int]] = [{} for _ in range(ctx.n_workers)]
        self._hot_l = [0.0] * n_groups
        self._warm_l = [0.0] * ctx.n_workers

    def on_request(self, i: int, v: int, now: float) -> None:
        """GDSF counts hits in :meth:`on_served`."""

    def on_served(self, g: int, w: int, v: int, now: float) -> None:
        """One more hit: raise ``H`` in the group and on the worker."""
        f = self._hot_freq[g][v] + 1
        self._hot_freq[g][v] = f
        self._hot[g].push(v, self._hot_l[g] + f * self._hot_value[v])
        f = self._warm_freq[w][v] + 1
        self._warm_freq[w][v] = f
        self._warm[w].push(v, self._warm_l[w] + f * self._warm_value[v])

    def on_insert_hot(self, g: int, v: int, now: float) -> None:
        """Enter with frequency 0 (the serving hit adds 1)."""
        self._hot_freq[g][v] = 0
        self._hot[g].push(v, self._hot_l[g])

    def on_remove_hot(self, g: int, v: int) -> None:
        """Forget ``v`` in the group."""
        self._hot[g].discard(v)
        del self._hot_freq[g][v]

    def on_insert_warm(self, w: int, v: int, now: float) -> None:
        """Enter with frequency 0 (the serving hit adds 1)."""
        self._warm_freq[w][v] = 0
        self._warm[w].push(v, self._warm_l[w])

    def on_remove_warm(self, w: int, v: int) -> None:
        """Forget ``v`` on the worker."""
        self._warm[w].discard(v)
        del self._warm_freq[w][v]

    def hot_victim(self, g: int, now: float, busy: Mapping[int, float]) -> int | None:
        """Smallest ``H`` that is not busy; ``L`` rises to it."""
        heap = self._hot[g]
        v = heap.pop_min(lambda u: busy.get(u, 0.0) <= now)
        if v is not None:
            self._hot_l[g] = max(self._hot_l[g], heap.key(v))
        return v

    def warm_victim(self, w: int, now: float, hot: Container[int]) -> int | None:
        """Smallest ``H`` among WARM members that are not HOT; ``L`` rises to it."""
        heap = self._warm[w]
        v = heap.pop_min(lambda u: u not in hot)
        if v is not None:
            self._warm_l[w] = max(self._warm_l[w], heap.key(v))
        return v


class GdsfPolicy:
    """Greedy-Dual-Size-Frequency (cost-aware), for HOT and WARM."""

    name = "gdsf"

    def plan(self, snapshot: Snapshot, now: float) -> Plan:
        """Make room by demoting / evicting the lowest ``requests * reload_cost / size``."""
        bw = snapshot.bandwidths

        def size(v: str) -> int:
            meta = snapshot.versions.get(v)
            return 0 if meta is None else meta.size_bytes

        def hot_key(v: str, w: WorkerState) -> tuple[float, float]:
            return (snapshot.stats_of(v).requests * bw.warm_to_hot_s(size(v)), 0.0)

        def warm_key(v: str, w: WorkerState) -> tuple[float, float]:
            s = size(v)
            return (snapshot.stats_of(v).requests * bw.cold_to_warm_s(s) / max(s, 1), 0.0)

        return enforce_capacity(snapshot, hot_key, warm_key)

    def online(self, ctx: OnlineContext) -> GdsfOnline:
        """Fresh online state."""
        return GdsfOnline(ctx)
