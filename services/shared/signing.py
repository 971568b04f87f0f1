"""Sign and verify artifact directories (adapters, models) with OpenSSF model-signing.

Wraps `model-signing==1.1.1` (key-based, offline, EC P-256/384/521 PEM keys).
A signature is a Sigstore bundle (JSON) holding a DSSE envelope whose payload
is an in-toto statement listing every file of the directory with its sha256.
In an adapter directory the bundle is the file ``model.sig``
(:data:`SIGNATURE_FILENAME`); it is the only file that is not itself signed.

What this module adds to model-signing:

* strict file sets: model-signing (by default) skips ``.git*`` files and honours
  ``ignore_paths`` written by the signer; here every regular file in the
  directory except the signature must be in the signed manifest, symbolic links
  and special files are refused, and every problem is reported at once;
* classified errors (:class:`SignatureInvalid`, :class:`DigestMismatch`,
  :class:`UnsignedFile`, :class:`MissingFile`) carrying every problem, instead
  of a ``ValueError`` with text;
* a list of trusted keys (the first one that verifies wins);
* the **manifest digest**, the value the registry records as a version's
  ``sha256`` (see :func:`manifest_digest`);
* the signer identity string of a key (see :func:`key_identity`).

Everything here blocks (file hashing, signature checks): async callers run it
in a thread, e.g. ``await asyncio.to_thread(verify_directory, ...)``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from cryptography import exceptions as crypto_exceptions
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from model_signing import hashing as ms_hashing
from model_signing import signing as ms_signing

# Private modules of model-signing: the public ``verifying.Config.verify`` does
# signature check + file comparison in one call and reports failures as bare
# ``ValueError`` text. These two classes are exactly its first two steps
# (read bundle, authenticate payload → manifest); they are pinned with the
# package (==1.1.1) and covered by tests/unit/devkit/test_signing.py.
from model_signing._signing import sign_ec_key as _ms_ec_key
from model_signing._signing import sign_sigstore_pb as _ms_sigstore_pb

from loraplane.shared.errors import FailedPrecondition

SIGNATURE_FILENAME = "model.sig"
"""Name of the signature bundle inside a signed directory."""

HASH_ALGORITHM = "sha256"
"""Per-file digest algorithm used when signing (the only one accepted on verify)."""

SERIALIZATION_METHOD = "files"
"""model-signing serialization used: one manifest entry per file (no shards)."""

_CHUNK = 1 << 20


# --------------------------------------------------------------------------- errors


@dataclass(frozen=True)
class SignatureProblem:
    """One reason a directory failed verification."""

    code: str
    """Machine-readable class: ``signature_invalid``, ``digest_mismatch``,
    ``unsigned_file`` or ``missing_file``."""
    detail: str
    """Human-readable explanation."""
    path: str | None = None
    """The file concerned (POSIX path relative to the directory), if any."""

    def __str__(self) -> str:
        where = f" {self.path}:" if self.path else ""
        return f"{self.code}:{where} {self.detail}"


class SignatureError(FailedPrecondition):
    """A directory does not match a trusted signature.

    The exception class is the classification of the *first* problem in
    priority order signature > digest > missing > unsigned; ``problems`` holds
    every problem found (admission reports them all). Never retriable: the
    same bytes fail the same way.
    """

    code: ClassVar[str] = "signature_error"
    """Stable classification string (also the ``code`` of the leading problem)."""

    def __init__(self, problems: Sequence[SignatureProblem]) -> None:
        if not problems:
            raise ValueError("a SignatureError needs at least one problem")
        self.problems: tuple[SignatureProblem, ...] = tuple(problems)
        super().__init__("; ".join(str(p) for p in self.problems))

    @property
    def paths(self) -> tuple[str, ...]:
        """Files named by the problems, in order."""
        return tuple(p.path for p in self.problems if p.path is not None)


class SignatureInvalid(SignatureError):
    """The bundle is unreadable, or no trusted key verifies it."""

    code = "signature_invalid"


class DigestMismatch(SignatureError):
    """A file's content differs from its digest in the signed manifest."""

    code = "digest_mismatch"


class MissingFile(SignatureError):
    """A file listed in the signed manifest is absent."""

    code = "missing_file"


class UnsignedFile(SignatureError):
    """A file (or link, or special file) is present but not in the signed manifest."""

    code = "unsigned_file"


_ERROR_BY_CODE: dict[str, type[SignatureError]] = {
    cls.code: cls for cls in (SignatureInvalid, DigestMismatch, MissingFile, UnsignedFile)
}
_PRIORITY = (SignatureInvalid.code, DigestMismatch.code, MissingFile.code, UnsignedFile.code)


def _error(problems: Sequence[SignatureProblem]) -> SignatureError:
    """The error class of the highest-priority problem, carrying all of them."""
    ordered = sorted(problems, key=lambda p: (_PRIORITY.index(p.code), p.path or ""))
    return _ERROR_BY_CODE[ordered[0].code](ordered)


def _invalid(detail: str, path: str | None = None) -> SignatureInvalid:
    return SignatureInvalid([SignatureProblem(SignatureInvalid.code, detail, path)])


def _raise_for(problems: Sequence[SignatureProblem]) -> None:
    """Raise :func:`_error` of ``problems`` unless there are none."""
    if problems:
        raise _error(problems)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class SignedManifest:
    """What a signature covers: every file of the directory and its sha256."""

    model_dir: Path
    """The signed directory."""
    signature_path: Path
    """The bundle file."""
    files: Mapping[str, str] = field(default_factory=dict)
    """POSIX relative path → sha256 hex, for every signed file."""
    manifest_digest: str = ""
    """See :func:`manifest_digest`; the registry's ``sha256`` of the version."""
    signer_identity: str = ""
    """See :func:`key_identity`."""

    @property
    def size_bytes(self) -> int:
        """Total size of the signed files as they are on disk now."""
        return sum((self.model_dir / name).stat().st_size for name in self.files)


@dataclass(frozen=True)
class VerifiedManifest(SignedManifest):
    """A :class:`SignedManifest` whose signature and files have been checked."""

    trusted_key: Path = Path()
    """The trusted public key that verified the signature."""


# --------------------------------------------------------------------------- digests


def digest_of_files(files: Mapping[str, str]) -> str:
    """The manifest digest of a ``{relative path: sha256 hex}`` mapping.

    Definition (stable, documented, reproducible with coreutils): the sha256
    hex of the lines ``"<sha256 hex of file>  <relative POSIX path>\\n"`` for
    every signed file, sorted by path (code-point / ``LC_ALL=C`` order); i.e.
    the ``sha256sum`` listing of the directory, hashed::

        (cd DIR && sha256sum adapter_config.json adapter_model.safetensors) | sha256sum

    Unlike the in-toto subject digest of model-signing (a hash of the
    concatenated file digests only) it binds file names too.
    """
    lines = "".join(f"{files[name]}  {name}\n" for name in sorted(files))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


def manifest_digest(signature_path: Path) -> str:
    """Manifest digest of the files listed in a signature bundle.

    This reads the bundle WITHOUT verifying it (no key needed); use the
    ``manifest_digest`` of :func:`verify_directory`'s result when trust matters.
    Raises :class:`SignatureInvalid` when the bundle cannot be parsed.
    """
    statement = _read_statement_unverified(Path(signature_path))
    return digest_of_files(_files_from_statement(statement))


def compute_manifest_digest(model_dir: Path, signature_path: Path | None = None) -> str:
    """Recompute the manifest digest from the files of ``model_dir``.

    Every regular file is included except the signature bundle (``model.sig``
    or ``signature_path`` when it lies inside the directory). Raises
    :class:`UnsignedFile` for symbolic links or special files.
    """
    model_dir = Path(model_dir)
    files, problems = _hash_tree(model_dir, _excluded(model_dir, signature_path))
    _raise_for(problems)
    return digest_of_files(files)


# --------------------------------------------------------------------------- keys


def _public_key_of(key_path: Path, password: str | None = None) -> ec.EllipticCurvePublicKey:
    data = Path(key_path).read_bytes()
    key: Any
    if b"PRIVATE KEY" in data:
        key = serialization.load_pem_private_key(
            data, password.encode() if password else None
        ).public_key()
    else:
        key = serialization.load_pem_public_key(data)
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise TypeError(f"{key_path}: not an elliptic-curve key")
    return key


def key_identity(key_path: Path, password: str | None = None) -> str:
    """Signer identity of a PEM key (private or public): ``key:sha256:<hex>``.

    ``<hex>`` is the sha256 of the public key's DER SubjectPublicKeyInfo, so a
    private key and its public key have the same identity (``openssl pkey
    -pubin -in pub.pem -outform DER | sha256sum``).
    """
    der = _public_key_of(key_path, password).public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return f"key:sha256:{hashlib.sha256(der).hexdigest()}"


# --------------------------------------------------------------------------- sign


def sign_directory(
    model_dir: Path,
    private_key: Path,
    signature_path: Path | None = None,
    *,
    password: str | None = None,
) -> SignedManifest:
    """Sign every file of ``model_dir`` with an EC private key (PEM).

    The bundle goes to ``signature_path`` (default ``model_dir/model.sig``),
    replacing any previous one atomically. Symbolic links and special files are
    refused (:class:`UnsignedFile`), as is an empty directory (``ValueError``).
    Returns the signed file list, the manifest digest and the signer identity.
    """
    model_dir = Path(model_dir)
    sig_path = Path(signature_path) if signature_path else model_dir / SIGNATURE_FILENAME
    if not model_dir.is_dir():
        raise NotADirectoryError(str(model_dir))
    excluded = _excluded(model_dir, sig_path)
    files, problems = _hash_tree(model_dir, excluded)
    _raise_for(problems)
    if not files:
        raise ValueError(f"{model_dir}: nothing to sign")

    hashing_config = (
        ms_hashing.Config()  # type: ignore[no-untyped-call]
        .use_file_serialization(hashing_algorithm="sha256", allow_symlinks=False)
        .set_ignored_paths(paths=sorted(excluded), ignore_git_paths=False)
    )
    tmp = sig_path.with_name(f".{sig_path.name}.tmp-{uuid.uuid4().hex[:12]}")
    try:
        (
            ms_signing.Config()  # type: ignore[no-untyped-call]
            .use_elliptic_key_signer(private_key=Path(private_key), password=password)
            .set_hashing_config(hashing_config)
            .sign(model_dir, tmp)
        )
        signed = _files_from_statement(_read_statement_unverified(tmp))
        if signed != files:  # a file changed while we were signing
            raise RuntimeError(f"{model_dir}: files changed during signing")
        os.replace(tmp, sig_path)
    finally:
        tmp.unlink(missing_ok=True)
    return SignedManifest(
        model_dir=model_dir,
        signature_path=sig_path,
        files=files,
        manifest_digest=digest_of_files(files),
        signer_identity=key_identity(Path(private_key), password),
    )


# --------------------------------------------------------------------------- verify


def verify_directory(
    model_dir: Path,
    public_keys: Sequence[Path],
    signature_path: Path | None = None,
) -> VerifiedManifest:
    """Verify ``model_dir`` against its signature and a list of trusted keys.

    1. the bundle must parse and be signed by one of ``public_keys`` (tried in
       order) → else :class:`SignatureInvalid`;
    2. the signed manifest must use per-file sha256 serialization;
    3. the directory must hold exactly the signed files (the bundle itself
       excepted), each with its signed digest → else :class:`DigestMismatch`
       (naming the file), :class:`MissingFile` or :class:`UnsignedFile`,
       each error carrying every problem found.

    Raises ``ValueError`` if ``public_keys`` is empty or a key file is not an
    EC public key (a configuration error, not a property of the artifact).
    """
    model_dir = Path(model_dir)
    sig_path = Path(signature_path) if signature_path else model_dir / SIGNATURE_FILENAME
    if not public_keys:
        raise ValueError("no trusted public keys given")
    verifiers = [(Path(k), _ms_ec_key.Verifier(Path(k))) for k in public_keys]

    try:
        signature = _ms_sigstore_pb.Signature.read(sig_path)
    except FileNotFoundError:
        raise _invalid("signature bundle not found", _rel_or_name(model_dir, sig_path)) from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise _invalid(f"unreadable bundle: {exc}", _rel_or_name(model_dir, sig_path)) from exc

    trusted_key: Path | None = None
    failures: list[str] = []
    expected_manifest = None
    for key_path, verifier in verifiers:
        try:
            expected_manifest = verifier.verify(signature)
        except (ValueError, KeyError, TypeError, crypto_exceptions.InvalidSignature) as exc:
            failures.append(f"{key_path.name}: {type(exc).__name__}: {exc}".rstrip(": "))
            continue
        trusted_key = key_path
        break
    if trusted_key is None or expected_manifest is None:
        raise _invalid("not signed by any trusted key (" + "; ".join(failures) + ")")

    params = expected_manifest.serialization_type
    if params.get("method") != SERIALIZATION_METHOD or params.get("hash_type") != HASH_ALGORITHM:
        raise _invalid(f"unsupported serialization {params!r} (want per-file {HASH_ALGORITHM})")
    expected: dict[str, str] = {}
    for rd in expected_manifest.resource_descriptors():
        if rd.digest.algorithm != HASH_ALGORITHM:
            raise _invalid(f"digest algorithm {rd.digest.algorithm}", rd.identifier)
        expected[rd.identifier] = rd.digest.digest_hex

    actual, problems = _hash_tree(model_dir, _excluded(model_dir, sig_path))
    for name in sorted(expected.keys() - actual.keys()):
        problems.append(SignatureProblem(MissingFile.code, "signed file is missing", name))
    for name in sorted(actual.keys() - expected.keys()):
        problems.append(SignatureProblem(UnsignedFile.code, "file is not in the signature", name))
    for name in sorted(expected.keys() & actual.keys()):
        if expected[name] != actual[name]:
            problems.append(
                SignatureProblem(
                    DigestMismatch.code,
                    f"sha256 {actual[name]} != signed {expected[name]}",
                    name,
                )
            )
    _raise_for(problems)

    return VerifiedManifest(
        model_dir=model_dir,
        signature_path=sig_path,
        files=actual,
        manifest_digest=digest_of_files(actual),
        signer_identity=key_identity(trusted_key),
        trusted_key=trusted_key,
    )


# --------------------------------------------------------------------------- helpers


def _rel_or_name(model_dir: Path, path: Path) -> str:
    try:
        return PurePosixPath(path.relative_to(model_dir)).as_posix()
    except ValueError:
        return path.name


def _excluded(model_dir: Path, signature_path: Path | None) -> frozenset[str]:
    """Relative paths (inside ``model_dir``) that are not signed: the bundle only."""
    sig = Path(signature_path) if signature_path else model_dir / SIGNATURE_FILENAME
    try:
        rel = sig.resolve().relative_to(model_dir.resolve())
    except ValueError:
        return frozenset()
    return frozenset({PurePosixPath(rel).as_posix()})


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _hash_tree(
    model_dir: Path, excluded: frozenset[str]
) -> tuple[dict[str, str], list[SignatureProblem]]:
    """sha256 of every regular file below ``model_dir`` (hidden ones too).

    Symbolic links and special files are returned as ``unsigned_file`` problems.
    """
    files: dict[str, str] = {}
    problems: list[SignatureProblem] = []
    for dirpath, dirnames, filenames in os.walk(model_dir, followlinks=False):
        base = Path(dirpath)
        for name in sorted(dirnames):
            if (base / name).is_symlink():
                rel = PurePosixPath((base / name).relative_to(model_dir)).as_posix()
                problems.append(SignatureProblem(UnsignedFile.code, "symbolic link", rel))
        for name in sorted(filenames):
            path = base / name
            rel = PurePosixPath(path.relative_to(model_dir)).as_posix()
            if rel in excluded:
                continue
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                problems.append(SignatureProblem(UnsignedFile.code, "symbolic link", rel))
            elif not stat.S_ISREG(mode):
                problems.append(SignatureProblem(UnsignedFile.code, "not a regular file", rel))
            else:
                files[rel] = _sha256_file(path)
    return files, problems


def _read_statement_unverified(signature_path: Path) -> dict[str, Any]:
    """The in-toto statement inside a bundle, parsed but NOT authenticated."""
    try:
        bundle = json.loads(signature_path.read_text(encoding="utf-8"))
        payload = base64.b64decode(bundle["dsseEnvelope"]["payload"], validate=True)
        statement = json.loads(payload)
        if not isinstance(statement, dict):
            raise TypeError("statement is not an object")
        return statement
    except FileNotFoundError:
        raise _invalid("signature bundle not found", signature_path.name) from None
    except (OSError, ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise _invalid(f"unreadable bundle: {exc}", signature_path.name) from exc


def _files_from_statement(statement: Mapping[str, Any]) -> dict[str, str]:
    """``{path: sha256 hex}`` from a model-signing v1.0 in-toto statement."""
    try:
        predicate = statement["predicate"]
        serialization_params = predicate["serialization"]
        if (
            serialization_params.get("method") != SERIALIZATION_METHOD
            or serialization_params.get("hash_type") != HASH_ALGORITHM
        ):
            raise ValueError(f"unsupported serialization {serialization_params!r}")
        files: dict[str, str] = {}
        for resource in predicate["resources"]:
            if resource["algorithm"] != HASH_ALGORITHM:
                raise ValueError(f"unsupported digest algorithm {resource['algorithm']!r}")
            files[str(resource["name"])] = str(resource["digest"])
        return files
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _invalid(f"unexpected statement: {exc}") from exc
