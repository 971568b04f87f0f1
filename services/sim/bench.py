"""Policy benchmark: every policy on the reference traces at several capacities.

``python -m loraplane.sim.bench`` (what ``make bench-policy`` runs) prints one
table per (trace, capacity) with each policy's figures and its HOT hit ratio
as a fraction of Belady's and of LRU's, checks the acceptance targets of the
heat policy, and writes everything to ``.loraplane/bench/policy.json``. Beside
each check it prints what any policy could reach (``ceilings``): Belady's hit
ratio over LRU's and the interactive P99 floor (:func:`ttft_floor`); a missed
target beyond them is reported ``unreachable (...)`` in ``check_status``, one
within them says how far it is (the share of Belady it needs; the P99 of a
clairvoyant policy aimed at the target, :mod:`loraplane.sim.oracle`).

Reference traces (:mod:`loraplane.sim.presets`) are generated from the Azure
arrivals (``--azure-dir``, default ``../shared/traces/azure-llm-2023``) and
cached under ``.loraplane/bench/traces``; ``conv-1h`` falls back to the copy
checked in under ``tests/data/traces`` when the Azure files are absent.
``gentd26`` and ``gentd26-x24`` are the real Alibaba GenTD26 requests
(:mod:`loraplane.sim.gentd26`, checked in under ``tests/data/traces/gentd26``) at
real time and 24 times faster.

Beside our baselines, each case reports libCacheSim's online policies on the
HOT tier (:mod:`loraplane.sim.peers`, rows ``lcs:NAME``: HOT hit ratio only), and
the checks compare heat with the *best online baseline* of either simulator:
HOT hit ratio (within 0.005), non-compulsory cold starts and interactive P99
(ours: libCacheSim has no WARM tier and no cost model). At the end a summary
table lists every case side by side, the time-scale invariance of each
GenTD26 pair and heat's simulation speed at 1,000 to 100,000 versions.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from loraplane import native
from loraplane.policy.config import PolicyConfig, load_config
from loraplane.policy.factory import make_policy
from loraplane.sim import peers
from loraplane.sim.cost import CostModel, measured_engine_costs
from loraplane.sim.generator import DEFAULT_AZURE_DIR, generate
from loraplane.sim.gentd26 import REQUEST_FILE, import_gentd26
from loraplane.sim.oracle import TailOracle
from loraplane.sim.presets import PRESETS
from loraplane.sim.simulator import Capacities, SimResult, simulate, ttft_floor
from loraplane.sim.trace import Trace, read_trace, write_trace

GIB = 2**30
POLICY_ORDER = ("heat", "lru", "fifo", "lfu", "gdsf", "belady")
ONLINE_BASELINES = ("lru", "fifo", "lfu", "gdsf")
"""Our online baselines (Belady needs the future; heat is the policy under test)."""
CHECKED_IN = Path("tests/data/traces")
"""Where small reference traces are checked in (relative to the repository root)."""

_CAPACITIES = (
    Capacities(gpu_slots=16, host_bytes=10 * GIB, workers=4),
    Capacities(gpu_slots=16, host_bytes=12 * GIB, workers=4),
    Capacities(gpu_slots=8, host_bytes=10 * GIB, workers=4),
)
_GENTD26_CAPACITIES = (
    Capacities(gpu_slots=16, host_bytes=8 * GIB, workers=1),
    Capacities(gpu_slots=32, host_bytes=12 * GIB, workers=1),
)
BENCH_CASES: dict[str, tuple[Capacities, ...]] = {
    "conv-1h": _CAPACITIES,
    "large-1h": _CAPACITIES,
    "mixed-3h": _CAPACITIES,
    "gentd26": _GENTD26_CAPACITIES,
    "gentd26-x24": _GENTD26_CAPACITIES,
}
"""Capacities per reference trace: 4 workers with 16 (or 8) engine LoRA slots (``max_loras``)
and 10 or 12 GiB of host memory for adapter files each, against 80–170 GB of adapter versions;
GenTD26 (8,300 units, ~620 GB): one worker with 16 slots and 8 GiB or 32 slots and 12 GiB
(12 GiB: the simulator needs room for a full HOT tier plus one more 340 MB adapter)."""
GENTD26_SCALES = {"gentd26": 1.0, "gentd26-x24": 24.0}
"""Time scale of each GenTD26 case."""
SYNTHETIC = ("conv-1h", "large-1h", "mixed-3h")
DEFAULT_GENTD26_DIR = Path("../shared/traces/alibaba-gentd26")


@dataclass(frozen=True)
class Targets:
    """Acceptance targets of the heat policy (from the issue)."""

    vs_belady: float = 0.85
    vs_lru: float = 1.10
    p99_vs_lru: float = 0.50
    requests_per_s: float = 50_000.0
    vs_best_hot_slack: float = 0.005
    """Heat's HOT hit ratio must be >= the best online baseline's minus this."""
    time_scale_invariance: float = 0.02
    """|heat/LRU at real time - heat/LRU at x24| must stay within this."""
    gentd26_requests_per_s: float = 100_000.0


def load_reference_trace(name: str, azure_dir: Path, cache_dir: Path) -> Trace:
    """The reference trace ``name``: cached, else generated, else the checked-in copy."""
    cached = cache_dir / f"{name}.csv.gz"
    if cached.is_file():
        return read_trace(cached)
    if name in GENTD26_SCALES:
        source = CHECKED_IN / "gentd26" / REQUEST_FILE
        if not source.is_file():
            source = DEFAULT_GENTD26_DIR / REQUEST_FILE
        write_trace(cached, import_gentd26(source, time_scale=GENTD26_SCALES[name]))
        return read_trace(cached)
    checked_in = CHECKED_IN / f"{name}.csv.gz"
    cfg = PRESETS[name]
    from dataclasses import replace

    if (azure_dir / "AzureLLMInferenceTrace_conv.csv").is_file():
        write_trace(cached, generate(replace(cfg, azure_dir=azure_dir)))
        return read_trace(cached)
    if checked_in.is_file():
        return read_trace(checked_in)
    raise FileNotFoundError(
        f"reference trace {name}: no Azure traces in {azure_dir} and no {checked_in}"
    )


def run_case(
    trace: Trace, caps: Capacities, cfg: PolicyConfig, cost: CostModel
) -> dict[str, SimResult]:
    """Every policy on one trace and capacity."""
    return {name: simulate(trace, make_policy(name, cfg), caps, cost) for name in POLICY_ORDER}


def case_figures(results: dict[str, SimResult]) -> list[dict[str, Any]]:
    """The JSON objects of one case, with ratios to Belady and LRU added."""
    belady = results["belady"].gpu_hit_ratio
    lru = results["lru"]
    lru_p99 = lru.ttft_ms.get("interactive", {}).get("p99", 0.0)
    out = []
    for name in POLICY_ORDER:
        r = results[name]
        d = r.as_dict()
        d["gpu_hit_vs_belady"] = round(r.gpu_hit_ratio / belady, 4) if belady else None
        d["gpu_hit_vs_lru"] = round(r.gpu_hit_ratio / lru.gpu_hit_ratio, 4) if lru.gpu_hit_ratio else None
        p99 = r.ttft_ms.get("interactive", {}).get("p99", 0.0)
        d["interactive_p99_vs_lru"] = round(p99 / lru_p99, 4) if lru_p99 else None
        out.append(d)
    return out


def peer_adjusted(figures: list[dict[str, Any]], peer: dict[str, float]) -> dict[str, float]:
    """libCacheSim's HOT hit ratios carried over to our rules: ``peer × our Belady / its Belady``.

    libCacheSim has no in-flight rule (it may evict a version with requests running). Where
    requests overlap (the synthetic traces, 4 workers) that rule costs every policy: our
    Belady reaches 0.534 on large-1h at 8 slots, libCacheSim's 0.616, and its raw S3-FIFO
    (0.541) lies above our optimum. The share of the in-flight-free optimum a peer reaches,
    applied to our optimum, is the comparison used for "best online baseline"; the raw
    ratios are printed and kept in ``peer_hot_hit_ratio``. Where nothing overlaps (GenTD26:
    0.6433 against 0.6436) the factor is ~1.
    """
    lcs_opt = peer.get("Belady", 0.0)
    opt = next(f for f in figures if f["policy"] == "belady")["gpu_hit_ratio"]
    online = {n: r for n, r in peer.items() if n not in peers.PEER_EXACT}
    if not lcs_opt:
        return online
    return {n: r * opt / lcs_opt for n, r in online.items()}


def best_baselines(
    figures: list[dict[str, Any]], peer: dict[str, float]
) -> dict[str, tuple[str, float]]:
    """The best online baseline per figure: HOT hit ratio (ours and libCacheSim's), fewest
    non-compulsory cold starts and lowest interactive P99 (ours: the peers have no WARM tier)."""
    ours = [f for f in figures if f["policy"] in ONLINE_BASELINES]
    hot = [(f["policy"], f["gpu_hit_ratio"]) for f in ours]
    hot += [(f"lcs:{n}", r) for n, r in peer_adjusted(figures, peer).items()]
    cold = min(ours, key=lambda f: f["cold_starts"])
    p99 = min(ours, key=lambda f: f["ttft_ms"].get("interactive", {}).get("p99", 0.0))
    return {
        "hot": max(hot, key=lambda x: x[1]),
        "cold_starts": (cold["policy"], float(cold["cold_starts"])),
        "interactive_p99_ms": (
            p99["policy"], p99["ttft_ms"].get("interactive", {}).get("p99", 0.0)
        ),
    }


def peer_checks(
    figures: list[dict[str, Any]], best: dict[str, tuple[str, float]], targets: Targets
) -> dict[str, bool]:
    """Heat against the best online baseline (every case)."""
    heat = next(f for f in figures if f["policy"] == "heat")
    heat_p99 = heat["ttft_ms"].get("interactive", {}).get("p99", 0.0)
    return {
        f"hot >= best - {targets.vs_best_hot_slack}": (
            heat["gpu_hit_ratio"] >= best["hot"][1] - targets.vs_best_hot_slack
        ),
        "cold starts <= best": heat["cold_starts"] <= best["cold_starts"][1],
        "interactive p99 <= best": heat_p99 <= best["interactive_p99_ms"][1],
    }


def checks(figures: list[dict[str, Any]], targets: Targets) -> dict[str, bool]:
    """Which acceptance targets the heat policy meets in one case."""
    heat = next(f for f in figures if f["policy"] == "heat")
    return {
        f"hit >= {targets.vs_belady} x belady": heat["gpu_hit_vs_belady"] >= targets.vs_belady,
        f"hit >= {targets.vs_lru} x lru": heat["gpu_hit_vs_lru"] >= targets.vs_lru,
        "0 platinum cold starts": heat["cold_starts_by_priority"]["platinum"] == 0,
        "0 canary cold starts": heat["cold_starts_canary"] == 0,
        f"interactive p99 <= {targets.p99_vs_lru} x lru": (
            heat["interactive_p99_vs_lru"] is not None
            and heat["interactive_p99_vs_lru"] <= targets.p99_vs_lru
        ),
        f">= {targets.requests_per_s:,.0f} req/s": heat["sim_requests_per_s"] >= targets.requests_per_s,
    }


def ceilings(
    figures: list[dict[str, Any]],
    floor: dict[str, dict[str, float]],
    clairvoyant: SimResult | None = None,
) -> dict[str, float | None]:
    """What any policy can reach in one case: the HOT hit ratio of the offline optimum
    (Belady) over LRU's, and the interactive P99 TTFT floor (:func:`ttft_floor`); with
    ``clairvoyant`` (a :class:`~loraplane.sim.oracle.TailOracle` run aimed at the P99 target),
    the interactive P99 that knowing the future reaches (not a bound: a reference)."""
    by_name = {f["policy"]: f for f in figures}
    heat, lru = by_name["heat"], by_name["lru"]
    lru_p99 = lru["ttft_ms"].get("interactive", {}).get("p99", 0.0)
    floor_p99 = floor.get("interactive", {}).get("p99", 0.0)
    out: dict[str, float | None] = {
        "heat_vs_lru": heat["gpu_hit_vs_lru"],
        "belady_vs_lru": by_name["belady"]["gpu_hit_vs_lru"],
        "interactive_p99_floor_ms": floor_p99,
        "interactive_p99_floor_vs_lru": round(floor_p99 / lru_p99, 4) if lru_p99 else None,
        "interactive_p99_clairvoyant_ms": None,
        "interactive_p99_clairvoyant_vs_lru": None,
    }
    if clairvoyant is not None:
        p99 = clairvoyant.ttft_ms.get("interactive", {}).get("p99", 0.0)
        out["interactive_p99_clairvoyant_ms"] = p99
        out["interactive_p99_clairvoyant_vs_lru"] = round(p99 / lru_p99, 4) if lru_p99 else None
    return out


def clairvoyant_run(
    trace: Trace, caps: Capacities, results: dict[str, SimResult], targets: Targets,
    cost: CostModel,
) -> SimResult | None:
    """The tail oracle aimed at ``targets.p99_vs_lru`` x LRU's interactive P99 (None without
    interactive requests)."""
    lru_p99 = results["lru"].ttft_ms.get("interactive", {}).get("p99", 0.0)
    if not lru_p99:
        return None
    target_s = targets.p99_vs_lru * lru_p99 / 1000.0
    return simulate(trace, TailOracle(trace, target_s, cost), caps, cost)


def check_status(
    verdict: dict[str, bool], ceiling: dict[str, float | None], targets: Targets
) -> dict[str, str]:
    """Each check as ``met``, ``unreachable (why)`` — a target above what the offline optimum
    reaches (hit ratio) or below the floor no policy can beat (P99) — or ``missed``, with how
    far in brackets when the ceilings say it (``missed (needs x x belady)``,
    ``missed (clairvoyant tail oracle: x x lru)``)."""
    out = {name: "met" if ok else "missed" for name, ok in verdict.items()}
    belady_vs_lru = ceiling["belady_vs_lru"]
    lru_key = f"hit >= {targets.vs_lru} x lru"
    if not verdict[lru_key] and belady_vs_lru is not None and belady_vs_lru < targets.vs_lru:
        out[lru_key] = f"unreachable (belady/lru = {belady_vs_lru:.3f})"
    floor_vs_lru = ceiling["interactive_p99_floor_vs_lru"]
    p99_key = f"interactive p99 <= {targets.p99_vs_lru} x lru"
    if not verdict[p99_key] and floor_vs_lru is not None and floor_vs_lru > targets.p99_vs_lru:
        out[p99_key] = f"unreachable (p99 floor = {floor_vs_lru:.3f} x lru)"
    # a missed target within reach says how far: the share of Belady it needs, what a
    # clairvoyant policy reaches
    if out[lru_key] == "missed" and belady_vs_lru:
        out[lru_key] = f"missed (needs {targets.vs_lru / belady_vs_lru:.3f} x belady)"
    oracle_vs_lru = ceiling.get("interactive_p99_clairvoyant_vs_lru")
    if out[p99_key] == "missed" and oracle_vs_lru is not None:
        out[p99_key] = f"missed (clairvoyant tail oracle: {oracle_vs_lru:.2f} x lru)"
    return out


def render(
    trace_name: str, trace: Trace, caps: Capacities, figures: list[dict[str, Any]],
    peer: dict[str, float] | None = None,
) -> Table:
    """One rich table per case (libCacheSim rows: HOT hit ratio only, raw; their ×belady and
    ×lru are to libCacheSim's own Belady and LRU: it has no in-flight rule)."""
    title = (
        f"{trace_name}: {len(trace)} requests, {trace.n_versions} versions — "
        f"{caps.workers} workers × {caps.gpu_slots} slots"
        + (f" ({caps.active_slots} in GPU)" if caps.active_slots else "")
        + f", {caps.host_bytes / GIB:g} GiB host"
    )
    table = Table(title=title, title_justify="left")
    cols = ("policy", "gpu hit", "×belady", "×lru", "host hit", "compuls.", "cold",
            "cold p/g/s/b", "cold can.", "int p50", "int p99", "p99×lru", "bg p99", "loads",
            "evict.", "req/s cpu")
    for c in cols:
        table.add_column(c, justify="left" if c == "policy" else "right")
    for f in figures:
        prio = f["cold_starts_by_priority"]
        inter = f["ttft_ms"].get("interactive", {})
        bg = f["ttft_ms"].get("background", {})
        table.add_row(
            f["policy"],
            f"{f['gpu_hit_ratio']:.3f}",
            f"{f['gpu_hit_vs_belady']:.3f}",
            f"{f['gpu_hit_vs_lru']:.3f}",
            f"{f['host_hit_ratio']:.3f}",
            str(f["compulsory_misses"]),
            str(f["cold_starts"]),
            f"{prio['platinum']}/{prio['gold']}/{prio['silver']}/{prio['bronze']}",
            str(f["cold_starts_canary"]),
            f"{inter.get('p50', 0):.0f}",
            f"{inter.get('p99', 0):.0f}",
            f"{f['interactive_p99_vs_lru']:.2f}",
            f"{bg.get('p99', 0):.0f}",
            str(f["loads"]),
            str(f["evictions"]),
            f"{f['sim_requests_per_s']:,.0f}",
        )
    by_name = {f["policy"]: f for f in figures}
    belady = by_name["belady"]["gpu_hit_ratio"]
    lru = (peer or {}).get("LRU") or by_name["lru"]["gpu_hit_ratio"]
    belady = (peer or {}).get("Belady") or belady
    for name, ratio in (peer or {}).items():
        table.add_row(
            f"lcs:{name}", f"{ratio:.3f}", f"{ratio / belady:.3f}" if belady else "-",
            f"{ratio / lru:.3f}" if lru else "-", *(["-"] * (len(cols) - 4)),
        )
    return table


def _mark(name: str, status: str) -> str:
    if status == "met":
        return f"[green]✓ {name}[/]"
    if status.startswith("missed"):
        return f"[red]✗ {name}{status[len('missed'):]}[/]"
    return f"[yellow]– {name}: {status}[/]"


def unprotected(cfg: PolicyConfig) -> PolicyConfig:
    """``cfg`` with no never-evict protection (canaries, priorities): the cold-start ceiling of
    the business rules."""
    from dataclasses import replace

    return replace(cfg, never_evict=replace(cfg.never_evict, priorities=(), active_canary=False))


def peer_status(
    verdict: dict[str, bool], figures: list[dict[str, Any]],
    best: dict[str, tuple[str, float]], targets: Targets,
) -> dict[str, str]:
    """:func:`peer_checks` as ``met`` or ``missed (how far, against whom)``."""
    heat = next(f for f in figures if f["policy"] == "heat")
    heat_p99 = heat["ttft_ms"].get("interactive", {}).get("p99", 0.0)
    far = {
        f"hot >= best - {targets.vs_best_hot_slack}": (
            f"{heat['gpu_hit_ratio']:.4f} vs {best['hot'][0]} {best['hot'][1]:.4f}"
        ),
        "cold starts <= best": (
            f"{heat['cold_starts']} vs {best['cold_starts'][0]} {best['cold_starts'][1]:.0f}"
        ),
        "interactive p99 <= best": (
            f"{heat_p99:.0f} ms vs {best['interactive_p99_ms'][0]} "
            f"{best['interactive_p99_ms'][1]:.0f} ms"
        ),
    }
    return {k: "met" if ok else f"missed ({far[k]})" for k, ok in verdict.items()}


def synthetic_trace(n_versions: int, n_requests: int = 100_000, seed: int = 7) -> Trace:
    """A Zipf-0.8 trace over ``n_versions`` versions (sizes 7–340 MB, mixed classes and
    priorities, one request every 0.1 s): for heat's speed as the catalog grows."""
    import csv
    import io
    import random

    from loraplane.policy.model import PRIORITIES, REQUEST_CLASSES
    from loraplane.sim.generator import adapter_size_bytes
    from loraplane.sim.trace import TraceRow, format_rows, parse_rows

    rng = random.Random(seed)
    weights = [1.0 / (k + 1) ** 0.8 for k in range(n_versions)]
    picks = rng.choices(range(n_versions), weights=weights, k=n_requests)
    sizes = [adapter_size_bytes(rng.choice((8, 16, 32, 64)), rng.random() < 0.6)
             for _ in range(n_versions)]
    prio = [PRIORITIES[min(3, int(rng.random() * 4))] for _ in range(n_versions)]
    rows = [
        TraceRow(ts=0.1 * i, tenant_id=f"t{v % 100}", adapter_id=f"a{v}@1", priority=prio[v],
                 request_class=REQUEST_CLASSES[v % 2], rank=8, size_bytes=sizes[v], canary=False,
                 prompt_tokens=100, output_tokens=20)
        for i, v in enumerate(picks)
    ]
    text = "".join(format_rows(rows))
    return parse_rows(csv.DictReader(io.StringIO(text)), f"zipf-{n_versions}")


def scaling(cfg: PolicyConfig, cost: CostModel) -> dict[str, float]:
    """Heat's simulated requests per CPU second at 1,000, 10,000 and 100,000 versions
    (1 worker, 16 slots, 8 GiB)."""
    caps = Capacities(gpu_slots=16, host_bytes=8 * GIB, workers=1)
    out = {}
    for n in (1_000, 10_000, 100_000):
        trace = synthetic_trace(n)
        out[str(n)] = round(simulate(trace, make_policy("heat", cfg), caps, cost).sim_requests_per_s, 1)
    return out


def summary_table(cases: list[dict[str, Any]]) -> Table:
    """Every case side by side: heat, LRU, the best online baseline and Belady."""
    table = Table(title="summary: heat against the best online baseline (ours + libCacheSim)",
                  title_justify="left")
    for c in ("case", "heat HOT", "LRU HOT", "best online HOT", "Belady HOT", "cold heat",
              "cold LRU", "cold best", "int p99 heat", "int p99 LRU", "int p99 best", "overflows",
              "heat req/s"):
        table.add_column(c, justify="left" if c == "case" else "right")
    for case in cases:
        by = {f["policy"]: f for f in case["results"]}
        best = case["best_baselines"]
        heat, lru = by["heat"], by["lru"]

        def p99(f: dict[str, Any]) -> float:
            return float(f["ttft_ms"].get("interactive", {}).get("p99", 0.0))

        table.add_row(
            f"{case['trace']} {case['workers']}×{case['gpu_slots']}×{case['host_bytes'] / GIB:g}G",
            f"{heat['gpu_hit_ratio']:.4f}", f"{lru['gpu_hit_ratio']:.4f}",
            f"{best['hot'][1]:.4f} {best['hot'][0]}", f"{by['belady']['gpu_hit_ratio']:.4f}",
            str(heat["cold_starts"]), str(lru["cold_starts"]),
            f"{best['cold_starts'][1]:.0f} {best['cold_starts'][0]}",
            f"{p99(heat):.0f}", f"{p99(lru):.0f}",
            f"{best['interactive_p99_ms'][1]:.0f} {best['interactive_p99_ms'][0]}",
            str(heat.get("protection_overflows", 0)),
            f"{heat['sim_requests_per_s']:,.0f}",
        )
    return table


def time_scale_pairs(cases: list[dict[str, Any]], targets: Targets) -> list[dict[str, Any]]:
    """heat/LRU HOT ratio of each GenTD26 capacity at real time and x24, and their gap."""
    out = []
    by_key = {(c["trace"], c["gpu_slots"], c["host_bytes"]): c for c in cases}
    for (trace, slots, host), case in by_key.items():
        if trace != "gentd26" or ("gentd26-x24", slots, host) not in by_key:
            continue
        fast = by_key[("gentd26-x24", slots, host)]
        a = case["ceilings"]["heat_vs_lru"]
        b = fast["ceilings"]["heat_vs_lru"]
        gap = abs(a - b)
        out.append({"gpu_slots": slots, "host_bytes": host, "heat_vs_lru_x1": a,
                    "heat_vs_lru_x24": b, "gap": round(gap, 4),
                    "met": gap <= targets.time_scale_invariance})
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit status 0 even when a target is missed (it is a report)."""
    parser = argparse.ArgumentParser(prog="python -m loraplane.sim.bench", description=__doc__)
    parser.add_argument("--azure-dir", type=Path, default=DEFAULT_AZURE_DIR)
    parser.add_argument("--out", type=Path, default=Path(".loraplane/bench/policy.json"))
    parser.add_argument("--cache-dir", type=Path, default=Path(".loraplane/bench/traces"))
    parser.add_argument("--policy-config", type=Path, default=None)
    parser.add_argument("--traces", default=",".join(BENCH_CASES),
                        help="comma-separated reference traces")
    parser.add_argument("--slots", default="",
                        help="only the capacities with these slot counts (comma-separated)")
    parser.add_argument("--no-scaling", action="store_true",
                        help="skip heat's speed at 1k / 10k / 100k versions")
    parser.add_argument("--active-slots-share", type=float, default=0.0,
                        help="HOT's two levels: GPU slots (max_loras) = this share of each "
                             "case's registered slots (max_cpu_loras); 0 = one level")
    parser.add_argument("--register-ms", type=float, default=None,
                        help="WARM -> registered per load (default: the cost model's)")
    parser.add_argument("--activate-ms", type=float, default=None,
                        help="registered -> GPU slot, fixed part (default: the cost model's)")
    args = parser.parse_args(argv)

    cfg = load_config(args.policy_config)
    cost = CostModel.measured()
    if args.register_ms is not None or args.activate_ms is not None:
        units = cost.as_dict()
        units.update({k: v for k, v in (("register_ms", args.register_ms),
                                        ("activate_ms", args.activate_ms)) if v is not None})
        cost = CostModel.from_units(**units)
    share = args.active_slots_share
    if not 0.0 <= share <= 1.0:
        console = Console()
        console.print(f"--active-slots-share {share} is outside 0..1")
        return 2
    targets = Targets()
    console = Console(width=200)
    with_peers = peers.available()
    if not with_peers:
        console.print("[yellow]libcachesim is not installed (pip install -e .[test]): "
                      "no libCacheSim baselines[/]")
    report: dict[str, Any] = {
        "generated_by": "python -m loraplane.sim.bench",
        "cost_model": cost.as_dict(),
        "engine_costs_measured": measured_engine_costs().source,
        "targets": asdict(targets),
        "peer_simulator": "libcachesim 0.3.5" if with_peers else None,
        "policy_code": native.status(),
        "cases": [],
    }
    only_slots = {int(x) for x in args.slots.split(",") if x.strip()}
    started = time.perf_counter()
    for name in [t.strip() for t in args.traces.split(",") if t.strip()]:
        if name not in BENCH_CASES:
            console.print(f"unknown trace {name}; known: {', '.join(BENCH_CASES)}")
            return 2
        trace = load_reference_trace(name, args.azure_dir, args.cache_dir)
        for caps in BENCH_CASES[name]:
            if only_slots and caps.gpu_slots not in only_slots:
                continue
            if share > 0:
                caps = replace(caps, active_slots=max(1, round(caps.gpu_slots * share)))
            results = run_case(trace, caps, cfg, cost)
            figures = case_figures(results)
            peer = (peers.peer_hot_hit_ratios(trace, caps, ("LRU", "Belady", *peers.PEER_ONLINE))
                    if with_peers else {})
            best = best_baselines(figures, peer)
            verdict = checks(figures, targets)
            ceiling = ceilings(
                figures, ttft_floor(trace, caps, cost),
                clairvoyant_run(trace, caps, results, targets, cost),
            )
            status = check_status(verdict, ceiling, targets)
            if name not in SYNTHETIC:
                # the synthetic margins (x LRU, 0.5 x LRU's P99) are not targets on real traffic
                keep = ("0 platinum cold starts", "0 canary cold starts")
                verdict = {k: verdict[k] for k in keep}
                status = {k: status[k] for k in keep}
                heat_rps = results["heat"].sim_requests_per_s
                speed = f">= {targets.gentd26_requests_per_s:,.0f} req/s"
                verdict[speed] = heat_rps >= targets.gentd26_requests_per_s
                status[speed] = "met" if verdict[speed] else f"missed ({heat_rps:,.0f})"
            overflows = int(results["heat"].extra.get("protection_overflows", 0))
            plat = "0 platinum cold starts"
            if not verdict[plat] and overflows:
                status[plat] = f"unreachable (protected set over its share: {overflows} overflows)"
            vs_best = peer_checks(figures, best, targets)
            verdict.update(vs_best)
            status.update(peer_status(vs_best, figures, best, targets))
            if not vs_best["cold starts <= best"]:
                # what the business rules cost: heat with nothing protected
                free = unprotected(cfg)
                ceiling["heat_cold_starts_without_protection"] = float(
                    simulate(trace, make_policy("heat", free), caps, cost).cold_starts
                )
                status["cold starts <= best"] += (
                    f"; without protection {ceiling['heat_cold_starts_without_protection']:.0f}"
                )
            console.print(render(name, trace, caps, figures, peer))
            console.print(
                f"  ceilings: heat/lru = {ceiling['heat_vs_lru']:.3f}, "
                f"belady/lru = {ceiling['belady_vs_lru']:.3f}; interactive p99 floor = "
                f"{ceiling['interactive_p99_floor_ms']:.0f} ms "
                f"({ceiling['interactive_p99_floor_vs_lru'] or 0:.2f} x lru), clairvoyant tail "
                f"oracle {ceiling['interactive_p99_clairvoyant_ms'] or 0:.0f} ms "
                f"({ceiling['interactive_p99_clairvoyant_vs_lru'] or 0:.2f} x lru)"
            )
            console.print("  heat: " + "  ".join(_mark(k, st) for k, st in status.items()))
            report["cases"].append({
                "trace": name,
                "requests": len(trace),
                "versions": trace.n_versions,
                "workers": caps.workers,
                "gpu_slots": caps.gpu_slots,
                "active_slots": caps.active_slots,
                "host_bytes": caps.host_bytes,
                "checks": verdict,
                "check_status": status,
                "ceilings": ceiling,
                "best_baselines": best,
                "peer_hot_hit_ratio": {f"lcs:{k}": round(v, 6) for k, v in peer.items()},
                "peer_hot_hit_ratio_adjusted": {
                    f"lcs:{k}": round(v, 6) for k, v in peer_adjusted(figures, peer).items()
                },
                "results": figures,
            })
    console.print(summary_table(report["cases"]))
    pairs = time_scale_pairs(report["cases"], targets)
    report["time_scale_invariance"] = pairs
    for pair in pairs:
        mark = "[green]✓[/]" if pair["met"] else "[red]✗[/]"
        console.print(
            f"{mark} time-scale invariance, GenTD26 {pair['gpu_slots']} slots: heat/lru "
            f"{pair['heat_vs_lru_x1']:.4f} at x1, {pair['heat_vs_lru_x24']:.4f} at x24 "
            f"(gap {pair['gap']:.4f}, target <= {targets.time_scale_invariance})"
        )
    if not args.no_scaling:
        speed = scaling(cfg, cost)
        report["heat_requests_per_s_by_versions"] = speed
        console.print("heat simulated requests per CPU second by catalog size: " + ", ".join(
            f"{int(n):,} versions {v:,.0f}" for n, v in speed.items()))
    console.print("cost model: " + ", ".join(f"{k}={v:g}" for k, v in cost.as_dict().items()))
    console.print(f"engine costs measured by: {measured_engine_costs().source}")
    console.print(f"policy code: {native.status()}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    console.print(f"wrote {args.out} in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
