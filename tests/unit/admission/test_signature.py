"""Signature check: trusted key, exact file coverage, registry digest and signer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from loraplane.admission.checks.signature import RegisteredFile, check_signature
from loraplane.admission.problems import (
    DIGEST_MISMATCH,
    MISSING_FILE,
    SIGNATURE_INVALID,
    UNSIGNED_FILE,
    UNTRUSTED_SIGNER,
    codes_of,
)
from loraplane.admission.trust import TrustedKey, TrustStore
from loraplane.shared.signing import compute_manifest_digest, key_identity, sign_directory


def _check(adapter: Path, trusted: list[TrustedKey], **kw: object):  # type: ignore[no-untyped-def]
    digest = kw.pop("sha256", None) or compute_manifest_digest(adapter)
    return check_signature(adapter, adapter / "model.sig", trusted=trusted,
                           registered_sha256=str(digest), **kw)  # type: ignore[arg-type]


def test_valid(adapter: Path, trusted: list[TrustedKey]) -> None:
    result = _check(adapter, trusted, registered_signer=trusted[0].identity)
    assert result.problems == ()
    assert result.verified is not None
    assert result.verified.signer_identity == trusted[0].identity
    assert result.bytes_hashed == sum(
        (adapter / n).stat().st_size for n in ("adapter_config.json",
                                               "adapter_model.safetensors"))


def test_untrusted_signer(adapter: Path, trusted: list[TrustedKey], keys_dir: Path) -> None:
    sign_directory(adapter, keys_dir / "untrusted" / "dev-signing.key")
    (p,) = _check(adapter, trusted).problems
    assert p.code == UNTRUSTED_SIGNER and "not trusted" in p.message


def test_tenant_keys_only_trusted_for_their_tenant(adapter: Path, keys_dir: Path,
                                                   tmp_path: Path) -> None:
    tenants = tmp_path / "tenants"
    (tenants / "globex").mkdir(parents=True)
    (tenants / "globex" / "k.pub").write_bytes(
        (keys_dir / "untrusted" / "dev-signing.pub").read_bytes())
    (tenants / "globex" / "private.pem").write_bytes(
        (keys_dir / "untrusted" / "dev-signing.key").read_bytes())
    sign_directory(adapter, keys_dir / "untrusted" / "dev-signing.key")
    store = TrustStore(keys_dir / "trusted", tenants)
    assert _check(adapter, store.keys_for("globex")).problems == ()
    assert codes_of(_check(adapter, store.keys_for("acme")).problems) == {UNTRUSTED_SIGNER}
    assert [p.name for p in store.skipped] == ["private.pem"]  # private keys never trusted


def test_forged_signature_with_trusted_hint(adapter: Path, trusted: list[TrustedKey]) -> None:
    bundle = json.loads((adapter / "model.sig").read_text())
    sig = bundle["dsseEnvelope"]["signatures"][0]
    sig["sig"] = sig["sig"][:-8] + ("A" * 8 if not sig["sig"].endswith("A" * 8) else "B" * 8)
    (adapter / "model.sig").write_text(json.dumps(bundle))
    assert codes_of(_check(adapter, trusted).problems) == {SIGNATURE_INVALID}


@pytest.mark.parametrize("content", [None, b"", b"not json", b'{"verificationMaterial": 1}',
                                     b"x" * (2 << 20)])
def test_missing_or_garbage_bundle(adapter: Path, trusted: list[TrustedKey],
                                   content: bytes | None) -> None:
    if content is None:
        (adapter / "model.sig").unlink()
    else:
        (adapter / "model.sig").write_bytes(content)
    problems = _check(adapter, trusted).problems
    assert codes_of(problems) == {SIGNATURE_INVALID}


def test_tampered_after_signing(adapter: Path, trusted: list[TrustedKey]) -> None:
    digest = compute_manifest_digest(adapter)
    weights = adapter / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    (p,) = _check(adapter, trusted, sha256=digest).problems
    assert (p.code, p.path) == (DIGEST_MISMATCH, "adapter_model.safetensors")


def test_unsigned_extra_file_and_missing_file(adapter: Path, trusted: list[TrustedKey]) -> None:
    digest = compute_manifest_digest(adapter)
    (adapter / "README.md").write_text("hi")
    (adapter / "adapter_config.json").unlink()
    problems = _check(adapter, trusted, sha256=digest).problems
    assert {(p.code, p.path) for p in problems} == {
        (UNSIGNED_FILE, "README.md"), (MISSING_FILE, "adapter_config.json")}


def test_refused_and_linked_files_not_reported_twice(adapter: Path,
                                                     trusted: list[TrustedKey]) -> None:
    digest = compute_manifest_digest(adapter)
    (adapter / "adapter_model.safetensors").unlink()
    os.symlink("/etc/hostname", adapter / "adapter_model.safetensors")
    result = _check(adapter, trusted, sha256=digest)
    assert result.problems == ()  # the files check reports the link (SYMLINK)
    assert result.verified is None  # but nothing was verified


def test_registry_digest_signer_and_files(adapter: Path, trusted: list[TrustedKey],
                                          keys_dir: Path) -> None:
    result = _check(adapter, trusted, sha256="0" * 64)
    assert [(p.code, p.path) for p in result.problems] == [(DIGEST_MISMATCH, "")]
    assert result.verified is None

    other = key_identity(keys_dir / "untrusted" / "dev-signing.pub")
    (p,) = _check(adapter, trusted, registered_signer=other).problems
    assert p.code == UNTRUSTED_SIGNER

    files = [RegisteredFile("adapter_config.json", 1, "a" * 64)]
    problems = _check(adapter, trusted, registered_files=files).problems
    assert {(p.code, p.path) for p in problems} == {
        (DIGEST_MISMATCH, "adapter_config.json"), (DIGEST_MISMATCH, "adapter_model.safetensors")}


def test_no_trusted_keys(adapter: Path) -> None:
    assert codes_of(_check(adapter, []).problems) == {UNTRUSTED_SIGNER}
