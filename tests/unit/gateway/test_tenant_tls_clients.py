"""The test suite's tenant clients (``tests/support/tls.py``) against a gateway serving its
public ports as the stack's gateways do: with edge TLS they trust the stack's dev CA and
check that the certificate names ``gateway`` - one of another identity of the same CA,
which names ``127.0.0.1`` too, is refused on both ports - and with
``LORAPLANE_STACK_EDGE_TLS=false`` they dial plaintext."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from loraplane.gateway.app import GatewayApp
from loraplane.stack.certs import ensure_dev_pki
from loraplane.stack.settings import StackSettings
from loraplane.stack.stack import Stack
from tests.support.tls import (
    blocking_tenant_http,
    edge_tls_settings,
    tenant_channel,
    tenant_env,
    tenant_http,
    tenant_url,
)

from .harness import bare_gateway


def _stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **over: Any) -> Stack:
    """A test-profile stack's settings (not started) with its dev CA written."""
    for var in ("LORAPLANE_STACK_TLS", "LORAPLANE_STACK_S3_TLS", "LORAPLANE_STACK_EDGE_TLS"):
        monkeypatch.delenv(var, raising=False)
    s = StackSettings(profile="test", port_base=34300, data_dir=tmp_path / "stack", **over)
    ensure_dev_pki(s.pki_dir)
    return Stack(s)


def _gateway(**edge: str) -> AbstractAsyncContextManager[GatewayApp]:
    return bare_gateway("tenant-clients", **edge)


async def _grpc_serving(stack: Stack, app: GatewayApp) -> bool:
    async with tenant_channel(stack, f"127.0.0.1:{app.grpc_port}") as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="loraplane.v1.Inference"), timeout=5)
    return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)


async def test_tenant_clients_trust_the_dev_ca_and_check_the_gateways_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stack = _stack(tmp_path, monkeypatch)
    assert stack.settings.edge_tls is True  # the test profile's default with tls
    edge = edge_tls_settings(stack)
    assert edge == {"edge_tls_cert_file": str(stack.settings.pki_dir / "gateway.pem"),
                    "edge_tls_key_file": str(stack.settings.pki_dir / "gateway.key")}
    assert tenant_env(stack) == {"LORAPLANE_GATEWAY_CA_FILE": str(stack.settings.ca_file)}
    async with _gateway(**edge) as app:
        url = tenant_url(stack, app.http_port)
        assert url.startswith("https://")
        async with tenant_http(stack, base_url=url, timeout=5) as http:
            assert (await http.get("/healthz")).status_code == 200

        def blocking_get() -> int:  # off the loop the gateway serves on
            with blocking_tenant_http(stack, timeout=5) as http:
                return http.get(f"{url}/healthz").status_code

        assert await asyncio.to_thread(blocking_get) == 200
        assert await _grpc_serving(stack, app)
        async with httpx.AsyncClient(timeout=5) as plain:  # no CA: refused
            with pytest.raises(httpx.ConnectError):
                await plain.get(f"{url}/healthz")

    # the same CA's worker certificate names 127.0.0.1 too: refused by the name check
    pki = stack.settings.pki_dir
    async with _gateway(edge_tls_cert_file=str(pki / "worker.pem"),
                        edge_tls_key_file=str(pki / "worker.key")) as app:
        async with tenant_http(stack, timeout=5) as http:
            with pytest.raises(httpx.ConnectError, match="certificate verify failed"):
                await http.get(f"{tenant_url(stack, app.http_port)}/healthz")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _grpc_serving(stack, app)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_with_a_plaintext_edge_the_tenant_clients_dial_plaintext(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stack = _stack(tmp_path, monkeypatch, edge_tls=False)
    assert stack.settings.tls and not stack.settings.edge_tls
    edge = edge_tls_settings(stack)
    assert edge == {"edge_tls_cert_file": "", "edge_tls_key_file": ""}
    assert tenant_env(stack) == {"LORAPLANE_GATEWAY_CA_FILE": ""}
    async with _gateway(**edge) as app:
        url = tenant_url(stack, app.http_port)
        assert url.startswith("http://")
        async with tenant_http(stack, base_url=url, timeout=5) as http:
            assert (await http.get("/healthz")).status_code == 200
        assert await _grpc_serving(stack, app)
