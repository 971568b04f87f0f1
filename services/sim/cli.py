"""``loraplane sim``, ``loraplane trace gen`` and ``loraplane trace import``: the cache simulator,
the trace generator and the importer of real traces."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from loraplane.policy.config import PolicyConfigError, load_config
from loraplane.policy.factory import POLICIES, make_policy
from loraplane.sim.cost import CostModel
from loraplane.sim.generator import DEFAULT_AZURE_DIR, GenConfig, generate
from loraplane.sim.gentd26 import (
    DEFAULT_GENTD26_DIR,
    DEFAULT_KEY,
    REQUEST_FILE,
    Gentd26Error,
    import_gentd26,
)
from loraplane.sim.presets import PRESETS
from loraplane.sim.simulator import Capacities, SimResult, simulate
from loraplane.sim.trace import TraceError, read_trace, write_trace

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}


def parse_bytes(text: str) -> int:
    """``"8GiB"``, ``"500MB"``, ``"1e9"`` or ``"1073741824"`` → bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise typer.BadParameter(f"not a byte size: {text!r} (e.g. 8GiB, 500MB, 1073741824)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def result_table(results: list[SimResult], title: str) -> Table:
    """A rich table of simulation results (one row per policy)."""
    table = Table(title=title)
    for col in ("policy", "gpu hit", "host hit", "compulsory", "cold", "cold plat",
                "cold canary", "p50 int ms", "p99 int ms", "p99 bg ms", "loads", "evictions",
                "req/s"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in results:
        inter = r.ttft_ms.get("interactive", {})
        bg = r.ttft_ms.get("background", {})
        table.add_row(
            r.policy,
            f"{r.gpu_hit_ratio:.3f}",
            f"{r.host_hit_ratio:.3f}",
            str(r.compulsory_misses),
            str(r.cold_starts),
            str(r.cold_starts_by_priority.get("platinum", 0)),
            str(r.cold_starts_canary),
            f"{inter.get('p50', 0.0):.0f}",
            f"{inter.get('p99', 0.0):.0f}",
            f"{bg.get('p99', 0.0):.0f}",
            str(r.loads),
            str(r.hot_evictions + r.warm_evictions),
            f"{r.sim_requests_per_s:,.0f}",
        )
    return table


def sim_cmd(
    trace: Annotated[Path, typer.Option("--trace", help="Trace file (.csv or .csv.gz).")],
    gpu_slots: Annotated[int, typer.Option("--gpu-slots", help="HOT (registered, vLLM max_cpu_loras) versions per worker and base model.")],
    host_bytes: Annotated[str, typer.Option("--host-bytes", help="Host bytes per worker (8GiB, 500MB…).")],
    policies: Annotated[str, typer.Option("--policies", help="Comma-separated policy names.")] = (
        "heat,lru,fifo,lfu,gdsf,belady"
    ),
    workers: Annotated[int, typer.Option("--workers", help="Number of workers.")] = 1,
    active_slots: Annotated[int, typer.Option("--active-slots", help="GPU slots (vLLM max_loras) per worker and base model, below --gpu-slots: HOT's second level; 0 = one level.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list, one object per policy.")] = False,
    policy_config: Annotated[
        Path | None, typer.Option("--policy-config", help="Policy YAML (default config/policy.yaml).")
    ] = None,
    host_to_gpu_mb_per_s: Annotated[float, typer.Option(help="Host→GPU bandwidth (MB/s).")] = 12_000.0,
    s3_mb_per_s: Annotated[float, typer.Option(help="Object-store bandwidth (MB/s).")] = 200.0,
    s3_latency_ms: Annotated[float, typer.Option(help="Object-store latency (ms).")] = 50.0,
    verify_mb_per_s: Annotated[float, typer.Option(help="Verification throughput (MB/s).")] = 1_000.0,
    register_ms: Annotated[float | None, typer.Option(help="WARM → registered cost per load (ms; default: the bench's measurement, sim/engine_costs.json).")] = None,
    activate_ms: Annotated[float | None, typer.Option(help="Registered → GPU slot cost, fixed part (ms; plus size / host→GPU; default: the bench's measurement).")] = None,
    prefill_ms_per_token: Annotated[float, typer.Option(help="Prefill cost per prompt token (ms).")] = 0.05,
    base_ttft_ms: Annotated[float, typer.Option(help="Fixed TTFT part of every request (ms).")] = 20.0,
    tpot_ms: Annotated[float, typer.Option(help="Time per output token (ms): in-flight time.")] = 15.0,
) -> None:
    """Simulate a request trace against cache policies and report hit ratios, cold starts, TTFT."""
    names = [n.strip() for n in policies.split(",") if n.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown or not names:
        raise typer.BadParameter(
            f"unknown policies {unknown}; known: {', '.join(POLICIES)}", param_hint="--policies"
        )
    try:
        cfg = load_config(policy_config)
        cost = CostModel.from_units(
            host_to_gpu_mb_per_s=host_to_gpu_mb_per_s, s3_mb_per_s=s3_mb_per_s,
            s3_latency_ms=s3_latency_ms, verify_mb_per_s=verify_mb_per_s, register_ms=register_ms,
            activate_ms=activate_ms, prefill_ms_per_token=prefill_ms_per_token, base_ttft_ms=base_ttft_ms, tpot_ms=tpot_ms,
        )
        parsed = read_trace(trace)
        caps = Capacities(gpu_slots=gpu_slots, host_bytes=parse_bytes(host_bytes), workers=workers,
                          active_slots=active_slots)
        results = [simulate(parsed, make_policy(n, cfg), caps, cost) for n in names]
    except (PolicyConfigError, TraceError, ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if as_json:
        typer.echo(json.dumps([r.as_dict() for r in results], indent=2))
        return
    console = Console(width=max(Console().width, 160))
    console.print(
        result_table(
            results,
            f"{trace.name}: {len(parsed)} requests, {parsed.n_versions} versions, "
            f"{workers} worker(s) × {gpu_slots} slots, {host_bytes} host",
        )
    )
    console.print("cost model: " + ", ".join(f"{k}={v:g}" for k, v in cost.as_dict().items()))


trace_app = typer.Typer(help="Request traces for the cache simulator.", no_args_is_help=True)


@trace_app.command("gen")
def trace_gen_cmd(
    out: Annotated[Path, typer.Option("--out", help="Output file (.csv or .csv.gz).")],
    preset: Annotated[
        str | None, typer.Option("--preset", help=f"Start from a reference trace: {', '.join(PRESETS)}.")
    ] = None,
    azure_dir: Annotated[Path, typer.Option("--azure-dir", help="Azure LLM 2023 traces.")] = DEFAULT_AZURE_DIR,
    source: Annotated[str | None, typer.Option("--source", help="conv, code or conv,code.")] = None,
    hours: Annotated[int | None, typer.Option("--hours", help="Tile the ~1 h arrivals this many times.")] = None,
    seed: Annotated[int | None, typer.Option("--seed")] = None,
    tenants: Annotated[int | None, typer.Option("--tenants")] = None,
    zipf_alpha: Annotated[float | None, typer.Option("--zipf-alpha", help="Popularity exponent.")] = None,
    bursts_per_hour: Annotated[float | None, typer.Option("--bursts-per-hour")] = None,
    releases_per_hour: Annotated[float | None, typer.Option("--releases-per-hour")] = None,
) -> None:
    """Turn Azure LLM arrivals into a multi-tenant LoRA trace (seeded, reproducible)."""
    if preset is not None and preset not in PRESETS:
        raise typer.BadParameter(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    cfg = PRESETS[preset] if preset else GenConfig()
    overrides: dict[str, object] = {"azure_dir": azure_dir}
    if source is not None:
        overrides["sources"] = tuple(s.strip() for s in source.split(",") if s.strip())
    for key, value in (("hours", hours), ("seed", seed), ("tenants", tenants),
                       ("zipf_alpha", zipf_alpha), ("bursts_per_hour", bursts_per_hour),
                       ("releases_per_hour", releases_per_hour)):
        if value is not None:
            overrides[key] = value
    from dataclasses import replace

    cfg = replace(cfg, **overrides)  # type: ignore[arg-type]
    try:
        rows = list(generate(cfg))
    except (OSError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    write_trace(out, rows)
    versions = len({r.adapter_id for r in rows})
    typer.echo(f"{out}: {len(rows)} requests, {versions} versions, seed {cfg.seed}")


IMPORTERS = ("gentd26",)
"""Real traces ``loraplane trace import`` knows."""


@trace_app.command("import")
def trace_import_cmd(
    source: Annotated[str, typer.Argument(help=f"Which real trace: {', '.join(IMPORTERS)}.")],
    out: Annotated[Path, typer.Option("--out", help="Output file (.csv or .csv.gz).")],
    input_file: Annotated[Path, typer.Option("--input", help="The source file.")] = (
        DEFAULT_GENTD26_DIR / REQUEST_FILE
    ),
    time_scale: Annotated[float, typer.Option(
        "--time-scale", help="Replay K times faster (ts / K); every other field is unchanged.")
    ] = 1.0,
    key: Annotated[str, typer.Option("--key", help="Key of the hash that assigns tiers, sizes, "
                                     "classes and canaries.")] = DEFAULT_KEY,
) -> None:
    """Map a real request trace onto the simulator's format (deterministic; see gentd26.py)."""
    if source not in IMPORTERS:
        raise typer.BadParameter(f"unknown trace {source!r}; known: {', '.join(IMPORTERS)}")
    try:
        rows = list(import_gentd26(input_file, time_scale=time_scale, key=key))
    except (OSError, Gentd26Error, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    write_trace(out, rows)
    versions = len({r.adapter_id for r in rows})
    typer.echo(f"{out}: {len(rows)} requests, {versions} versions, time scale {time_scale:g}")
