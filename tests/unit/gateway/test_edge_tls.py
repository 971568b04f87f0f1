"""TLS at the edge: the assembled gateway (no Kafka, no bootstrap) serving its public gRPC
and HTTP listeners with a certificate from settings; clients that trust the CA reach
it, plaintext ones do not, and ``loraplane generate`` trusts ``LORAPLANE_GATEWAY_CA_FILE``."""

from __future__ import annotations

import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from cryptography import x509
from prometheus_client import CollectorRegistry
from pydantic import ValidationError
from typer.testing import CliRunner

from loraplane.cli.main import app as cli_app
from loraplane.gateway.app import GatewayApp
from loraplane.gateway.settings import GatewaySettings
from loraplane.shared.tls import TlsConfigError, edge_server_credentials
from loraplane.stack.certs import CertFiles, ensure_dev_pki
from loraplane.v1 import inference_pb2, inference_pb2_grpc


class _NullPublisher:
    async def publish(self, topic: str, msg: Any) -> None:
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, CertFiles]:
    return ensure_dev_pki(tmp_path / "pki")


@pytest.fixture
async def gateway(pki: dict[str, CertFiles]) -> AsyncIterator[GatewayApp]:
    cert = pki["gateway"]
    settings = GatewaySettings(
        grpc_port=_free_port(), http_port=_free_port(), metrics_port=0, bootstrap=False,
        consume_events=False, worker_probe_interval_s=0, instance_id="edge-tls",
        edge_tls_cert_file=str(cert.cert), edge_tls_key_file=str(cert.key))
    app = GatewayApp(settings, publisher=_NullPublisher(), registry=CollectorRegistry(),
                     serve_metrics=False)
    await app.start()
    try:
        yield app
    finally:
        await app.stop(0.5)


def test_settings_need_both_files_and_a_matching_pair(pki: dict[str, CertFiles]) -> None:
    with pytest.raises(ValidationError, match="LORAPLANE_GATEWAY_EDGE_TLS_KEY_FILE"):
        GatewaySettings(edge_tls_cert_file=str(pki["gateway"].cert))
    with pytest.raises(TlsConfigError, match="does not belong"):
        edge_server_credentials(str(pki["gateway"].cert), str(pki["worker"].key))
    with pytest.raises(TlsConfigError, match="cannot read"):
        edge_server_credentials(str(pki["gateway"].cert), "/nonexistent/key.pem")


async def test_grpc_and_http_listeners_speak_tls(gateway: GatewayApp,
                                                 pki: dict[str, CertFiles]) -> None:
    s = gateway.settings
    ca = pki["gateway"].ca
    req = inference_pb2.GenerateRequest(adapter="support", prompt="hi", max_tokens=1)
    async with grpc.aio.secure_channel(f"127.0.0.1:{s.grpc_port}",
                                       grpc.ssl_channel_credentials(ca.read_bytes())) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            [m async for m in inference_pb2_grpc.InferenceStub(ch).Generate(req, timeout=5)]
    # reached the gateway over TLS: it asks for the API key it was not given
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    async with grpc.aio.insecure_channel(f"127.0.0.1:{s.grpc_port}") as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            [m async for m in inference_pb2_grpc.InferenceStub(ch).Generate(req, timeout=5)]
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # plaintext is not served

    async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(ca))) as client:
        r = await client.get(f"https://127.0.0.1:{s.http_port}/v1/models")
    assert r.status_code == 401
    async with httpx.AsyncClient() as client:
        with pytest.raises(httpx.HTTPError):
            await client.get(f"http://127.0.0.1:{s.http_port}/v1/models")


async def test_the_cli_trusts_the_ca_it_is_given(gateway: GatewayApp,
                                                 pki: dict[str, CertFiles]) -> None:
    import asyncio

    env = {"LORAPLANE_GATEWAY_GRPC": f"127.0.0.1:{gateway.settings.grpc_port}",
           "LORAPLANE_API_KEY": "lp_not_a_key_0123456789",
           "LORAPLANE_GATEWAY_CA_FILE": str(pki["gateway"].ca)}
    args = ["generate", "--adapter", "support", "--prompt", "hi", "--timeout", "10"]
    trusted = await asyncio.to_thread(CliRunner().invoke, cli_app, args, env=env)
    assert "UNAUTHENTICATED" in trusted.output, trusted.output  # the gateway answered
    env["LORAPLANE_GATEWAY_CA_FILE"] = str(pki["gateway"].ca.parent / "missing.pem")
    missing = await asyncio.to_thread(CliRunner().invoke, cli_app, args, env=env)
    assert missing.exit_code == 2 and "LORAPLANE_GATEWAY_CA_FILE" in missing.output


async def test_the_grpc_edge_certificate_is_reloaded_without_a_restart(
        tmp_path: Path) -> None:
    first = ensure_dev_pki(tmp_path / "a")["gateway"]
    second = ensure_dev_pki(tmp_path / "b")["gateway"]  # another CA
    cert, key = tmp_path / "edge.pem", tmp_path / "edge.key"
    cert.write_bytes(first.cert.read_bytes())
    key.write_bytes(first.key.read_bytes())
    metrics = CollectorRegistry()
    settings = GatewaySettings(
        grpc_port=_free_port(), http_port=0, metrics_port=0, bootstrap=False,
        consume_events=False, worker_probe_interval_s=0, instance_id="edge-reload",
        edge_tls_cert_file=str(cert), edge_tls_key_file=str(key))
    app = GatewayApp(settings, publisher=_NullPublisher(), registry=metrics,
                     serve_metrics=False)
    await app.start()

    async def code(ca: Path) -> grpc.StatusCode:
        async with grpc.aio.secure_channel(f"127.0.0.1:{settings.grpc_port}",
                                           grpc.ssl_channel_credentials(ca.read_bytes())) as ch:
            try:
                [m async for m in inference_pb2_grpc.InferenceStub(ch).Generate(
                    inference_pb2.GenerateRequest(adapter="a", prompt="p", max_tokens=1),
                    timeout=5)]
            except grpc.aio.AioRpcError as err:
                return err.code()
        return grpc.StatusCode.OK

    def edge_expiry() -> float | None:
        return metrics.get_sample_value(
            "loraplane_tls_certificate_expiry_timestamp_seconds", {"role": "edge"})

    try:
        assert await code(first.ca) == grpc.StatusCode.UNAUTHENTICATED  # served, no key
        assert edge_expiry() == x509.load_pem_x509_certificate(
            first.cert.read_bytes()).not_valid_after_utc.timestamp()
        for src, dst in ((second.cert, cert), (second.key, key)):
            tmp = dst.with_suffix(".tmp")
            tmp.write_bytes(src.read_bytes())
            tmp.replace(dst)
        assert await code(second.ca) == grpc.StatusCode.UNAUTHENTICATED  # the new one
        assert await code(first.ca) == grpc.StatusCode.UNAVAILABLE  # the old CA: no more
        assert edge_expiry() == x509.load_pem_x509_certificate(
            second.cert.read_bytes()).not_valid_after_utc.timestamp()
    finally:
        await app.stop(0.5)
