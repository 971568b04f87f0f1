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
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from loraplane.policy.config import PolicyConfig, load_config
from loraplane.policy.factory import make_policy
from loraplane.sim.cost import CostModel
from loraplane.sim.generator import DEFAULT_AZURE_DIR, generate
from loraplane.sim.oracle import TailOracle
from loraplane.sim.presets import PRESETS
from loraplane.sim.simulator import Capacities, SimResult, simulate, ttft_floor
from loraplane.sim.trace import Trace, read_trace, write_trace

GIB = 2**30
POLICY_ORDER = ("heat", "lru", "fifo", "lfu", "gdsf", "belady")
CHECKED_IN = Path("tests/data/traces")
"""Where small reference traces are checked in (relative to the repository root)."""

_CAPACITIES = (
    Capacities(gpu_slots=16, host_bytes=10 * GIB, workers=4),
    Capacities(gpu_slots=16, host_bytes=12 * GIB, workers=4),
    Capacities(gpu_slots=8, host_bytes=10 * GIB, workers=4),
)
BENCH_CASES: dict[str, tuple[Capacities, ...]] = {
    "conv-1h": _CAPACITIES,
    "large-1h": _CAPACITIES,
    "mixed-3h": _CAPACITIES,
}
"""Capacities per reference trace: 4 workers with 16 (or 8) engine LoRA slots (``max_loras``)
and 10 or 12 GiB of host memory for adapter files each, against 80–170 GB of adapter versions."""


@dataclass(frozen=True)
class Targets:
    """Acceptance targets of the heat policy (from the issue)."""

    vs_belady: float = 0.85
    vs_lru: float = 1.10
    p99_vs_lru: float = 0.50
    requests_per_s: float = 50_000.0


def load_reference_trace(name: str, azure_dir: Path, cache_dir: Path) -> Trace:
    """The reference trace ``name``: cached, else generated, else the checked-in copy."""
    cached = cache_dir / f"{name}.csv.gz"
    if cached.is_file():
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


def render(trace_name: str, trace: Trace, caps: Capacities, figures: list[dict[str, Any]]) -> Table:
    """One rich table per case."""
    title = (
        f"{trace_name}: {len(trace)} requests, {trace.n_versions} versions — "
        f"{caps.workers} workers × {caps.gpu_slots} slots, {caps.host_bytes / GIB:g} GiB host"
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
    return table


def _mark(name: str, status: str) -> str:
    if status == "met":
        return f"[green]✓ {name}[/]"
    if status.startswith("missed"):
        return f"[red]✗ {name}{status[len('missed'):]}[/]"
    return f"[yellow]– {name}: {status}[/]"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit status 0 even when a target is missed (it is a report)."""
    parser = argparse.ArgumentParser(prog="python -m loraplane.sim.bench", description=__doc__)
    parser.add_argument("--azure-dir", type=Path, default=DEFAULT_AZURE_DIR)
    parser.add_argument("--out", type=Path, default=Path(".loraplane/bench/policy.json"))
    parser.add_argument("--cache-dir", type=Path, default=Path(".loraplane/bench/traces"))
    parser.add_argument("--policy-config", type=Path, default=None)
    parser.add_argument("--traces", default=",".join(BENCH_CASES),
                        help="comma-separated reference traces")
    args = parser.parse_args(argv)

    cfg = load_config(args.policy_config)
    cost = CostModel()
    targets = Targets()
    console = Console(width=200)
    report: dict[str, Any] = {
        "generated_by": "python -m loraplane.sim.bench",
        "cost_model": cost.as_dict(),
        "targets": asdict(targets),
        "cases": [],
    }
    started = time.perf_counter()
    for name in [t.strip() for t in args.traces.split(",") if t.strip()]:
        if name not in BENCH_CASES:
            console.print(f"unknown trace {name}; known: {', '.join(BENCH_CASES)}")
            return 2
        trace = load_reference_trace(name, args.azure_dir, args.cache_dir)
        for caps in BENCH_CASES[name]:
            results = run_case(trace, caps, cfg, cost)
            figures = case_figures(results)
            verdict = checks(figures, targets)
            ceiling = ceilings(
                figures, ttft_floor(trace, caps, cost),
                clairvoyant_run(trace, caps, results, targets, cost),
            )
            status = check_status(verdict, ceiling, targets)
            console.print(render(name, trace, caps, figures))
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
                "host_bytes": caps.host_bytes,
                "checks": verdict,
                "check_status": status,
                "ceilings": ceiling,
                "results": figures,
            })
    console.print("cost model: " + ", ".join(f"{k}={v:g}" for k, v in cost.as_dict().items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    console.print(f"wrote {args.out} in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
