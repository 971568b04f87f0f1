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

from loraplane.policy.config import DEFAULT_CONFIG_PATH, config_from_mapping
from loraplane.policy.factory import make_policy
from loraplane.sim.bench import BENCH_CASES
from loraplane.sim.simulator import SimResult, simulate
from loraplane.sim.trace import Trace, read_trace

GIB = 2**30


def find_trace(name: str) -> Trace:
    """The reference trace ``name`` from the bench cache or the checked-in copies."""
    for folder in (Path(".loraplane/bench/traces"), Path("tests/data/traces")):
        path = folder / f"{name}.csv.gz"
        if path.is_file():
            return read_trace(path)
    raise SystemExit(f"no trace {name}: run make bench-policy first")


def parse_variant(text: str) -> tuple[str, list[tuple[list[str], Any]]]:
    """``NAME: a.b=1, c=x`` → (NAME, [(['a', 'b'], 1), (['c'], 'x')])."""
    name, _, rest = text.partition(":")
    edits = []
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq:
            raise SystemExit(f"variant {name!r}: {part!r} is not KEY=VALUE")
        edits.append((key.strip().split("."), yaml.safe_load(value)))
    return name.strip(), edits


def line(r: SimResult, lru: SimResult) -> str:
    """One case's figures relative to LRU."""
    p99 = r.ttft_ms["interactive"]["p99"] / lru.ttft_ms["interactive"]["p99"]
    return (f"hit {r.gpu_hits / lru.gpu_hits:.3f} p99 {p99:.2f} "
            f"cold {r.cold_starts}({r.cold_starts_by_class['interactive']}i)")


def main(argv: list[str] | None = None) -> int:
    """Run every variant on every case and print one block per variant."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", default="conv-1h,large-1h")
    parser.add_argument("--variant", action="append", default=[])
    args = parser.parse_args(argv)
    base = yaml.safe_load(DEFAULT_CONFIG_PATH.read_text(encoding="utf-8"))
    variants = [("default", [])] + [parse_variant(v) for v in args.variant]
    cases = []
    for name in args.traces.split(","):
        trace = find_trace(name)
        for caps in BENCH_CASES[name]:
            cases.append((name, trace, caps, simulate(trace, make_policy("lru"), caps)))
    for vname, edits in variants:
        mapping = copy.deepcopy(base)
        for path, value in edits:
            node = mapping
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = value
        cfg = config_from_mapping(mapping)
        print(vname)
        for name, trace, caps, lru in cases:
            r = simulate(trace, make_policy("heat", cfg), caps)
            label = f"{name} {caps.gpu_slots}x{caps.host_bytes / GIB:g}GiB"
            print(f"  {label:22s} {line(r, lru)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
