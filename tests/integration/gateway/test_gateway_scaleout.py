"""Two ``python -m loraplane.gateway`` processes on one host serve the same public gRPC and
HTTP ports (``SO_REUSEPORT``), each with its own ``/metrics`` and instance id, fed by the
test stack's Kafka, routing to an echo worker: new connections are spread between them
(counted per process from their metrics), each publishes heat under its own id, and after
a SIGKILL of one the other serves every request alone; a restarted one joins the port
only once its views replayed (no request answered ``keys_loading`` meanwhile)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
from prometheus_client.parser import text_string_to_metric_families

from loraplane.gateway.auth import key_hash
from loraplane.shared import topics
from loraplane.shared.tls import GATEWAY
from loraplane.stack.stack import Stack
from loraplane.v1 import inference_pb2, inference_pb2_grpc
from tests.support.echo_worker import EchoWorker, serve_echo_worker
from tests.support.tls import (
    blocking_tenant_http,
    edge_tls_env,
    tenant_channel,
    tenant_http,
    tenant_url,
    tls_env,
)

from .conftest import eventually, free_port, publisher, read_topic, worker_tls
from .events import admitted, key_created, promoted, worker_state

REQUESTS = 40
"""Requests per phase, each on a connection of its own (the kernel balances connections,
not requests): the chance that one of two processes gets fewer than 5 of 40 is ~1e-7."""


def _served(text: str, tenant: str) -> int:
    """Requests of ``tenant`` a gateway's /metrics counts as served (outcome ok)."""
    return int(sum(
        s.value for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "loraplane_gateway_requests_total" and s.labels.get("tenant") == tenant
        and s.labels.get("outcome") == "ok"))


def _spawn(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "loraplane.gateway"], env=env,
                                stdout=out, stderr=subprocess.STDOUT)


async def test_two_processes_share_the_ports_and_one_survives_the_others_kill(
    stack: Stack, unique: str, tmp_path: Path
) -> None:
    tenant, base, secret = f"t-{unique}", f"base-{unique}", f"lp_{unique}_secret"
    worker = EchoWorker(worker_id=f"w-{unique}", base_models=(base,), hot={901})
    server = await serve_echo_worker(worker, tls=worker_tls(stack))
    grpc_port, http_port = free_port(), free_port()
    metrics = [free_port(), free_port()]
    procs: list[subprocess.Popen[bytes]] = []
    envs: list[dict[str, str]] = []
    logs = [tmp_path / f"gateway-{i}.log" for i in range(2)]
    try:
        async with publisher(stack) as pub:
            await pub.publish(topics.TENANT_EVENTS,
                              key_created(tenant, f"k-{unique}", key_hash(secret)))
            await pub.publish(topics.ADAPTER_ADMISSIONS, admitted(tenant, "chat", "v1", 901, base))
            await pub.publish(topics.ADAPTER_LIFECYCLE, promoted(tenant, "chat", "v1", 901, base))
            await pub.publish(topics.CACHE_STATE, worker_state(worker, base))
        for i in range(2):
            env = {
                **os.environ, **stack.settings.client_env(),
                "LORAPLANE_GATEWAY_GRPC_PORT": str(grpc_port),
                "LORAPLANE_GATEWAY_HTTP_PORT": str(http_port),
                "LORAPLANE_GATEWAY_METRICS_PORT": str(metrics[i]),
                "LORAPLANE_GATEWAY_PROCESSES": "2", "LORAPLANE_GATEWAY_PROCESS_INDEX": str(i),
                "LORAPLANE_GATEWAY_BOOTSTRAP": "false", "LORAPLANE_GATEWAY_HEAT_FLUSH_INTERVAL_S":
                    "0.2",
                **tls_env(stack, GATEWAY), **edge_tls_env(stack),
            }
            envs.append(env)
            procs.append(_spawn(env, logs[i]))

        async with httpx.AsyncClient(timeout=5) as http:
            async def scrape(i: int) -> int:
                return _served((await http.get(f"http://127.0.0.1:{metrics[i]}/metrics")).text,
                               tenant)

            async def metrics_up() -> bool:
                for i, p in enumerate(procs):
                    assert p.poll() is None, logs[i].read_text()
                try:
                    await asyncio.gather(scrape(0), scrape(1))
                except httpx.HTTPError:
                    return False
                return True

            await eventually(metrics_up, timeout_s=60, every_s=0.2)

            async def one_grpc() -> bool:
                """One request on a connection of its own (a fresh channel, its own
                subchannel pool)."""
                async with tenant_channel(
                        stack, f"127.0.0.1:{grpc_port}",
                        options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
                    req = inference_pb2.GenerateRequest(adapter="chat", prompt="hi", max_tokens=2)
                    try:
                        msgs = [m async for m in inference_pb2_grpc.InferenceStub(ch).Generate(
                            req, metadata=(("authorization", f"Bearer {secret}"),), timeout=10)]
                    except grpc.aio.AioRpcError:
                        return False
                return msgs[0].resolved.adapter.version == "v1"

            async def one_http() -> bool:
                async with tenant_http(stack, base_url=tenant_url(stack, http_port),
                                       timeout=10) as c:  # a connection of its own
                    r = await c.post("/v1/completions", headers={"authorization":
                                                                  f"Bearer {secret}"},
                                     json={"model": "chat", "prompt": "hi", "max_tokens": 2})
                return r.status_code == 200

            async def both_serve() -> bool:  # each process's views caught up
                await one_grpc()
                return min(await scrape(0), await scrape(1)) > 0

            await eventually(both_serve, timeout_s=60, every_s=0.05)
            before = [await scrape(0), await scrape(1)]
            results = [await one_grpc() for _ in range(REQUESTS // 2)]
            results += [await one_http() for _ in range(REQUESTS // 2)]
            assert all(results), results
            counts = [await scrape(i) - before[i] for i in range(2)]
            assert sum(counts) == REQUESTS, counts  # each request counted by one process
            assert min(counts) >= 5, f"requests per process {counts}: not spread"

            # each publishes heat under its own instance id
            batches = await read_topic(stack, topics.ADAPTER_HEAT,
                                       lambda m: m.meta.adapter.tenant_id == tenant)
            assert {b.source_id for b in batches} == {"gateway/gateway-0", "gateway/gateway-1"}

            # SIGKILL one: the other serves every new connection, gRPC and HTTP
            procs[1].send_signal(signal.SIGKILL)
            procs[1].wait(10)
            alone = await scrape(0)
            results = [await one_grpc() for _ in range(REQUESTS // 2)]
            results += [await one_http() for _ in range(REQUESTS // 2)]
            assert all(results), results
            assert await scrape(0) - alone == REQUESTS
            assert procs[0].poll() is None

            # a restarted one joins the port only once its views replayed: while it comes
            # up every request is served (none answered keys_loading), then it takes its part
            procs.append(_spawn(envs[1], tmp_path / "gateway-1-again.log"))
            results = []

            async def rejoined() -> bool:
                results.append(await one_grpc())
                try:
                    return await scrape(1) > 0
                except httpx.HTTPError:
                    return False

            await eventually(rejoined, timeout_s=60, every_s=0.02)
            assert all(results), f"{results.count(False)} of {len(results)} failed"
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        await server.stop(0)
    assert procs[0].returncode == 0, logs[0].read_text()  # a clean stop after the other's kill
    assert procs[2].returncode == 0


def test_the_stacks_two_gateway_processes_serve_one_port_and_a_killed_one_comes_back(
    stack: Stack, tmp_path: Path
) -> None:
    """The ``make run`` wiring without vLLM: the supervisor's two gateway service processes
    (``service_processes``: their env, shared public ports, own /metrics), on the test
    stack's Kafka; SIGKILL one, the shared ports keep answering on new connections, and the
    supervisor's restart (``launch``) brings it back beside the running one. TLS as the
    session's stack has it: each process its ``gateway`` identity and, with ``edge_tls``,
    its public ports on TLS with that certificate of a dev CA written here (as ``make run``
    writes its own)."""
    from loraplane.stack.certs import ensure_dev_pki
    from loraplane.stack.settings import StackSettings
    from loraplane.stack.supervisor import service_env, service_processes

    s = StackSettings(profile="test", port_base=stack.settings.port_base, data_dir=tmp_path,
                      tls=stack.settings.tls, s3_tls=stack.settings.s3_tls,
                      edge_tls=stack.settings.edge_tls)
    if s.tls:
        ensure_dev_pki(s.pki_dir)
    own = Stack(s)  # not started: its settings say what its gateways' tenants trust
    gateways = [p for p in service_processes(s, service_env(s)) if p.spec.name == "gateway"]
    assert [p.name for p in gateways] == ["svc-gateway", "svc-gateway-1"]
    http_port = int(gateways[0].env()["LORAPLANE_GATEWAY_HTTP_PORT"])
    if s.edge_tls:
        assert gateways[0].env()["LORAPLANE_GATEWAY_EDGE_TLS_CERT_FILE"] == str(
            s.pki_dir / "gateway.pem")

    def ready_answers(n: int) -> list[int]:
        codes = []
        for _ in range(n):  # a connection of its own each
            try:
                with blocking_tenant_http(own, timeout=5) as http:
                    codes.append(http.get(f"{tenant_url(own, http_port)}/readyz").status_code)
            except httpx.HTTPError:
                codes.append(0)
        return codes

    try:
        for p in gateways:
            assert p.start(), p.name  # beside the first one on the shared ports
        assert all(p.health().healthy for p in gateways)
        wait_until = time.monotonic() + 60
        while ready_answers(1) != [200]:
            assert time.monotonic() < wait_until, "not ready"
            time.sleep(0.2)
        pid = gateways[1].pid()
        assert pid is not None
        gateways[1].kill()
        assert ready_answers(20) == [200] * 20
        assert not gateways[1].health().healthy and gateways[0].health().healthy
        gateways[1].launch()  # what the supervisor's restart does
        wait_until = time.monotonic() + 60
        while not gateways[1].health().healthy:
            assert time.monotonic() < wait_until, gateways[1].log.read_text()
            time.sleep(0.2)
        assert gateways[1].pid() not in (None, pid)
        assert ready_answers(20) == [200] * 20
    finally:
        for p in gateways:
            p.stop()
