"""Mutual TLS for the services a test runs itself, as ``make run`` runs them (issue 23).

The test stack writes its dev CA and one certificate per identity under
``<stack data dir>/pki`` when it starts (``stack/certs.py``; ``StackSettings.tls``, on by
default). A service a test builds in its own process (``WorkerApp``, ``RegistryApp``,
``GatewayApp``) or starts as a process (``Launcher``) serves and dials with its own
identity's certificate, and a test calling an internal API presents the identity of the
real caller (the authorization tables allow per identity: only gateways and the
cache-manager may call ``WorkerInternal.Generate``, the cache-manager's read API is the
gateway's and the operator's, the registry's admin API the operator's):

* :func:`tls_settings` / :func:`tls_env`: the ``tls_*_file`` settings fields / the
  ``LORAPLANE_TLS_*`` variables of one identity (``WorkerSettings(**tls_settings(stack,
  WORKER), ...)``);
* :func:`tls_files`: its :class:`~loraplane.shared.tls.TlsFiles` (``WorkerPool(tls=...)``);
* :func:`internal_channel`: an asyncio channel to an internal API as ``caller``, checking
  the server is ``server`` (:func:`blocking_internal_channel`: the blocking twin).

Each follows the stack: with ``LORAPLANE_STACK_TLS=false`` (no CA) the fields are empty,
the environment and the files ``None``, and the channels plaintext, as the stack's own
services then run.

The tenant-facing ports of a test's gateway (public gRPC, HTTP / OpenAI) are not
internal: there the gateway presents the dev CA's ``gateway`` certificate without asking
for one (tenants present API keys), as ``make run``'s do - ``StackSettings.edge_tls``, on
with ``tls`` in the ``test`` profile too. Every tenant client of the suite trusts the dev
CA and checks that the server's certificate names ``gateway`` (every dev certificate names
``127.0.0.1``, so the address alone would take any identity's):

* :func:`edge_tls_settings` / :func:`edge_tls_env`: the ``edge_tls_*_file`` fields of an
  in-process gateway's settings / the ``LORAPLANE_GATEWAY_EDGE_TLS_*`` variables of a
  gateway process (the supervisor's own :func:`~loraplane.stack.supervisor.edge_tls_env`);
* :func:`tenant_env`: ``LORAPLANE_GATEWAY_CA_FILE`` of a tenant's CLI (``loraplane
  generate``) or client process;
* :func:`tenant_channel` (:func:`blocking_tenant_channel`, :func:`tenant_channel_to` for a
  process holding only the CA's path): a channel to a public gRPC port;
* :func:`tenant_url`, :func:`tenant_http` (:func:`blocking_tenant_http`): the base URL of a
  public HTTP port and an ``httpx`` client of it (the official ``openai`` client takes it
  as ``http_client``).

With ``LORAPLANE_STACK_EDGE_TLS=false`` (or no TLS at all) these say plaintext: no edge
certificate, an empty CA variable, ``http://`` and insecure channels - the same tests then
run against a plaintext edge.

:func:`make_pki` is a private CA of a test's own (beside the session's): the platform's
identities, and a ``gateway`` certificate of another CA and an expired one of this CA,
the certificates a handshake must refuse.
"""

from __future__ import annotations

import datetime as dt
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from loraplane.shared.tls import (
    GATEWAY,
    TLS_ENV,
    TlsFiles,
    edge_aio_channel,
    edge_channel,
    secure_or_insecure_aio_channel,
    secure_or_insecure_channel,
)
from loraplane.stack import supervisor
from loraplane.stack.certs import DEV_IDENTITIES, ensure_dev_pki, issue, make_ca, write_identity
from loraplane.stack.stack import Stack

GATEWAY_CA_ENV = "LORAPLANE_GATEWAY_CA_FILE"
"""The CA a tenant's client trusts at the edge (demo.env, ``loraplane generate``)."""


def settings_of(files: TlsFiles | None) -> dict[str, str]:
    """The ``tls_*_file`` fields of a service's settings presenting ``files`` (all three
    empty when ``None``: plaintext)."""
    if files is None:
        return dict.fromkeys(TLS_ENV, "")
    return {"tls_ca_file": str(files.ca), "tls_cert_file": str(files.cert),
            "tls_key_file": str(files.key)}


def env_of(files: TlsFiles | None) -> dict[str, str]:
    """The ``LORAPLANE_TLS_*`` variables of a service process presenting ``files``
    (none when ``None``: plaintext)."""
    if files is None:
        return {}
    return {TLS_ENV[name]: value for name, value in settings_of(files).items()}


def tls_files(stack: Stack, identity: str) -> TlsFiles | None:
    """``identity``'s certificate and key of the stack's dev CA (``None``: the stack runs
    without TLS)."""
    s = stack.settings
    if not s.tls:
        return None
    return TlsFiles(s.ca_file, s.pki_dir / f"{identity}.pem", s.pki_dir / f"{identity}.key")


def tls_settings(stack: Stack, identity: str) -> dict[str, str]:
    """The ``tls_*_file`` settings fields of a service that is ``identity`` on the stack."""
    return settings_of(tls_files(stack, identity))


def tls_env(stack: Stack, identity: str) -> dict[str, str]:
    """The ``LORAPLANE_TLS_*`` variables of a service process that is ``identity``."""
    return env_of(tls_files(stack, identity))


def internal_channel(stack: Stack, address: str, *, caller: str,
                     server: str) -> grpc.aio.Channel:
    """An asyncio channel to the internal API at ``address`` presenting ``caller``'s
    certificate and checking the server's is ``server``'s (the platform's own channel:
    ``secure_or_insecure_aio_channel``, reconnecting within a second)."""
    return secure_or_insecure_aio_channel(address, tls_files(stack, caller), server=server)


def blocking_internal_channel(stack: Stack, address: str, *, caller: str,
                              server: str) -> grpc.Channel:
    """The blocking-API twin of :func:`internal_channel`."""
    return secure_or_insecure_channel(address, tls_files(stack, caller), server=server)


def edge_tls_env(stack: Stack) -> dict[str, str]:
    """``LORAPLANE_GATEWAY_EDGE_TLS_*`` of a gateway process serving its public ports as
    the stack's own gateways do (none: a plaintext edge)."""
    return supervisor.edge_tls_env(stack.settings)


def edge_tls_settings(stack: Stack) -> dict[str, str]:
    """The ``edge_tls_cert_file`` / ``edge_tls_key_file`` fields of an in-process
    gateway's settings (both empty: a plaintext edge)."""
    env = edge_tls_env(stack)
    return {"edge_tls_cert_file": env.get("LORAPLANE_GATEWAY_EDGE_TLS_CERT_FILE", ""),
            "edge_tls_key_file": env.get("LORAPLANE_GATEWAY_EDGE_TLS_KEY_FILE", "")}


def edge_ca_file(stack: Stack) -> Path | None:
    """The CA a tenant trusts at the stack's edge (``None``: plaintext)."""
    ca = supervisor.edge_client_env(stack.settings).get(GATEWAY_CA_ENV, "")
    return Path(ca) if ca else None


def tenant_env(stack: Stack) -> dict[str, str]:
    """``LORAPLANE_GATEWAY_CA_FILE`` of a tenant's client process or CLI call: the dev CA,
    or empty with a plaintext edge (set either way: a value in the caller's own
    environment must not leak in)."""
    ca = edge_ca_file(stack)
    return {GATEWAY_CA_ENV: str(ca) if ca else ""}


def tenant_channel_to(address: str, ca_file: Path | str | None, *,
                      options: Iterable[tuple[str, Any]] = ()) -> grpc.aio.Channel:
    """An asyncio channel to a gateway's public gRPC port at ``address``: TLS trusting
    ``ca_file`` and checking the certificate names ``gateway``, no client certificate;
    plaintext when ``ca_file`` is empty. The platform's channel options
    (:func:`~loraplane.shared.tls.channel_options`: a dropped connection is dialled again
    within a second; the handshake keeps gRPC's own connect deadline), ``options`` on
    top."""
    return edge_aio_channel(address, Path(ca_file).read_bytes() if ca_file else None,
                            server=GATEWAY, options=options)


def tenant_channel(stack: Stack, address: str, *,
                   options: Iterable[tuple[str, Any]] = ()) -> grpc.aio.Channel:
    """A tenant's asyncio channel to the public gRPC port at ``address`` of a gateway
    serving as the stack's do (:func:`tenant_channel_to` with the stack's edge CA)."""
    return tenant_channel_to(address, edge_ca_file(stack), options=options)


def blocking_tenant_channel(stack: Stack, address: str, *,
                            options: Iterable[tuple[str, Any]] = ()) -> grpc.Channel:
    """The blocking-API twin of :func:`tenant_channel`."""
    ca = edge_ca_file(stack)
    return edge_channel(address, ca.read_bytes() if ca else None, server=GATEWAY,
                        options=options)


def tenant_url(stack: Stack, port: int) -> str:
    """The base URL of a gateway's public HTTP port: ``https://`` with edge TLS."""
    scheme = "https" if edge_ca_file(stack) else "http"
    return f"{scheme}://127.0.0.1:{port}"


def tenant_ssl_context(stack: Stack) -> ssl.SSLContext | None:
    """What a tenant's HTTPS client verifies the gateway with: the dev CA, hostname
    checked (``None``: plaintext edge)."""
    ca = edge_ca_file(stack)
    return None if ca is None else ssl.create_default_context(cafile=str(ca))


class _AsyncServerName(httpx.AsyncHTTPTransport):
    """HTTPS checking the certificate names ``name`` (as SNI and hostname), whatever
    address the URL dials."""

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._name = name

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.extensions = {**request.extensions, "sni_hostname": self._name}
        return await super().handle_async_request(request)


class _ServerName(httpx.HTTPTransport):
    """The blocking twin of :class:`_AsyncServerName`."""

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._name = name

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.extensions = {**request.extensions, "sni_hostname": self._name}
        return super().handle_request(request)


def tenant_http(stack: Stack, **kwargs: Any) -> httpx.AsyncClient:
    """A tenant's ``httpx.AsyncClient`` of a gateway's public HTTP port (URLs from
    :func:`tenant_url`): with edge TLS it trusts the dev CA and checks the certificate
    names ``gateway``; ``kwargs`` as ``httpx.AsyncClient`` takes them (``base_url``,
    ``timeout``)."""
    context = tenant_ssl_context(stack)
    if context is None:
        return httpx.AsyncClient(**kwargs)
    return httpx.AsyncClient(transport=_AsyncServerName(GATEWAY, verify=context), **kwargs)


def blocking_tenant_http(stack: Stack, **kwargs: Any) -> httpx.Client:
    """The blocking twin of :func:`tenant_http`."""
    context = tenant_ssl_context(stack)
    if context is None:
        return httpx.Client(**kwargs)
    return httpx.Client(transport=_ServerName(GATEWAY, verify=context), **kwargs)


@dataclass(frozen=True)
class Pki:
    """A private CA's certificates (:func:`make_pki`)."""

    ours: dict[str, TlsFiles]
    """Identity -> its certificate of this CA."""
    foreign: TlsFiles
    """A ``gateway`` certificate of another CA (trusting this one)."""
    expired: TlsFiles
    """A ``gateway`` certificate of this CA, expired yesterday."""

    @property
    def ca(self) -> bytes:
        """This CA's certificate (PEM)."""
        return next(iter(self.ours.values())).ca.read_bytes()

    def of(self, identity: str) -> TlsFiles:
        return self.ours[identity]

    def env(self, identity: str) -> dict[str, str]:
        """The ``LORAPLANE_TLS_*`` variables of a process that is ``identity``."""
        return env_of(self.ours[identity])

    def settings(self, identity: str) -> dict[str, str]:
        """The ``tls_*_file`` settings fields of a service that is ``identity``."""
        return settings_of(self.ours[identity])


def make_pki(root: Path, identities: tuple[str, ...] = DEV_IDENTITIES) -> Pki:
    """A fresh CA under ``root/pki`` (as the stack writes it) with ``identities`` (which
    must include ``gateway``), and the two refused ``gateway`` certificates under
    ``root/foreign`` and ``root/expired``."""
    ours = ensure_dev_pki(root / "pki", identities)
    ca_file = ours[GATEWAY].ca
    ca_cert = x509.load_pem_x509_certificate(ca_file.read_bytes())
    ca_key = serialization.load_pem_private_key((root / "pki" / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    now = dt.datetime.now(dt.UTC)
    cert, key = issue(GATEWAY, ca_cert, ca_key, not_before=now - dt.timedelta(days=3),
                      not_after=now - dt.timedelta(days=1))
    expired = write_identity(root / "expired", GATEWAY, cert, key, ca_file)
    other_ca, other_key = make_ca("another CA")
    cert, key = issue(GATEWAY, other_ca, other_key)
    foreign = write_identity(root / "foreign", GATEWAY, cert, key, ca_file)
    return Pki({name: TlsFiles(f.ca, f.cert, f.key) for name, f in ours.items()},
               foreign=TlsFiles(foreign.ca, foreign.cert, foreign.key),
               expired=TlsFiles(expired.ca, expired.cert, expired.key))
