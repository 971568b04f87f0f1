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
services then run. The tenant-facing ports of a test's gateway are not internal: they
serve TLS only where the gateway is given an edge certificate (``edge_tls``, off in the
``test`` profile), and tenants present API keys, never certificates.

:func:`make_pki` is a private CA of a test's own (beside the session's): the platform's
identities, and a ``gateway`` certificate of another CA and an expired one of this CA,
the certificates a handshake must refuse.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from loraplane.shared.tls import (
    GATEWAY,
    TLS_ENV,
    TlsFiles,
    secure_or_insecure_aio_channel,
    secure_or_insecure_channel,
)
from loraplane.stack.certs import DEV_IDENTITIES, ensure_dev_pki, issue, make_ca, write_identity
from loraplane.stack.stack import Stack


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
