"""The gateway bench runs end to end at a tiny size, on the worker service (null engine) by
default and on the echo worker on request, and writes every required key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.gateway import main

REQUIRED = ("direct_p50_ms", "proxy_p50_ms", "gateway_p50_ms", "direct_p99_ms",
            "proxy_p99_ms", "gateway_p99_ms", "ratio_p50", "gateway_rps")


@pytest.mark.parametrize(("worker", "per_message"), [(None, 1), ("echo", 1), (None, 4)])
def test_bench_writes_the_required_figures(tmp_path: Path, worker: str | None,
                                           per_message: int) -> None:
    out = tmp_path / "gateway.json"
    choice = ["--worker", worker] if worker else []  # default: the worker service, null engine
    if per_message != 1:
        choice += ["--tokens-per-message", str(per_message)]
    assert main(["--rounds", "1", "--latency-requests", "40", "--latency-concurrency", "2",
                 "--throughput-requests", "80", "--throughput-concurrency", "8",
                 "--clients", "1", "--out", str(out), *choice]) == 0
    report = json.loads(out.read_text())
    # every path streams the same tokens in the same messages: 4 tokens, one per message
    # (the echo worker adds a first and a last message), or all 4 in one message
    expected_messages = 6 if worker == "echo" else 4 // per_message
    assert report["tokens_per_request"] == 4 and report["tokens_per_message"] == per_message
    assert report["messages_per_request"] == expected_messages
    for t in ("direct", "proxy", "gateway"):
        assert report[f"{t}_messages_per_request"] == expected_messages, t
        assert report[f"{t}_tokens_received_per_request"] == 4, t
        assert report[f"{t}_client_cpu_us_per_request"] > 0, t
        assert report[f"{t}_worker_cpu_us_per_request"] > 0, t
        assert report[f"{t}_main_thread_cpu_us_per_request"] > 0, t  # the event loop's part
    assert report["gateway_capacity_rps"] == round(
        1e6 / report["gateway_cpu_us_per_request"], 1)
    assert report["proxy_capacity_rps"] == round(1e6 / report["proxy_cpu_us_per_request"], 1)
    assert report["worker_kind"] == (worker or "null")
    assert report["worker"].startswith("worker service" if worker is None else "echo worker")
    for key in REQUIRED:
        assert isinstance(report[key], float | int) and report[key] > 0, key
    assert report["ratio_p50"] == round(report["gateway_p50_ms"] / report["proxy_p50_ms"], 3)
    assert report["gateway_errors"] == report["proxy_errors"] == report["direct_errors"] == 0
    if worker is None:  # TLS at the edge, beside the plaintext edge, both on the mTLS worker
        assert report["gateway_tls_errors"] == report["gateway_mtls_errors"] == 0
        assert report["gateway_tls_tokens_received_per_request"] == 4
        assert report["gateway_tls_client_cpu_us_per_request"] > 0
        assert report["edge_tls_ratio_p50"] == round(
            report["gateway_tls_p50_ms"] / report["gateway_mtls_p50_ms"], 3)
    assert report["gateway_cpu_us_per_request"] > 0
    # two gateway processes on one port: every request counted by one of them, both served
    per_process = report["gateway_x2_requests_per_process"]
    assert sum(per_process) == 40 + 80 and min(per_process) > 0, per_process
    assert report["gateway_x2_errors"] == 0
    assert report["gateway_x2_tokens_received_per_request"] == 4
    assert report["x2_cpu_ratio"] == round(
        report["gateway_x2_cpu_us_per_request"] / report["proxy_cpu_us_per_request"], 3)
    even = sum(per_process) / 2
    assert report["gateway_x2_spread_pct"] == round(
        max(abs(n - even) for n in per_process) / even * 100, 1)


def test_bench_refuses_chunks_on_the_echo_worker(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["--worker", "echo", "--tokens-per-message", "2", "--out", str(tmp_path / "x")])


async def test_null_engine_puts_tokens_per_chunk_together(tmp_path: Path) -> None:
    from loraplane.worker.engine import EngineAdapter, EngineLimits, EngineRequest, Sampling
    from loraplane.worker.null_engine import NullEngine

    limits = EngineLimits(max_loras=2, max_cpu_loras=4, max_lora_rank=16)

    async def chunks(per: int, n: int) -> list[tuple[tuple[int, ...], bool, str | None, str]]:
        engine = NullEngine(limits, tmp_path, tokens_per_chunk=per)
        req = EngineRequest(request_id="r", prompt="p", sampling=Sampling(max_tokens=n, temperature=0.0),
                            adapter=EngineAdapter(engine_id=7, name="a", path=tmp_path, rank=8))
        return [(c.token_ids, c.finished, c.finish_reason, c.text)
                async for c in engine.generate(req)]

    assert await chunks(1, 3) == [((7,), False, None, "t7 "), ((7,), False, None, "t7 "),
                                  ((7,), True, "length", "t7 ")]
    assert await chunks(3, 4) == [((7, 7, 7), False, None, "t7 t7 t7 "),
                                  ((7,), True, "length", "t7 ")]
    assert await chunks(4, 4) == [((7, 7, 7, 7), True, "length", "t7 t7 t7 t7 ")]
    with pytest.raises(ValueError):
        NullEngine(limits, tmp_path, tokens_per_chunk=0)
