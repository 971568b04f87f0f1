"""Register → event published latency of the registry on a running stack.

``python -m benchmarks.registry [--count N] [--concurrency C] [--out FILE]``

Starts a registry process (``python -m loraplane.registry``: gRPC on a free port, its own
topic namespace so nothing else consumes the events), registers ``N`` versions through
the gRPC API from this process and measures, per version:

* ``rpc``: the RegisterVersion call (client side);
* ``register_to_ack``: RegisterVersion call start → broker ack of its ``AdapterReleased``
  (the outbox row's ``published_at``; same host clock);
* ``relay``: enqueue (inside the registering transaction) → broker ack, as the relay
  recorded in the outbox row (``published_at - created_at``);
* ``end_to_end``: RegisterVersion call start → the ``AdapterReleased`` record read back
  by a consumer of the topic (what admission would observe).

Connections come from ``LORAPLANE_*`` (the ``make run`` stack by default). Prints a
table and writes JSON (default ``.loraplane/bench/registry.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import grpc
from aiokafka import AIOKafkaConsumer, TopicPartition

from loraplane.shared.codec import decode_as
from loraplane.shared.kafka_admin import ensure_topics
from loraplane.shared.settings import CommonSettings
from loraplane.shared.topics import ADAPTER_RELEASES, TOPICS
from loraplane.v1 import events_pb2, registry_pb2, registry_pb2_grpc
from tests.support.registry import record

DEFAULT_OUT = Path(__file__).resolve().parents[1] / ".loraplane" / "bench" / "registry.json"


def percentiles(values: list[float]) -> dict[str, float]:
    """p50 / p95 / p99 / max / mean in milliseconds of values in seconds."""
    if not values:
        return {}
    ordered = sorted(values)

    def pct(p: float) -> float:
        index = min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))
        return ordered[index] * 1000

    return {"p50_ms": round(pct(50), 2), "p95_ms": round(pct(95), 2),
            "p99_ms": round(pct(99), 2), "max_ms": round(ordered[-1] * 1000, 2),
            "mean_ms": round(statistics.fmean(ordered) * 1000, 2), "n": len(ordered)}


async def _start_registry(env: dict[str, str]) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loraplane.registry", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    assert proc.stdout is not None
    async with asyncio.timeout(60):
        while True:
            line = await proc.stdout.readline()
            if not line:
                raise RuntimeError("the registry exited before it was ready")
            if line.startswith(b"registry ready"):
                break
    # Keep draining its output so the pipe never fills up.
    asyncio.get_running_loop().create_task(_drain(proc.stdout))
    return proc


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def run(count: int, concurrency: int, warmup: int) -> dict[str, Any]:
    """Run the benchmark against a registry process; returns the report."""
    ns = f"bench{uuid.uuid4().hex[:8]}."
    token = uuid.uuid4().hex + uuid.uuid4().hex
    port = _free_port()
    settings = CommonSettings()
    # plaintext, as the bench's channel: a shell that sourced demo.env carries the
    # operator's certificate (LORAPLANE_TLS_*), which would make this registry serve mTLS
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("LORAPLANE_TLS_")},
           "LORAPLANE_REGISTRY_GRPC_PORT": str(port),
           "LORAPLANE_REGISTRY_METRICS_PORT": "0", "LORAPLANE_REGISTRY_OPERATOR_TOKEN": token,
           "LORAPLANE_REGISTRY_TOPIC_PREFIX": ns,
           "LORAPLANE_REGISTRY_CONSUMER_GROUP": f"registry-{ns}",
           "LORAPLANE_INSTANCE_ID": "registry-bench"}
    await ensure_topics(settings.kafka(), [ADAPTER_RELEASES], prefix=ns)
    registry = await _start_registry(env)
    topic = ns + ADAPTER_RELEASES
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap,
                                enable_auto_commit=False, fetch_max_wait_ms=20)
    await consumer.start()
    consumer.assign([TopicPartition(topic, p)
                     for p in range(TOPICS[ADAPTER_RELEASES].partitions)])
    await consumer.seek_to_beginning()
    received: dict[str, float] = {}
    stop = asyncio.Event()

    async def read() -> None:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=100)
            now = time.perf_counter()
            for records in batch.values():
                for r in records:
                    ev = decode_as(events_pb2.AdapterReleased, r.value, r.headers)
                    received[ev.meta.adapter.version] = now

    reader = asyncio.create_task(read())
    md = (("authorization", f"Bearer {token}"), ("x-loraplane-actor", "bench"))
    started: dict[str, float] = {}
    wall: dict[str, float] = {}
    rpc: dict[str, float] = {}
    tenant = f"bench-{uuid.uuid4().hex[:8]}"
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = registry_pb2_grpc.RegistryAdminStub(channel)
            await stub.CreateTenant(registry_pb2.CreateTenantRequest(tenant_id=tenant),
                                    metadata=md)
            sem = asyncio.Semaphore(concurrency)

            async def register(i: int) -> None:
                version = f"v{i}"
                rec = record(tenant, f"a{i % 16}", version, settings.artifact_bucket,
                             seed=version)
                async with sem:
                    t0 = time.perf_counter()
                    started[version] = t0
                    wall[version] = time.time()
                    await stub.RegisterVersion(registry_pb2.RegisterVersionRequest(
                        version=rec), metadata=md)
                    rpc[version] = time.perf_counter() - t0

            total = warmup + count
            await asyncio.gather(*(register(i) for i in range(total)))
            deadline = time.monotonic() + 60
            while len(received) < total and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        conn = await asyncpg.connect(settings.postgres_dsn)
        try:
            rows = await conn.fetch(
                "SELECT extract(epoch FROM published_at - created_at)::float8 AS s FROM outbox "
                "WHERE topic = $1 AND published_at IS NOT NULL ORDER BY id", topic)
            acked: dict[str, float] = {}
            for row in await conn.fetch(
                    "SELECT payload, extract(epoch FROM published_at)::float8 AS acked "
                    "FROM outbox WHERE topic = $1 AND published_at IS NOT NULL", topic):
                ev = events_pb2.AdapterReleased.FromString(row["payload"])
                acked[ev.meta.adapter.version] = row["acked"]
        finally:
            await conn.close()
    finally:
        stop.set()
        await reader
        await consumer.stop()
        registry.send_signal(signal.SIGTERM)
        await asyncio.wait_for(registry.wait(), 30)
    measured = [f"v{i}" for i in range(warmup, warmup + count)]
    e2e = [received[v] - started[v] for v in measured if v in received]
    return {
        "count": count,
        "concurrency": concurrency,
        "warmup": warmup,
        "lost": sum(1 for v in measured if v not in received),
        "rpc": percentiles([rpc[v] for v in measured]),
        "register_to_ack": percentiles([acked[v] - wall[v] for v in measured if v in acked]),
        "relay_enqueue_to_ack": percentiles([r["s"] for r in rows[warmup:]]),
        "end_to_end_register_to_consumed": percentiles(e2e),
    }


def main() -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=300, help="versions measured")
    parser.add_argument("--concurrency", type=int, default=1, help="registrations in flight")
    parser.add_argument("--warmup", type=int, default=20, help="versions before measuring")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON report path")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    report = asyncio.run(run(args.count, args.concurrency, args.warmup))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"register → event published, {args.count} versions, concurrency "
          f"{args.concurrency} (lost: {report['lost']})")
    for name in ("rpc", "register_to_ack", "relay_enqueue_to_ack",
                 "end_to_end_register_to_consumed"):
        p = report[name]
        print(f"  {name:<34} p50 {p.get('p50_ms', 0):>7.2f} ms  p95 {p.get('p95_ms', 0):>7.2f}"
              f" ms  p99 {p.get('p99_ms', 0):>7.2f} ms  max {p.get('max_ms', 0):>7.2f} ms")
    print(f"  report: {args.out}")
    return 0 if report["lost"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
