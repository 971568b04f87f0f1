"""Mutual TLS on the internal APIs, on the real test stack (issue 23).

A registry (session PostgreSQL and Tansu), a worker on the real vLLM engine and a
cache-manager process, each serving with its own certificate of a fresh CA
(``stack/certs.py``, as ``make run`` does). For each API:

* the platform's own callers get through with their own certificates, through the very
  client code they run (the gateway's worker pool, its registry and placement bootstrap;
  the operator certificate or the gateway with the operator token on the registry);
* a caller without a client certificate, with one of another CA, with an expired one of
  the right CA, or with nothing but a tenant's API key on a plaintext channel is refused in
  the TLS handshake (UNAVAILABLE; the test checks the API never saw them; their count,
  ``loraplane_grpc_tls_handshake_refusals_total``, is a service process's and is checked
  by ``tests/unit/shared/test_handshake_refusals.py`` on a real mTLS server);
* a caller with a valid certificate of an identity the table does not allow (or a tenant
  key where the operator token is needed) gets PERMISSION_DENIED naming the problem, and
  ``loraplane_grpc_auth_refusals_total{service, rpc, reason}`` counts it.
"""

from __future__ import annotations

import datetime as dt
import gc
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from prometheus_client import CollectorRegistry

from loraplane.devkit.builder import DemoManifest, build_demo
from loraplane.gateway.bootstrap import bootstrap_catalog, bootstrap_placement
from loraplane.gateway.catalog import AdapterCatalog
from loraplane.gateway.placement import PlacementView
from loraplane.gateway.workers import WorkerPool
from loraplane.registry.app import RegistryApp
from loraplane.shared.tls import (
    CACHE_MANAGER,
    GATEWAY,
    OPERATOR,
    REGISTRY_ID,
    WORKER,
    TlsFiles,
    secure_or_insecure_aio_channel,
)
from loraplane.stack.certs import CertFiles, ensure_dev_pki, issue, make_ca, write_identity
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
from loraplane.worker.app import WorkerApp
from loraplane.worker.vllm_engine import VllmEngine
from tests.integration.platform.support import worker_settings
from tests.support.cache_manager import Launcher, Manager
from tests.support.registry import TOKEN, registry_settings

pytestmark = pytest.mark.engine

TENANT_KEY = "lp_live_tenant_key_of_acme_0123456789"
"""What a tenant holds: an API key (no certificate)."""


@dataclass
class Pki:
    ours: dict[str, CertFiles]
    foreign: TlsFiles
    """A ``gateway`` certificate of another CA."""
    expired: TlsFiles
    """A ``gateway`` certificate of our CA, expired yesterday."""

    def of(self, identity: str) -> TlsFiles:
        f = self.ours[identity]
        return TlsFiles(f.ca, f.cert, f.key)

    def env(self, identity: str) -> dict[str, str]:
        f = self.ours[identity]
        return {"LORAPLANE_TLS_CA_FILE": str(f.ca), "LORAPLANE_TLS_CERT_FILE": str(f.cert),
                "LORAPLANE_TLS_KEY_FILE": str(f.key)}

    def settings(self, identity: str) -> dict[str, str]:
        f = self.ours[identity]
        return {"tls_ca_file": str(f.ca), "tls_cert_file": str(f.cert),
                "tls_key_file": str(f.key)}


def make_pki(root: Path) -> Pki:
    ours = ensure_dev_pki(root / "pki")
    ca_cert = x509.load_pem_x509_certificate(ours[GATEWAY].ca.read_bytes())
    ca_key = serialization.load_pem_private_key((root / "pki" / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    now = dt.datetime.now(dt.UTC)
    cert, key = issue(GATEWAY, ca_cert, ca_key, not_before=now - dt.timedelta(days=3),
                      not_after=now - dt.timedelta(days=1))
    expired = write_identity(root / "expired", GATEWAY, cert, key, ours[GATEWAY].ca)
    other_ca, other_key = make_ca("another CA")
    cert, key = issue(GATEWAY, other_ca, other_key)
    foreign = write_identity(root / "foreign", GATEWAY, cert, key, ours[GATEWAY].ca)
    return Pki(ours, foreign=TlsFiles(foreign.ca, foreign.cert, foreign.key),
               expired=TlsFiles(expired.ca, expired.cert, expired.key))


@dataclass
class Secured:
    pki: Pki
    demo: DemoManifest
    registry: RegistryApp
    registry_metrics: CollectorRegistry
    worker: WorkerApp
    worker_metrics: CollectorRegistry
    manager: Manager


@pytest.fixture(scope="module")
async def secured(stack: Stack, tmp_path_factory: pytest.TempPathFactory
                  ) -> AsyncIterator[Secured]:
    unique = uuid.uuid4().hex[:8]
    work = tmp_path_factory.mktemp("mtls")
    pki = make_pki(work)
    demo = build_demo()
    reg_metrics = CollectorRegistry()
    registry = RegistryApp(
        registry_settings(stack, registry_topic_prefix=f"mt{unique}.",
                          instance_id=f"reg-mtls-{unique}", **pki.settings(REGISTRY_ID)),
        registry=reg_metrics, serve_metrics=False)
    await registry.start()
    wsettings = worker_settings(stack, demo, work, f"w-mtls-{unique}", **pki.settings(WORKER))
    engine = await VllmEngine.start(demo.base_model.dir, wsettings.engine_options())
    worker_metrics = CollectorRegistry()
    worker = WorkerApp(wsettings, engine, registry=worker_metrics, kafka=False)
    await worker.start()
    launcher = Launcher(stack.settings.client_env(), work, f"mtls-{unique}")
    manager = launcher.start(**pki.env(CACHE_MANAGER))
    try:
        await manager.wait_leader(60)
        yield Secured(pki, demo, registry, reg_metrics, worker, worker_metrics, manager)
    finally:
        launcher.stop_all()
        await worker.stop()
        await engine.close()
        del engine
        gc.collect()
        await registry.stop()


def _generate_request(demo: DemoManifest) -> worker_pb2.WorkerGenerateRequest:
    """A base-model request as the gateway sends it (made-up request id)."""
    req = worker_pb2.WorkerGenerateRequest(
        request_id=uuid.uuid4().hex, base_model=demo.base_model.name,
        params=inference_pb2.GenerateRequest(prompt="Hello", max_tokens=2))
    req.adapter.tenant_id = "acme"
    return req


def _count(metrics: CollectorRegistry, service: str, rpc: str, reason: str) -> float:
    return metrics.get_sample_value(
        "loraplane_grpc_auth_refusals_total",
        {"service": service, "rpc": rpc, "reason": reason}) or 0.0


def _served(metrics: CollectorRegistry, service: str, rpc: str) -> float:
    """Calls the API itself answered (any status): what got past the handshake and the
    table."""
    total = 0.0
    for family in metrics.collect():
        if family.name != "loraplane_rpc_requests":
            continue
        for s in family.samples:
            if (s.name.endswith("_total") and s.labels.get("service") == service
                    and s.labels.get("method") == rpc and s.labels.get("code") == "OK"):
                total += s.value
    return total


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
    addr = s.worker.grpc_address
    req = _generate_request(s.demo)
    svc = "loraplane.v1.WorkerInternal"
    before = _served(s.worker_metrics, svc, "Generate")

    # refused in the handshake: never reach the API
    for label, files in (("another CA", s.pki.foreign), ("expired", s.pki.expired)):
        err = await _worker_call(addr, files, req)
        assert err is not None and err.code() == grpc.StatusCode.UNAVAILABLE, label
    err = await _worker_call(addr, None, req, metadata=(("authorization",
                                                         f"Bearer {TENANT_KEY}"),))
    assert err is not None and err.code() == grpc.StatusCode.UNAVAILABLE  # plaintext + key
    ca = s.pki.of(GATEWAY).ca.read_bytes()
    async with grpc.aio.secure_channel(addr, grpc.ssl_channel_credentials(ca), options=[
            ("grpc.ssl_target_name_override", WORKER)]) as ch:  # TLS, no client certificate
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            [m async for m in worker_pb2_grpc.WorkerInternalStub(ch).Generate(req, timeout=30)]
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    assert _served(s.worker_metrics, svc, "Generate") == before

    # a certificate of the CA, but not a gateway's: refused by the table, counted
    for identity in (OPERATOR, WORKER):
        err = await _worker_call(addr, s.pki.of(identity), req)
        assert err is not None and err.code() == grpc.StatusCode.PERMISSION_DENIED
        details = err.details() or ""
        assert f"'{identity}'" in details and "WorkerInternal/Generate" in details, details
        assert "allowed: cache-manager, gateway" in details, details
    assert _count(s.worker_metrics, svc, "Generate", "identity_not_allowed") == 2
    assert _served(s.worker_metrics, svc, "Generate") == before

    # the gateway's own worker pool gets its tokens
    pool = WorkerPool(tls=s.pki.of(GATEWAY))
    try:
        chunks = [m async for m in pool.stub(addr).Generate(_generate_request(s.demo),
                                                             timeout=60)]
        state = await pool.stub(addr).GetState(worker_pb2.GetStateRequest(), timeout=10)
    finally:
        await pool.close()
    assert chunks and chunks[-1].finish_reason
    assert state.worker_id == s.worker.settings.worker_id
    assert _served(s.worker_metrics, svc, "Generate") == before + 1


async def test_cache_manager_read_api_needs_an_allowed_identity(secured: Secured) -> None:
    s = secured
    addr = f"127.0.0.1:{s.manager.grpc_port}"

    async def list_workers(files: TlsFiles | None) -> grpc.StatusCode:
        async with secure_or_insecure_aio_channel(addr, files, server=CACHE_MANAGER) as ch:
            try:
                await cache_pb2_grpc.CacheManagerStub(ch).ListWorkers(
                    cache_pb2.ListWorkersRequest(), timeout=10)
            except grpc.aio.AioRpcError as err:
                return err.code()
        return grpc.StatusCode.OK

    assert await list_workers(None) == grpc.StatusCode.UNAVAILABLE
    assert await list_workers(s.pki.foreign) == grpc.StatusCode.UNAVAILABLE
    assert await list_workers(s.pki.expired) == grpc.StatusCode.UNAVAILABLE
    assert await list_workers(s.pki.of(WORKER)) == grpc.StatusCode.PERMISSION_DENIED
    counted = [ln for ln in s.manager.metric_lines("loraplane_grpc_auth_refusals_total")
               if 'rpc="ListWorkers"' in ln and 'reason="identity_not_allowed"' in ln]
    assert counted and float(counted[0].split()[-1]) == 1.0, counted
    assert await list_workers(s.pki.of(OPERATOR)) == grpc.StatusCode.OK
    # the gateway's placement bootstrap, over its own channel code
    async with secure_or_insecure_aio_channel(addr, s.pki.of(GATEWAY),
                                              server=CACHE_MANAGER) as ch:
        assert await bootstrap_placement(ch, PlacementView(), timeout_s=10) >= 0


async def test_registry_admin_takes_the_operator_certificate_or_token(secured: Secured) -> None:
    s = secured
    addr = s.registry.address
    svc = "loraplane.v1.RegistryAdmin"

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

    for files, token in ((None, TOKEN), (None, TENANT_KEY), (s.pki.foreign, TOKEN),
                         (s.pki.expired, TOKEN)):
        # even the right token: without a certificate of the CA there is no connection
        assert (await list_tenants(files, token))[0] == grpc.StatusCode.UNAVAILABLE
    code, details = await list_tenants(s.pki.of(GATEWAY))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "missing operator token" in details
    assert _count(s.registry_metrics, svc, "ListTenants", "missing_token") == 1
    code, details = await list_tenants(s.pki.of(GATEWAY), TENANT_KEY)
    assert code == grpc.StatusCode.PERMISSION_DENIED and "not the operator token" in details
    assert _count(s.registry_metrics, svc, "ListTenants", "bad_token") == 1
    assert TENANT_KEY not in details and TOKEN not in details

    assert (await list_tenants(s.pki.of(OPERATOR)))[0] == grpc.StatusCode.OK
    assert (await list_tenants(s.pki.of(GATEWAY), TOKEN))[0] == grpc.StatusCode.OK
    # the gateway's catalog bootstrap: its certificate and the operator token
    async with secure_or_insecure_aio_channel(addr, s.pki.of(GATEWAY),
                                              server=REGISTRY_ID) as ch:
        assert await bootstrap_catalog(ch, AdapterCatalog(), token=TOKEN, timeout_s=10) >= 0
