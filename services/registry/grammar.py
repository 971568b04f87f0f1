"""Grammar of registry identifiers and the content-addressed artifact layout.

Every validator returns a list of :class:`Problem` (field + message) instead of
raising at the first one; :func:`require` raises one ``InvalidArgument`` naming every
field. The grammar is documented in ``services/registry/README.md`` and matches the
database CHECK constraints (migrations ``2026112900000{1,2}``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from loraplane.shared.errors import InvalidArgument
from loraplane.shared.signing import SIGNATURE_FILENAME, digest_of_files

TENANT_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{1,62}$")
"""Tenant id: 2-63 characters, lowercase letters, digits, ``-``; starts alphanumeric."""
ADAPTER_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
"""Adapter name: 1-63 characters, lowercase letters, digits, ``.``, ``_``, ``-``."""
VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
"""Version label: 1-64 characters, letters, digits, ``.``, ``_``, ``-``; starts alphanumeric."""
BASE_MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
"""Base model: ``name`` or ``org/name`` (each part starts alphanumeric), at most 128 chars."""
MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,127}$")
"""Target module: a Python-identifier-like module path (``q_proj``, ``mlp.down_proj``)."""
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
"""Digest: 64 lowercase hex characters."""
REVISION_RE = re.compile(r"^[A-Za-z0-9._-]{0,128}$")
"""Tokenizer revision: up to 128 letters, digits, ``.``, ``_``, ``-`` (may be empty)."""
FILE_SEGMENT_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
"""One segment of an artifact file path (no leading dot: no ``..``, no hidden files)."""

RESERVED_ADAPTER_NAMES = frozenset({"base"})
"""Names no adapter may be released under: on the inference APIs ``base`` means the base
model (the gateway checks base-model names before adapter names, so such an adapter could
never be called)."""

MAX_BASE_MODEL_LEN = 128
MAX_FILES = 64
"""Most files an artifact may list (a PEFT adapter has two plus the signature)."""
MAX_DISPLAY_NAME_LEN = 200
MAX_DESCRIPTION_LEN = 500
MAX_RANK = 1024
"""Sanity bound for ``rank``; the engine's ``max_lora_rank`` is enforced by admission."""
SUPPORTED_FORMATS = ("peft",)
ARTIFACT_ROOT = "adapters"
"""First segment of every artifact key in the allow-listed bucket."""


@dataclass(frozen=True)
class Problem:
    """One invalid field."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def require(problems: Iterable[Problem]) -> None:
    """Raise ``InvalidArgument`` listing every problem (fields named), if any."""
    found = list(problems)
    if found:
        raise InvalidArgument("; ".join(str(p) for p in found))


def _match(field: str, value: str, pattern: re.Pattern[str], what: str) -> list[Problem]:
    if not value:
        return [Problem(field, "is required")]
    if not pattern.fullmatch(value):
        return [Problem(field, f"{value!r} is not a valid {what}")]
    return []


def check_tenant_id(value: str, field: str = "tenant_id") -> list[Problem]:
    """Problems of a tenant id (see :data:`TENANT_ID_RE`)."""
    return _match(field, value, TENANT_ID_RE, "tenant id (^[a-z0-9][a-z0-9-]{1,62}$)")


def check_adapter_name(value: str, field: str = "adapter_name") -> list[Problem]:
    """Problems of an adapter name (see :data:`ADAPTER_NAME_RE`)."""
    return _match(field, value, ADAPTER_NAME_RE, "adapter name (^[a-z0-9][a-z0-9._-]{0,62}$)")


def check_adapter_name_free(
    value: str, base_model: str, field: str = "adapter_name"
) -> list[Problem]:
    """Problems of releasing an adapter under ``value`` on ``base_model``: a reserved name
    (:data:`RESERVED_ADAPTER_NAMES`) or the name of its base model, which call the base model
    on the inference APIs. Checked where versions are created, not on reads (an adapter
    released under such a name before the rule can still be listed and retired)."""
    if value in RESERVED_ADAPTER_NAMES:
        return [Problem(field, f"{value!r} is reserved: it names the base model on the "
                               "inference APIs; choose another adapter name")]
    if value and value == base_model:
        return [Problem(field, f"{value!r} is the name of its base model, which calls the "
                               "base model on the inference APIs; choose another adapter name")]
    return []


def check_version(value: str, field: str = "version") -> list[Problem]:
    """Problems of a version label (see :data:`VERSION_RE`)."""
    return _match(field, value, VERSION_RE, "version (^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$)")


def check_base_model(value: str, field: str = "base_model") -> list[Problem]:
    """Problems of a base model name (see :data:`BASE_MODEL_RE`)."""
    if len(value) > MAX_BASE_MODEL_LEN:
        return [Problem(field, f"longer than {MAX_BASE_MODEL_LEN} characters")]
    return _match(field, value, BASE_MODEL_RE, "base model name (name or org/name)")


def check_sha256(value: str, field: str = "sha256") -> list[Problem]:
    """Problems of a lowercase hex SHA-256 digest."""
    return _match(field, value, SHA256_RE, "sha256 (64 lowercase hex characters)")


def check_file_path(value: str, field: str) -> list[Problem]:
    """Problems of an artifact-relative file path: POSIX, relative, no ``..`` or hidden part."""
    if not value:
        return [Problem(field, "is required")]
    if value.startswith("/") or "\\" in value:
        return [Problem(field, f"{value!r} must be a relative POSIX path")]
    parts = value.split("/")
    if any(not FILE_SEGMENT_RE.fullmatch(p) for p in parts):
        return [Problem(field, f"{value!r} has an invalid segment (no '..', no hidden files)")]
    return []


def check_files(
    files: Sequence[tuple[str, int, str]], field: str = "files", *, require_digests: bool = True
) -> list[Problem]:
    """Problems of a file list ``[(path, size_bytes, sha256)]``."""
    problems: list[Problem] = []
    if not files:
        return [Problem(field, "at least one file is required")]
    if len(files) > MAX_FILES:
        problems.append(Problem(field, f"more than {MAX_FILES} files"))
    seen: set[str] = set()
    for i, (path, size, digest) in enumerate(files):
        where = f"{field}[{i}]"
        problems += check_file_path(path, f"{where}.path")
        if path in seen:
            problems.append(Problem(f"{where}.path", f"{path!r} is listed twice"))
        seen.add(path)
        if size < 0:
            problems.append(Problem(f"{where}.size_bytes", "must be >= 0"))
        if require_digests or digest:
            problems += check_sha256(digest, f"{where}.sha256")
    return problems


def check_priority_value(value: int, field: str, *, allow_unspecified: bool) -> list[Problem]:
    """Problems of a ``Priority`` enum value (1..4; 0 only where it means 'inherit')."""
    low = 0 if allow_unspecified else 1
    if not low <= value <= 4:
        return [Problem(field, f"{value} is not a valid priority")]
    return []


def content_digest(files: Iterable[tuple[str, str]]) -> str:
    """Content address of an artifact: the manifest digest formula
    (:func:`loraplane.shared.signing.digest_of_files`) over ``(path, sha256)`` of every
    artifact file, the signature bundle excluded."""
    return digest_of_files({p: d for p, d in files if p != SIGNATURE_FILENAME})


def artifact_prefix(tenant_id: str, adapter_name: str, version: str, digest: str) -> str:
    """Key prefix (ending in ``/``) chosen by the registry for one version's files:
    ``adapters/<tenant>/<name>/<version>/<content digest>/``."""
    for part in (tenant_id, adapter_name, version, digest):
        if not part or "/" in part or part.startswith("."):
            raise InvalidArgument(f"cannot build an artifact prefix from {part!r}")
    return f"{ARTIFACT_ROOT}/{tenant_id}/{adapter_name}/{version}/{digest}/"


def artifact_uri(bucket: str, prefix: str) -> str:
    """``s3://bucket/prefix``."""
    return f"s3://{bucket}/{prefix}"


def signature_uri(artifact_root_uri: str) -> str:
    """Location of the signature bundle of an artifact (``<artifact_uri>model.sig``)."""
    return artifact_root_uri + SIGNATURE_FILENAME


def object_key(prefix: str, path: str) -> str:
    """Full key of one artifact file; ``path`` must already be validated."""
    key = prefix + path
    if ".." in PurePosixPath(key).parts:
        raise InvalidArgument(f"invalid artifact path {path!r}")
    return key
