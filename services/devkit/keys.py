"""The development signing key (EC P-256), derived from a seed.

DEV ONLY. The key is a pure function of the seed, so every checkout builds the
same key and its identity is stable; anyone with this source can sign with it.
Production trusts only keys held by the release pipeline.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from loraplane.shared.signing import key_identity

_P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
PRIVATE_KEY_NAME = "dev-signing.key"
"""File name of the PEM (PKCS#8, unencrypted) private key."""
PUBLIC_KEY_NAME = "dev-signing.pub"
"""File name of the PEM (SubjectPublicKeyInfo) public key."""


@dataclass(frozen=True)
class DevKeyPair:
    """Paths of a written key pair and its signer identity."""

    private_key: Path
    public_key: Path
    identity: str


def derive_private_key(seed: int, label: str = "dev") -> ec.EllipticCurvePrivateKey:
    """A P-256 private key that depends only on ``seed`` and ``label``."""
    material = hashlib.sha256(f"loraplane-signing-key/{label}/{seed}".encode()).digest()
    scalar = int.from_bytes(material, "big") % (_P256_ORDER - 1) + 1
    return ec.derive_private_key(scalar, ec.SECP256R1())


def write_dev_keys(out_dir: Path, seed: int, label: str = "dev") -> DevKeyPair:
    """Write the key pair derived from ``seed`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    key = derive_private_key(seed, label)
    private_path = out_dir / PRIVATE_KEY_NAME
    public_path = out_dir / PUBLIC_KEY_NAME
    private_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    private_path.chmod(0o600)
    public_path.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return DevKeyPair(private_path, public_path, key_identity(public_path))
