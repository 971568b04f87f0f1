"""Mutual TLS on the internal APIs, on the real test stack (issue 23).

A registry (session PostgreSQL and Tansu), a worker on the real vLLM engine and a
cache-manager, each a service process of its own (``python -m loraplane.<service>``, as
``make run`` starts them), serving with its own certificate of a fresh CA
(``stack/certs.py``, as ``make run`` does). For each API:

* the platform's own callers get through with their own certificates, through the very
  client code they run (the gateway's worker pool, its registry and placement bootstrap;
  the operator certificate or the gateway with the operator token on the registry);
* a caller without a client certificate, with one of another CA, with an expired one of
  the right CA, or with nothing but a tenant's API key on a plaintext channel is refused in
  the TLS handshake (UNAVAILABLE; the test checks the API never saw them), and the
  process's own ``/metrics`` counts each in
  ``loraplane_grpc_tls_handshake_refusals_total{service, reason, side}``: a refused call
  raises its reason's count (``side="server_or_client"`` for the reasons a client logs
  too in the cache-manager, which also dials TLS gRPC) and no other series; calls that
  pass the handshake (good ones, or refused by the table) count nothing; each reason's
  count is exactly the number of gRPC core's ``Handshake failed`` lines of that reason in
  the process's own log. The count is of refused *handshakes*, not of calls: usually one
  per refused call, but a client still waiting for its call reconnects (the platform's
  channels after 200 ms, x1.6 up to 1 s: ``tls.RECONNECT_OPTIONS``) and each attempt is
  refused and counted again, and it goes on after the call failed and its channel was
  closed (seen on the worker: 3-4 refusals 0.2-0.8 s apart within a second, then one a
  second for as long as the test process lived): so the good calls of each API are made
  before its refused ones, and the exact check is against the process's log;
* a caller with a valid certificate of an identity the table does not allow (or a tenant
  key where the operator token is needed) gets PERMISSION_DENIED naming the problem, and
  ``loraplane_grpc_auth_refusals_total{service, rpc, reason}`` counts it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr
from pydantic_settings import BaseSettings

from loraplane.devkit.builder import DemoManifest, build_demo
from loraplane.gateway.bootstrap import bootstrap_catalog, bootstrap_placement
from loraplane.gateway.catalog import AdapterCatalog
from loraplane.gateway.placement import PlacementView
from loraplane.gateway.workers import WorkerPool
from loraplane.shared.stderr_tee import REASONS, classify
from loraplane.shared.tls import (
    CACHE_MANAGER,
    GATEWAY,
    OPERATOR,
    REGISTRY_ID,
    WORKER,
    TlsFiles,
    secure_or_insecure_aio_channel,
)
from loraplane.stack.stack import Stack
from loraplane.v1 import (
    cache_pb2,
    cache_pb2_grpc,
    inference_pb2,
    registry_pb2,
    registry_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from tests.integration.platform.support import worker_settings
from tests.support.cache_manager import REPO, Launcher, Manager, free_port
from tests.support.registry import TOKEN, registry_settings
from tests.support.tls import Pki, make_pki

pytestmark = pytest.mark.engine

TENANT_KEY = "lp_live_tenant_key_of_acme_0123456789"
"""What a tenant holds: an API key (no certificate)."""


T = TypeVar("T")


@dataclass
class Service:
    """A service process (``python -m loraplane.<module>``) and its ports."""

    name: str
    proc: subprocess.Popen[bytes]
    grpc_port: int
    metrics_port: int
    log: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def scrape(self) -> list[Any]:
        """Every sample of the process's own ``/metrics``."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=5) as r:
            text = r.read().decode()
        return [sample for family in text_string_to_metric_families(text)
                for sample in family.samples]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def _env_of(settings: BaseSettings) -> dict[str, str]:
    """The ``LORAPLANE_*`` variables giving a service process ``settings`` (the fields a
    test helper set)."""
    env: dict[str, str] = {}
    for name in settings.model_fields_set:
        value = getattr(settings, name)
        if value is None:
            continue
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        elif isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, dict | list | tuple):
            value = json.dumps(value)
        env[f"LORAPLANE_{name.upper()}"] = str(value)
    return env


def _answers(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _spawn(name: str, module: str, env: dict[str, str], grpc_port: int,
           metrics_port: int, work: Path) -> Service:
    log = work / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", module], env=env, cwd=REPO,
                                stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return Service(name, proc, grpc_port, metrics_port, log)


async def _launch(name: str, module: str, env: dict[str, str], grpc_port: int,
                  metrics_port: int, work: Path, timeout_s: float) -> Service:
    """Start a service process (its own process group, log in ``work``) and wait until
    its ``/metrics`` and its gRPC port answer."""
    service = _spawn(name, module, env, grpc_port, metrics_port, work)
    proc, log = service.proc, service.log
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited {proc.returncode}:\n"
                                 f"{log.read_text(errors='replace')[-4000:]}")
        if _answers(metrics_port) and _answers(grpc_port):
            return service
        if time.monotonic() > deadline:
            service.stop()
            raise AssertionError(f"{name} not serving after {timeout_s:.0f}s:\n"
                                 f"{log.read_text(errors='replace')[-4000:]}")
        await asyncio.sleep(0.2)


@dataclass
class Secured:
    pki: Pki
    demo: DemoManifest
    registry: Service
    worker: Service
    worker_id: str
    manager: Manager


@pytest.fixture(scope="module")
async def secured(stack: Stack, tmp_path_factory: pytest.TempPathFactory
                  ) -> AsyncIterator[Secured]:
    unique = uuid.uuid4().hex[:8]
    work = tmp_path_factory.mktemp("mtls")
    pki = make_pki(work)
    demo = build_demo()
    base = {**os.environ, **stack.settings.client_env(), "HF_HUB_OFFLINE": "1"}
    base.pop("GRPC_VERBOSITY", None)  # gRPC core's INFO line is what is counted
    ports = {name: (free_port(), free_port()) for name in ("registry", "worker")}
    reg_settings = registry_settings(
        stack, registry_topic_prefix=f"mt{unique}.", instance_id=f"reg-mtls-{unique}",
        registry_grpc_port=ports["registry"][0], registry_metrics_port=ports["registry"][1],
        **pki.settings(REGISTRY_ID))
    worker_id = f"w-mtls-{unique}"
    wsettings = worker_settings(stack, demo, work, worker_id,
                                worker_grpc_port=ports["worker"][0],
                                worker_metrics_port=ports["worker"][1], **pki.settings(WORKER))
    started: list[Service] = []
    launcher = Launcher(stack.settings.client_env(), work, f"mtls-{unique}", stack=stack)
    try:
        started.append(await _launch("registry", "loraplane.registry",
                                     {**base, **_env_of(reg_settings)}, *ports["registry"],
                                     work, 60))
        started.append(await _launch(
            "worker", "loraplane.worker",
            {**base, **_env_of(wsettings), "VLLM_CPU_OMP_THREADS_BIND": "nobind"},
            *ports["worker"], work, 300))
        manager = launcher.start(**pki.env(CACHE_MANAGER))
        await manager.wait_leader(60)
        yield Secured(pki, demo, started[0], started[1], worker_id, manager)
    finally:
        launcher.stop_all()
        for service in reversed(started):
            service.stop()


def _refusals(samples: list[Any], service: str) -> dict[tuple[str, str], float]:
    """``loraplane_grpc_tls_handshake_refusals_total`` of ``service`` by (reason, side)."""
    return {(s.labels["reason"], s.labels["side"]): s.value for s in samples
            if s.name == "loraplane_grpc_tls_handshake_refusals_total"
            and s.labels.get("service") == service}


def _delta(after: dict[tuple[str, str], float], before: dict[tuple[str, str], float]
           ) -> dict[tuple[str, str], float]:
    return {key: value - before.get(key, 0.0) for key, value in after.items()
            if value != before.get(key, 0.0)}


async def _counted(scrape: Callable[[], list[Any]], service: str, call: Awaitable[T],
                   expect: int, *, settle_s: float = 0.5, timeout_s: float = 15.0
                   ) -> tuple[T, dict[tuple[str, str], float]]:
    """Run ``call``; return its result and how ``service``'s refusal counts moved once
    their sum rose by ``expect`` (counted asynchronously: gRPC core's line goes through
    the process's stderr tee) and stayed there ``settle_s`` more."""
    before = _refusals(await asyncio.to_thread(scrape), service)
    assert len(before) == len(REASONS), before  # every series exported from the start
    result = await call
    deadline = time.monotonic() + timeout_s
    while True:
        moved = _delta(_refusals(await asyncio.to_thread(scrape), service), before)
        if sum(moved.values()) >= expect or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(settle_s)
    return result, _delta(_refusals(await asyncio.to_thread(scrape), service), before)


def _metric_counted(samples: list[Any], service: str) -> float | None:
    return next((s.value for s in samples
                 if s.name == "loraplane_grpc_tls_handshake_refusals_counted"
                 and s.labels.get("service") == service), None)


def _one_reason(moved: dict[tuple[str, str], float], key: tuple[str, str],
                earlier: set[tuple[str, str]]) -> None:
    """A refused call: its reason rose (at least once: its client reconnects, each attempt
    refused again); any other series that moved is an earlier refused client's, still
    reconnecting. Adds ``key`` to ``earlier``."""
    assert moved.get(key, 0) >= 1 and set(moved) - {key} <= earlier, (key, moved)
    earlier.add(key)


def _counts_match_the_log(scrape: Callable[[], list[Any]], service: str, log: Path) -> None:
    """The exact check: since the process started, each reason's count is the number of
    gRPC core's ``Handshake failed`` lines of that reason in its own log (the tee forwards
    a line before it reports it)."""
    logged: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        reason = classify(line)
        if reason is not None:
            logged[reason] = logged.get(reason, 0) + 1
    counted: dict[str, float] = {}
    for (reason, _side), value in _refusals(scrape(), service).items():
        if value:
            counted[reason] = counted.get(reason, 0) + value
    assert counted == logged and logged, (counted, logged)


def _generate_request(demo: DemoManifest) -> worker_pb2.WorkerGenerateRequest:
    """A base-model request as the gateway sends it (made-up request id)."""
    req = worker_pb2.WorkerGenerateRequest(
        request_id=uuid.uuid4().hex, base_model=demo.base_model.name,
        params=inference_pb2.GenerateRequest(prompt="Hello", max_tokens=2))
    req.adapter.tenant_id = "acme"
    return req


def _count(samples: list[Any], service: str, rpc: str, reason: str) -> float:
    return next((s.value for s in samples
                 if s.name == "loraplane_grpc_auth_refusals_total"
                 and s.labels == {"service": service, "rpc": rpc, "reason": reason}), 0.0)


def _served(samples: list[Any], service: str, rpc: str) -> float:
    """Calls the API itself answered (OK): what got past the handshake and the table."""
    return sum(s.value for s in samples
               if s.name == "loraplane_rpc_requests_total" and s.labels.get("service") == service
               and s.labels.get("method") == rpc and s.labels.get("code") == "OK")


async def _worker_call(address: str, files: TlsFiles | None, req: worker_pb2.WorkerGenerateRequest,
                       *, metadata: tuple[tuple[str, str], ...] = ()
                       ) -> grpc.aio.AioRpcError | None:
    async with secure_or_insecure_aio_channel(address, files, server=WORKER) as ch:
        try:
            [m async for m in worker_pb2_grpc.WorkerInternalStub(ch).Generate(
                req, metadata=metadata, timeout=60)]
        except grpc.aio.AioRpcError as err:
            return err
    return None


async def test_worker_serves_only_the_gateway(secured: Secured) -> None:
    s = secured
    addr = s.worker.address
    req = _generate_request(s.demo)
    svc = "loraplane.v1.WorkerInternal"
    before = _served(s.worker.scrape(), svc, "Generate")
    assert _metric_counted(s.worker.scrape(), "worker") == 1

    # the gateway's own worker pool gets its tokens; no refusal counted
    async def gateway_calls() -> tuple[list[Any], Any]:
        pool = WorkerPool(tls=s.pki.of(GATEWAY))
        try:
            chunks = [m async for m in pool.stub(addr).Generate(_generate_request(s.demo),
                                                                 timeout=60)]
            state = await pool.stub(addr).GetState(worker_pb2.GetStateRequest(), timeout=10)
        finally:
            await pool.close()
        return chunks, state

    (chunks, state), moved = await _counted(s.worker.scrape, "worker", gateway_calls(), 0)
    assert moved == {}
    assert chunks and chunks[-1].finish_reason
    assert state.worker_id == s.worker_id
    assert _served(s.worker.scrape(), svc, "Generate") == before + 1

    # a certificate of the CA, but not a gateway's: refused by the table, counted there
    # (the handshake itself succeeded: no handshake refusal)
    for identity in (OPERATOR, WORKER):
        err, moved = await _counted(s.worker.scrape, "worker",
                                    _worker_call(addr, s.pki.of(identity), req), 0)
        assert err is not None and err.code() == grpc.StatusCode.PERMISSION_DENIED
        details = err.details() or ""
        assert f"'{identity}'" in details and "WorkerInternal/Generate" in details, details
        assert "allowed: cache-manager, gateway" in details, details
        assert moved == {}, identity
    assert _count(s.worker.scrape(), svc, "Generate", "identity_not_allowed") == 2

    # refused in the handshake: never reach the API; counted with its reason
    earlier: set[tuple[str, str]] = set()
    for reason, files in (("unknown_ca", s.pki.foreign), ("expired", s.pki.expired)):
        err, moved = await _counted(s.worker.scrape, "worker",
                                    _worker_call(addr, files, req), 1)
        assert err is not None and err.code() == grpc.StatusCode.UNAVAILABLE, reason
        _one_reason(moved, (reason, "server"), earlier)
    err, moved = await _counted(s.worker.scrape, "worker", _worker_call(
        addr, None, req, metadata=(("authorization", f"Bearer {TENANT_KEY}"),)), 1)
    assert err is not None and err.code() == grpc.StatusCode.UNAVAILABLE  # plaintext + key
    _one_reason(moved, ("not_tls", "server"), earlier)
    ca = s.pki.of(GATEWAY).ca.read_bytes()

    async def no_certificate(**kwargs: Any) -> grpc.StatusCode:
        async with grpc.aio.secure_channel(addr, grpc.ssl_channel_credentials(ca), options=[
                ("grpc.ssl_target_name_override", WORKER)]) as ch:  # TLS, no certificate
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                [m async for m in worker_pb2_grpc.WorkerInternalStub(ch).Generate(
                    req, **kwargs)]
            return raised.value.code()

    code, moved = await _counted(s.worker.scrape, "worker", no_certificate(timeout=30), 1)
    assert code == grpc.StatusCode.UNAVAILABLE
    _one_reason(moved, ("no_certificate", "server"), earlier)
    # a call that waits for ready: its channel reconnects with gRPC's backoff (default
    # 1 s, x1.6, jitter 20 %) and every attempt is refused and counted
    code, moved = await _counted(s.worker.scrape, "worker",
                                 no_certificate(timeout=2.5, wait_for_ready=True), 2)
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    _one_reason(moved, ("no_certificate", "server"), earlier)
    assert moved[("no_certificate", "server")] >= 2, moved
    assert _served(s.worker.scrape(), svc, "Generate") == before + 1
    _counts_match_the_log(s.worker.scrape, "worker", s.worker.log)


async def test_cache_manager_read_api_needs_an_allowed_identity(secured: Secured) -> None:
    s = secured
    addr = f"127.0.0.1:{s.manager.grpc_port}"
    service = "cache-manager"
    scrape = Service("cache-manager", s.manager.proc, s.manager.grpc_port,
                     s.manager.metrics_port, s.manager.log).scrape
    assert _metric_counted(scrape(), service) == 1

    async def list_workers(files: TlsFiles | None) -> grpc.StatusCode:
        async with secure_or_insecure_aio_channel(addr, files, server=CACHE_MANAGER) as ch:
            try:
                await cache_pb2_grpc.CacheManagerStub(ch).ListWorkers(
                    cache_pb2.ListWorkersRequest(), timeout=10)
            except grpc.aio.AioRpcError as err:
                return err.code()
        return grpc.StatusCode.OK

    async def no_certificate() -> grpc.StatusCode:
        ca = s.pki.of(GATEWAY).ca.read_bytes()
        async with grpc.aio.secure_channel(addr, grpc.ssl_channel_credentials(ca), options=[
                ("grpc.ssl_target_name_override", CACHE_MANAGER)]) as ch:
            try:
                await cache_pb2_grpc.CacheManagerStub(ch).ListWorkers(
                    cache_pb2.ListWorkersRequest(), timeout=10)
            except grpc.aio.AioRpcError as err:
                return err.code()
        return grpc.StatusCode.OK

    # past the handshake (good, or refused by the table): no handshake refusal
    code, moved = await _counted(scrape, service, list_workers(s.pki.of(WORKER)), 0)
    assert code == grpc.StatusCode.PERMISSION_DENIED and moved == {}
    counted = [ln for ln in s.manager.metric_lines("loraplane_grpc_auth_refusals_total")
               if 'rpc="ListWorkers"' in ln and 'reason="identity_not_allowed"' in ln]
    assert counted and float(counted[0].split()[-1]) == 1.0, counted
    code, moved = await _counted(scrape, service, list_workers(s.pki.of(OPERATOR)), 0)
    assert code == grpc.StatusCode.OK and moved == {}

    # the gateway's placement bootstrap, over its own channel code
    async def bootstrap() -> int:
        async with secure_or_insecure_aio_channel(addr, s.pki.of(GATEWAY),
                                                  server=CACHE_MANAGER) as ch:
            return await bootstrap_placement(ch, PlacementView(), timeout_s=10)

    placed, moved = await _counted(scrape, service, bootstrap(), 0)
    assert placed >= 0 and moved == {}

    # refused in the handshake. It also dials TLS gRPC (workers, registry): the reasons a
    # client logs too are side=server_or_client; no_certificate is the server's for certain
    earlier: set[tuple[str, str]] = set()
    for call, key in ((list_workers(None), ("not_tls", "server_or_client")),
                      (list_workers(s.pki.foreign), ("unknown_ca", "server_or_client")),
                      (list_workers(s.pki.expired), ("expired", "server_or_client")),
                      (no_certificate(), ("no_certificate", "server"))):
        code, moved = await _counted(scrape, service, call, 1)
        assert code == grpc.StatusCode.UNAVAILABLE, key
        _one_reason(moved, key, earlier)
    _counts_match_the_log(scrape, service, s.manager.log)


async def test_registry_admin_takes_the_operator_certificate_or_token(secured: Secured) -> None:
    s = secured
    addr = s.registry.address
    svc = "loraplane.v1.RegistryAdmin"
    assert _metric_counted(s.registry.scrape(), "registry") == 1

    async def list_tenants(files: TlsFiles | None, token: str | None = None
                           ) -> tuple[grpc.StatusCode, str]:
        md = (("authorization", f"Bearer {token}"),) if token else ()
        async with secure_or_insecure_aio_channel(addr, files, server=REGISTRY_ID) as ch:
            try:
                await registry_pb2_grpc.RegistryAdminStub(ch).ListTenants(
                    registry_pb2.ListTenantsRequest(), metadata=md, timeout=10)
            except grpc.aio.AioRpcError as err:
                return err.code(), err.details() or ""
        return grpc.StatusCode.OK, ""

    # past the handshake (refused by the table, or good): no handshake refusal
    (code, details), moved = await _counted(s.registry.scrape, "registry",
                                            list_tenants(s.pki.of(GATEWAY)), 0)
    assert code == grpc.StatusCode.PERMISSION_DENIED and "missing operator token" in details
    assert moved == {}
    assert _count(s.registry.scrape(), svc, "ListTenants", "missing_token") == 1
    code, details = await list_tenants(s.pki.of(GATEWAY), TENANT_KEY)
    assert code == grpc.StatusCode.PERMISSION_DENIED and "not the operator token" in details
    assert _count(s.registry.scrape(), svc, "ListTenants", "bad_token") == 1
    assert TENANT_KEY not in details and TOKEN not in details

    (code, _), moved = await _counted(s.registry.scrape, "registry",
                                      list_tenants(s.pki.of(OPERATOR)), 0)
    assert code == grpc.StatusCode.OK and moved == {}
    assert (await list_tenants(s.pki.of(GATEWAY), TOKEN))[0] == grpc.StatusCode.OK
    # the gateway's catalog bootstrap: its certificate and the operator token
    async with secure_or_insecure_aio_channel(addr, s.pki.of(GATEWAY),
                                              server=REGISTRY_ID) as ch:
        assert await bootstrap_catalog(ch, AdapterCatalog(), token=TOKEN, timeout_s=10) >= 0
    assert sum(_refusals(s.registry.scrape(), "registry").values()) == 0

    earlier: set[tuple[str, str]] = set()
    for files, token, reason in ((None, TOKEN, "not_tls"), (None, TENANT_KEY, "not_tls"),
                                 (s.pki.foreign, TOKEN, "unknown_ca"),
                                 (s.pki.expired, TOKEN, "expired")):
        # even the right token: without a certificate of the CA there is no connection
        (code, _), moved = await _counted(s.registry.scrape, "registry",
                                          list_tenants(files, token), 1)
        assert code == grpc.StatusCode.UNAVAILABLE, reason
        _one_reason(moved, (reason, "server"), earlier)
    # no private key or token in the process's log
    log = s.registry.log.read_text(errors="replace")
    assert TOKEN not in log and TENANT_KEY not in log
    assert "PRIVATE KEY" not in log
    _counts_match_the_log(s.registry.scrape, "registry", s.registry.log)
