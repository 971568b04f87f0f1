"""Mutual TLS of the internal APIs over a real gRPC server on loopback: the stack's dev CA
(``stack/certs.py``), the shared credentials, the authorization table and its refusal
counter, rotation without a restart and the expiry gauge (``shared/tls.py``)."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from prometheus_client import CollectorRegistry

from loraplane.registry.auth import OperatorAuth, admin_rules
from loraplane.shared.grpcutil import Service, build_server
from loraplane.shared.metrics import RpcMetrics
from loraplane.shared.tls import (
    GATEWAY,
    OPERATOR,
    AuthzInterceptor,
    TlsConfigError,
    TlsFiles,
    allow,
    secure_or_insecure_aio_channel,
    server_security,
)
from loraplane.stack.certs import (
    DEV_IDENTITIES,
    RENEW_BEFORE,
    VALIDITY,
    CertFiles,
    ensure_dev_pki,
)
from loraplane.v1 import cache_pb2, cache_pb2_grpc
from tests.support.tls import make_pki

CACHE = "/loraplane.v1.CacheManager/"
TOKEN = "operator-token-0123456789"


def tls(files: CertFiles) -> TlsFiles:
    return TlsFiles(files.ca, files.cert, files.key)


class _Api(cache_pb2_grpc.CacheManagerServicer):
    """A servicer that counts what reached it."""

    def __init__(self) -> None:
        self.calls = 0

    async def ListWorkers(self, request: cache_pb2.ListWorkersRequest,
                          context: grpc.aio.ServicerContext) -> cache_pb2.ListWorkersResponse:
        self.calls += 1
        return cache_pb2.ListWorkersResponse()

    async def GetPlacement(self, request: cache_pb2.GetPlacementRequest,
                           context: grpc.aio.ServicerContext
                           ) -> cache_pb2.GetPlacementResponse:
        self.calls += 1
        return cache_pb2.GetPlacementResponse()


@dataclass
class Served:
    port: int
    api: _Api
    registry: CollectorRegistry

    def refusals(self, reason: str, rpc: str = "ListWorkers") -> float:
        value = self.registry.get_sample_value(
            "loraplane_grpc_auth_refusals_total",
            {"service": "loraplane.v1.CacheManager", "rpc": rpc, "reason": reason})
        return value or 0.0


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, CertFiles]:
    return ensure_dev_pki(tmp_path / "pki")


async def _serve(files: TlsFiles | None, rules: dict[str, object]
                 ) -> tuple[Served, object]:
    registry = CollectorRegistry()
    api = _Api()
    credentials, interceptors = server_security(files, rules, registry=registry)  # type: ignore[arg-type]
    if files is None:  # plaintext: only a token rule can pass (the registry's case)
        interceptors = [AuthzInterceptor(rules, registry=registry)]  # type: ignore[arg-type]
    server = build_server(
        [Service(cache_pb2_grpc.add_CacheManagerServicer_to_server, api,
                 "loraplane.v1.CacheManager")],
        port=0, metrics=RpcMetrics.for_registry(registry), credentials=credentials,
        interceptors=interceptors)
    await server.start()
    return Served(server.port, api, registry), server


@pytest.fixture
async def served(pki: dict[str, CertFiles]) -> AsyncIterator[Served]:
    s, server = await _serve(tls(pki["cache-manager"]), {CACHE: allow(GATEWAY)})
    try:
        yield s
    finally:
        await server.stop(0)  # type: ignore[attr-defined]


async def _call(port: int, creds: TlsFiles | None, *, metadata: tuple[tuple[str, str], ...] = (),
                server: str = "cache-manager") -> grpc.StatusCode:
    async with secure_or_insecure_aio_channel(f"127.0.0.1:{port}", creds,
                                              server=server) as ch:
        try:
            await cache_pb2_grpc.CacheManagerStub(ch).ListWorkers(
                cache_pb2.ListWorkersRequest(), metadata=metadata, timeout=5)
        except grpc.aio.AioRpcError as err:
            return err.code()
    return grpc.StatusCode.OK


def test_dev_pki_names_each_identity_and_is_reused(tmp_path: Path) -> None:
    now = dt.datetime.now(dt.UTC)
    first = ensure_dev_pki(tmp_path / "pki", now=now)
    assert sorted(first) == sorted(DEV_IDENTITIES)
    ca = x509.load_pem_x509_certificate(first["gateway"].ca.read_bytes())
    for identity, files in first.items():
        cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == identity
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.UniformResourceIdentifier) == [
            f"spiffe://loraplane/{identity}"]
        assert identity in san.get_values_for_type(x509.DNSName)
        assert cert.issuer == ca.subject
        assert oct(files.key.stat().st_mode & 0o777) == "0o600"
    before = {i: f.cert.read_bytes() for i, f in first.items()}
    again = ensure_dev_pki(tmp_path / "pki", now=now + dt.timedelta(days=1))
    assert {i: f.cert.read_bytes() for i, f in again.items()} == before
    # close to expiry: everything is issued again (the CA too)
    renewed = ensure_dev_pki(tmp_path / "pki", now=now + VALIDITY - RENEW_BEFORE / 2)
    assert all(renewed[i].cert.read_bytes() != before[i] for i in before)


def test_settings_need_all_three_files_and_readable_ones(tmp_path: Path,
                                                         pki: dict[str, CertFiles]) -> None:
    assert TlsFiles.from_settings("", "", "") is None
    with pytest.raises(TlsConfigError, match="LORAPLANE_TLS_KEY_FILE"):
        TlsFiles.from_settings(str(pki["worker"].ca), str(pki["worker"].cert), "")
    with pytest.raises(TlsConfigError, match="cannot read.*missing.pem"):
        TlsFiles.from_settings(str(pki["worker"].ca), str(tmp_path / "missing.pem"),
                               str(pki["worker"].key))


async def test_an_allowed_identity_is_served(served: Served, pki: dict[str, CertFiles]) -> None:
    assert await _call(served.port, tls(pki["gateway"])) == grpc.StatusCode.OK
    assert served.api.calls == 1


async def test_another_identity_is_refused_and_counted(
        served: Served, pki: dict[str, CertFiles]) -> None:
    async with secure_or_insecure_aio_channel(f"127.0.0.1:{served.port}", tls(pki["worker"]),
                                              server="cache-manager") as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await cache_pb2_grpc.CacheManagerStub(ch).ListWorkers(
                cache_pb2.ListWorkersRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "'worker'" in (err.value.details() or "") and "allowed: gateway" in (
        err.value.details() or "")
    assert served.refusals("identity_not_allowed") == 1
    assert served.api.calls == 0


async def test_an_unlisted_method_is_refused(served: Served, pki: dict[str, CertFiles]) -> None:
    # the table names the whole service for the gateway: GetPlacement is allowed too
    async with secure_or_insecure_aio_channel(f"127.0.0.1:{served.port}", tls(pki["gateway"]),
                                              server="cache-manager") as ch:
        await cache_pb2_grpc.CacheManagerStub(ch).GetPlacement(
            cache_pb2.GetPlacementRequest(), timeout=5)
    assert served.api.calls == 1
    # a table naming one method only: any other is refused
    s, server = await _serve(tls(pki["cache-manager"]),
                             {f"{CACHE}ListWorkers": allow(GATEWAY)})
    try:
        async with secure_or_insecure_aio_channel(f"127.0.0.1:{s.port}", tls(pki["gateway"]),
                                                  server="cache-manager") as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await cache_pb2_grpc.CacheManagerStub(ch).GetPlacement(
                    cache_pb2.GetPlacementRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert s.refusals("no_rule", rpc="GetPlacement") == 1
    finally:
        await server.stop(0)  # type: ignore[attr-defined]


async def test_no_certificate_other_ca_or_expired_never_reach_the_api(
        tmp_path: Path, served: Served, pki: dict[str, CertFiles]) -> None:
    served_ca = pki["gateway"].ca.read_bytes()
    refused = make_pki(tmp_path)  # of the served CA (``pki``'s files in tmp_path/pki, reused)
    assert refused.ca == served_ca
    no_cert = TlsFiles(pki["gateway"].ca, pki["gateway"].cert, pki["gateway"].key)
    # the handshake refuses them: grpcio gives the server no hook there (see shared/tls.py)
    assert await _call(served.port, refused.foreign) == grpc.StatusCode.UNAVAILABLE
    assert await _call(served.port, refused.expired) == grpc.StatusCode.UNAVAILABLE
    assert await _call(served.port, None,  # plaintext, a tenant's key as credential
                       metadata=(("authorization", "Bearer lp_tenant_key"),)
                       ) == grpc.StatusCode.UNAVAILABLE
    async with grpc.aio.secure_channel(  # TLS without a client certificate
            f"127.0.0.1:{served.port}", grpc.ssl_channel_credentials(no_cert.ca.read_bytes()),
            options=[("grpc.ssl_target_name_override", "cache-manager")]) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await cache_pb2_grpc.CacheManagerStub(ch).ListWorkers(
                cache_pb2.ListWorkersRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert served.api.calls == 0
    # and the client checks the server: a gateway dialling a "worker" refuses this one
    assert await _call(served.port, tls(pki["gateway"]), server="worker"
                       ) == grpc.StatusCode.UNAVAILABLE


async def test_operator_certificate_or_token_on_the_registry_rules(
        pki: dict[str, CertFiles]) -> None:
    rules = {f"/{'loraplane.v1.CacheManager'}/": admin_rules(OperatorAuth(TOKEN))[
        "/loraplane.v1.RegistryAdmin/"]}
    s, server = await _serve(tls(pki["cache-manager"]), rules)
    try:
        bearer = (("authorization", f"Bearer {TOKEN}"),)
        assert await _call(s.port, tls(pki[OPERATOR])) == grpc.StatusCode.OK
        assert await _call(s.port, tls(pki[GATEWAY]), metadata=bearer) == grpc.StatusCode.OK
        assert await _call(s.port, tls(pki[GATEWAY])) == grpc.StatusCode.PERMISSION_DENIED
        assert s.refusals("missing_token") == 1
        assert await _call(s.port, tls(pki[GATEWAY]),
                           metadata=(("authorization", "Bearer lp_tenant_key_123"),)
                           ) == grpc.StatusCode.PERMISSION_DENIED
        assert s.refusals("bad_token") == 1
        assert s.api.calls == 2
    finally:
        await server.stop(0)  # type: ignore[attr-defined]
    # TLS off (plaintext): the token alone, as before mutual TLS
    s, server = await _serve(None, rules)
    try:
        assert await _call(s.port, None) == grpc.StatusCode.UNAUTHENTICATED
        assert s.refusals("missing_token") == 1
        assert await _call(s.port, None, metadata=(("authorization", f"Bearer {TOKEN}"),)
                           ) == grpc.StatusCode.OK
    finally:
        await server.stop(0)  # type: ignore[attr-defined]


async def test_rotation_without_restart_and_the_expiry_gauge(tmp_path: Path) -> None:
    first = ensure_dev_pki(tmp_path / "a")
    served_files = TlsFiles(tmp_path / "live-ca.pem", tmp_path / "live.pem", tmp_path / "live.key")

    def install(files: CertFiles) -> None:
        for src, dst in ((files.ca, served_files.ca), (files.cert, served_files.cert),
                         (files.key, served_files.key)):
            tmp = dst.with_suffix(".tmp")
            tmp.write_bytes(src.read_bytes())
            os.replace(tmp, dst)

    install(first["cache-manager"])
    s, server = await _serve(served_files, {CACHE: allow(GATEWAY)})
    try:
        gauge = s.registry.get_sample_value(
            "loraplane_tls_certificate_expiry_timestamp_seconds", {"role": "cert"})
        cert = x509.load_pem_x509_certificate(first["cache-manager"].cert.read_bytes())
        assert gauge == cert.not_valid_after_utc.timestamp()
        assert await _call(s.port, tls(first[GATEWAY])) == grpc.StatusCode.OK
        # a new CA and certificate, dropped in place: the next connection uses them
        second = ensure_dev_pki(tmp_path / "b")
        install(second["cache-manager"])
        assert await _call(s.port, tls(second[GATEWAY])) == grpc.StatusCode.OK
        assert await _call(s.port, tls(first[GATEWAY])) == grpc.StatusCode.UNAVAILABLE
        cert = x509.load_pem_x509_certificate(second["cache-manager"].cert.read_bytes())
        assert s.registry.get_sample_value(
            "loraplane_tls_certificate_expiry_timestamp_seconds", {"role": "cert"}
        ) == cert.not_valid_after_utc.timestamp()
        # a broken file keeps the previous certificate serving
        served_files.key.write_bytes(b"not a key")
        assert await _call(s.port, tls(second[GATEWAY])) == grpc.StatusCode.OK
    finally:
        await server.stop(0)  # type: ignore[attr-defined]


def test_the_stack_gives_each_service_its_own_identity(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from loraplane.stack.services import SERVICES
    from loraplane.stack.settings import StackSettings
    from loraplane.stack.supervisor import (
        Supervisor,
        edge_client_env,
        edge_tls_env,
        replica_env,
        service_env,
    )

    for var in ("LORAPLANE_STACK_TLS", "LORAPLANE_STACK_S3_TLS", "LORAPLANE_STACK_EDGE_TLS"):
        monkeypatch.delenv(var, raising=False)
    s = StackSettings(profile="run", port_base=34100, data_dir=tmp_path / "stack")
    shared = service_env(s)  # what the CLI, the seed and demo.env get: the operator
    assert shared["LORAPLANE_TLS_CERT_FILE"].endswith("/pki/operator.pem")
    for spec in SERVICES:
        for replica in range(spec.replicas(s)):
            env = replica_env(s, spec, replica)
            assert env["LORAPLANE_TLS_CERT_FILE"] == str(s.root / "pki" / f"{spec.name}.pem")
            assert env["LORAPLANE_TLS_KEY_FILE"] == str(s.root / "pki" / f"{spec.name}.key")
            if spec.name != "gateway":
                assert "LORAPLANE_GATEWAY_EDGE_TLS_CERT_FILE" not in env

    # edge TLS: on by default in the run profile with tls (make run, make stress)
    assert s.edge_tls is True
    gateway = next(spec for spec in SERVICES if spec.name == "gateway")
    for replica in range(gateway.replicas(s)):  # every process on the shared public ports
        env = replica_env(s, gateway, replica)
        assert env["LORAPLANE_GATEWAY_EDGE_TLS_CERT_FILE"] == str(s.root / "pki" / "gateway.pem")
        assert env["LORAPLANE_GATEWAY_EDGE_TLS_KEY_FILE"] == str(s.root / "pki" / "gateway.key")
    demo = Supervisor(s).demo_env({})
    assert demo["LORAPLANE_GATEWAY_HTTP"].startswith("https://")
    assert demo["LORAPLANE_GATEWAY_CA_FILE"] == str(s.root / "pki" / "ca.pem")

    # turned off: plaintext at the edge, demo.env names no CA
    monkeypatch.setenv("LORAPLANE_STACK_EDGE_TLS", "false")
    plain = StackSettings(profile="run", port_base=34100, data_dir=tmp_path / "stack")
    monkeypatch.delenv("LORAPLANE_STACK_EDGE_TLS")
    assert plain.tls and plain.edge_tls is False
    assert "LORAPLANE_GATEWAY_EDGE_TLS_CERT_FILE" not in replica_env(plain, gateway, 0)
    demo = Supervisor(plain).demo_env({})
    assert demo["LORAPLANE_GATEWAY_HTTP"].startswith("http://")
    assert "LORAPLANE_GATEWAY_CA_FILE" not in demo

    # the test profile too: the suite's gateways serve TLS and its tenant clients trust
    # the dev CA (tests/support/tls.py), plaintext only when asked
    test = StackSettings(profile="test", port_base=34100, data_dir=tmp_path / "stack")
    assert test.tls and test.edge_tls is True
    assert edge_tls_env(test) == {
        "LORAPLANE_GATEWAY_EDGE_TLS_CERT_FILE": str(test.root / "pki" / "gateway.pem"),
        "LORAPLANE_GATEWAY_EDGE_TLS_KEY_FILE": str(test.root / "pki" / "gateway.key")}
    assert edge_client_env(test) == {"LORAPLANE_GATEWAY_CA_FILE": str(test.ca_file)}
    test_plain = StackSettings(profile="test", port_base=34100, data_dir=tmp_path / "stack",
                               edge_tls=False)
    assert test_plain.tls and test_plain.edge_tls is False
    assert "LORAPLANE_GATEWAY_EDGE_TLS_CERT_FILE" not in replica_env(test_plain, gateway, 0)
    assert edge_tls_env(test_plain) == {} and edge_client_env(test_plain) == {}

    off = StackSettings(profile="run", port_base=34100, data_dir=tmp_path / "stack", tls=False)
    assert off.edge_tls is False
    assert not any(k.startswith("LORAPLANE_TLS_") for k in service_env(off))
    assert not any(k.startswith(("LORAPLANE_TLS_", "LORAPLANE_GATEWAY_EDGE_TLS"))
                   for spec in SERVICES for k in replica_env(off, spec, 0))
    assert "LORAPLANE_GATEWAY_CA_FILE" not in Supervisor(off).demo_env({})
    with pytest.raises(ValueError, match="edge_tls needs tls"):
        StackSettings(profile="run", port_base=34100, data_dir=tmp_path / "stack", tls=False,
                      edge_tls=True)


async def test_no_key_or_token_in_metrics_or_logs(
        tmp_path: Path, pki: dict[str, CertFiles], caplog: pytest.LogCaptureFixture) -> None:
    from prometheus_client import generate_latest

    rules = {CACHE: admin_rules(OperatorAuth(TOKEN))["/loraplane.v1.RegistryAdmin/"]}
    live = TlsFiles(tmp_path / "ca.pem", tmp_path / "c.pem", tmp_path / "c.key")
    for src, dst in ((pki["cache-manager"].ca, live.ca), (pki["cache-manager"].cert, live.cert),
                     (pki["cache-manager"].key, live.key)):
        dst.write_bytes(src.read_bytes())
    caplog.set_level("DEBUG")
    s, server = await _serve(live, rules)
    try:
        wrong = "lp_tenant_key_that_must_not_leak_42"
        for md in ((("authorization", f"Bearer {wrong}"),), ()):
            await _call(s.port, tls(pki[GATEWAY]), metadata=md)
        live.key.write_bytes(b"-----BEGIN PRIVATE KEY-----\nnot a key\n")  # a bad rotation
        await _call(s.port, tls(pki[OPERATOR]))
        assert s.refusals("bad_token") == 1 and s.refusals("missing_token") == 1
    finally:
        await server.stop(0)  # type: ignore[attr-defined]
    exported = generate_latest(s.registry).decode()
    logged = caplog.text + "".join(r.getMessage() for r in caplog.records)
    assert "keeping the previous certificate" in logged  # the bad rotation was noticed
    secrets = [TOKEN, wrong, "PRIVATE KEY", "not a key",
               pki["cache-manager"].key.read_text().splitlines()[1]]
    for text in (exported, logged):
        assert not [x for x in secrets if x in text]
