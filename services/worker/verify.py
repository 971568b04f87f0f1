"""Verification of a download whose files were hashed while they were written.

:func:`loraplane.shared.signing.verify_directory` reads every file again to hash it,
which is what the worker does before registering a WARM version (files on disk may have
changed) and after a restart. On the COLD path the worker has just written the files
and hashed the very bytes it wrote (:meth:`~loraplane.worker.store.ObjectStore.download`
returns the sha256), so a second pass over up to 100 MB is wasted: here the signature
bundle is authenticated against the trusted keys (:func:`signed_digests`, which the host
tier runs as soon as the small bundle has arrived, while the weights still stream) and the
signed per-file digests are compared with the streamed ones (:func:`check_streamed`). The checks and the error classes are the ones of
``verify_directory`` (same model-signing building blocks, pinned with the package).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from cryptography import exceptions as crypto_exceptions
from model_signing._signing import sign_ec_key as _ms_ec_key
from model_signing._signing import sign_sigstore_pb as _ms_sigstore_pb

from loraplane.shared.signing import (
    HASH_ALGORITHM,
    SERIALIZATION_METHOD,
    DigestMismatch,
    MissingFile,
    SignatureInvalid,
    SignatureProblem,
    UnsignedFile,
    digest_of_files,
)


def _invalid(detail: str) -> SignatureInvalid:
    return SignatureInvalid([SignatureProblem(SignatureInvalid.code, detail)])


def signed_digests(signature_path: Path, public_keys: Sequence[Path]) -> dict[str, str]:
    """Authenticate the bundle with one of ``public_keys``; return ``{path: sha256}``.

    Raises :class:`~loraplane.shared.signing.SignatureInvalid` when the bundle is
    unreadable, uses another serialization, or no trusted key verifies it.
    """
    if not public_keys:
        raise ValueError("no trusted public keys given")
    try:
        signature = _ms_sigstore_pb.Signature.read(Path(signature_path))
    except FileNotFoundError:
        raise _invalid("signature bundle not found") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise _invalid(f"unreadable bundle: {exc}") from exc
    failures: list[str] = []
    for key in public_keys:
        try:
            manifest = _ms_ec_key.Verifier(Path(key)).verify(signature)
        except (ValueError, KeyError, TypeError, crypto_exceptions.InvalidSignature) as exc:
            failures.append(f"{Path(key).name}: {type(exc).__name__}: {exc}".rstrip(": "))
            continue
        params = manifest.serialization_type
        if params.get("method") != SERIALIZATION_METHOD or params.get("hash_type") != HASH_ALGORITHM:
            raise _invalid(f"unsupported serialization {params!r}")
        files: dict[str, str] = {}
        for rd in manifest.resource_descriptors():
            if rd.digest.algorithm != HASH_ALGORITHM:
                raise _invalid(f"digest algorithm {rd.digest.algorithm} for {rd.identifier}")
            files[rd.identifier] = rd.digest.digest_hex
        return files
    raise _invalid("not signed by any trusted key (" + "; ".join(failures) + ")")


def verify_streamed(
    signature_path: Path, streamed: Mapping[str, str], public_keys: Sequence[Path]
) -> str:
    """Check streamed ``{path: sha256}`` against the signed manifest; return the manifest
    digest (see :func:`~loraplane.shared.signing.digest_of_files`).

    Raises ``DigestMismatch`` / ``MissingFile`` / ``UnsignedFile`` (all
    :class:`~loraplane.shared.signing.SignatureError`) naming every file that differs.
    """
    return check_streamed(signed_digests(signature_path, public_keys), streamed)


def check_streamed(expected: Mapping[str, str], streamed: Mapping[str, str]) -> str:
    """Compare streamed ``{path: sha256}`` with the authenticated ``expected`` digests (from
    :func:`signed_digests`); return the manifest digest. Raises as :func:`verify_streamed`.
    """
    problems: list[SignatureProblem] = []
    for name in sorted(expected.keys() - streamed.keys()):
        problems.append(SignatureProblem(MissingFile.code, "signed file is missing", name))
    for name in sorted(streamed.keys() - expected.keys()):
        problems.append(SignatureProblem(UnsignedFile.code, "file is not in the signature", name))
    for name in sorted(expected.keys() & streamed.keys()):
        if expected[name] != streamed[name]:
            problems.append(SignatureProblem(
                DigestMismatch.code, f"sha256 {streamed[name]} != signed {expected[name]}", name))
    if problems:
        first = {p.code for p in problems}
        cls = (DigestMismatch if DigestMismatch.code in first
               else MissingFile if MissingFile.code in first else UnsignedFile)
        raise cls(problems)
    return digest_of_files(dict(streamed))
