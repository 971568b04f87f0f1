"""Mutual TLS for the internal gRPC APIs, and who may call what.

One place builds every credential and makes every authorization decision:

* :class:`TlsFiles` (from :class:`~loraplane.shared.settings.CommonSettings`'
  ``LORAPLANE_TLS_CA_FILE`` / ``_CERT_FILE`` / ``_KEY_FILE``; all three or none):
  :meth:`TlsFiles.server_credentials` requires a client certificate signed by the CA
  (a caller without one, with one from another CA, or with an expired one is refused in
  the TLS handshake: grpcio gives the server no hook there, so the caller sees
  UNAVAILABLE and gRPC core logs ``Handshake failed``, which
  :func:`count_handshake_refusals` counts); the server re-reads its
  certificate and key when their files change (checked at each new connection: rotation
  without a restart). :meth:`TlsFiles.channel_credentials` is the client side: it trusts
  only the CA and presents the caller's certificate.
* :func:`peer_identity`: who the caller is: the SAN URI ``spiffe://loraplane/<name>`` of
  its verified certificate (else its subject CN).
* :class:`AuthzInterceptor`: per full method, the identities allowed (and optionally a
  bearer-token check that may stand in for a certificate, e.g. the registry's operator
  token); unlisted methods are refused, health and reflection are open to any caller
  that passed the handshake. A refusal is UNAUTHENTICATED (no identity, no token) or
  PERMISSION_DENIED (identity not allowed, wrong token) with a message naming the
  method, the caller and who is allowed, and is counted in
  ``loraplane_grpc_auth_refusals_total{service, rpc, reason}``.
* :func:`edge_server_credentials` / :class:`EdgeCertificate`: the gateway's public gRPC and
  HTTPS listeners (no client certificate), both reloaded when their files change.
* :func:`count_handshake_refusals`: the handshakes the mTLS servers refuse, counted in
  ``loraplane_grpc_tls_handshake_refusals_total{service, reason, side}`` from gRPC core's
  log line (:mod:`loraplane.shared.stderr_tee`).
* ``loraplane_tls_certificate_expiry_timestamp_seconds{role}``: notAfter of the
  certificate (and CA) a process serves and dials with;
  ``loraplane_tls_certificate_reloads_total{listener, result}``: changed files loaded, or
  refused with the previous certificate kept.

Nothing here logs or exports key material or tokens (the token check only compares).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import grpc
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from loraplane.shared.errors import LoraplaneError, PermissionDenied, Unauthenticated
from loraplane.shared.grpcutil import AuthCheck, CallCheck, GuardInterceptor
from loraplane.shared.metrics import PerRegistry, split_method
from loraplane.shared.stderr_tee import (
    REASONS,
    SERVER_ONLY_REASONS,
    StderrTee,
    counting_possible,
)

log = logging.getLogger(__name__)

SPIFFE_PREFIX = "spiffe://loraplane/"
"""SAN URI prefix naming an identity (``spiffe://loraplane/gateway``)."""
OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
"""Methods any caller that passed the TLS handshake may call."""

# Identities of the platform (the CN / SAN URI name of each certificate).
GATEWAY = "gateway"
CACHE_MANAGER = "cache-manager"
WORKER = "worker"
REGISTRY_ID = "registry"
OPERATOR = "operator"


class TlsConfigError(ValueError):
    """The TLS settings are incomplete or name files that cannot be read."""


@dataclass(frozen=True)
class TlsFiles:
    """The CA bundle to trust, and this process's own certificate chain and key (PEM)."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def from_settings(cls, ca: str, cert: str, key: str) -> TlsFiles | None:
        """``None`` when all three are empty (TLS off); an error naming what is missing
        or unreadable otherwise."""
        given = {"LORAPLANE_TLS_CA_FILE": ca, "LORAPLANE_TLS_CERT_FILE": cert,
                 "LORAPLANE_TLS_KEY_FILE": key}
        if not any(given.values()):
            return None
        missing = [name for name, value in given.items() if not value]
        if missing:
            raise TlsConfigError(f"TLS needs all three files; not set: {', '.join(missing)}")
        files = cls(Path(ca), Path(cert), Path(key))
        unreadable = [f"{name}={value}" for name, value in given.items()
                      if not os.access(value, os.R_OK)]
        if unreadable:
            raise TlsConfigError(f"cannot read TLS file(s): {', '.join(unreadable)}")
        return files

    def _read(self) -> tuple[bytes, bytes, bytes]:
        return self.ca.read_bytes(), self.cert.read_bytes(), self.key.read_bytes()

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Client side: trust only the CA, present this process's certificate (read now:
        a channel opened after a rotation uses the new files)."""
        ca, cert, key = self._read()
        return grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=key, certificate_chain=cert)

    def server_credentials(
        self, expiry: CertExpiry | None = None) -> grpc.ServerCredentials:
        """Server side: present this certificate, require a client certificate signed by
        the CA; the files are re-read when they change (at the next new connection)."""
        reloader = _Reloader(self.cert, self.key, self.ca, build=_grpc_config, role="cert",
                             listener="internal", expiry=expiry)
        return grpc.dynamic_ssl_server_credentials(
            reloader.initial(), reloader.fetch, require_client_authentication=True)


def _check_pair(cert_pem: bytes, key_pem: bytes) -> None:
    """Raise ``ValueError`` unless the key is the certificate's (a half-written rotation
    must not replace a working pair; an encrypted key or one of an unsupported algorithm
    is a ``ValueError`` too)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    try:
        key = serialization.load_pem_private_key(key_pem, None)
        mine = key.public_key().public_bytes(serialization.Encoding.PEM, spki)
        theirs = cert.public_key().public_bytes(serialization.Encoding.PEM, spki)
    except (TypeError, UnsupportedAlgorithm) as exc:
        raise ValueError(f"the pair cannot be used ({type(exc).__name__}: an encrypted "
                         "key, or an unsupported algorithm)") from None
    if mine != theirs:
        raise ValueError("the private key does not belong to the certificate")


Built = TypeVar("Built")


class _Reloader(Generic[Built]):
    """Files changed -> reload, for every TLS server of the platform: the certificate
    fetcher of a gRPC server (gRPC calls :meth:`fetch` on every new connection, from its
    own thread) and the HTTPS edge (:class:`EdgeCertificate`, on its loop each interval).

    ``build(cert, key, ca)`` turns the pair just read (the key checked to be the
    certificate's) into what the server takes; ``ca``: the client CA to require (``None``:
    no client certificate, the edge). A changed file set that cannot be read, whose key is
    not the certificate's (a half-written rotation) or that ``build`` refuses is logged
    (the exception's type, never the files' content), counted in ``reloads`` as
    ``refused`` and not tried again until the files change again; the previous certificate
    keeps being served. ``expiry`` gets notAfter of each certificate loaded, as ``role``
    (and ``ca``)."""

    def __init__(self, cert: Path, key: Path, ca: Path | None, *,
                 build: Callable[[bytes, bytes, bytes | None], Built], role: str,
                 listener: str, expiry: CertExpiry | None = None) -> None:
        self.cert, self.key, self.ca = cert, key, ca
        self.build, self.role, self.listener, self.expiry = build, role, listener, expiry
        self._lock = threading.Lock()
        self._stamp: tuple[float, ...] = ()
        self._failed_stamp: tuple[float, ...] = ()

    def _paths(self) -> tuple[Path, ...]:
        return (self.cert, self.key) if self.ca is None else (self.cert, self.key, self.ca)

    def _stamp_now(self) -> tuple[float, ...]:
        # inode and size beside mtime: a coarse mtime clock (older kernels tick every
        # 1-10 ms) can give a rewrite the stamp of the half-written file refused before
        stamps: list[float] = []
        for path in self._paths():
            st = path.stat()
            stamps += (st.st_ino, st.st_size, st.st_mtime_ns)
        return tuple(stamps)

    def _load(self) -> Built:
        cert, key = self.cert.read_bytes(), self.key.read_bytes()
        ca = self.ca.read_bytes() if self.ca is not None else None
        _check_pair(cert, key)
        built = self.build(cert, key, ca)
        if self.expiry is not None:
            self.expiry.observe_pem(self.role, cert, ca)
        return built

    def initial(self) -> Built:
        """The files as they are now; raises ``OSError`` / ``ValueError`` (a key that is
        not the certificate's) / what ``build`` raises."""
        self._stamp = self._stamp_now()
        return self._load()

    def fetch(self) -> Built | None:
        """What ``build`` made of the files when they changed since the last load;
        ``None`` when they did not, or when the new set was refused."""
        try:
            stamp = self._stamp_now()
        except OSError:
            return None  # mid-rotation (a file renamed away): keep serving the old one
        with self._lock:
            if stamp == self._stamp or stamp == self._failed_stamp:
                return None
            reloads = self.expiry.reloads if self.expiry is not None else None
            try:
                built = self._load()
            except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
                self._failed_stamp = stamp
                if reloads is not None:
                    reloads.labels(self.listener, "refused").inc()
                log.warning("TLS files of the %s listener changed but cannot be loaded "
                            "(%s); keeping the previous certificate", self.listener,
                            type(exc).__name__)
                return None
            self._stamp = stamp
            if reloads is not None:
                reloads.labels(self.listener, "loaded").inc()
            log.info("TLS certificate of the %s listener reloaded from %s", self.listener,
                     self.cert)
            return built


def _grpc_config(cert: bytes, key: bytes, ca: bytes | None) -> Any:
    return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)


class CertExpiry(PerRegistry):
    """The certificates a process serves:
    ``loraplane_tls_certificate_expiry_timestamp_seconds{role}`` (``cert``, ``ca``;
    ``edge_grpc`` / ``edge_https``: the gateway's public certificate as each public
    listener serves it) and
    ``loraplane_tls_certificate_reloads_total{listener, result}`` (``internal``: an
    internal mTLS server, ``edge_grpc`` / ``edge_https``: the gateway's public listeners;
    ``loaded`` / ``refused``: a changed file set served, or refused and the previous one
    kept)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.gauge = Gauge(
            "loraplane_tls_certificate_expiry_timestamp_seconds",
            "notAfter (Unix time) of the TLS certificate this process presents (role=cert) "
            "and of the CA it trusts (role=ca) on its internal API, and of the gateway's "
            "public certificate as each public listener serves it (role=edge_grpc, "
            "edge_https).", ["role"], registry=registry)
        self.reloads = Counter(
            "loraplane_tls_certificate_reloads",
            "Changed certificate files a TLS listener loaded (result=loaded) or refused "
            "and kept serving the previous certificate (result=refused: unreadable, or a "
            "key that is not the certificate's), by listener (internal, edge_grpc, "
            "edge_https).", ["listener", "result"], registry=registry)

    def observe_pem(self, role: str, cert: bytes, ca: bytes | None = None) -> None:
        """notAfter of ``cert`` (PEM) as ``role``, and of ``ca`` as ``ca`` when given."""
        for label, pem in ((role, cert), ("ca", ca)):
            if pem is not None:
                when = x509.load_pem_x509_certificate(pem).not_valid_after_utc.timestamp()
                self.gauge.labels(label).set(when)


class AuthMetrics(PerRegistry):
    """``loraplane_grpc_auth_refusals_total{service, rpc, reason}``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.refusals = Counter(
            "loraplane_grpc_auth_refusals",
            "Internal gRPC calls refused by authentication or authorization, by gRPC "
            "service, method and reason (no_identity, identity_not_allowed, missing_token, "
            "bad_token, no_rule).", ["service", "rpc", "reason"], registry=registry)


class HandshakeRefusals(PerRegistry):
    """``loraplane_grpc_tls_handshake_refusals_total{service, reason, side}`` and
    ``loraplane_grpc_tls_handshake_refusals_counted{service}`` (:func:`count_handshake_refusals`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.refusals = Counter(
            "loraplane_grpc_tls_handshake_refusals",
            "TLS handshakes a gRPC server of this process refused, from gRPC core's "
            "'Handshake failed' log line, by service and reason (no_certificate, "
            "unknown_ca, expired, not_tls, other); side=server_or_client where the "
            "process also dials TLS gRPC and the line may be its own outgoing handshake.",
            ["service", "reason", "side"], registry=registry)
        self.counted = Gauge(
            "loraplane_grpc_tls_handshake_refusals_counted",
            "1 when this process counts refused TLS handshakes, 0 when it cannot "
            "(GRPC_VERBOSITY drops gRPC core's INFO line, or the stderr tee could not "
            "start or its child process ended).", ["service"], registry=registry)


def count_handshake_refusals(
    service: str, *, dials_tls: bool, registry: CollectorRegistry = REGISTRY,
) -> StderrTee | None:
    """Count the TLS handshakes this process's gRPC server refuses, in
    :class:`HandshakeRefusals` as ``service`` (``worker``, ``registry``,
    ``cache-manager``, ``gateway``): once per process, by its ``__main__`` before it
    serves (:mod:`loraplane.shared.stderr_tee` puts descriptor 2 through a child that
    forwards every byte and reports gRPC core's ``Handshake failed`` lines).

    ``dials_tls``: the process also opens TLS gRPC channels; the reasons a client can log
    too are then counted as ``side="server_or_client"`` (``no_certificate`` stays
    ``server``). Returns the tee, ``None`` when counting is off (``GRPC_VERBOSITY`` drops
    the line, or the child could not start: logged, ``..._counted`` 0)."""
    metrics = HandshakeRefusals.for_registry(registry)
    for reason in REASONS:  # every series from 0, so that increase() sees the first one
        metrics.refusals.labels(service, reason, _side(reason, dials_tls))
    if not counting_possible():
        log.warning("GRPC_VERBOSITY=%s: gRPC core does not log refused TLS handshakes, "
                    "so they are not counted", os.environ.get("GRPC_VERBOSITY"))
        metrics.counted.labels(service).set(0)
        return None

    def counted(reason: str, count: int) -> None:
        metrics.refusals.labels(service, reason, _side(reason, dials_tls)).inc(count)

    def lost() -> None:
        metrics.counted.labels(service).set(0)
        log.warning("refused TLS handshakes are no longer counted: the stderr tee's child "
                    "process ended (the original stderr is back)")

    tee = StderrTee(counted, lost)
    try:
        tee.start()
    except (OSError, RuntimeError) as exc:
        log.warning("refused TLS handshakes are not counted: the stderr tee did not start "
                    "(%s: %s)", type(exc).__name__, exc)
        metrics.counted.labels(service).set(0)
        return None
    metrics.counted.labels(service).set(1)
    return tee


def _side(reason: str, dials_tls: bool) -> str:
    return ("server" if not dials_tls or reason in SERVER_ONLY_REASONS
            else "server_or_client")


def peer_identity(context: grpc.aio.ServicerContext) -> str | None:
    """The verified caller's identity: its ``spiffe://loraplane/<name>`` SAN URI, else its
    certificate's CN; ``None`` on a plaintext connection."""
    auth = context.auth_context() or {}
    for uri in auth.get("peer_spiffe_id", ()) or auth.get("peer_uri", ()):
        text = uri.decode() if isinstance(uri, bytes) else str(uri)
        if text.startswith(SPIFFE_PREFIX):
            return text.removeprefix(SPIFFE_PREFIX)
    for cn in auth.get("x509_common_name", ()):
        return cn.decode() if isinstance(cn, bytes) else str(cn)
    return None


@dataclass(frozen=True)
class Rule:
    """Who may call one method: these certificate identities, or (when ``token`` is set)
    any caller whose bearer token ``token`` accepts."""

    identities: frozenset[str]
    token: AuthCheck | None = field(default=None, compare=False)


def allow(*identities: str, token: AuthCheck | None = None) -> Rule:
    """A rule: ``allow(GATEWAY, CACHE_MANAGER)``."""
    return Rule(frozenset(identities), token)


class _Refusal(LoraplaneError):
    """Carries the counted reason beside the status."""

    def __init__(self, base: type[LoraplaneError], message: str, reason: str) -> None:
        super().__init__(message)
        self.grpc_code = base.grpc_code
        self.http_status = base.http_status
        self.reason = reason


class AuthzInterceptor(GuardInterceptor):
    """Authorize every call by the caller's certificate identity (and optional token).

    ``rules`` maps full method names (``/loraplane.v1.WorkerInternal/Generate``) or whole
    services (``/loraplane.v1.RegistryAdmin/``, ending in ``/``) to a :class:`Rule`; a
    method matching neither (and not health / reflection) is refused. Place it after
    :class:`~loraplane.shared.grpcutil.ServiceInterceptor` (``build_server`` does) so a
    refusal becomes its status.
    """

    def __init__(self, rules: Mapping[str, Rule], *,
                 registry: CollectorRegistry = REGISTRY) -> None:
        self.rules = dict(rules)
        self.metrics = AuthMetrics.for_registry(registry)

    def rule_for(self, method: str) -> Rule | None:
        """The rule of ``method`` (its own, else its service's)."""
        rule = self.rules.get(method)
        if rule is None:
            rule = self.rules.get(method.rsplit("/", 1)[0] + "/")
        return rule

    def check(self, method: str, identity: str | None,
              metadata: Iterable[tuple[str, str | bytes]]) -> None:
        """Return when the caller may call ``method``; raise (counted) otherwise."""
        try:
            self._decide(method, identity, tuple(metadata))
        except _Refusal as refusal:
            service, rpc = split_method(method)
            self.metrics.refusals.labels(service, rpc, refusal.reason).inc()
            raise

    def _decide(self, method: str, identity: str | None,
                metadata: tuple[tuple[str, str | bytes], ...]) -> None:
        rule = self.rule_for(method)
        if rule is None:
            raise _Refusal(PermissionDenied, f"{method}: no caller is allowed", "no_rule")
        if identity is not None and identity in rule.identities:
            return
        allowed = ", ".join(sorted(rule.identities)) or "none"
        who = (f"caller {identity!r} (from its client certificate)" if identity is not None
               else "a caller without a client certificate")
        if rule.token is not None:
            try:
                rule.token(metadata, method)
                return
            except Unauthenticated as exc:
                if identity is None:
                    raise _Refusal(Unauthenticated, f"{method}: {who}; {exc.message}",
                                   "missing_token") from None
                raise _Refusal(PermissionDenied,
                               f"{method}: {who} is not allowed (allowed: {allowed}) and "
                               f"{exc.message}", "missing_token") from None
            except PermissionDenied as exc:
                raise _Refusal(PermissionDenied, f"{method}: {who}; {exc.message}",
                               "bad_token") from None
        if identity is None:
            raise _Refusal(Unauthenticated, f"{method}: {who}; allowed: {allowed}",
                           "no_identity")
        raise _Refusal(PermissionDenied, f"{method}: {who} is not allowed; allowed: "
                       f"{allowed}", "identity_not_allowed")

    def guard(self, method: str) -> CallCheck | None:
        """The check of ``method``: ``None`` (open) for health and reflection."""
        if method.startswith(OPEN_SERVICES):
            return None
        check = self.check

        def verify(context: grpc.aio.ServicerContext) -> None:
            check(method, peer_identity(context), context.invocation_metadata() or ())

        return verify


def server_name_option(identity: str) -> tuple[str, str]:
    """Channel option making the client verify that the server's certificate names
    ``identity`` (its SAN DNS), whatever host it dials (a worker's reported address)."""
    return ("grpc.ssl_target_name_override", identity)


RECONNECT_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
)
"""Reconnect backoff of every internal channel: a peer that went away is dialled again at
most a second apart. gRPC's default backoff (1 s, × 1.6 per failed attempt, up to 120 s)
meant that a channel to a worker killed for 40 s only tried again ~25 s after the worker
was back (the gateway's probes and requests fail fast meanwhile, so a restarted worker
stayed out of routing: ``make stress`` worker_kill recovered in 133 s under load). A
refused dial costs next to nothing.

``grpc.min_reconnect_backoff_ms`` stays gRPC's own (20 s): gRPC core reads it as the
shortest time one connection attempt may take (TCP connect, TLS handshake, the server's
first SETTINGS frame), not as a backoff. Set to 200 ms it cut mutual-TLS handshakes short
on a busy host ("connection attempt timed out before receiving SETTINGS frame",
"Handshake read failed"): 8 of 120 fresh channels to an mTLS server beside three threads
holding the GIL failed, 0 of 120 with the default (5 December)."""


def channel_options(options: Iterable[tuple[str, Any]] = ()) -> list[tuple[str, Any]]:
    """:data:`RECONNECT_OPTIONS` with ``options`` on top (a caller's own value of a key
    replaces the default)."""
    merged: dict[str, Any] = dict(RECONNECT_OPTIONS)
    merged.update(options)
    return list(merged.items())


def secure_or_insecure_aio_channel(
    address: str, files: TlsFiles | None, *, server: str,
    options: Iterable[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """An asyncio channel to ``address``: mTLS (verifying the server is ``server``) when
    ``files`` is set, plaintext otherwise; it reconnects within a second
    (:data:`RECONNECT_OPTIONS`)."""
    opts = channel_options(options)
    if files is None:
        return grpc.aio.insecure_channel(address, options=opts)
    return grpc.aio.secure_channel(
        address, files.channel_credentials(), options=[*opts, server_name_option(server)])


def _edge_dial(ca: bytes | None, server: str | None, options: Iterable[tuple[str, Any]]
               ) -> tuple[grpc.ChannelCredentials | None, list[tuple[str, Any]]]:
    opts = channel_options(options)
    if ca is None:
        return None, opts
    if server is not None:
        opts.append(server_name_option(server))
    return grpc.ssl_channel_credentials(ca), opts


def edge_channel(address: str, ca: bytes | None, *, server: str | None = None,
                 options: Iterable[tuple[str, Any]] = ()) -> grpc.Channel:
    """A tenant's channel to a gateway's public gRPC port: TLS trusting ``ca`` (PEM; no
    client certificate, tenants present API keys), the certificate checked to name
    ``server`` (default: the host dialled); plaintext when ``ca`` is ``None``. The
    platform's :func:`channel_options`, ``options`` on top."""
    credentials, opts = _edge_dial(ca, server, options)
    if credentials is None:
        return grpc.insecure_channel(address, options=opts)
    return grpc.secure_channel(address, credentials, options=opts)


def edge_aio_channel(address: str, ca: bytes | None, *, server: str | None = None,
                     options: Iterable[tuple[str, Any]] = ()) -> grpc.aio.Channel:
    """The asyncio twin of :func:`edge_channel`."""
    credentials, opts = _edge_dial(ca, server, options)
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=opts)
    return grpc.aio.secure_channel(address, credentials, options=opts)


def secure_or_insecure_channel(
    address: str, files: TlsFiles | None, *, server: str,
    options: Iterable[tuple[str, Any]] = (),
) -> grpc.Channel:
    """The blocking-API twin of :func:`secure_or_insecure_aio_channel` (the CLI)."""
    opts = channel_options(options)
    if files is None:
        return grpc.insecure_channel(address, options=opts)
    return grpc.secure_channel(
        address, files.channel_credentials(), options=[*opts, server_name_option(server)])



def server_security(
    files: TlsFiles | None, rules: Mapping[str, Rule], *,
    registry: CollectorRegistry = REGISTRY,
) -> tuple[grpc.ServerCredentials | None, list[grpc.aio.ServerInterceptor]]:
    """What ``build_server`` takes for an internal API: mTLS credentials and the
    :class:`AuthzInterceptor` of ``rules`` (expiry gauge in ``registry``); plaintext and no
    interceptor when ``files`` is ``None`` (TLS off: nobody has an identity)."""
    if files is None:
        return None, []
    credentials = files.server_credentials(CertExpiry.for_registry(registry))
    return credentials, [AuthzInterceptor(rules, registry=registry)]


TLS_ENV = {"tls_ca_file": "LORAPLANE_TLS_CA_FILE", "tls_cert_file": "LORAPLANE_TLS_CERT_FILE",
           "tls_key_file": "LORAPLANE_TLS_KEY_FILE"}
"""Settings field -> environment variable of the three TLS files."""


def tls_fields(env: Mapping[str, str]) -> dict[str, Any]:
    """The TLS settings fields held in an environment mapping (a stack's service env,
    demo.env): ``Settings(**other, **tls_fields(env))`` - the three mTLS files, and HTTPS
    to S3 with its CA (``LORAPLANE_S3_SECURE`` / ``LORAPLANE_S3_CA_FILE``)."""
    fields: dict[str, Any] = {field: env.get(var, "") for field, var in TLS_ENV.items()}
    fields["s3_secure"] = env.get("LORAPLANE_S3_SECURE", "false").lower() in ("1", "true")
    fields["s3_ca_file"] = env.get("LORAPLANE_S3_CA_FILE", "")
    return fields


def _edge_reloader(cert_file: str, key_file: str,
                   build: Callable[[bytes, bytes, bytes | None], Built], *, listener: str,
                   expiry: CertExpiry | None) -> tuple[_Reloader[Built], Built]:
    """A public listener's reloader and its first load; :class:`TlsConfigError` naming an
    unreadable file or a key that is not the certificate's."""
    # each public listener its own expiry series: a pair one refuses and the other takes
    # must not show the new date for both
    reloader = _Reloader(Path(cert_file), Path(key_file), None, build=build, role=listener,
                         listener=listener, expiry=expiry)
    try:
        return reloader, reloader.initial()
    except ssl.SSLError as exc:
        raise TlsConfigError(f"edge TLS {cert_file} / {key_file}: OpenSSL refused the pair "
                             f"({exc.reason})") from None
    except OSError as exc:
        raise TlsConfigError(f"cannot read edge TLS file {exc.filename}: {exc.strerror}"
                             ) from None
    except ValueError as exc:
        raise TlsConfigError(f"edge TLS {cert_file} / {key_file}: {exc}") from None


def edge_server_credentials(cert_file: str, key_file: str, *,
                            expiry: CertExpiry | None = None) -> grpc.ServerCredentials:
    """TLS for a public listener (the gateway's gRPC): present this certificate, ask for
    no client certificate (tenants authenticate with API keys); re-read when the files
    change, as the internal servers do (notAfter in ``expiry`` as ``role="edge_grpc"``). Raises
    :class:`TlsConfigError` naming an unreadable file or a key that is not the
    certificate's."""
    reloader, initial = _edge_reloader(cert_file, key_file, _grpc_config,
                                       listener="edge_grpc", expiry=expiry)
    return grpc.dynamic_ssl_server_credentials(
        initial, reloader.fetch, require_client_authentication=False)


@contextlib.contextmanager
def _pem_path(*parts: bytes) -> Iterator[str]:
    """A path OpenSSL reads ``parts`` from (``load_cert_chain`` takes files only): an
    anonymous memory file on Linux (``memfd``: the key's copy touches no filesystem), else
    a private temporary file (mode 0600, removed on exit)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("loraplane-edge-pem", os.MFD_CLOEXEC)
        try:
            os.write(fd, b"".join(parts))
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    fd, name = tempfile.mkstemp(prefix="loraplane-edge-", suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(b"".join(parts))
        yield name
    finally:
        os.unlink(name)


class EdgeCertificate:
    """The certificate of a public HTTPS listener (the gateway's uvicorn), replaced in its
    :class:`ssl.SSLContext` when the files change: handshakes begun after a reload present
    the new certificate, open connections keep theirs, nothing restarts.

    uvicorn builds one context (``Config.ssl`` after ``Config.load()``) and wraps every
    accepted connection with it; ``load_cert_chain`` on that same context replaces the
    certificate and key that later handshakes use. The change is noticed by
    :meth:`check` (the gRPC listeners' :class:`_Reloader`: a new pair is checked before it
    is served, a bad or half-written one is logged, counted and the old one kept), called
    by :meth:`run` every ``interval_s`` on the server's own loop: the context is only ever
    touched from the thread that accepts connections; a reload holds that loop about 2 ms
    (an EC P-256 pair: read, checked, loaded twice), a look that finds nothing changed
    about 20 us (measured on the development machine, 40 reloads)."""

    def __init__(self, context: ssl.SSLContext, cert_file: str, key_file: str, *,
                 expiry: CertExpiry | None = None) -> None:
        """Load the pair into ``context`` now (:class:`TlsConfigError` when it cannot)."""
        self.context = context
        self._key_type = ""
        self._reloader, _ = _edge_reloader(cert_file, key_file, self._install,
                                           listener="edge_https", expiry=expiry)

    def _install(self, cert: bytes, key: bytes, ca: bytes | None) -> ssl.SSLContext:
        """Load exactly the bytes that were checked (re-reading the served paths could
        pick up a later, unchecked write), into a scratch context first, so that a pair
        OpenSSL refuses never leaves the served context half-loaded. A key of another
        type than the one loaded at start (EC / RSA) is refused (``ValueError``: logged,
        counted, the old pair kept): OpenSSL keeps one certificate per key type in a
        context, so the old one would go on being served to every client that accepts
        it; changing the key type takes a restart."""
        key_type = type(serialization.load_pem_private_key(key, None)).__name__
        if self._key_type and key_type != self._key_type:
            raise ValueError(f"the new key is a {key_type}, the served one a "
                             f"{self._key_type}: a restart changes the key type")
        with _pem_path(cert if cert.endswith(b"\n") else cert + b"\n", key) as path:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(path)
            self.context.load_cert_chain(path)
        self._key_type = key_type
        return self.context

    def check(self) -> bool:
        """Reload when the files changed since the last load; ``True`` when the new pair
        is now served."""
        return self._reloader.fetch() is not None

    async def run(self, interval_s: float) -> None:
        """:meth:`check` every ``interval_s`` until cancelled (two ``stat`` calls each); an
        unexpected error is logged and the watch goes on (a task that died would stop
        every later reload without a word)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.check()
            except Exception:  # the watch must outlive one bad look
                log.exception("the HTTPS edge's certificate watch failed once; it goes on")
