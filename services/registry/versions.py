"""Adapter versions: upload plans, registration (immutable; the same content again is an
idempotent success, other content ALREADY_EXISTS), reads and listings (every registry
operation's conventions: :mod:`loraplane.registry.context`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from loraplane.registry import audit
from loraplane.registry.context import Ctx
from loraplane.registry.convert import (
    STATUS_FROM_PROTO,
    VERSION_COLUMNS,
    VERSION_FROM,
    adapter_ref,
    files_json,
    priority_db,
    version_pb,
)
from loraplane.registry.grammar import (
    MAX_RANK,
    MODULE_RE,
    REVISION_RE,
    SUPPORTED_FORMATS,
    Problem,
    artifact_prefix,
    artifact_uri,
    check_adapter_name,
    check_adapter_name_free,
    check_base_model,
    check_files,
    check_priority_value,
    check_sha256,
    check_tenant_id,
    check_version,
    content_digest,
    object_key,
    require,
    signature_uri,
)
from loraplane.registry.paging import decode_int_token, encode_token, page_size
from loraplane.registry.tenants import tenant_row
from loraplane.shared import outbox
from loraplane.shared.errors import AlreadyExists, NotFound
from loraplane.shared.signing import SIGNATURE_FILENAME
from loraplane.shared.topics import new_meta
from loraplane.v1 import common_pb2, events_pb2, registry_pb2

UPLOAD_TTL = timedelta(hours=1)
"""Validity of an upload plan (informational while uploads use the caller's credentials)."""


def ref_problems(tenant_id: str, name: str, version: str, *, name_field: str) -> list[Problem]:
    """Every problem of a version's three names (``name_field``: the name's field)."""
    return [
        *check_tenant_id(tenant_id),
        *check_adapter_name(name, name_field),
        *check_version(version),
    ]


async def version_row(
    conn: asyncpg.Connection, tenant_id: str, name: str, version: str
) -> Any:
    """The version's row (None when it does not exist)."""
    return await conn.fetchrow(
        f"SELECT {VERSION_COLUMNS} FROM {VERSION_FROM} "
        "WHERE v.adapter_id = $1 AND v.version = $2",
        f"{tenant_id}/{name}", version,
    )


async def require_version(
    conn: asyncpg.Connection, tenant_id: str, name: str, version: str
) -> Any:
    """The version's row; NOT_FOUND naming the tenant or the version that does not exist."""
    row = await version_row(conn, tenant_id, name, version)
    if row is None:
        await tenant_row(conn, tenant_id)
        raise NotFound(f"version {tenant_id}/{name}@{version} does not exist")
    return row


def version_json(row: Any) -> dict[str, Any]:
    """What the audit log records of a version: status, digest, engine id, base model, artifact
    and reasons."""
    return {
        "status": row["status"],
        "sha256": row["sha256"],
        "engine_id": row["engine_id"],
        "base_model": row["base_model"],
        "artifact_uri": row["artifact_uri"],
        "reasons": row["reasons"] or [],
    }


@dataclass(frozen=True)
class UploadPlan:
    """Where a version's files go (chosen by the registry)."""

    bucket: str
    key_prefix: str
    artifact_uri: str
    targets: list[tuple[str, str]]
    """``(relative path, full object key)`` per requested file."""
    expires_at: datetime


async def request_upload(
    conn: asyncpg.Connection,
    *,
    bucket: str,
    tenant_id: str,
    adapter_name: str,
    version: str,
    base_model: str,
    files: Sequence[tuple[str, int, str]],
    now: datetime,
) -> UploadPlan:
    """Choose the content-addressed location of a version's files.

    The prefix is ``adapters/<tenant>/<name>/<version>/<content digest>/`` in the
    allow-listed ``bucket``; the content digest covers every artifact file (the
    signature ``model.sig`` excluded; it must be listed). ALREADY_EXISTS when the
    version is registered with other content.
    """
    problems = [
        *ref_problems(tenant_id, adapter_name, version, name_field="adapter_name"),
        *check_adapter_name_free(adapter_name, base_model),
        *check_base_model(base_model),
        *check_files(files),
    ]
    if files and SIGNATURE_FILENAME not in {f[0] for f in files}:
        problems.append(Problem("files", f"must include the signature bundle {SIGNATURE_FILENAME}"))
    require(problems)
    await tenant_row(conn, tenant_id)
    digest = content_digest((p, d) for p, _, d in files)
    existing = await version_row(conn, tenant_id, adapter_name, version)
    if existing is not None:
        old = content_digest((f["path"], f["sha256"]) for f in existing["files"])
        if old != digest:
            raise AlreadyExists(
                f"version {tenant_id}/{adapter_name}@{version} already exists with other content"
            )
    prefix = artifact_prefix(tenant_id, adapter_name, version, digest)
    return UploadPlan(
        bucket=bucket,
        key_prefix=prefix,
        artifact_uri=artifact_uri(bucket, prefix),
        targets=[(p, object_key(prefix, p)) for p, _, _ in files],
        expires_at=now + UPLOAD_TTL,
    )


def check_record(rec: registry_pb2.AdapterVersion, *, bucket: str) -> list[Problem]:
    """Every problem of a version record given to RegisterVersion (fields prefixed
    ``version.``)."""
    p = "version."
    problems = [
        *check_tenant_id(rec.tenant_id, p + "tenant_id"),
        *check_adapter_name(rec.name, p + "name"),
        *check_adapter_name_free(rec.name, rec.base_model, p + "name"),
        *check_version(rec.version, p + "version"),
        *check_base_model(rec.base_model, p + "base_model"),
        *check_sha256(rec.sha256, p + "sha256"),
        *check_priority_value(rec.priority, p + "priority", allow_unspecified=True),
    ]
    if not 0 < rec.rank <= MAX_RANK:
        problems.append(Problem(p + "rank", f"{rec.rank} is outside [1, {MAX_RANK}]"))
    if (rec.format or "peft") not in SUPPORTED_FORMATS:
        problems.append(Problem(p + "format", f"{rec.format!r} is not one of {SUPPORTED_FORMATS}"))
    if not rec.target_modules:
        problems.append(Problem(p + "target_modules", "at least one module is required"))
    for i, module in enumerate(rec.target_modules):
        if not MODULE_RE.fullmatch(module):
            problems.append(Problem(f"{p}target_modules[{i}]", f"{module!r} is not a module name"))
    if len(set(rec.target_modules)) != len(rec.target_modules):
        problems.append(Problem(p + "target_modules", "lists a module twice"))
    if not REVISION_RE.fullmatch(rec.tokenizer_revision):
        problems.append(Problem(p + "tokenizer_revision", "is not a valid revision"))
    if len(rec.signer_identity) > 256:
        problems.append(Problem(p + "signer_identity", "longer than 256 characters"))
    if not math.isfinite(rec.lora_alpha) or rec.lora_alpha < 0:
        problems.append(Problem(p + "lora_alpha", "must be a finite number >= 0"))
    files = [(f.path, f.size_bytes, f.sha256) for f in rec.files]
    file_problems = check_files(files, p + "files")
    problems += file_problems
    if any(f.path == SIGNATURE_FILENAME for f in rec.files):
        problems.append(Problem(p + "files", f"must not list the signature {SIGNATURE_FILENAME} "
                                "(signature_uri points to it)"))
    if files and rec.size_bytes != sum(f.size_bytes for f in rec.files):
        problems.append(Problem(p + "size_bytes",
                                f"{rec.size_bytes} != total of files "
                                f"{sum(f.size_bytes for f in rec.files)}"))
    ids_ok = not any(x.field in (p + "tenant_id", p + "name", p + "version") for x in problems)
    if ids_ok and files and not file_problems:
        prefix = artifact_prefix(
            rec.tenant_id, rec.name, rec.version, content_digest((f[0], f[2]) for f in files)
        )
        expected = artifact_uri(bucket, prefix)
        if rec.artifact_uri != expected:
            problems.append(Problem(p + "artifact_uri",
                                    f"must be {expected} (the location RequestUpload chose)"))
        if rec.signature_uri and rec.signature_uri != signature_uri(expected):
            problems.append(Problem(p + "signature_uri", f"must be {signature_uri(expected)}"))
    return problems


async def lock_adapter(conn: asyncpg.Connection, tenant_id: str, name: str) -> Any:
    """Lock the adapter row (NOT_FOUND for an unknown tenant or adapter)."""
    row = await conn.fetchrow(
        "SELECT * FROM adapters WHERE adapter_id = $1 FOR UPDATE", f"{tenant_id}/{name}"
    )
    if row is None:
        await tenant_row(conn, tenant_id)
        raise NotFound(f"adapter {tenant_id}/{name} does not exist")
    return row


async def register_version(
    conn: asyncpg.Connection, ctx: Ctx, *, record: registry_pb2.AdapterVersion, bucket: str
) -> tuple[registry_pb2.AdapterVersion, bool]:
    """Register a version (status pending) and emit ``AdapterReleased``.

    Returns (stored record, created). The same (adapter, version) again with the same
    sha256 is an idempotent success (``created`` False, no event); with another sha256
    it is ALREADY_EXISTS.
    """
    require(check_record(record, bucket=bucket))
    tenant_id, name, version = record.tenant_id, record.name, record.version
    await tenant_row(conn, tenant_id, lock="FOR SHARE")
    adapter_id = f"{tenant_id}/{name}"
    await conn.execute(
        "INSERT INTO adapters (adapter_id, tenant_id, name, base_model) VALUES ($1, $2, $3, $4) "
        "ON CONFLICT (adapter_id) DO NOTHING",
        adapter_id, tenant_id, name, record.base_model,
    )
    await lock_adapter(conn, tenant_id, name)
    await conn.execute(
        "INSERT INTO release_pointers (adapter_id) VALUES ($1) ON CONFLICT DO NOTHING", adapter_id
    )
    existing = await version_row(conn, tenant_id, name, version)
    if existing is not None:
        if existing["sha256"] == record.sha256:
            return version_pb(existing), False
        raise AlreadyExists(
            f"version {adapter_id}@{version} already exists with sha256 {existing['sha256']}; "
            "versions are immutable"
        )
    await conn.execute(
        """
        INSERT INTO adapter_versions (
            adapter_id, version, base_model, rank, format, target_modules, artifact_uri,
            sha256, size_bytes, signature_uri, signer_identity, tokenizer_revision,
            status, priority_override, files, lora_alpha, created_by, created_at)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 'pending', $13, $14, $15,
                $16, clock_timestamp())
        """,
        adapter_id, version, record.base_model, record.rank, record.format or "peft",
        list(record.target_modules), record.artifact_uri, record.sha256, record.size_bytes,
        record.signature_uri or signature_uri(record.artifact_uri), record.signer_identity,
        record.tokenizer_revision, priority_db(record.priority), files_json(record.files),
        float(record.lora_alpha), ctx.actor,
    )
    row = await version_row(conn, tenant_id, name, version)
    stored = version_pb(row)
    await audit.write(conn, actor=ctx.actor, action="version.register",
                      subject=audit.subject_version(tenant_id, name, version),
                      before=None, after=version_json(row))
    event = events_pb2.AdapterReleased(
        meta=new_meta(ctx.producer, adapter_ref(row), clock=ctx.clock),
        engine_id=stored.engine_id,
        rank=stored.rank,
        format=stored.format,
        target_modules=stored.target_modules,
        artifact_uri=stored.artifact_uri,
        sha256=stored.sha256,
        size_bytes=stored.size_bytes,
        signer_identity=stored.signer_identity,
        tokenizer_revision=stored.tokenizer_revision,
        priority=stored.effective_priority,
        signature_uri=stored.signature_uri,
        files=stored.files,
        lora_alpha=stored.lora_alpha,
    )
    await outbox.enqueue(conn, event, topic_prefix=ctx.topic_prefix, tenant_id=tenant_id,
                         base_model=stored.base_model)
    return stored, True


async def get_version(
    conn: asyncpg.Connection, *, tenant_id: str, adapter_name: str, version: str
) -> registry_pb2.AdapterVersion:
    """Read one version; NOT_FOUND if the tenant or the version is unknown."""
    require(ref_problems(tenant_id, adapter_name, version, name_field="adapter_name"))
    return version_pb(await require_version(conn, tenant_id, adapter_name, version))


async def list_versions(
    conn: asyncpg.Connection,
    *,
    tenant_id: str = "",
    adapter_name: str = "",
    base_model: str = "",
    status: int = common_pb2.VERSION_STATUS_UNSPECIFIED,
    size: int = 0,
    token: str = "",
) -> tuple[list[registry_pb2.AdapterVersion], str]:
    """Versions matching every given filter, newest first (by engine id)."""
    problems: list[Problem] = []
    if tenant_id:
        problems += check_tenant_id(tenant_id)
    if adapter_name:
        problems += check_adapter_name(adapter_name)
    if base_model:
        problems += check_base_model(base_model)
    if status and status not in STATUS_FROM_PROTO:
        problems.append(Problem("status", f"{status} is not a valid status"))
    require(problems)
    limit = page_size(size)
    before = decode_int_token(token)
    status_label = STATUS_FROM_PROTO[status].value if status else ""
    rows = await conn.fetch(
        f"""
        SELECT {VERSION_COLUMNS} FROM {VERSION_FROM}
        WHERE ($1 = '' OR a.tenant_id = $1)
          AND ($2 = '' OR a.name = $2)
          AND ($3 = '' OR v.base_model = $3)
          AND ($4 = '' OR v.status::text = $4)
          AND ($5 = 0 OR v.engine_id < $5)
        ORDER BY v.engine_id DESC LIMIT $6
        """,
        tenant_id, adapter_name, base_model, status_label, before, limit + 1,
    )
    more = len(rows) > limit
    rows = rows[:limit]
    return [version_pb(r) for r in rows], encode_token(str(rows[-1]["engine_id"])) if more else ""
