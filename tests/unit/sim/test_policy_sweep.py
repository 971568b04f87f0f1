"""scripts/policy_sweep.py: variants parsed and validated before anything runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "policy_sweep.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], check=False, capture_output=True,
                          text=True, timeout=120, cwd="/")


def test_bad_variants_and_traces_are_refused_with_the_reason() -> None:
    for args, reason in [
        (("--variant", "score.warm_size_exponent=0.5"), "expected NAME: KEY=VALUE"),
        (("--variant", "v: score.nope=1"), "score.nope: unknown key"),
        (("--variant", "v: score.weights.qps.x=1"), "goes through a value"),
        (("--traces", "conv-1h,bogus"), "unknown trace(s) bogus"),
    ]:
        done = run(*args)
        assert done.returncode != 0
        assert reason in done.stderr


def test_a_variant_is_measured_beside_the_default_on_every_case() -> None:
    done = run("--traces", "conv-1h", "--variant", "bigger: score.warm_size_exponent=1.5")
    assert done.returncode == 0, done.stderr
    blocks = done.stdout.split("bigger\n")
    assert blocks[0].startswith("default\n")
    default_lines = blocks[0].splitlines()[1:]
    variant_lines = blocks[1].splitlines()
    assert len(default_lines) == len(variant_lines) == 3  # 16x10, 16x12, 8x10 GiB
    assert all("hit " in x and " p99 " in x and " cold " in x for x in variant_lines)
    assert default_lines != variant_lines  # the size exponent changes WARM's choices
