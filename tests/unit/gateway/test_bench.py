"""The gateway bench runs end to end at a tiny size, on the worker service (null engine) by
default and on the echo worker on request, and writes every required key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loraplane.gateway.bench import main

REQUIRED = ("direct_p50_ms", "proxy_p50_ms", "gateway_p50_ms", "direct_p99_ms",
            "proxy_p99_ms", "gateway_p99_ms", "ratio_p50", "gateway_rps")


@pytest.mark.parametrize("worker", [None, "echo"])
def test_bench_writes_the_required_figures(tmp_path: Path, worker: str | None) -> None:
    out = tmp_path / "gateway.json"
    choice = ["--worker", worker] if worker else []  # default: the worker service, null engine
    assert main(["--rounds", "1", "--latency-requests", "40", "--latency-concurrency", "2",
                 "--throughput-requests", "80", "--throughput-concurrency", "8",
                 "--clients", "1", "--out", str(out), *choice]) == 0
    report = json.loads(out.read_text())
    assert report["worker_kind"] == (worker or "null")
    assert report["worker"].startswith("worker service" if worker is None else "echo worker")
    for key in REQUIRED:
        assert isinstance(report[key], float | int) and report[key] > 0, key
    assert report["ratio_p50"] == round(report["gateway_p50_ms"] / report["proxy_p50_ms"], 3)
    assert report["gateway_errors"] == report["proxy_errors"] == report["direct_errors"] == 0
    assert report["gateway_cpu_us_per_request"] > 0
