"""The local certificate authority and one certificate per service (DEV ONLY).

``make run`` and the test stack call :func:`ensure_dev_pki` when they start: it writes,
under ``<stack data dir>/pki/``, a CA (``ca.pem`` / ``ca.key``) and, for each identity in
:data:`DEV_IDENTITIES`, ``<name>.pem`` / ``<name>.key``. Each certificate names its
identity twice: subject CN = the identity and SAN URI ``spiffe://loraplane/<identity>``
(what :mod:`loraplane.shared.tls` reads back), SAN DNS = the identity (clients check the
server is the service they meant: ``grpc.ssl_target_name_override``, whatever address
they dial), plus SAN DNS ``localhost`` and IP ``127.0.0.1``.

The CA key stays in the data directory (mode 0600) and is only used here; existing files
are reused while the certificate is valid for more than :data:`RENEW_BEFORE` (so a
restarted service keeps its CA). Nothing here is for production: compose and Kubernetes
mount certificates issued by the operator's own CA (``LORAPLANE_TLS_*_FILE``).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from loraplane.shared.tls import OPERATOR, SPIFFE_PREFIX

DEV_IDENTITIES: tuple[str, ...] = (
    "registry", "admission", "cache-manager", "worker", "gateway", OPERATOR,
    "postgres", "seaweedfs", "tansu",
)
"""Identities the stack issues: every service, ``operator`` (the CLI, seed, CI), and the
servers of the stack's components (PostgreSQL, SeaweedFS's S3 gateway, Tansu), which no
gRPC API's table allows."""
COMPOSE_IDENTITIES: tuple[str, ...] = (
    "registry", "admission", "cache-manager", "worker", "gateway", OPERATOR,
    "kafka", "postgres", "minio",
)
"""What :func:`write_compose_pki` issues: each docker-compose.yml service under its
service name (its SAN DNS is the host name the others dial), the operator (the CLI on the
host) and the three servers."""
KAFKA_KEYSTORE = "kafka-keystore.pem"
"""apache/kafka's PEM keystore: the broker's private key and certificate in one file."""
VALIDITY = dt.timedelta(days=30)
RENEW_BEFORE = dt.timedelta(days=7)
"""A certificate valid for less than this is issued again at the next start."""


@dataclass(frozen=True)
class CertFiles:
    """Paths of one identity's certificate and key, and of the CA that issued it."""

    ca: Path
    cert: Path
    key: Path


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def make_ca(common_name: str = "loraplane dev CA", *, now: dt.datetime | None = None,
            validity: dt.timedelta = VALIDITY,
            ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA certificate and its key."""
    now = now or dt.datetime.now(dt.UTC)
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True,
            content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def issue(identity: str, ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, *,
          now: dt.datetime | None = None, not_before: dt.datetime | None = None,
          not_after: dt.datetime | None = None,
          ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A server + client certificate for ``identity`` signed by the CA (validity
    ``VALIDITY`` from ``now`` unless ``not_before`` / ``not_after`` are given: a test
    issues an expired one that way)."""
    if not identity or "/" in identity:
        raise ValueError(f"identity {identity!r} must be a non-empty name without '/'")
    now = now or dt.datetime.now(dt.UTC)
    key = _new_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or now - dt.timedelta(minutes=5))
        .not_valid_after(not_after or now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName([
            x509.UniformResourceIdentifier(SPIFFE_PREFIX + identity),
            x509.DNSName(identity),
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(
            [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
            ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def write_identity(out_dir: Path, identity: str, cert: x509.Certificate,
                   key: ec.EllipticCurvePrivateKey, ca_path: Path) -> CertFiles:
    """Write ``<identity>.pem`` / ``<identity>.key`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = CertFiles(ca=ca_path, cert=out_dir / f"{identity}.pem",
                      key=out_dir / f"{identity}.key")
    _write_key(files.key, key)
    _write_cert(files.cert, cert)
    return files


def _still_valid(path: Path, now: dt.datetime) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        return False
    return cert.not_valid_after_utc - now > RENEW_BEFORE


def ensure_dev_pki(pki_dir: Path, identities: tuple[str, ...] = DEV_IDENTITIES, *,
                   now: dt.datetime | None = None) -> dict[str, CertFiles]:
    """The stack's CA and one certificate per identity under ``pki_dir`` (created, or
    reused while valid); returns identity -> files."""
    now = now or dt.datetime.now(dt.UTC)
    pki_dir.mkdir(parents=True, exist_ok=True)
    pki_dir.chmod(0o700)
    ca_path, ca_key_path = pki_dir / "ca.pem", pki_dir / "ca.key"
    fresh_ca = not (_still_valid(ca_path, now) and ca_key_path.exists())
    if fresh_ca:
        ca_cert, ca_key = make_ca(now=now)
        _write_key(ca_key_path, ca_key)
        _write_cert(ca_path, ca_cert)
    else:
        ca_cert = x509.load_pem_x509_certificate(ca_path.read_bytes())
        loaded = serialization.load_pem_private_key(ca_key_path.read_bytes(), None)
        assert isinstance(loaded, ec.EllipticCurvePrivateKey)
        ca_key = loaded
    out: dict[str, CertFiles] = {}
    for identity in identities:
        files = CertFiles(ca=ca_path, cert=pki_dir / f"{identity}.pem",
                          key=pki_dir / f"{identity}.key")
        if fresh_ca or not files.key.exists() or not _still_valid(files.cert, now):
            cert, key = issue(identity, ca_cert, ca_key, now=now)
            files = write_identity(pki_dir, identity, cert, key, ca_path)
        out[identity] = files
    return out


def write_compose_pki(out_dir: Path, *, now: dt.datetime | None = None) -> dict[str, CertFiles]:
    """The certificates ``docker-compose.yml`` mounts (``loraplane stack certs``): a CA and
    one certificate per :data:`COMPOSE_IDENTITIES` in ``out_dir`` (reused while valid, as
    :func:`ensure_dev_pki`), plus :data:`KAFKA_KEYSTORE`.

    Compose mounts each container's own files one by one, never the directory: the
    identities' keys are written readable by every user (0644), because each image runs as
    its own user (the services as 10001, apache/kafka as 1000) and a bind-mounted file keeps
    its host owner; the directory stays 0700, so on the host only its owner reaches them,
    and the CA key (0600) is mounted nowhere. For a test or staging deployment: production
    mounts certificates of its own CA the same way."""
    files = ensure_dev_pki(out_dir, COMPOSE_IDENTITIES, now=now)
    for identity in files.values():
        identity.key.chmod(0o644)
    kafka = files["kafka"]
    keystore = out_dir / KAFKA_KEYSTORE
    keystore.write_bytes(kafka.key.read_bytes() + kafka.cert.read_bytes())
    keystore.chmod(0o644)
    return files
