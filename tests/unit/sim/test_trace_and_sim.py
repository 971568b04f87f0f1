"""Trace format, the simulator's accounting and cost model, and ``loraplane sim --json``."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loraplane.cli.main import app
from loraplane.policy.cost import Bandwidths
from loraplane.policy.factory import make_policy
from loraplane.policy.model import Priority, RequestClass
from loraplane.sim.cli import parse_bytes
from loraplane.sim.cost import CostModel
from loraplane.sim.simulator import Capacities, percentile, simulate
from loraplane.sim.trace import (
    Trace,
    TraceError,
    TraceRow,
    format_rows,
    parse_rows,
    read_trace,
    write_trace,
)

MB = 1_000_000


def row(ts: float, name: str, **kw: object) -> TraceRow:
    base: dict[str, object] = {
        "ts": ts, "tenant_id": "t", "adapter_id": f"t/{name}@v1", "priority": Priority.GOLD,
        "request_class": RequestClass.INTERACTIVE, "rank": 16, "size_bytes": 100 * MB, "canary": False,
        "prompt_tokens": 1000, "output_tokens": 0,
    }
    base.update(kw)
    return TraceRow(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("suffix", [".csv", ".csv.gz"])
def test_write_then_read_round_trips(tmp_path: Path, suffix: str) -> None:
    rows = [row(0.5, "a"), row(1.25, "b", canary=True, request_class=RequestClass.CANARY),
            row(1.25, "a", priority=Priority.PLATINUM)]
    path = tmp_path / f"t{suffix}"
    write_trace(path, rows)
    trace = read_trace(path)
    assert trace.ts == [0.5, 1.25, 1.25]
    assert trace.version_ids == ["t/a@v1", "t/b@v1"]
    assert trace.version == [0, 1, 0]
    assert trace.canary == [0, 1, 0] and trace.classes == [0, 2, 0]
    assert trace.priorities == [1, 1, 0]
    assert trace.base_models == ["default"]
    write_trace(tmp_path / f"u{suffix}", rows)
    assert (tmp_path / f"u{suffix}").read_bytes() == path.read_bytes()  # reproducible bytes


def test_invalid_traces_name_every_problem() -> None:
    text = (
        "ts,tenant_id,adapter_id,priority,request_class,rank,size_bytes,canary,prompt_tokens,"
        "output_tokens\n"
        "5,t,t/a@v1,gold,interactive,8,100,0,10,10\n"
        "4,t,t/a@v1,diamond,urgent,8,100,2,10,10\n"
        "x,t,t/a@v1,gold,interactive,8,100,0,10,10\n"
    )
    with pytest.raises(TraceError) as err:
        parse_rows(csv.DictReader(io.StringIO(text)), "bad")
    problems = "\n".join(err.value.problems)
    # every problem names the line (row) and the column
    for needle in ("line 3: ", "column ts: 4.0 < previous 5.0", "column priority: 'diamond'",
                   "column request_class: 'urgent'", "column canary: 2 not 0 or 1",
                   "line 4: column ts: not float: 'x'"):
        assert needle in problems, needle


def test_missing_columns_are_reported(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("ts,adapter_id\n1,a\n")
    with pytest.raises(TraceError, match="missing columns: tenant_id, priority"):
        read_trace(p)


def trace(rows: list[TraceRow]) -> Trace:
    return parse_rows(csv.DictReader(io.StringIO("".join(format_rows(rows)))), "hand")


def test_accounting_and_ttft_on_a_hand_trace() -> None:
    # 1 slot, host bytes for 2 × 100 MB: a, b, a (WARM hit), c (b leaves WARM), b (cold start)
    rows = [row(0, "a"), row(100, "b"), row(200, "a"), row(300, "c"),
            row(400, "b", priority=Priority.SILVER)]
    cost = CostModel()
    r = simulate(trace(rows), make_policy("lru"), Capacities(1, 200 * MB), cost)
    assert (r.requests, r.gpu_hits, r.host_hits, r.compulsory_misses, r.cold_starts) == (
        5, 0, 1, 3, 1)
    assert r.cold_starts_by_priority == {"platinum": 0, "gold": 0, "silver": 1, "bronze": 0}
    assert r.cold_starts_by_class["interactive"] == 1 and r.cold_starts_canary == 0
    bw = cost.bandwidths
    prefill = 1000 * 0.05 / 1000 + 0.020
    warm = 100 * MB / bw.host_to_gpu_bytes_per_s + bw.register_s
    cold = bw.s3_latency_s + 100 * MB / bw.s3_bytes_per_s + 100 * MB / bw.verify_bytes_per_s
    # non-compulsory interactive requests: the WARM hit and the cold start
    assert r.ttft_ms["interactive"]["p50"] == pytest.approx((prefill + warm) * 1000, abs=1e-3)
    assert r.ttft_ms["interactive"]["p99"] == pytest.approx((prefill + warm + cold) * 1000,
                                                            abs=1e-3)
    assert r.loads == 5 and r.hot_evictions == 4 and r.warm_evictions == 2


def test_canary_cold_starts_are_counted_apart() -> None:
    rows = [row(0, "c", canary=True, request_class=RequestClass.CANARY), row(1, "x"),
            row(2, "y"), row(3, "z"), row(4, "c", canary=True, request_class=RequestClass.CANARY)]
    # 1 slot, host bytes for 3: z pushes the least recently used (the canary) out under LRU
    r = simulate(trace(rows), make_policy("lru"), Capacities(1, 300 * MB))
    assert r.cold_starts == 1 and r.cold_starts_canary == 1
    assert r.cold_starts_by_class == {"interactive": 0, "background": 0, "canary": 1}
    heat = simulate(trace(rows), make_policy("heat"), Capacities(1, 300 * MB))
    assert heat.cold_starts_canary == 0 and heat.host_hits == 1


def test_capacities_that_cannot_work_are_refused() -> None:
    with pytest.raises(ValueError, match="host bytes"):
        simulate(trace([row(0, "a")]), make_policy("lru"), Capacities(2, 250 * MB))
    with pytest.raises(ValueError, match="workers"):
        simulate(trace([row(0, "a")]), make_policy("lru"), Capacities(1, 10**12, 0))


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0 and percentile(values, 99) == 99.0
    assert percentile([], 99) == 0.0 and percentile([7.0], 1) == 7.0


def test_parse_bytes() -> None:
    assert parse_bytes("8GiB") == 8 * 2**30
    assert parse_bytes("500MB") == 500 * MB
    assert parse_bytes("1e9") == 10**9
    with pytest.raises(Exception, match="not a byte size"):
        parse_bytes("lots")


def test_cost_model_units_round_trip() -> None:
    cost = CostModel.from_units(s3_mb_per_s=100.0, register_ms=5.0)
    assert cost.bandwidths.s3_bytes_per_s == 100 * MB
    assert cost.as_dict()["register_ms"] == pytest.approx(5.0)
    assert CostModel.from_units().as_dict() == CostModel.measured().as_dict()
    assert CostModel().bandwidths == Bandwidths()
    with pytest.raises(ValueError):
        CostModel.from_units(s3_mb_per_s=0)


def test_sim_cli_json_shape(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    write_trace(path, [row(float(i), "abcde"[i % 5]) for i in range(50)])
    result = CliRunner().invoke(app, [
        "sim", "--trace", str(path), "--gpu-slots", "2", "--host-bytes", "1GB",
        "--policies", "heat,lru,fifo,lfu,belady", "--workers", "2", "--json",
        "--s3-mb-per-s", "400",
    ])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert [o["policy"] for o in out] == ["heat", "lru", "fifo", "lfu", "belady"]
    for o in out:
        for key in ("policy", "requests", "gpu_hit_ratio", "host_hit_ratio", "compulsory_misses",
                    "cold_starts", "cold_starts_by_priority", "cold_starts_canary", "ttft_ms",
                    "loads", "evictions", "sim_requests_per_s", "cost_model"):
            assert key in o, key
        assert o["requests"] == 50
        assert set(o["cold_starts_by_priority"]) == {"platinum", "gold", "silver", "bronze"}
        assert set(o["ttft_ms"]["interactive"]) >= {"p50", "p99"}
        assert o["cost_model"]["s3_mb_per_s"] == 400.0


def test_sim_cli_reports_bad_input(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["sim", "--trace", str(tmp_path / "none.csv"), "--gpu-slots",
                                 "2", "--host-bytes", "1GB"])
    assert result.exit_code == 2 and "error" in result.output
    result = runner.invoke(app, ["sim", "--trace", "x", "--gpu-slots", "2", "--host-bytes",
                                 "1GB", "--policies", "magic"])
    assert result.exit_code != 0 and "unknown policies" in result.output


def test_sim_cli_refuses_an_unusable_trace_naming_row_and_column(tmp_path: Path) -> None:
    """``loraplane sim`` on a trace it cannot use: exit 2, each problem with its line and column."""
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "ts,tenant_id,adapter_id,priority,request_class,rank,size_bytes,canary,prompt_tokens,"
        "output_tokens\n"
        "1,t,t/a@v1,gold,interactive,8,100,0,10,10\n"
        "2,t,t/a@v1,diamond,interactive,8,100,0,10,10\n"
    )
    result = CliRunner().invoke(app, ["sim", "--trace", str(bad), "--gpu-slots", "2",
                                      "--host-bytes", "1GB"])
    assert result.exit_code == 2
    assert "line 3" in result.output and "column priority: 'diamond'" in result.output


def test_two_level_hot_charges_an_activation_outside_the_gpu_slots() -> None:
    # 3 registered (gpu_slots) over 2 GPU slots (active_slots): a, b, c load (each activated),
    # then a (HOT, pushed out of its slot by c: activated), b (same), b again (in a slot)
    rows = [row(0, "a"), row(10, "b"), row(20, "c"), row(30, "a"), row(40, "b"), row(50, "b")]
    cost = CostModel.from_units(register_ms=20.0, activate_ms=4.0)
    one = simulate(trace(rows), make_policy("lru"), Capacities(3, 1000 * MB), cost)
    two = simulate(trace(rows), make_policy("lru"), Capacities(3, 1000 * MB, active_slots=2),
                   cost)
    assert one.gpu_hits == two.gpu_hits == 3 and one.loads == two.loads == 3
    assert one.extra["slot_activations"] == 0 and two.extra["slot_activations"] == 2
    bw = cost.bandwidths
    activation = bw.activate_s + 100 * MB / bw.host_to_gpu_bytes_per_s
    assert activation == pytest.approx(bw.activation_s(100 * MB))
    assert bw.warm_to_hot_s(100 * MB) == pytest.approx(bw.register_s + activation)
    prefill = 1000 * 0.05 / 1000 + 0.020
    assert one.ttft_ms["interactive"]["p99"] == pytest.approx(prefill * 1000, abs=1e-3)
    assert two.ttft_ms["interactive"]["p99"] == pytest.approx((prefill + activation) * 1000,
                                                              abs=1e-3)
    assert two.as_dict()["active_slots"] == 2
    with pytest.raises(ValueError, match="active slots"):
        simulate(trace(rows), make_policy("lru"), Capacities(2, 1000 * MB, active_slots=3))
