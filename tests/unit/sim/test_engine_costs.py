"""The simulator's engine costs come from bench-cold's measurement (issue 19): the checked-in
``services/sim/engine_costs.json`` is what ``CostModel.measured()``, ``CostModel.from_units()``
(``loraplane sim``, ``make bench-policy``) default to; a deployment's own figures override
it; a bare ``CostModel()`` keeps the reference constants the policy tests assume."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from benchmarks.cold import SizeResult, engine_costs
from loraplane.sim.cost import (
    ENGINE_COSTS_FILE,
    CostModel,
    measured_engine_costs,
    parse_engine_costs,
)

MB = 1_000_000


def checked_in() -> dict[str, object]:
    text = resources.files("loraplane.sim").joinpath(ENGINE_COSTS_FILE).read_text()
    data: dict[str, object] = json.loads(text)
    return data


def test_the_simulators_defaults_are_the_checked_in_measurement() -> None:
    data = checked_in()
    assert data["command"] and data["measured_at"] and data["sizes"]
    bw = CostModel.measured().bandwidths
    assert bw.register_s == pytest.approx(float(data["register_ms"]) / 1000)  # type: ignore[arg-type]
    assert bw.activate_s == pytest.approx(float(data["activate_ms"]) / 1000)  # type: ignore[arg-type]
    units = CostModel.from_units().as_dict()
    assert (units["register_ms"], units["activate_ms"]) == pytest.approx(
        (data["register_ms"], data["activate_ms"]))
    assert measured_engine_costs().source.startswith(str(data["command"]))


def test_loraplane_sim_runs_the_measured_costs_unless_told_otherwise(tmp_path: Path) -> None:
    """The CLI prints its cost model: the measurement by default, a flag's figure instead."""
    from typer.testing import CliRunner

    from loraplane.cli.main import app

    trace = tmp_path / "t.csv"
    trace.write_text("ts,tenant_id,adapter_id,priority,request_class,rank,size_bytes,canary,"
                     "prompt_tokens,output_tokens\n" + "".join(
                         f"{t},acme,{a},gold,interactive,8,1000000,0,10,2\n"
                         for t, a in enumerate("aba")))
    args = ["sim", "--trace", str(trace), "--gpu-slots", "1", "--host-bytes", "1GB",
            "--policies", "lru"]
    measured = measured_engine_costs()
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    assert f"register_ms={measured.register_ms:g}" in out.output
    assert f"activate_ms={measured.activate_ms:g}" in out.output
    out = CliRunner().invoke(app, [*args, "--register-ms", "4", "--activate-ms", "0.25"])
    assert out.exit_code == 0, out.output
    assert "register_ms=4," in out.output and "activate_ms=0.25," in out.output


def test_a_deployment_overrides_the_measured_costs() -> None:
    gpu = CostModel.from_units(register_ms=4.0, activate_ms=0.3).bandwidths
    assert (gpu.register_s, gpu.activate_s) == pytest.approx((0.004, 0.0003))
    only_one = CostModel.from_units(activate_ms=0.0).bandwidths
    assert only_one.register_s == pytest.approx(measured_engine_costs().register_ms / 1000)


def test_a_broken_measurement_is_refused_naming_each_field() -> None:
    with pytest.raises(ValueError, match="register_ms missing.*activate_ms missing"):
        parse_engine_costs(json.dumps({"command": "x"}))
    with pytest.raises(ValueError, match="activate_ms missing or not a number >= 0"):
        parse_engine_costs(json.dumps({"register_ms": 3, "activate_ms": -1}))


def result(size_mb: float, add_lora_ms: float, activate_ms: float) -> SizeResult:
    zero = dict.fromkeys(("pipeline_mb_s", "raw_mb_s", "ratio", "pipeline_best_mb_s",
                          "raw_best_mb_s", "ratio_best", "fetch_verify_mb_s",
                          "fetch_verify_ratio", "raw_s", "pipeline_s", "list_s", "download_s",
                          "verify_s", "register_s", "warm_to_hot_s", "warm_verify_s"), 0.0)
    return SizeResult(size_bytes=int(size_mb * MB), rank=8, repeats=5,
                      warm_register_s=add_lora_ms / 1000, activate_adapter_s=activate_ms / 1000,
                      **zero)  # type: ignore[arg-type]


def test_bench_cold_writes_the_fixed_parts_the_simulator_reads() -> None:
    """add_lora = 15 ms + 0.3 ms/MB, of which activate_adapter = 2 ms + 0.05 ms/MB: the file
    holds the intercepts (13 and 2 ms) and the slopes, and parses back."""
    rows = [result(mb, 15 + 0.3 * mb, 2 + 0.05 * mb) for mb in (1, 10, 25, 50, 100)]
    out = engine_costs(rows, command="python -m benchmarks.cold --sim-costs x",
                       measured_at="2026-12-02T03:00:00Z",
                       load_average={"start": [0.5, 0.5, 0.5], "end": [0.6, 0.5, 0.5]})
    assert (out["register_ms"], out["activate_ms"]) == pytest.approx((13.0, 2.0))
    assert (out["register_ms_per_mb"], out["activate_ms_per_mb"]) == pytest.approx((0.25, 0.05))
    assert [s["size_mb"] for s in out["sizes"]] == [1, 10, 25, 50, 100]
    back = parse_engine_costs(json.dumps(out))
    assert (back.register_ms, back.activate_ms) == pytest.approx((13.0, 2.0))
    assert back.source == "python -m benchmarks.cold --sim-costs x at 2026-12-02T03:00:00Z"
