"""A clairvoyant reference for the interactive P99: what knowing the future buys in WARM.

Belady maximises HOT hits, not the interactive tail. The tail is set by the
interactive requests that wait for a load longer than the target: a request
whose version must come from COLD and whose COLD load (plus prefill) exceeds
the target ``T`` counts, every other miss does not. :class:`TailOracle` keeps
HOT as Belady does and picks WARM victims for that objective with the future
known: versions with no *critical* request ahead (an interactive request that
would exceed ``T`` if its version came from COLD) leave first, by furthest
next use; then the version whose next critical request is furthest away.

It is a heuristic with clairvoyance, not a bound (the WARM problem with sizes
is NP-hard): when it meets a target, the target is reachable with enough
knowledge of the future; when it misses, that proves nothing. The benchmark
prints its P99 beside the floor (:func:`loraplane.sim.simulator.ttft_floor`)
so a missed P99 target reads "reachable by a clairvoyant policy" or not.
"""

from __future__ import annotations

from collections.abc import Container

from loraplane.policy._lazyheap import LazyHeap
from loraplane.policy.belady import BeladyOnline
from loraplane.policy.model import RequestClass
from loraplane.policy.online import CLASS_CODE, OnlineContext
from loraplane.policy.plan import Plan
from loraplane.policy.snapshot import Snapshot
from loraplane.sim.cost import CostModel
from loraplane.sim.trace import Trace


def critical_requests(trace: Trace, target_s: float, cost: CostModel) -> list[bool]:
    """Per request: interactive, over ``target_s`` if its version came from COLD, and within
    it if the version was WARM (the others are slow or fast whatever WARM holds)."""
    bw = cost.bandwidths
    warm = [bw.warm_to_hot_s(s) for s in trace.version_size]
    cold = [bw.cold_to_warm_s(s) + w for s, w in zip(trace.version_size, warm, strict=True)]
    base_s = cost.base_ttft_ms / 1000.0
    prefill_s = cost.prefill_ms_per_token / 1000.0
    interactive = CLASS_CODE[RequestClass.INTERACTIVE]
    out = []
    for i, v in enumerate(trace.version):
        own = base_s + trace.prompt_tokens[i] * prefill_s
        out.append(
            trace.classes[i] == interactive and own + warm[v] <= target_s < own + cold[v]
        )
    return out


class TailOracleOnline(BeladyOnline):
    """Belady in HOT; in WARM, furthest next critical request (no critical request: first)."""

    def __init__(self, ctx: OnlineContext, critical: list[bool]) -> None:
        super().__init__(ctx)
        n = len(ctx.versions)
        if len(critical) != n:
            raise ValueError(f"critical flags for {len(critical)} requests, trace has {n}")
        nxt = [n] * n
        last: dict[int, int] = {}
        for i in range(n - 1, -1, -1):
            v = ctx.versions[i]
            nxt[i] = last.get(v, n)
            if critical[i]:
                last[v] = i
        self._n = n
        self._next_critical = nxt
        self._next_critical_of = [n] * ctx.n_versions
        self._tail_warm = [LazyHeap() for _ in range(ctx.n_workers)]

    def _warm_key(self, v: int) -> float:
        if self._next_critical_of[v] >= self._n:
            # nothing critical ahead: these go first, the one needed furthest first
            return -float(2 * self._n + self._next_of[v])
        return -float(self._next_critical_of[v])

    def on_request(self, i: int, v: int, now: float) -> None:
        """Learn v's next use and next critical use."""
        super().on_request(i, v, now)
        self._next_critical_of[v] = self._next_critical[i]

    def on_served(self, g: int, w: int, v: int, now: float) -> None:
        """Re-key v in HOT (Belady: next use) and in WARM (tail order)."""
        self.on_insert_hot(g, v, now)
        self._tail_warm[w].push(v, self._warm_key(v))

    def on_insert_warm(self, w: int, v: int, now: float) -> None:
        """Track v on the worker."""
        self._tail_warm[w].push(v, self._warm_key(v))

    def on_remove_warm(self, w: int, v: int) -> None:
        """Forget v on the worker."""
        self._tail_warm[w].discard(v)

    def warm_victim(self, w: int, now: float, hot: Container[int]) -> int | None:
        """The non-HOT WARM member whose next critical request is furthest away."""
        return self._tail_warm[w].pop_min(lambda u: u not in hot)


class TailOracle:
    """Clairvoyant reference aimed at an interactive TTFT target (simulator only)."""

    name = "tail-oracle"

    def __init__(self, trace: Trace, target_s: float, cost: CostModel | None = None) -> None:
        self._cost = cost or CostModel()
        self._critical = critical_requests(trace, target_s, self._cost)

    def online(self, ctx: OnlineContext) -> TailOracleOnline:
        """Fresh state for one run of the trace it was built from, with the same cost model."""
        if ctx.bandwidths != self._cost.bandwidths:
            raise ValueError(
                "the tail oracle was built for other bandwidths than this run's: pass the same "
                "CostModel to TailOracle and simulate"
            )
        return TailOracleOnline(ctx, self._critical)

    def plan(self, snapshot: Snapshot, now: float) -> Plan:
        """Not a planner: it needs the simulated trace's future."""
        raise NotImplementedError("the tail oracle exists for the simulator only")
