"""Signature check: a trusted key signed exactly these files, and the registry agrees.

Wraps ``loraplane.shared.signing.verify_directory`` (OpenSSF model-signing, key-based,
offline) and classifies its problems, then compares the verified manifest with what the
registry recorded for the version:

* bundle absent, unreadable, or not verifying → ``SIGNATURE_INVALID``;
* bundle names (``verificationMaterial.publicKey.hint``) a key that is not trusted for
  this tenant → ``UNTRUSTED_SIGNER`` (the hint only routes; trust comes from the
  cryptographic check with the trusted key);
* a file differs from its signed digest → ``DIGEST_MISMATCH``; a signed file is absent →
  ``MISSING_FILE``; a file is not in the signature → ``UNSIGNED_FILE``;
* the manifest digest differs from the registered ``sha256`` (or a file from the
  registered file list) → ``DIGEST_MISMATCH``; another signer than the registered one →
  ``UNTRUSTED_SIGNER``.

Files refused before download, and symbolic links (reported by the files check), are not
reported again as missing or unsigned.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from loraplane.admission.problems import (
    DIGEST_MISMATCH,
    MISSING_FILE,
    SIGNATURE_INVALID,
    UNSIGNED_FILE,
    UNTRUSTED_SIGNER,
    Code,
    Problem,
)
from loraplane.admission.trust import TrustedKey
from loraplane.shared import signing

MAX_BUNDLE_BYTES = 1 << 20
"""Signature bundles are a few KiB; larger ones are refused unread."""
SIGNATURE_PATH = signing.SIGNATURE_FILENAME

_CODE: dict[str, Code] = {
    signing.SignatureInvalid.code: SIGNATURE_INVALID,
    signing.DigestMismatch.code: DIGEST_MISMATCH,
    signing.MissingFile.code: MISSING_FILE,
    signing.UnsignedFile.code: UNSIGNED_FILE,
}


@dataclass(frozen=True, slots=True)
class RegisteredFile:
    """A file as the registry recorded it."""

    path: str
    size_bytes: int
    sha256: str


@dataclass(frozen=True)
class SignatureResult:
    """What the signature check found."""

    problems: tuple[Problem, ...]
    verified: signing.VerifiedManifest | None
    """The verified manifest, when the signature verified and every file matched."""
    bytes_hashed: int
    """Bytes of artifact files hashed."""


def bundle_key_hint(signature_path: Path) -> tuple[str | None, list[Problem]]:
    """The unauthenticated key hint of a bundle; problems if it cannot be read."""
    try:
        with signature_path.open("rb") as f:
            raw = f.read(MAX_BUNDLE_BYTES + 1)
    except FileNotFoundError:
        return None, [Problem(SIGNATURE_INVALID, "signature bundle is missing", SIGNATURE_PATH)]
    except OSError as exc:
        return None, [Problem(SIGNATURE_INVALID, f"unreadable bundle: {exc}", SIGNATURE_PATH)]
    if len(raw) > MAX_BUNDLE_BYTES:
        return None, [Problem(SIGNATURE_INVALID, f"bundle larger than {MAX_BUNDLE_BYTES} "
                              "bytes", SIGNATURE_PATH)]
    try:
        doc = json.loads(raw)
        hint = doc["verificationMaterial"]["publicKey"].get("hint") or None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return None, [Problem(SIGNATURE_INVALID, f"not a Sigstore bundle: "
                              f"{type(exc).__name__}", SIGNATURE_PATH)]
    if hint is not None and not isinstance(hint, str):
        return None, [Problem(SIGNATURE_INVALID, "key hint is not a string", SIGNATURE_PATH)]
    return hint, []


def check_signature(
    adapter_dir: Path,
    signature_path: Path,
    *,
    trusted: Sequence[TrustedKey],
    registered_sha256: str,
    registered_files: Sequence[RegisteredFile] = (),
    registered_signer: str = "",
    refused: Collection[str] = (),
) -> SignatureResult:
    """Verify ``adapter_dir`` against ``signature_path`` and the registry's record."""
    adapter_dir = Path(adapter_dir)
    if not trusted:
        return SignatureResult((Problem(UNTRUSTED_SIGNER, "no key is trusted for this "
                                        "tenant"),), None, 0)
    hint, problems = bundle_key_hint(Path(signature_path))
    if problems:
        return SignatureResult(tuple(problems), None, 0)
    keys = [k for k in trusted if k.hint == hint] if hint else list(trusted)
    if not keys:
        return SignatureResult((Problem(UNTRUSTED_SIGNER, f"signed by key {hint} which is "
                                        "not trusted for this tenant", SIGNATURE_PATH),),
                               None, 0)
    links = {p.name for p in adapter_dir.iterdir() if p.is_symlink()} \
        if adapter_dir.is_dir() else set()
    quiet = {*refused, *links}
    bytes_hashed = _regular_bytes(adapter_dir, signature_path)
    try:
        verified = signing.verify_directory(adapter_dir, [k.path for k in keys],
                                            Path(signature_path))
    except signing.SignatureError as err:
        out = [
            Problem(_CODE.get(p.code, SIGNATURE_INVALID), p.detail, p.path or "")
            for p in err.problems
            if not (p.path in quiet and p.code in (signing.MissingFile.code,
                                                   signing.UnsignedFile.code))
        ]
        # Problems only about refused or linked files add nothing: those files are
        # already reasons of the verdict (download stage / files check), never admitted.
        return SignatureResult(tuple(out), None, bytes_hashed)

    if verified.manifest_digest != registered_sha256:
        problems.append(Problem(DIGEST_MISMATCH, f"manifest digest {verified.manifest_digest} "
                                f"!= registered sha256 {registered_sha256[:64] or '(none)'}"))
    if registered_signer and verified.signer_identity != registered_signer:
        problems.append(Problem(UNTRUSTED_SIGNER, f"signed by {verified.signer_identity}, the "
                                f"registry recorded {registered_signer[:100]}", SIGNATURE_PATH))
    problems.extend(_compare_files(verified.files, registered_files, adapter_dir))
    return SignatureResult(tuple(problems), verified if not problems else None, bytes_hashed)


def _compare_files(
    signed: Mapping[str, str], registered: Sequence[RegisteredFile], adapter_dir: Path
) -> list[Problem]:
    if not registered:
        return []
    problems: list[Problem] = []
    reg = {f.path: f for f in registered}
    for name in sorted(set(signed) | set(reg)):
        if name not in reg:
            problems.append(Problem(DIGEST_MISMATCH, "signed file is not in the registered "
                                    "file list", name))
        elif name not in signed:
            problems.append(Problem(DIGEST_MISMATCH, "registered file is not signed", name))
        elif signed[name] != reg[name].sha256:
            problems.append(Problem(DIGEST_MISMATCH, f"sha256 {signed[name]} != registered "
                                    f"{reg[name].sha256[:64]}", name))
        elif (adapter_dir / name).stat().st_size != reg[name].size_bytes:
            problems.append(Problem(DIGEST_MISMATCH, f"size differs from the registered "
                                    f"{reg[name].size_bytes} bytes", name))
    return problems


def _regular_bytes(adapter_dir: Path, signature_path: Path) -> int:
    if not adapter_dir.is_dir():
        return 0
    total = 0
    for p in adapter_dir.iterdir():
        if p.is_file() and not p.is_symlink() and p.resolve() != Path(signature_path).resolve():
            total += p.stat().st_size
    return total
