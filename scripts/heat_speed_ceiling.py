"""Where heat's simulation time goes on GenTD26: the ceiling of the speed target (issue 13).

    .venv/bin/python scripts/heat_speed_ceiling.py [--reps 9] [--trace gentd26]

Runs, interleaved and in one process, on each GenTD26 capacity of the bench:

* ``lru``: the simulator with LRU (the loop and the cheapest policy);
* ``stats``: the same loop with the adaptive heat policy's per-request statistics alone
  (the version record, heat / WARM heat / reuse keys, the tenant refresh:
  :meth:`AdaptiveHeatOnline.count_request`, the policy's own step) and LRU victims — no shadow
  caches, experts or rankings;
* ``heat``: the whole adaptive heat policy (what ``make bench-policy`` measures).

Prints the median requests per CPU second and µs per request of each, with the load
average and whether the policy ran compiled (``loraplane.native``): what is left for the
shadows and rankings within 10 µs per request (100 k/s).
A measurement tool, not a policy: ``stats`` makes no sensible decisions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import OrderedDict
from collections.abc import Container, Mapping
from pathlib import Path
from typing import Any

from loraplane import native
from loraplane.policy.adaptive import AdaptiveHeatOnline
from loraplane.policy.config import PolicyConfig, load_config
from loraplane.policy.factory import make_policy
from loraplane.policy.online import OnlineContext
from loraplane.sim.bench import BENCH_CASES, load_reference_trace
from loraplane.sim.cost import CostModel
from loraplane.sim.generator import DEFAULT_AZURE_DIR
from loraplane.sim.simulator import simulate


class StatsOnly:
    """Heat's per-request statistics and nothing else; LRU victims (one worker)."""

    def __init__(self, ctx: OnlineContext, cfg: PolicyConfig) -> None:
        self._heat = AdaptiveHeatOnline(ctx, cfg)
        self.on_request = self._heat.count_request
        """The adaptive policy's own statistics step, called by the simulator (compiled when
        ``loraplane.native`` is)."""
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._warm_lru: OrderedDict[int, None] = OrderedDict()

    def on_served(self, g: int, w: int, v: int, now: float) -> None:
        self._lru.move_to_end(v)

    def on_insert_hot(self, g: int, v: int, now: float) -> None:
        self._lru[v] = None

    def on_remove_hot(self, g: int, v: int) -> None:
        del self._lru[v]

    def on_insert_warm(self, w: int, v: int, now: float) -> None:
        self._warm_lru[v] = None

    def on_remove_warm(self, w: int, v: int) -> None:
        del self._warm_lru[v]

    def hot_victim(self, g: int, now: float, busy: Mapping[int, float]) -> int | None:
        for u in self._lru:
            if busy.get(u, 0.0) <= now:
                return u
        return None

    def warm_victim(self, w: int, now: float, hot: Container[int]) -> int | None:
        for u in self._warm_lru:
            if u not in hot:
                return u
        return None


class _StatsPolicy:
    name = "stats"

    def __init__(self, cfg: PolicyConfig) -> None:
        self.cfg = cfg

    def online(self, ctx: OnlineContext) -> StatsOnly:
        return StatsOnly(ctx, self.cfg)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--trace", default="gentd26", choices=("gentd26", "gentd26-x24"))
    parser.add_argument("--cache-dir", type=Path, default=Path(".loraplane/bench/traces"))
    args = parser.parse_args(argv)
    cfg = load_config(None)
    cost = CostModel()
    trace = load_reference_trace(args.trace, DEFAULT_AZURE_DIR, args.cache_dir)
    runs: dict[tuple[int, str], list[float]] = {}
    for _ in range(args.reps):
        for caps in BENCH_CASES[args.trace]:
            policies: dict[str, Any] = {
                "lru": make_policy("lru", cfg), "stats": _StatsPolicy(cfg),
                "heat": make_policy("heat", cfg),
            }
            for tag, policy in policies.items():
                rps = simulate(trace, policy, caps, cost).sim_requests_per_s
                runs.setdefault((caps.gpu_slots, tag), []).append(rps)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{args.trace}: {len(trace)} requests, {trace.n_versions} versions; load {load}; "
          f"medians of {args.reps} interleaved runs; policy {native.status()}")
    for (slots, tag), values in runs.items():
        med = statistics.median(values)
        print(f"  {slots:3d} slots  {tag:6s} {med:10,.0f} req/s  {1e6 / med:6.2f} us/request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
