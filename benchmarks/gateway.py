"""``python -m benchmarks.gateway`` (``make bench-gateway``): the gateway's overhead.

Three ways to reach the same worker, measured side by side in one run, in
interleaved rounds (direct, proxy, gateway, direct, …) so machine noise hits all
three alike:

* **direct**: the client calls ``WorkerInternal.Generate`` on the worker;
* **proxy**: a bare pass-through gRPC proxy (``Inference.Generate`` → one fixed
  ``WorkerInternal.Generate``, no auth, no resolution, no metrics);
* **gateway**: the real gateway process (auth, name check, resolution, budget
  decision, routing, metrics, heat), its views seeded with one tenant, one adapter
  HOT on the worker;
* **gateway_mtls** (``--worker null``): the same gateway and worker, each a process of
  its own again, with mutual TLS between them (the stack's dev CA, ``shared/tls.py``: the
  worker requires the gateway's client certificate and checks it against its table), so
  ``mtls_*`` ratios put TLS beside plaintext (latency and CPU per request of the gateway
  and of the worker);
* **gateway_tls** (``--worker null``): that mutual-TLS pair's worker behind a third
  gateway that also serves its tenant port over TLS (``LORAPLANE_GATEWAY_EDGE_TLS_*``: the
  dev CA's ``gateway`` certificate; the clients dial it with that CA), so ``edge_tls_*``
  ratios put the tenant → gateway TLS beside a plaintext edge (``gateway_mtls``: the same
  worker hop): latency, and CPU per request of the gateway and of the clients;
* **gateway_x2** (``--x2``, the default): two gateway processes serving one port
  (``LORAPLANE_GATEWAY_PROCESSES=2``: ``SO_REUSEPORT``, each its share of the flow caps),
  on the plaintext worker; its CPU per request is both processes' together, and the
  requests each process served (``gateway_x2_requests_per_process``, read from each one's
  ``/metrics`` over the measured rounds) give ``gateway_x2_spread_pct``, the largest
  deviation from an even share (target ±15 %). ``x2_cpu_ratio`` is its CPU per request
  over the bare proxy's (target ≤ 1.10, like ``cpu_ratio`` of one process),
  ``x2_vs_one_cpu_ratio`` / ``x2_vs_one_rps_ratio`` put it beside one process.

Each client opens ``--connections`` (64) connections to every target and its requests
take them in turn: the kernel spreads connections, not requests, between processes
sharing a port, so the balance of ``gateway_x2`` is that of ``clients × connections``
hashed connections.

Every component is its own process; the load comes from ``--clients`` client
processes with bounded concurrency. Two phases per round:

* *latency*: ``--latency-concurrency`` streams in flight (the p50 / p99 reported as
  ``<target>_p50_ms`` / ``_p99_ms``, and ``ratio_p50`` = gateway / proxy);
* *throughput*: ``--throughput-concurrency`` streams in flight (``<target>_rps``:
  completed streamed requests per second).

The worker (``--worker null``, the default) is the real worker service
(:class:`loraplane.worker.app.WorkerApp`: its ``WorkerInternal`` gRPC server, engine
guard, request path, metrics) on :class:`loraplane.worker.null_engine.NullEngine`
(fixed tokens, no model), Kafka off. Its adapter is a tiny signed LoRA the bench
writes into a temporary directory object store and loads HOT through the worker's own
command path (a ``LoadAdapter`` cache command: fetch, signature and digest checks,
registration); every request then carries that version's real engine id, digest and
rank. ``--worker echo`` swaps in the echo worker of
:mod:`tests.support.echo_worker` (a bare ``WorkerInternal`` server without the
worker service). The JSON's ``worker`` / ``worker_kind`` say which worker was used.

CPU: ``<target>_cpu_us_per_request`` is the measured process's (the worker for direct,
else the proxy or the gateway) during the throughput phase, beside the worker's and all
clients' in the same phase, and ``<target>_main_thread_cpu_us_per_request`` the part of it in
the process's main thread (the event loop: the proxy's or the gateway's Python; the
others are gRPC core's threads); ``gateway_capacity_rps`` / ``proxy_capacity_rps`` = 1e6 /
CPU µs per request (one process on one dedicated core), while ``gateway_rps`` is what the
shared machine delivered. ``--tokens-per-message`` (null engine chunk size) and
``--uvloop`` / ``--no-uvloop`` (default: uvloop, like the gateway process) apply to every
path alike; the messages and tokens each request received are
counted by the clients (``<target>_messages_per_request``).
Writes ``.loraplane/bench/gateway.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing as mp
import os
import platform
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc

from loraplane.v1 import (
    common_pb2,
    events_pb2,
    inference_pb2,
    inference_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)

TENANT = "bench"
ADAPTER = "bench-adapter"
VERSION = "v1"
ENGINE_ID = 7
RANK = 8
BASE_MODEL = "tiny"
WORKER_ID = "bench-worker"
API_KEY = "lp_bench_secret"
TARGETS = ("direct", "proxy", "gateway")
MTLS = "gateway_mtls"
"""The gateway → worker hop over mutual TLS (a second worker and gateway pair)."""
EDGE = "gateway_tls"
"""TLS at the edge too: a gateway on the mutual-TLS worker serving its tenants over TLS."""
X2 = "gateway_x2"
"""Two gateway processes sharing one port (SO_REUSEPORT), on the plaintext worker."""
WORKERS = ("null", "echo")
LATENCY_RATIO_TARGET = 1.2
CPU_RATIO_TARGET = 1.10
"""Gateway CPU per request over the bare proxy's (issue 18)."""
SPREAD_TARGET_PCT = 15.0
"""Largest deviation of one gateway_x2 process's requests from an even share (issue 18)."""
RPS_TARGET = 2000.0


@dataclass(frozen=True)
class ServeOptions:
    """How the server processes run (the same for worker, proxy and gateway)."""

    tokens_per_message: int = 1
    """Tokens the null engine puts in one chunk (one chunk = one streamed message)."""
    uvloop: bool = False
    """Run every server process's event loop on uvloop."""
    pki_dir: str = ""
    """The dev CA's directory (``stack/certs.py``) for the mutual-TLS pair."""
    processes: int = 1
    """Gateway processes sharing the port (``gateway_x2``: 2) and this one's index."""
    process_index: int = 0
    port: int = 0
    """The gateway's port (0: any free one; the second ``gateway_x2`` process: the first's)."""
    metrics_port: int = 0
    """The gateway's ``/metrics`` (0: none), scraped for its request count."""


@dataclass(frozen=True)
class Version:
    """The one adapter version every request targets, as the worker holds it."""

    engine_id: int = ENGINE_ID
    sha256: str = "0" * 64
    rank: int = RANK
    artifact_uri: str = "s3://bench/x/"
    size_bytes: int = 1000


def _ref() -> common_pb2.AdapterRef:
    return common_pb2.AdapterRef(tenant_id=TENANT, adapter_name=ADAPTER, version=VERSION,
                                 base_model=BASE_MODEL)


def _worker_request(
    params: inference_pb2.GenerateRequest, version: Version
) -> worker_pb2.WorkerGenerateRequest:
    return worker_pb2.WorkerGenerateRequest(
        request_id=uuid.uuid4().hex, adapter=_ref(), engine_id=version.engine_id,
        sha256=version.sha256, params=params, request_class=common_pb2.REQUEST_CLASS_INTERACTIVE,
        base_model=BASE_MODEL, rank=version.rank, artifact_uri=version.artifact_uri,
        size_bytes=version.size_bytes,
    )


# --------------------------------------------------------------------------- servers


def _serve(role: str, out: Any, worker_addr: str, worker_kind: str, workdir: str,
           version: Version, options: ServeOptions = ServeOptions()) -> None:
    """Process entry: run one server role, report ``(role, description, port, version)``
    on ``out`` (``(role, error, 0, None)`` when it could not start)."""
    try:
        if options.uvloop:
            import uvloop

            uvloop.install()
        asyncio.run(_serve_async(role, out, worker_addr, worker_kind, Path(workdir), version,
                                 options))
    except Exception as exc:
        out.put((role, f"{type(exc).__name__}: {exc}", 0, None))
        raise


async def _serve_async(role: str, out: Any, worker_addr: str, worker_kind: str,
                       workdir: Path, version: Version, options: ServeOptions) -> None:
    tls = _tls_settings(options.pki_dir, role)
    if role in ("worker", "worker_mtls"):
        if worker_kind == "null":
            desc, port, held, stop = await _start_null_worker(
                workdir / role, options.tokens_per_message, tls)
        else:
            desc, port, held, stop = await _start_echo_worker()
        out.put((role, desc, port, held))
        await asyncio.Event().wait()
        await stop()
    elif role == "proxy":
        server = grpc.aio.server(options=[("grpc.max_concurrent_streams", 1000)])
        inference_pb2_grpc.add_InferenceServicer_to_server(BareProxy(worker_addr, version),
                                                           server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        out.put((role, "bare pass-through proxy", port, version))
        await server.wait_for_termination()
    elif role in ("gateway", MTLS, EDGE) or role.startswith(X2):
        app = await _start_gateway(worker_addr, version, tls, options)
        from loraplane.gateway.__main__ import tune_collector

        tune_collector(app.settings)  # as python -m loraplane.gateway does after start
        out.put((role, "gateway", app.grpc_port, version))
        await asyncio.Event().wait()


Stop = Callable[[], Any]


def _tls_settings(pki_dir: str, role: str) -> dict[str, str]:
    """The TLS settings of a server role: the mutual-TLS pair's files, else explicitly
    none (plaintext even when the bench's shell sourced demo.env's LORAPLANE_TLS_*)."""
    identity = {"worker_mtls": "worker", MTLS: "gateway", EDGE: "gateway"}.get(role)
    if identity is None or not pki_dir:
        return {"tls_ca_file": "", "tls_cert_file": "", "tls_key_file": ""}
    d = Path(pki_dir)
    tls = {"tls_ca_file": str(d / "ca.pem"), "tls_cert_file": str(d / f"{identity}.pem"),
           "tls_key_file": str(d / f"{identity}.key")}
    if role == EDGE:  # its tenant port too, with the same certificate
        tls |= {"edge_tls_cert_file": str(d / "gateway.pem"),
                "edge_tls_key_file": str(d / "gateway.key")}
    return tls


async def _start_echo_worker() -> tuple[str, int, Version, Stop]:
    """``--worker echo``: the echo worker (fixed tokens; no worker service, no engine)."""
    from tests.support.echo_worker import EchoWorker, serve_echo_worker

    worker = EchoWorker(worker_id=WORKER_ID, base_models=(BASE_MODEL,), hot={ENGINE_ID},
                        record=False)
    server = await serve_echo_worker(worker)
    port = int(worker.address.rsplit(":", 1)[1])
    return "echo worker (fixed tokens; WorkerInternal without the worker service)", port, \
        Version(), lambda: server.stop(0)


class DirStore:
    """The object store over a local directory (``root/<bucket>/<key>``)."""

    def __init__(self, root: Path) -> None:
        """Objects live under ``root``."""
        self.root = root

    def list(self, bucket: str, prefix: str) -> list[Any]:
        """Every object whose key starts with ``prefix``."""
        from loraplane.shared.objectstore import ObjectInfo

        base = self.root / bucket
        return [ObjectInfo(p.relative_to(base).as_posix(), p.stat().st_size)
                for p in sorted(base.rglob("*"))
                if p.is_file() and p.relative_to(base).as_posix().startswith(prefix)]

    def stream(self, bucket: str, key: str) -> Iterator[bytes]:
        """The object's bytes."""
        from loraplane.shared.objectstore import ObjectMissing

        if not (self.root / bucket / key).is_file():
            raise ObjectMissing(f"no object {key}")
        return iter([(self.root / bucket / key).read_bytes()])


async def _start_null_worker(workdir: Path, tokens_per_message: int = 1,
                             tls: dict[str, str] | None = None
                             ) -> tuple[str, int, Version, Stop]:
    """``--worker null``: the worker service on its null engine, Kafka off, with the
    bench's adapter signed, put in a directory object store and loaded HOT by a
    ``LoadAdapter`` command through the worker's command executor."""
    from loraplane.devkit.keys import write_dev_keys
    from loraplane.shared.signing import sign_directory
    from loraplane.shared.topics import new_meta
    from loraplane.worker.app import WorkerApp
    from loraplane.worker.lora_files import LlamaDims, write_lora
    from loraplane.worker.null_engine import NullEngine
    from loraplane.worker.settings import WorkerSettings

    dims = LlamaDims(num_layers=2, hidden=32, heads=4, kv_heads=2, head_dim=8, intermediate=64)
    base = workdir / "base"
    base.mkdir(parents=True)
    (base / "config.json").write_text(json.dumps({
        "num_hidden_layers": dims.num_layers, "hidden_size": dims.hidden,
        "num_attention_heads": dims.heads, "num_key_value_heads": dims.kv_heads,
        "head_dim": dims.head_dim, "intermediate_size": dims.intermediate}))
    keys = write_dev_keys(workdir / "keys", seed=1, label="bench")
    settings = WorkerSettings(
        worker_id=WORKER_ID, worker_grpc_port=0, worker_metrics_port=0, base_model=BASE_MODEL,
        base_model_dir=base, trusted_keys=str(keys.public_key), worker_host_dir=workdir / "host",
        **(tls or {}),
    )
    src = workdir / "src"
    write_lora(src, dims, base_model=BASE_MODEL, rank=RANK, modules=("q_proj", "v_proj"))
    signed = sign_directory(src, keys.private_key)
    key = (f"{settings.artifact_prefix}/{TENANT}/{ADAPTER}/{VERSION}/"
           f"{signed.manifest_digest[:16]}/")
    shutil.copytree(src, workdir / "s3" / settings.artifact_bucket / key)
    version = Version(engine_id=ENGINE_ID, sha256=signed.manifest_digest, rank=RANK,
                      artifact_uri=f"s3://{settings.artifact_bucket}/{key}",
                      size_bytes=signed.size_bytes)

    engine = NullEngine(settings.limits, base, token_delay_s=0.0,
                        tokens_per_chunk=tokens_per_message)
    app = WorkerApp(settings, engine, store=DirStore(workdir / "s3"), kafka=False)
    await app.start()
    cmd = events_pb2.CacheCommand(
        meta=new_meta("bench/gateway", _ref()), command_id=uuid.uuid4().hex, worker_id=WORKER_ID,
        load=events_pb2.LoadAdapter(
            target_tier=common_pb2.TIER_HOT, engine_id=version.engine_id,
            artifact_uri=version.artifact_uri, sha256=version.sha256,
            size_bytes=version.size_bytes, rank=version.rank))
    report = await app.executor.execute(cmd)
    if report is None or report.WhichOneof("report") != "loaded" \
            or report.loaded.tier != common_pb2.TIER_HOT:
        await app.stop(0)
        raise RuntimeError(f"the worker did not load the bench adapter HOT: {report}")
    port = int(app.grpc_address.rsplit(":", 1)[1])
    return ("worker service on the null engine (WorkerApp + NullEngine, Kafka off; "
            "adapter loaded HOT by a LoadAdapter command)"), port, version, \
        lambda: app.stop(0)


class BareProxy(inference_pb2_grpc.InferenceServicer):
    """Pass-through: every ``Inference.Generate`` becomes one ``WorkerInternal.Generate``."""

    def __init__(self, worker_addr: str, version: Version) -> None:
        self.channel = grpc.aio.insecure_channel(worker_addr)
        self.stub = worker_pb2_grpc.WorkerInternalStub(self.channel)
        self.version = version

    async def Generate(
        self, request: inference_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        call = self.stub.Generate(_worker_request(request, self.version),
                                  timeout=context.time_remaining())
        async for msg in call:
            yield msg


async def _start_gateway(worker_addr: str, version: Version,
                         tls: dict[str, str] | None = None,
                         options: ServeOptions = ServeOptions()) -> Any:
    from loraplane.gateway.app import GatewayApp
    from loraplane.gateway.auth import key_hash
    from loraplane.gateway.catalog import VersionInfo
    from loraplane.gateway.settings import GatewaySettings

    class NullPublisher:
        async def publish(self, topic: str, msg: Any) -> None:
            return None

    from loraplane.gateway.flow import FlowConfig

    settings = GatewaySettings(
        grpc_port=options.port, http_port=0, metrics_port=options.metrics_port,
        bootstrap=False, consume_events=False, instance_id=f"bench-{options.process_index}",
        processes=options.processes, process_index=options.process_index,  # x2: shared port
        # the request path's own cost, at a concurrency above one tenant's default quota
        # and the admission limit per worker (flow control is make bench-isolation's):
        # quotas counted but unlimited, admission without a limit
        default_max_in_flight=0, flow=FlowConfig(max_in_flight_per_worker=0),
        **(tls or {}),  # the mutual-TLS pair: the gateway's certificate towards its worker
    )
    app = GatewayApp(settings, publisher=NullPublisher(),
                     serve_metrics=bool(options.metrics_port))
    g = app.gateway
    g.auth.add_key(TENANT, "bench-key", key_hash(API_KEY))
    g.catalog.upsert_version(VersionInfo(TENANT, ADAPTER, VERSION, BASE_MODEL,
                                         version.engine_id, version.sha256, version.rank,
                                         version.artifact_uri, version.size_bytes))
    g.catalog.set_release(TENANT, ADAPTER, stable=VERSION, base_model=BASE_MODEL, at=1.0)
    state = events_pb2.WorkerState(worker_id=WORKER_ID, base_models=[BASE_MODEL],
                                   grpc_address=worker_addr, seq=1, ready=True)
    state.placements.add(engine_id=version.engine_id, tier=common_pb2.TIER_HOT)
    g.placement.apply_state(state, time.time() + 1e6)  # never stale during the bench
    await app.start()
    return app


# --------------------------------------------------------------------------- clients


@dataclass
class PhaseResult:
    """What one client process measured."""

    latencies_ms: list[float] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)
    errors: int = 0
    elapsed_s: float = 0.0
    messages: int = 0
    """Streamed messages received by completed requests."""
    tokens: int = 0
    """Tokens received by completed requests."""


def _client(conn: Connection, addrs: dict[str, str], version: Version,
            connections: int = 1, ca_file: str = "") -> None:
    """Process entry: run phases on command until told to stop (``ca_file``: what the
    clients trust on the ``gateway_tls`` target)."""
    asyncio.run(_client_async(conn, addrs, version, connections, ca_file))


async def _load(
    target: str,
    n: int,
    concurrency: int,
    tokens: int,
    worker: list[worker_pb2_grpc.WorkerInternalStub],
    stubs: dict[str, list[inference_pb2_grpc.InferenceStub]],
    version: Version,
) -> PhaseResult:
    """``n`` streamed requests to ``target`` with ``concurrency`` in flight, taking the
    target's connections in turn (request ``k`` on connection ``k % connections``)."""
    auth = (("authorization", f"Bearer {API_KEY}"),)
    params = inference_pb2.GenerateRequest(adapter=ADAPTER, prompt="bench prompt",
                                           max_tokens=tokens)
    result = PhaseResult()
    remaining = [n]

    turn = itertools.count()

    async def one() -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            j = next(turn)
            t0 = time.perf_counter()
            first = 0.0
            messages = tokens_seen = 0
            try:
                if target == "direct":
                    call = worker[j % len(worker)].Generate(_worker_request(params, version),
                                                            timeout=30)
                else:
                    pool = stubs[target]
                    call = pool[j % len(pool)].Generate(params, metadata=auth, timeout=30)
                async for msg in call:
                    if not first:
                        first = time.perf_counter()
                    messages += 1
                    tokens_seen += len(msg.token_ids)
            except grpc.aio.AioRpcError:
                result.errors += 1
                continue
            end = time.perf_counter()
            result.messages += messages
            result.tokens += tokens_seen
            result.latencies_ms.append((end - t0) * 1000)
            result.ttft_ms.append((first - t0) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(concurrency)))
    result.elapsed_s = time.perf_counter() - started
    return result


async def _client_async(conn: Connection, addrs: dict[str, str], version: Version,
                        connections: int = 1, ca_file: str = "") -> None:
    # ``connections`` channels per target, each its own TCP connection (a local subchannel
    # pool: channels to one address would share one otherwise); SO_REUSEPORT spreads
    # connections, not requests, between the gateway_x2 processes
    opts = [("grpc.use_local_subchannel_pool", 1)]

    def channel(target: str, addr: str) -> grpc.aio.Channel:
        if target != EDGE:
            return grpc.aio.insecure_channel(addr, options=opts)
        creds = grpc.ssl_channel_credentials(Path(ca_file).read_bytes())
        return grpc.aio.secure_channel(addr, creds, options=[
            *opts, ("grpc.ssl_target_name_override", "gateway")])

    channels = {t: [channel(t, a) for _ in range(connections)] for t, a in addrs.items()}
    worker = [worker_pb2_grpc.WorkerInternalStub(ch) for ch in channels["direct"]]
    stubs = {t: [inference_pb2_grpc.InferenceStub(ch) for ch in channels[t]]
             for t in addrs if t != "direct"}
    loop = asyncio.get_running_loop()
    while True:
        cmd = await loop.run_in_executor(None, conn.recv)
        if cmd is None:
            break
        target, n, concurrency, tokens = cmd
        result = await _load(target, n, concurrency, tokens, worker, stubs, version)
        conn.send(result)
    for pool in channels.values():
        for ch in pool:
            await ch.close()


# --------------------------------------------------------------------------- orchestration


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _stat_cpu_seconds(path: str) -> float:
    """User + system CPU time in a ``/proc`` ``stat`` file (0 when it cannot be read)."""
    try:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux ``/proc``; 0 elsewhere)."""
    return _stat_cpu_seconds(f"/proc/{pid}/stat")


def main_thread_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process's main thread so far (its event loop: the
    servers' Python runs there, gRPC core's own threads are the others)."""
    return _stat_cpu_seconds(f"/proc/{pid}/task/{pid}/stat")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _served(metrics_port: int) -> int:
    """Requests a gateway process's /metrics counts (``loraplane_gateway_requests_total``,
    every outcome)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return int(sum(s.value for fam in text_string_to_metric_families(text)
                   for s in fam.samples if s.name == "loraplane_gateway_requests_total"))


def spread_pct(counts: list[int]) -> float:
    """Largest deviation of one process's count from the even share, in % of that share."""
    even = sum(counts) / max(1, len(counts))
    return round(max(abs(n - even) for n in counts) / even * 100, 1) if even else float("nan")


def run_phase(clients: list[Connection], target: str, n: int, concurrency: int,
              tokens: int) -> PhaseResult:
    """Run one phase on every client at once; merge the results."""
    per = max(1, n // len(clients))
    conc = max(1, concurrency // len(clients))
    started = time.perf_counter()
    for c in clients:
        c.send((target, per, conc, tokens))
    parts: list[PhaseResult] = [c.recv() for c in clients]
    merged = PhaseResult(elapsed_s=time.perf_counter() - started)
    for p in parts:
        merged.latencies_ms += p.latencies_ms
        merged.ttft_ms += p.ttft_ms
        merged.errors += p.errors
        merged.messages += p.messages
        merged.tokens += p.tokens
    return merged


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table; write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--latency-requests", type=int, default=500)
    ap.add_argument("--latency-concurrency", type=int, default=4)
    ap.add_argument("--throughput-requests", type=int, default=2000)
    ap.add_argument("--throughput-concurrency", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=4, help="tokens streamed per request")
    ap.add_argument("--tokens-per-message", type=int, default=1,
                    help="tokens per streamed message (the null engine's chunk size, as vLLM "
                         "merges deltas produced faster than they are read); all paths alike")
    ap.add_argument("--uvloop", action=argparse.BooleanOptionalAction, default=True,
                    help="run every server process (worker, proxy, gateway) on uvloop, as the "
                         "gateway runs by default (default: %(default)s)")
    ap.add_argument("--clients", type=int, default=2, help="load generator processes")
    ap.add_argument("--connections", type=int, default=64,
                    help="connections each client opens to every target (requests take them "
                         "in turn); the kernel spreads connections, not requests, between "
                         "the two gateway_x2 processes, so the spread is that of --clients x "
                         "--connections hashed connections (default: %(default)s)")
    ap.add_argument("--x2", action=argparse.BooleanOptionalAction, default=True,
                    help="also measure two gateway processes sharing one port (gateway_x2; "
                         "default: %(default)s)")
    ap.add_argument("--worker", choices=WORKERS, default="null",
                    help="null: the worker service on its null engine; echo: the echo worker")
    ap.add_argument("--out", type=Path, default=Path(".loraplane/bench/gateway.json"))
    args = ap.parse_args(argv)
    if args.tokens_per_message < 1:
        ap.error("--tokens-per-message must be >= 1")
    if args.connections < 1:
        ap.error("--connections must be >= 1")
    if args.tokens_per_message != 1 and args.worker != "null":
        ap.error("--tokens-per-message needs --worker null (the echo worker sends one token "
                 "per message)")
    ctx = mp.get_context("spawn")
    procs: list[Any] = []
    workdir = tempfile.mkdtemp(prefix="loraplane-bench-gateway-")
    targets = (*TARGETS, MTLS, EDGE) if args.worker == "null" else TARGETS
    if args.x2:
        targets = (*targets, X2)
    pki = ""
    if MTLS in targets:
        from loraplane.stack.certs import ensure_dev_pki

        pki = str(Path(workdir) / "pki")
        ensure_dev_pki(Path(pki))
    options = ServeOptions(tokens_per_message=args.tokens_per_message, uvloop=args.uvloop,
                           pki_dir=pki)
    try:
        q = ctx.Queue()

        def start(role: str, worker_addr: str, version: Version,
                  opts: ServeOptions = options) -> tuple[str, int, Version]:
            p = ctx.Process(target=_serve, daemon=True,
                            args=(role, q, worker_addr, args.worker, workdir, version,
                                  opts))
            p.start()
            procs.append(p)
            name, desc, port, held = q.get(timeout=120)
            if held is None:
                raise SystemExit(f"bench {name} did not start: {desc}")
            assert p.pid is not None
            pids["direct" if role == "worker" else role] = p.pid
            return desc, port, held

        pids: dict[str, int] = {}
        worker_kind, worker_port, version = start("worker", "", Version())
        worker_addr = f"127.0.0.1:{worker_port}"
        ports = {role: start(role, worker_addr, version)[1] for role in ("proxy", "gateway")}
        addrs = {"direct": worker_addr, **{k: f"127.0.0.1:{v}" for k, v in ports.items()}}
        if MTLS in targets:
            _, mtls_worker_port, mtls_version = start("worker_mtls", "", Version())
            mtls_port = start(MTLS, f"127.0.0.1:{mtls_worker_port}", mtls_version)[1]
            addrs[MTLS] = f"127.0.0.1:{mtls_port}"
            edge_port = start(EDGE, f"127.0.0.1:{mtls_worker_port}", mtls_version)[1]
            addrs[EDGE] = f"127.0.0.1:{edge_port}"
        x2_metrics: list[int] = []
        if X2 in targets:  # two gateway processes on one port, the same plaintext worker
            x2_port = 0
            for i in range(2):
                x2_metrics.append(_free_port())
                got = start(f"{X2}_{i}", worker_addr, version, replace(
                    options, processes=2, process_index=i, port=x2_port,
                    metrics_port=x2_metrics[i]))[1]
                x2_port = x2_port or got
            addrs[X2] = f"127.0.0.1:{x2_port}"
        measured = {t: [pids[f"{X2}_0"], pids[f"{X2}_1"]] if t == X2 else [pids[t]]
                    for t in targets}
        worker_pid = {t: pids["worker_mtls" if t in (MTLS, EDGE) else "direct"]
                      for t in targets}
        clients: list[Connection] = []
        client_pids: list[int] = []
        for _ in range(args.clients):
            parent, child = ctx.Pipe()
            ca = str(Path(pki) / "ca.pem") if pki else ""
            p = ctx.Process(target=_client,
                            args=(child, addrs, version, args.connections, ca), daemon=True)
            p.start()
            procs.append(p)
            clients.append(parent)
            assert p.pid is not None
            client_pids.append(p.pid)

        for t in targets:  # warm up connections and code paths
            run_phase(clients, t, 400, args.throughput_concurrency, args.tokens)
        lat: dict[str, PhaseResult] = {t: PhaseResult() for t in targets}
        tput: dict[str, list[float]] = {t: [] for t in targets}
        tput_lat: dict[str, PhaseResult] = {t: PhaseResult() for t in targets}
        cpu: dict[str, list[float]] = {t: [] for t in targets}
        main_cpu: dict[str, list[float]] = {t: [] for t in targets}
        client_cpu: dict[str, list[float]] = {t: [] for t in targets}
        worker_cpu: dict[str, list[float]] = {t: [] for t in targets}
        messages: dict[str, list[int]] = {t: [0, 0, 0] for t in targets}  # msgs, tokens, reqs
        x2_before = [_served(port) for port in x2_metrics]
        for _ in range(args.rounds):
            for t in targets:
                r = run_phase(clients, t, args.latency_requests, args.latency_concurrency,
                              args.tokens)
                lat[t].latencies_ms += r.latencies_ms
                lat[t].ttft_ms += r.ttft_ms
                lat[t].errors += r.errors
            for t in targets:
                before = sum(cpu_seconds(pid) for pid in measured[t])
                before_main = sum(main_thread_cpu_seconds(pid) for pid in measured[t])
                before_worker = cpu_seconds(worker_pid[t])
                before_clients = sum(cpu_seconds(c) for c in client_pids)
                r = run_phase(clients, t, args.throughput_requests, args.throughput_concurrency,
                              args.tokens)
                used = sum(cpu_seconds(pid) for pid in measured[t]) - before
                done = max(1, len(r.latencies_ms))
                tput[t].append(len(r.latencies_ms) / r.elapsed_s)
                cpu[t].append(used * 1e6 / done)
                main_cpu[t].append((sum(main_thread_cpu_seconds(pid) for pid in measured[t])
                                    - before_main) * 1e6 / done)
                worker_cpu[t].append((cpu_seconds(worker_pid[t]) - before_worker) * 1e6 / done)
                client_cpu[t].append(
                    (sum(cpu_seconds(c) for c in client_pids) - before_clients) * 1e6 / done)
                counts = messages[t]
                counts[0] += r.messages
                counts[1] += r.tokens
                counts[2] += len(r.latencies_ms)
                tput_lat[t].latencies_ms += r.latencies_ms
                tput_lat[t].errors += r.errors
        x2_counts = [_served(port) - b for port, b in zip(x2_metrics, x2_before, strict=True)]
        for c in clients:
            c.send(None)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(5)
        shutil.rmtree(workdir, ignore_errors=True)

    report: dict[str, Any] = {
        "worker": worker_kind,
        "worker_kind": args.worker,
        "tokens_per_request": args.tokens,
        "tokens_per_message": args.tokens_per_message,
        "event_loop": "uvloop" if args.uvloop else "asyncio",
        "latency_concurrency": args.latency_concurrency,
        "throughput_concurrency": args.throughput_concurrency,
        "rounds": args.rounds,
        "clients": args.clients,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
    }
    for t in targets:
        report[f"{t}_p50_ms"] = round(_pct(lat[t].latencies_ms, 0.50), 3)
        report[f"{t}_p99_ms"] = round(_pct(lat[t].latencies_ms, 0.99), 3)
        report[f"{t}_ttft_p50_ms"] = round(_pct(lat[t].ttft_ms, 0.50), 3)
        report[f"{t}_rps"] = round(statistics.median(tput[t]), 1)
        report[f"{t}_loaded_p50_ms"] = round(_pct(tput_lat[t].latencies_ms, 0.50), 3)
        report[f"{t}_loaded_p99_ms"] = round(_pct(tput_lat[t].latencies_ms, 0.99), 3)
        report[f"{t}_errors"] = lat[t].errors + tput_lat[t].errors
        report[f"{t}_cpu_us_per_request"] = round(statistics.median(cpu[t]), 1)
        report[f"{t}_main_thread_cpu_us_per_request"] = round(statistics.median(main_cpu[t]), 1)
        report[f"{t}_worker_cpu_us_per_request"] = round(statistics.median(worker_cpu[t]), 1)
        report[f"{t}_client_cpu_us_per_request"] = round(statistics.median(client_cpu[t]), 1)
        msgs, toks, reqs = messages[t]
        report[f"{t}_messages_per_request"] = round(msgs / max(1, reqs), 3)
        report[f"{t}_tokens_received_per_request"] = round(toks / max(1, reqs), 3)
    # what the client received through the gateway (the same on every path unless broken)
    report["messages_per_request"] = report["gateway_messages_per_request"]
    report["ratio_p50"] = round(report["gateway_p50_ms"] / report["proxy_p50_ms"], 3)
    report["ratio_p99"] = round(report["gateway_p99_ms"] / report["proxy_p99_ms"], 3)
    report["ratio_loaded_p50"] = round(
        report["gateway_loaded_p50_ms"] / report["proxy_loaded_p50_ms"], 3)
    report["cpu_ratio"] = round(
        report["gateway_cpu_us_per_request"] / report["proxy_cpu_us_per_request"], 3)
    # Capacity of one process on one dedicated core: 1e6 / its CPU µs per request. The
    # measured <target>_rps is bounded by the whole machine (clients, worker and the server
    # share its cores); the capacity is what the process itself costs.
    for t in ("proxy", "gateway"):
        report[f"{t}_capacity_rps"] = round(1e6 / report[f"{t}_cpu_us_per_request"], 1)
    report["gateway_rps_per_core"] = report["gateway_capacity_rps"]  # older name, same figure
    if MTLS in targets:  # mutual TLS on the gateway → worker hop beside plaintext
        report["mtls_ratio_p50"] = round(report[f"{MTLS}_p50_ms"] / report["gateway_p50_ms"], 3)
        report["mtls_ratio_p99"] = round(report[f"{MTLS}_p99_ms"] / report["gateway_p99_ms"], 3)
        report["mtls_ratio_loaded_p50"] = round(
            report[f"{MTLS}_loaded_p50_ms"] / report["gateway_loaded_p50_ms"], 3)
        report["mtls_gateway_cpu_ratio"] = round(
            report[f"{MTLS}_cpu_us_per_request"] / report["gateway_cpu_us_per_request"], 3)
        report["mtls_worker_cpu_ratio"] = round(
            report[f"{MTLS}_worker_cpu_us_per_request"]
            / report["gateway_worker_cpu_us_per_request"], 3)
    if EDGE in targets:  # TLS at the tenant → gateway edge beside a plaintext edge
        report["edge_tls_ratio_p50"] = round(
            report[f"{EDGE}_p50_ms"] / report[f"{MTLS}_p50_ms"], 3)
        report["edge_tls_ratio_p99"] = round(
            report[f"{EDGE}_p99_ms"] / report[f"{MTLS}_p99_ms"], 3)
        report["edge_tls_ratio_loaded_p50"] = round(
            report[f"{EDGE}_loaded_p50_ms"] / report[f"{MTLS}_loaded_p50_ms"], 3)
        report["edge_tls_gateway_cpu_ratio"] = round(
            report[f"{EDGE}_cpu_us_per_request"] / report[f"{MTLS}_cpu_us_per_request"], 3)
        report["edge_tls_client_cpu_ratio"] = round(
            report[f"{EDGE}_client_cpu_us_per_request"]
            / report[f"{MTLS}_client_cpu_us_per_request"], 3)
        report["all_tls_ratio_p50"] = round(
            report[f"{EDGE}_p50_ms"] / report["gateway_p50_ms"], 3)
        report["all_tls_gateway_cpu_ratio"] = round(
            report[f"{EDGE}_cpu_us_per_request"] / report["gateway_cpu_us_per_request"], 3)
    if X2 in targets:  # two processes on one port beside one process
        report[f"{X2}_capacity_rps"] = round(1e6 / report[f"{X2}_cpu_us_per_request"], 1)
        report[f"{X2}_requests_per_process"] = x2_counts
        report[f"{X2}_spread_pct"] = spread_pct(x2_counts)
        report["x2_cpu_ratio"] = round(
            report[f"{X2}_cpu_us_per_request"] / report["proxy_cpu_us_per_request"], 3)
        report["x2_vs_one_cpu_ratio"] = round(
            report[f"{X2}_cpu_us_per_request"] / report["gateway_cpu_us_per_request"], 3)
        report["x2_vs_one_rps_ratio"] = round(report[f"{X2}_rps"] / report["gateway_rps"], 3)
        report["x2_spread_target_pct"] = SPREAD_TARGET_PCT
    report["cpu_ratio_target"] = CPU_RATIO_TARGET
    report["ratio_p50_target"] = LATENCY_RATIO_TARGET
    report["gateway_rps_target"] = RPS_TARGET

    print(f"gateway bench — worker: {worker_kind}; {args.tokens} tokens/request in "
          f"{report['messages_per_request']:g} messages; event loop {report['event_loop']}; "
          f"{args.clients} client processes; {os.cpu_count()} CPUs")
    print(f"{'':13}{'p50 ms':>10}{'p99 ms':>10}{'ttft p50':>10}"
          f"{'rps':>10}{'loaded p50':>12}{'loaded p99':>12}{'cpu us/req':>12}"
          f"{'worker us':>11}{'client us':>11}")
    for t in targets:
        print(f"{t:13}{report[f'{t}_p50_ms']:>10.3f}{report[f'{t}_p99_ms']:>10.3f}"
              f"{report[f'{t}_ttft_p50_ms']:>10.3f}{report[f'{t}_rps']:>10.1f}"
              f"{report[f'{t}_loaded_p50_ms']:>12.3f}{report[f'{t}_loaded_p99_ms']:>12.3f}"
              f"{report[f'{t}_cpu_us_per_request']:>12.1f}"
              f"{report[f'{t}_worker_cpu_us_per_request']:>11.1f}"
              f"{report[f'{t}_client_cpu_us_per_request']:>11.1f}")
    print("(cpu us/req: the measured process — the worker for direct, the proxy or the "
          "gateway otherwise; worker us / client us: the worker and all client processes "
          "during the same phase)")
    ok_ratio = report["ratio_p50"] <= LATENCY_RATIO_TARGET
    ok_rps = report["gateway_rps"] >= RPS_TARGET
    print(f"gateway/proxy latency ratio p50 {report['ratio_p50']:.3f} "
          f"(target <= {LATENCY_RATIO_TARGET}: {'met' if ok_ratio else 'NOT met'}); "
          f"p99 {report['ratio_p99']:.3f}; at load p50 {report['ratio_loaded_p50']:.3f}")
    print(f"CPU per request: gateway/proxy {report['cpu_ratio']:.3f}; capacity of one "
          f"process on a dedicated core: gateway ~{report['gateway_capacity_rps']:.0f} "
          f"requests/s, bare proxy ~{report['proxy_capacity_rps']:.0f}")
    print(f"gateway streamed requests/s {report['gateway_rps']:.0f} measured with clients, "
          f"worker and gateway sharing {os.cpu_count()} CPUs "
          f"(target >= {RPS_TARGET:.0f} on one gateway process: "
          f"{'met' if ok_rps else 'NOT met'}; gateway capacity "
          f"{report['gateway_capacity_rps']:.0f}: "
          f"{'met' if report['gateway_capacity_rps'] >= RPS_TARGET else 'NOT met'})")
    if MTLS in targets:
        print(f"mutual TLS gateway → worker / plaintext: latency p50 {report['mtls_ratio_p50']:.3f}, "
              f"p99 {report['mtls_ratio_p99']:.3f}, at load p50 "
              f"{report['mtls_ratio_loaded_p50']:.3f}; CPU per request gateway "
              f"{report['mtls_gateway_cpu_ratio']:.3f}, worker {report['mtls_worker_cpu_ratio']:.3f}")
    if EDGE in targets:
        print(f"TLS tenant → gateway / plaintext edge (both on the mutual-TLS worker): latency "
              f"p50 {report['edge_tls_ratio_p50']:.3f}, p99 {report['edge_tls_ratio_p99']:.3f}, "
              f"at load p50 {report['edge_tls_ratio_loaded_p50']:.3f}; CPU per request "
              f"gateway {report['edge_tls_gateway_cpu_ratio']:.3f}, clients "
              f"{report['edge_tls_client_cpu_ratio']:.3f}; TLS on both hops / none: latency "
              f"p50 {report['all_tls_ratio_p50']:.3f}, gateway CPU "
              f"{report['all_tls_gateway_cpu_ratio']:.3f}")
    extra = {k: report[f"gateway_{k}"] - report[f"proxy_{k}"]
             for k in ("cpu_us_per_request", "main_thread_cpu_us_per_request")}
    print(f"CPU per request by thread: main thread (the event loop, where the Python runs) "
          f"proxy {report['proxy_main_thread_cpu_us_per_request']:.0f} us, gateway "
          f"{report['gateway_main_thread_cpu_us_per_request']:.0f} us; gRPC core's threads "
          f"proxy {report['proxy_cpu_us_per_request'] - report['proxy_main_thread_cpu_us_per_request']:.0f}"
          f" us, gateway {report['gateway_cpu_us_per_request'] - report['gateway_main_thread_cpu_us_per_request']:.0f}"
          f" us: {extra['main_thread_cpu_us_per_request']:.0f} of the gateway's "
          f"{extra['cpu_us_per_request']:.0f} us over the proxy are in the main thread")
    print(f"CPU per request / bare proxy's: one gateway process {report['cpu_ratio']:.3f} "
          f"(target <= {CPU_RATIO_TARGET}: "
          f"{'met' if report['cpu_ratio'] <= CPU_RATIO_TARGET else 'NOT met'})")
    if X2 in targets:
        spread = report[f"{X2}_spread_pct"]
        print(f"two gateway processes on one port (SO_REUSEPORT, {args.clients} x "
              f"{args.connections} connections): CPU per request (both processes) "
              f"{report[f'{X2}_cpu_us_per_request']:.0f} us = {report['x2_cpu_ratio']:.3f} x "
              f"the bare proxy's, {report['x2_vs_one_cpu_ratio']:.3f} x one process's "
              f"(target <= {CPU_RATIO_TARGET} x proxy: "
              f"{'met' if report['x2_cpu_ratio'] <= CPU_RATIO_TARGET else 'NOT met'}); "
              f"requests/s {report[f'{X2}_rps']:.0f} = {report['x2_vs_one_rps_ratio']:.3f} x "
              f"one process's on this machine; requests per process "
              f"{' / '.join(str(n) for n in x2_counts)}, spread +-{spread:.1f} % "
              f"(target +-{SPREAD_TARGET_PCT:g} %: "
              f"{'met' if spread <= SPREAD_TARGET_PCT else 'NOT met'})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
