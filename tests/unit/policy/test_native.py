"""The compiled policy (``loraplane.native``): the same decisions as the interpreted code, the
same module in the simulator and the cache manager, and never a build of other sources.

Each run is a fresh process, as the services and ``make bench-policy`` are: the choice between
compiled and interpreted code is made at ``import loraplane``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loraplane import native

SOURCE = Path(native.__file__).resolve().parents[1]

# Every heat figure and the SHA-256 of the full victim sequence of each case, from a fresh
# process. The victims are recorded by delegation (a compiled class takes no Python subclass).
_RUN = r"""
import csv, hashlib, io, json, sys
from pathlib import Path
from loraplane import native
from loraplane.cache_manager import leader  # the cache manager's import of the policy
from loraplane.policy import adaptive, heat, ranking
from loraplane.policy.config import load_config
from loraplane.sim.cost import CostModel
from loraplane.sim.gentd26 import REQUEST_FILE, import_gentd26
from loraplane.sim.simulator import Capacities, simulate
from loraplane.sim.trace import format_rows, parse_rows, read_trace

GIB = 2**30
traces = Path(sys.argv[1])
quick = sys.argv[2:] == ["status"]
cfg = load_config(None)


class Recorded(heat.HeatPolicy):
    def online(self, ctx):
        inner = super().online(ctx)
        digest = self.digest = hashlib.sha256()

        class Online:
            def __getattr__(self, name):
                return getattr(inner, name)

            def hot_victim(self, g, now, busy):
                victim = inner.hot_victim(g, now, busy)
                digest.update(f"h{g},{victim},{inner.hot_expert(g)};".encode())
                return victim

            def warm_victim(self, w, now, hot):
                victim = inner.warm_victim(w, now, hot)
                digest.update(f"w{w},{victim},{inner.warm_expert(w)};".encode())
                return victim

        return Online()


def gentd26(scale):
    rows = import_gentd26(traces / "gentd26" / REQUEST_FILE, time_scale=scale)
    return parse_rows(csv.DictReader(io.StringIO("".join(format_rows(rows)))), "gentd26")


cases = [] if quick else [
    ("gentd26", gentd26(1.0), Capacities(16, 8 * GIB, 1)),
    ("gentd26", gentd26(1.0), Capacities(32, 12 * GIB, 1)),
    ("gentd26-x24", gentd26(24.0), Capacities(16, 8 * GIB, 1)),
    ("conv-1h", read_trace(traces / "conv-1h.csv.gz"), Capacities(8, 10 * GIB, 4)),
]
out = {"compiled": native.is_compiled("loraplane.policy.adaptive"),
       "heat_compiled": native.is_compiled("loraplane.policy.heat"),
       "module": adaptive.__file__, "status": native.status(),
       "one_class": ranking.AdaptiveHeatOnline is adaptive.AdaptiveHeatOnline
                    is heat.AdaptiveHeatOnline, "cases": []}
for name, trace, caps in cases:
    policy = Recorded(cfg)
    figures = simulate(trace, policy, caps, CostModel()).as_dict()
    figures.pop("sim_requests_per_s")
    figures.pop("sim_requests_per_wall_s")
    out["cases"].append({"case": f"{name} {caps}", "figures": figures,
                         "victims": policy.digest.hexdigest()})
print(json.dumps(out))
"""


def _run(env: dict[str, str], *args: str) -> dict[str, object]:
    traces = Path(__file__).resolve().parents[2] / "data" / "traces"
    done = subprocess.run(
        [sys.executable, "-c", _RUN, str(traces), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def built() -> Path:
    """The build for the current sources (``make install`` made it; built here otherwise)."""
    return native.build()


def test_compiled_and_interpreted_take_the_same_decisions(built: Path) -> None:
    compiled = _run({native.ENV_SWITCH: "1"})
    plain = _run({native.ENV_SWITCH: "0"})
    # the build is for these sources: a change while the test ran would show here
    assert compiled["compiled"] is True, compiled["status"]
    assert str(compiled["module"]).startswith(str(built))
    assert plain["compiled"] is False and str(plain["module"]).endswith("adaptive.py")
    assert compiled["heat_compiled"] is True and plain["heat_compiled"] is False
    assert compiled["one_class"] and plain["one_class"]
    assert isinstance(compiled["cases"], list) and isinstance(plain["cases"], list)
    assert len(compiled["cases"]) == 4
    for a, b in zip(compiled["cases"], plain["cases"], strict=True):
        assert a["figures"]["requests"] > 10_000
        assert a == b, a["case"]


def _copy_sources(where: Path) -> Path:
    pkg = where / "loraplane"
    for sub in native.DIGESTED:
        shutil.copytree(SOURCE / sub, pkg / sub, ignore=shutil.ignore_patterns("__pycache__"))
    return pkg


def test_an_edit_to_any_policy_source_changes_the_build_key(tmp_path: Path) -> None:
    pkg = _copy_sources(tmp_path)
    assert native.digest(pkg) == native.digest()
    for name in ("adaptive.py", "model.py"):
        edited = pkg / "policy" / name
        before = edited.read_bytes()
        edited.write_bytes(before + b"\n# edited\n")
        assert native.digest(pkg) != native.digest()
        edited.write_bytes(before)
    assert native.digest(pkg) == native.digest()


def test_a_build_of_other_sources_is_never_loaded(built: Path, tmp_path: Path) -> None:
    # a build directory with a complete build under another key (what an edit leaves behind)
    root = tmp_path / "builds"
    shutil.copytree(built, root / ("0" * len(built.name)))
    stale = _run({native.ROOT_ENV: str(root), native.ENV_SWITCH: "1"}, "status")
    assert stale["compiled"] is False
    assert "no build for the current sources" in str(stale["status"])
    # the same files under the key of the current sources are served
    shutil.copytree(built, root / built.name)
    fresh = _run({native.ROOT_ENV: str(root), native.ENV_SWITCH: "1"}, "status")
    assert fresh["compiled"] is True
    assert str(fresh["module"]).startswith(str(root / built.name))
