"""Compare heat-policy configuration variants against LRU on the reference cases.

    .venv/bin/python scripts/policy_sweep.py --traces conv-1h,large-1h \\
        --variant "budget0.3: score.class_budgets_s.interactive=0.3" \\
        --variant "size0.5: score.warm_size_exponent=0.5"

Each variant is ``NAME: KEY=VALUE[, KEY=VALUE…]`` on top of ``config/policy.yaml``
(KEY is a dotted path, VALUE is read as YAML). Prints, per case, the HOT hits ×
LRU, the interactive P99 × LRU and the cold starts (interactive in brackets):
the figures the policy README quotes for the levers it tried. Traces come from
``.loraplane/bench/traces`` (written by ``make bench-policy``) or
``tests/data/traces``.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

from loraplane.policy.config import PolicyConfig, PolicyConfigError, config_from_mapping
from loraplane.policy.factory import make_policy
from loraplane.sim.bench import BENCH_CASES
from loraplane.sim.simulator import SimResult, simulate
from loraplane.sim.trace import Trace, read_trace

GIB = 2**30
ROOT = Path(__file__).resolve().parent.parent
"""Repository root: the script works from any directory."""


def find_trace(name: str) -> Trace:
    """The reference trace ``name`` from the bench cache or the checked-in copies."""
    for folder in (ROOT / ".loraplane/bench/traces", ROOT / "tests/data/traces"):
        path = folder / f"{name}.csv.gz"
        if path.is_file():
            return read_trace(path)
    raise SystemExit(f"trace {name} is not generated yet: run make bench-policy first")


def parse_variant(text: str) -> tuple[str, list[tuple[list[str], Any]]]:
    """``NAME: a.b=1, c=x`` → (NAME, [(['a', 'b'], 1), (['c'], 'x')])."""
    name, colon, rest = text.partition(":")
    if not colon or not name.strip():
        raise SystemExit(f"variant {text!r}: expected NAME: KEY=VALUE[, KEY=VALUE…]")
    edits = []
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise SystemExit(f"variant {name.strip()!r}: {part!r} is not KEY=VALUE")
        edits.append((key.strip().split("."), yaml.safe_load(value)))
    return name.strip(), edits


def build_config(
    base: dict[str, Any], name: str, edits: list[tuple[list[str], Any]]
) -> PolicyConfig:
    """``base`` with the edits applied, validated (exits with every problem)."""
    mapping = copy.deepcopy(base)
    for path, value in edits:
        node = mapping
        for key in path[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise SystemExit(f"variant {name!r}: {'.'.join(path)} goes through a value")
        node[path[-1]] = value
    try:
        return config_from_mapping(mapping)
    except PolicyConfigError as e:
        raise SystemExit(f"variant {name!r}: {e}") from None


def ratio(a: float, b: float) -> str:
    """a / b, or n/a when b is 0."""
    return f"{a / b:.3f}" if b else "n/a"


def line(r: SimResult, lru: SimResult) -> str:
    """One case's figures relative to LRU."""
    p99 = r.ttft_ms.get("interactive", {}).get("p99", 0.0)
    lru_p99 = lru.ttft_ms.get("interactive", {}).get("p99", 0.0)
    return (f"hit {ratio(r.gpu_hits, lru.gpu_hits)} p99 {ratio(p99, lru_p99)} "
            f"cold {r.cold_starts}({r.cold_starts_by_class['interactive']}i)")


def main(argv: list[str] | None = None) -> int:
    """Run every variant on every case and print one block per variant."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", default="conv-1h,large-1h")
    parser.add_argument("--variant", action="append", default=[])
    args = parser.parse_args(argv)
    base = yaml.safe_load((ROOT / "config/policy.yaml").read_text(encoding="utf-8")) or {}
    variants = [("default", [])] + [parse_variant(v) for v in args.variant]
    configs = [(name, build_config(base, name, edits)) for name, edits in variants]
    names = [n.strip() for n in args.traces.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCH_CASES]
    if unknown or not names:
        raise SystemExit(f"unknown trace(s) {', '.join(unknown) or '(none)'}; known: "
                         f"{', '.join(BENCH_CASES)}")
    cases = []
    for name in names:
        trace = find_trace(name)
        for caps in BENCH_CASES[name]:
            cases.append((name, trace, caps, simulate(trace, make_policy("lru"), caps)))
    for vname, cfg in configs:
        print(vname)
        for name, trace, caps, lru in cases:
            r = simulate(trace, make_policy("heat", cfg), caps)
            label = f"{name} {caps.gpu_slots}x{caps.host_bytes / GIB:g}GiB"
            print(f"  {label:22s} {line(r, lru)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
