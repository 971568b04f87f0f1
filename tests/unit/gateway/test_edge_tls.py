"""TLS at the edge: the assembled gateway (no Kafka, no bootstrap) serving its public gRPC
and HTTP listeners with a certificate from settings; clients that trust the CA reach
it, plaintext ones do not, and ``loraplane generate`` trusts ``LORAPLANE_GATEWAY_CA_FILE``."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from prometheus_client import CollectorRegistry
from pydantic import ValidationError
from typer.testing import CliRunner

from loraplane.cli.main import app as cli_app
from loraplane.gateway.app import GatewayApp
from loraplane.gateway.settings import GatewaySettings
from loraplane.shared.tls import (
    CertExpiry,
    EdgeCertificate,
    TlsConfigError,
    edge_server_credentials,
)
from loraplane.stack.certs import CertFiles, ensure_dev_pki, issue, make_ca
from loraplane.v1 import inference_pb2, inference_pb2_grpc
from tests.support.ports import free_port

from .harness import NullPublisher, bare_gateway


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, CertFiles]:
    return ensure_dev_pki(tmp_path / "pki")


@pytest.fixture
async def gateway(pki: dict[str, CertFiles]) -> AsyncIterator[GatewayApp]:
    cert = pki["gateway"]
    async with bare_gateway("edge-tls", edge_tls_cert_file=str(cert.cert),
                            edge_tls_key_file=str(cert.key)) as app:
        yield app


def test_settings_need_both_files_and_a_matching_pair(pki: dict[str, CertFiles]) -> None:
    with pytest.raises(ValidationError, match="LORAPLANE_GATEWAY_EDGE_TLS_KEY_FILE"):
        GatewaySettings(edge_tls_cert_file=str(pki["gateway"].cert))
    with pytest.raises(TlsConfigError, match="does not belong"):
        edge_server_credentials(str(pki["gateway"].cert), str(pki["worker"].key))
    with pytest.raises(TlsConfigError, match="cannot read"):
        edge_server_credentials(str(pki["gateway"].cert), "/nonexistent/key.pem")


def test_an_encrypted_key_is_refused_like_a_wrong_one(pki: dict[str, CertFiles],
                                                     tmp_path: Path) -> None:
    key = serialization.load_pem_private_key(pki["gateway"].key.read_bytes(), None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase")))
    with pytest.raises(TlsConfigError, match="cannot be used"):
        edge_server_credentials(str(pki["gateway"].cert), str(encrypted))


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
        grpc_port=free_port(), http_port=0, metrics_port=0, bootstrap=False,
        consume_events=False, worker_probe_interval_s=0, instance_id="edge-reload",
        edge_tls_cert_file=str(cert), edge_tls_key_file=str(key))
    app = GatewayApp(settings, publisher=NullPublisher(), registry=metrics,
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
            "loraplane_tls_certificate_expiry_timestamp_seconds", {"role": "edge_grpc"})

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


def _install(src_cert: bytes, src_key: bytes, cert: Path, key: Path) -> None:
    """Drop a pair in place the way a rotation does (write aside, rename over)."""
    for data, dst in ((src_cert, cert), (src_key, key)):
        tmp = dst.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(dst)


async def _served_certificate(port: int, ca: Path) -> x509.Certificate:
    """The certificate a new TLS connection to ``port`` is given (verified against ``ca``)."""
    client = ssl.create_default_context(cafile=str(ca))
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_the_https_edge_certificate_is_reloaded_without_a_restart(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The HTTPS listener (uvicorn) serves a rotated certificate to new connections while a
    connection opened before keeps working; a bad pair dropped in place is refused,
    counted and the previous certificate kept; the expiry gauge follows what is served."""
    caplog.set_level(logging.DEBUG)
    now = dt.datetime.now(dt.UTC)
    ca_cert, ca_key = make_ca(now=now)
    ca = tmp_path / "ca.pem"
    ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))

    def pem(days: int) -> tuple[x509.Certificate, bytes, bytes]:
        cert, key = issue("gateway", ca_cert, ca_key, not_after=now + dt.timedelta(days=days))
        return cert, cert.public_bytes(serialization.Encoding.PEM), key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption())

    first, second, third = pem(10), pem(20), pem(30)
    cert, key = tmp_path / "edge.pem", tmp_path / "edge.key"
    _install(first[1], first[2], cert, key)
    metrics = CollectorRegistry()
    settings = GatewaySettings(
        grpc_port=free_port(), http_port=free_port(), metrics_port=0, bootstrap=False,
        consume_events=False, worker_probe_interval_s=0, instance_id="edge-https-reload",
        edge_tls_cert_file=str(cert), edge_tls_key_file=str(key),
        edge_tls_check_interval_s=0.05)
    app = GatewayApp(settings, publisher=NullPublisher(), registry=metrics,
                     serve_metrics=False)
    await app.start()
    port = app.http_port

    def edge_expiry() -> float | None:
        return metrics.get_sample_value(
            "loraplane_tls_certificate_expiry_timestamp_seconds", {"role": "edge_https"})

    def reloads(result: str) -> float:
        return metrics.get_sample_value(
            "loraplane_tls_certificate_reloads_total",
            {"listener": "edge_https", "result": result}) or 0.0

    async def until(done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 10
        while not done():
            assert time.monotonic() < deadline, "the HTTPS listener did not look at its files"
            await asyncio.sleep(0.02)

    async def models_status(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: gateway\r\n\r\n")
        await writer.drain()
        status = (await reader.readline()).split()[1]
        length = 0
        while (line := await reader.readline()) != b"\r\n":
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        await reader.readexactly(length)  # the whole response: the connection stays usable
        return status

    try:
        assert (await _served_certificate(port, ca)).serial_number == first[0].serial_number
        assert edge_expiry() == first[0].not_valid_after_utc.timestamp()
        before = await asyncio.open_connection(
            "127.0.0.1", port, ssl=ssl.create_default_context(cafile=str(ca)))
        assert await models_status(*before) == b"401"  # reached the API (no key given)

        _install(second[1], second[2], cert, key)  # rotation: a new serial and notAfter
        await until(lambda: reloads("loaded") == 1)
        assert (await _served_certificate(port, ca)).serial_number == second[0].serial_number
        assert edge_expiry() == second[0].not_valid_after_utc.timestamp()
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(ca))) as c:
            assert (await c.get(f"https://127.0.0.1:{port}/v1/models")).status_code == 401
        assert await models_status(*before) == b"401"  # the open connection keeps going
        before[1].close()

        # a pair that does not match (the third certificate, the second key), then a
        # half-written key: each refused and counted, the second certificate still served
        _install(third[1], second[2], cert, key)
        await until(lambda: reloads("refused") == 1)
        assert (await _served_certificate(port, ca)).serial_number == second[0].serial_number
        _install(third[1], third[2][:len(third[2]) // 2], cert, key)
        await until(lambda: reloads("refused") == 2)
        assert (await _served_certificate(port, ca)).serial_number == second[0].serial_number
        assert edge_expiry() == second[0].not_valid_after_utc.timestamp()
        assert reloads("loaded") == 1

        _install(third[1], third[2], cert, key)  # the rotation completed
        await until(lambda: reloads("loaded") == 2)
        assert (await _served_certificate(port, ca)).serial_number == third[0].serial_number
        assert edge_expiry() == third[0].not_valid_after_utc.timestamp()
    finally:
        await app.stop(0.5)
    assert app._tasks.edge_https is not None and app._tasks.edge_https.done()
    logged = caplog.text
    assert "cannot be loaded" in logged and "reloaded" in logged
    assert "PRIVATE KEY" not in logged
    for _, _, private in (first, second, third):
        body = b"".join(private.splitlines()[1:-1]).decode()
        assert body[:40] not in logged and body[-40:] not in logged


@pytest.mark.parametrize("memfd", [True, False], ids=["memfd", "tempfile"])
def test_edge_certificate_checks_and_leaves_no_key_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memfd: bool) -> None:
    """:class:`EdgeCertificate` alone: ``check`` is ``False`` while nothing changed, ``True``
    once a new pair is served; without ``memfd`` (not Linux) the key goes through a private
    temporary file that is gone afterwards."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    if not memfd:
        monkeypatch.delattr(os, "memfd_create")
    first, second = ensure_dev_pki(tmp_path / "a"), ensure_dev_pki(tmp_path / "b")
    cert, key = tmp_path / "edge.pem", tmp_path / "edge.key"
    _install(first["gateway"].cert.read_bytes(), first["gateway"].key.read_bytes(), cert, key)
    metrics = CollectorRegistry()
    edge = EdgeCertificate(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), str(cert), str(key),
                           expiry=CertExpiry.for_registry(metrics))
    assert edge.check() is False
    _install(second["gateway"].cert.read_bytes(), second["gateway"].key.read_bytes(),
             cert, key)
    assert edge.check() is True
    assert edge.check() is False
    assert list(scratch.iterdir()) == []
    assert metrics.get_sample_value("loraplane_tls_certificate_expiry_timestamp_seconds",
                                    {"role": "edge_https"}) == x509.load_pem_x509_certificate(
        second["gateway"].cert.read_bytes()).not_valid_after_utc.timestamp()


def test_a_rotation_to_another_key_type_is_refused_not_half_served(tmp_path: Path) -> None:
    """OpenSSL keeps one certificate per key type in a context: an RSA pair loaded over an
    EC one would leave the EC certificate served to every client that accepts it, while
    the counter said ``loaded``. So a change of key type is refused (counted, the old pair
    kept, the served certificate unchanged) and takes a restart."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    first = ensure_dev_pki(tmp_path / "a")
    cert, key = tmp_path / "edge.pem", tmp_path / "edge.key"
    _install(first["gateway"].cert.read_bytes(), first["gateway"].key.read_bytes(), cert, key)
    metrics = CollectorRegistry()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    edge = EdgeCertificate(context, str(cert), str(key), expiry=CertExpiry.for_registry(metrics))
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gateway")])
    now = dt.datetime.now(dt.UTC)
    rsa_cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                .public_key(rsa_key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now).not_valid_after(now + dt.timedelta(days=5))
                .sign(rsa_key, hashes.SHA256()))
    _install(rsa_cert.public_bytes(serialization.Encoding.PEM),
             rsa_key.private_bytes(serialization.Encoding.PEM,
                                   serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()), cert, key)
    assert edge.check() is False
    assert metrics.get_sample_value("loraplane_tls_certificate_reloads_total",
                                    {"listener": "edge_https", "result": "refused"}) == 1
    assert metrics.get_sample_value("loraplane_tls_certificate_expiry_timestamp_seconds",
                                    {"role": "edge_https"}) == x509.load_pem_x509_certificate(
        first["gateway"].cert.read_bytes()).not_valid_after_utc.timestamp()
    # an EC pair again (the rotation done right) is taken
    second = ensure_dev_pki(tmp_path / "b")
    _install(second["gateway"].cert.read_bytes(), second["gateway"].key.read_bytes(),
             cert, key)
    assert edge.check() is True
