"""Trusted signing keys: platform-wide keys and per-tenant keys, from directories.

Layout (both directories configurable, see :class:`~loraplane.admission.settings.AdmissionSettings`)::

    <platform_keys_dir>/*.pub | *.pem          trusted for every tenant
    <tenant_keys_dir>/<tenant_id>/*.pub | *.pem trusted for that tenant only

Only EC public keys are loaded; a private key or anything unparsable in a trust
directory is skipped and reported in :attr:`TrustStore.skipped` (a misconfiguration,
not a property of an artifact). Keys are read on every call, so adding a tenant key
takes effect without a restart.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from loraplane.shared.signing import key_identity

KEY_SUFFIXES = (".pub", ".pem")
MAX_KEY_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class TrustedKey:
    """One trusted public key."""

    path: Path
    """PEM file."""
    identity: str
    """``key:sha256:<hex of DER SPKI>`` (see ``loraplane.shared.signing.key_identity``)."""
    hint: str
    """sha256 hex of the PEM SPKI encoding: the ``publicKey.hint`` model-signing writes
    into bundles, which names the signing key without being trusted."""
    scope: str
    """``"platform"`` or the tenant id."""


def _load_key(path: Path, scope: str) -> TrustedKey:
    data = path.read_bytes()[: MAX_KEY_BYTES + 1]
    if len(data) > MAX_KEY_BYTES:
        raise ValueError("key file too large")
    key = serialization.load_pem_public_key(data)  # a private key fails here on purpose
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise TypeError("not an elliptic-curve public key")
    pem = key.public_bytes(serialization.Encoding.PEM,
                           serialization.PublicFormat.SubjectPublicKeyInfo)
    return TrustedKey(path=path, identity=key_identity(path),
                      hint=hashlib.sha256(pem).hexdigest(), scope=scope)


@dataclass
class TrustStore:
    """Reads trusted keys from the platform and tenant key directories."""

    platform_dir: Path | None
    tenant_dir: Path | None
    skipped: dict[Path, str] = field(default_factory=dict)
    """Files that were not loaded, with why (filled by :meth:`keys_for`)."""

    def _scan(self, directory: Path | None, scope: str) -> list[TrustedKey]:
        if directory is None or not directory.is_dir():
            return []
        keys: list[TrustedKey] = []
        for path in sorted(directory.iterdir()):
            if path.suffix not in KEY_SUFFIXES or not path.is_file() or path.is_symlink():
                continue
            try:
                keys.append(_load_key(path, scope))
            except (ValueError, TypeError, OSError) as exc:
                self.skipped[path] = f"{type(exc).__name__}: {exc}"
        return keys

    def keys_for(self, tenant_id: str) -> list[TrustedKey]:
        """Keys trusted for ``tenant_id``: the platform's, then the tenant's own."""
        platform = self._scan(self.platform_dir, "platform")
        tenant: list[TrustedKey] = []
        if self.tenant_dir is not None and tenant_id and "/" not in tenant_id \
                and not tenant_id.startswith("."):
            tenant = self._scan(self.tenant_dir / tenant_id, tenant_id)
        return [*platform, *tenant]
