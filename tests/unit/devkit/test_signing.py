"""loraplane.shared.signing on the demo adapters (real model-signing, real keys)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

import model_signing
import pytest

from loraplane.devkit.builder import DemoManifest
from loraplane.devkit.keys import DevKeyPair
from loraplane.shared.signing import (
    SIGNATURE_FILENAME,
    DigestMismatch,
    MissingFile,
    SignatureInvalid,
    UnsignedFile,
    compute_manifest_digest,
    key_identity,
    manifest_digest,
    sign_directory,
    verify_directory,
)


def test_every_demo_adapter_verifies(demo: DemoManifest) -> None:
    for adapter in (*demo.adapters, demo.zero_adapter):
        verified = verify_directory(adapter.dir, [demo.keys.public_key])
        assert set(verified.files) == {"adapter_config.json", "adapter_model.safetensors"}
        assert verified.manifest_digest == adapter.manifest_digest
        assert verified.signer_identity == demo.keys.identity
        assert verified.trusted_key == demo.keys.public_key
        assert verified.size_bytes == adapter.size_bytes


def test_manifest_digest_definition(demo: DemoManifest) -> None:
    """sha256 of the sorted ``sha256sum`` listing, from the bundle and from the files."""
    adapter = demo.adapter("acme", "code")
    lines = ""
    for name in sorted(["adapter_config.json", "adapter_model.safetensors"]):
        lines += f"{hashlib.sha256((adapter.dir / name).read_bytes()).hexdigest()}  {name}\n"
    expected = hashlib.sha256(lines.encode()).hexdigest()
    assert manifest_digest(adapter.signature_path) == expected
    assert compute_manifest_digest(adapter.dir) == expected
    assert adapter.manifest_digest == expected


def test_digests_differ_between_versions(demo: DemoManifest) -> None:
    digests = {a.manifest_digest for a in (*demo.adapters, demo.zero_adapter)}
    assert len(digests) == len(demo.adapters) + 1


def test_upstream_model_signing_accepts_our_signature(demo: DemoManifest) -> None:
    """Interoperability: the plain model-signing verifier agrees (model.sig is ignored)."""
    adapter = demo.adapter("globex", "legal")
    model_signing.verifying.Config().use_elliptic_key_verifier(
        public_key=demo.keys.public_key
    ).verify(adapter.dir, adapter.signature_path)


def test_identity_is_the_same_for_private_and_public_key(demo: DemoManifest) -> None:
    assert key_identity(demo.keys.private_key) == key_identity(demo.keys.public_key)
    assert demo.keys.identity.startswith("key:sha256:") and len(demo.keys.identity) == 75


def test_one_byte_tamper_is_a_digest_mismatch_naming_the_file(
    adapter_copy: Path, demo: DemoManifest
) -> None:
    weights = adapter_copy / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(DigestMismatch) as err:
        verify_directory(adapter_copy, [demo.keys.public_key])
    assert err.value.paths == ("adapter_model.safetensors",)
    assert err.value.code == "digest_mismatch"
    assert not err.value.retriable


@pytest.mark.parametrize("extra", ["notes.txt", ".gitattributes", "sub/adapter_model.bin"])
def test_extra_file_is_refused(adapter_copy: Path, demo: DemoManifest, extra: str) -> None:
    """model-signing skips .git* files by default; we do not skip anything."""
    (adapter_copy / extra).parent.mkdir(parents=True, exist_ok=True)
    (adapter_copy / extra).write_text("x")
    with pytest.raises(UnsignedFile) as err:
        verify_directory(adapter_copy, [demo.keys.public_key])
    assert err.value.paths == (extra,)


def test_symlink_is_refused(adapter_copy: Path, demo: DemoManifest) -> None:
    (adapter_copy / "link.json").symlink_to(adapter_copy / "adapter_config.json")
    with pytest.raises(UnsignedFile) as err:
        verify_directory(adapter_copy, [demo.keys.public_key])
    assert err.value.paths == ("link.json",)


def test_missing_file_is_refused(adapter_copy: Path, demo: DemoManifest) -> None:
    (adapter_copy / "adapter_config.json").unlink()
    with pytest.raises(MissingFile) as err:
        verify_directory(adapter_copy, [demo.keys.public_key])
    assert err.value.paths == ("adapter_config.json",)


def test_every_problem_is_reported(adapter_copy: Path, demo: DemoManifest) -> None:
    (adapter_copy / "adapter_config.json").write_text("{}")
    (adapter_copy / "adapter_model.safetensors").unlink()
    (adapter_copy / "evil.py").write_text("import os")
    with pytest.raises(DigestMismatch) as err:  # the highest-priority class leads
        verify_directory(adapter_copy, [demo.keys.public_key])
    assert [(p.code, p.path) for p in err.value.problems] == [
        ("digest_mismatch", "adapter_config.json"),
        ("missing_file", "adapter_model.safetensors"),
        ("unsigned_file", "evil.py"),
    ]


def test_wrong_key_is_refused(adapter_copy: Path, other_keys: DevKeyPair) -> None:
    with pytest.raises(SignatureInvalid, match="not signed by any trusted key"):
        verify_directory(adapter_copy, [other_keys.public_key])


def test_trusted_keys_are_tried_in_order(
    adapter_copy: Path, demo: DemoManifest, other_keys: DevKeyPair
) -> None:
    verified = verify_directory(adapter_copy, [other_keys.public_key, demo.keys.public_key])
    assert verified.trusted_key == demo.keys.public_key


def test_missing_signature_is_refused(adapter_copy: Path, demo: DemoManifest) -> None:
    (adapter_copy / SIGNATURE_FILENAME).unlink()
    with pytest.raises(SignatureInvalid):
        verify_directory(adapter_copy, [demo.keys.public_key])


def test_forged_payload_is_refused(adapter_copy: Path, demo: DemoManifest) -> None:
    """Re-listing a tampered file's new digest in the bundle breaks the signature."""
    weights = adapter_copy / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")
    sig = adapter_copy / SIGNATURE_FILENAME
    bundle = json.loads(sig.read_text())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    for resource in statement["predicate"]["resources"]:
        if resource["name"] == "adapter_model.safetensors":
            resource["digest"] = hashlib.sha256(weights.read_bytes()).hexdigest()
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    sig.write_text(json.dumps(bundle))
    with pytest.raises(SignatureInvalid):
        verify_directory(adapter_copy, [demo.keys.public_key])


def test_garbage_signature_is_refused(adapter_copy: Path, demo: DemoManifest) -> None:
    (adapter_copy / SIGNATURE_FILENAME).write_text("not json")
    with pytest.raises(SignatureInvalid):
        verify_directory(adapter_copy, [demo.keys.public_key])
    with pytest.raises(SignatureInvalid):
        manifest_digest(adapter_copy / SIGNATURE_FILENAME)


def test_no_trusted_keys_is_a_configuration_error(adapter_copy: Path) -> None:
    with pytest.raises(ValueError, match="no trusted"):
        verify_directory(adapter_copy, [])


def test_resign_replaces_signature_and_external_signature_path(
    adapter_copy: Path, demo: DemoManifest, other_keys: DevKeyPair, tmp_path: Path
) -> None:
    signed = sign_directory(adapter_copy, other_keys.private_key)
    assert signed.signer_identity == other_keys.identity
    assert verify_directory(adapter_copy, [other_keys.public_key]).manifest_digest == (
        signed.manifest_digest
    )
    with pytest.raises(SignatureInvalid):
        verify_directory(adapter_copy, [demo.keys.public_key])
    # A signature kept outside the directory signs the directory only.
    outside = tmp_path / "adapter.sig"
    (adapter_copy / SIGNATURE_FILENAME).unlink()
    sign_directory(adapter_copy, demo.keys.private_key, outside)
    assert verify_directory(adapter_copy, [demo.keys.public_key], outside).files.keys() == {
        "adapter_config.json",
        "adapter_model.safetensors",
    }
    assert not list(tmp_path.glob(".*tmp*")) and not list(adapter_copy.glob(".*tmp*"))


def test_sign_refuses_symlinks_and_empty_dirs(tmp_path: Path, demo: DemoManifest) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="nothing to sign"):
        sign_directory(empty, demo.keys.private_key)
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "a.json").write_text("{}")
    os.symlink("/etc/hostname", linked / "b.json")
    with pytest.raises(UnsignedFile):
        sign_directory(linked, demo.keys.private_key)
    assert not (linked / SIGNATURE_FILENAME).exists()
