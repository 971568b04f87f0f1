"""bench-cold's verdict per size: met, missed, or beyond what the engine's fixed cost allows;
the pipeline against its ceiling, load by load (the exit status)."""

from __future__ import annotations

import pytest

from benchmarks.cold import (
    TARGET_OF_CEILING,
    TARGET_RATIO,
    SizeResult,
    paired_of_ceiling,
    paired_raw,
    size_status,
    verdict,
)


def test_met_missed_and_unreachable() -> None:
    assert size_status(0.75, 0.9) == "met"
    assert size_status(TARGET_RATIO, 0.5) == "met"  # met is met, whatever the ceiling says
    assert size_status(0.57, 0.85) == "missed"  # reachable in principle
    # 1 MB: raw 6.5 ms, add_lora 18 ms -> no pipeline can beat 0.27
    ceiling = round(0.0065 / (0.0065 + 0.018), 3)
    assert size_status(0.2, ceiling) == "unreachable (ceiling 0.27)"


def test_each_load_is_paired_with_the_raw_gets_before_and_after_it() -> None:
    assert paired_raw([0.10, 0.12, 0.20, 0.10]) == pytest.approx([0.11, 0.16, 0.15])


def _result(of_ceiling: float, paired: float) -> SizeResult:
    r = SizeResult(size_bytes=1, pipeline_mb_s=1, raw_mb_s=1, ratio=1, pipeline_best_mb_s=1,
                   raw_best_mb_s=1, ratio_best=1, fetch_verify_mb_s=1, fetch_verify_ratio=1,
                   rank=2, repeats=9, raw_s=0.1, pipeline_s=0.2, list_s=0, download_s=0.1,
                   verify_s=0, register_s=0.1, warm_to_hot_s=0.1, warm_verify_s=0,
                   warm_register_s=0.1)
    r.of_ceiling, r.of_ceiling_paired = of_ceiling, paired
    return r


def test_one_disturbed_load_does_not_decide_and_the_target_is_unchanged() -> None:
    # 100 MB-like loads: raw 0.19 s, add_lora 0.15 s, the pipeline 0.35 s (of the ceiling 0.971)
    raw, reg = [0.19] * 9, [0.15] * 9
    pipe = [0.35] * 9
    assert paired_of_ceiling(raw, reg, pipe) == pytest.approx(0.971, abs=1e-3)
    pipe[4] = 0.60  # one load hit by other work on the machine
    assert paired_of_ceiling(raw, reg, pipe) >= TARGET_OF_CEILING
    # a pipeline 0.37 s in five of nine loads (0.919 of the ceiling) misses whatever the rest did
    pipe = [0.37] * 5 + [0.30] * 4
    assert paired_of_ceiling(raw, reg, pipe) < TARGET_OF_CEILING
    assert TARGET_OF_CEILING == 0.95


def test_the_verdict_is_the_paired_figure() -> None:
    ok, paired_miss = _result(0.93, 0.96), _result(0.97, 0.94)
    assert verdict([ok, paired_miss]) == [paired_miss]
