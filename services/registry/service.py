"""Registry versions and releases: every operation is a function over one connection.

Each function runs inside the caller's transaction (``async with transaction(pool) as
conn``), validates its input (INVALID_ARGUMENT names every bad field), applies the
state change, appends the audit entry and writes the event to the outbox, so the
change, its audit entry and its event commit together or not at all.

Entities changed by a function are locked (``SELECT ... FOR UPDATE``) before the
outbox row is written, which makes outbox id order equal to commit order per adapter
(the relay's per-key ordering relies on it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
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
    reasons_json,
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
from loraplane.registry.status import (
    Pointers,
    ReleasePlan,
    Status,
    plan_canary,
    plan_promote,
    plan_retire,
    plan_rollback,
)
from loraplane.registry.tenants import tenant_row
from loraplane.shared import outbox
from loraplane.shared.dedupe import claim
from loraplane.shared.errors import AlreadyExists, FailedPrecondition, NotFound
from loraplane.shared.signing import SIGNATURE_FILENAME
from loraplane.shared.topics import new_meta
from loraplane.v1 import common_pb2, events_pb2, registry_pb2

UPLOAD_TTL = timedelta(hours=1)
"""Validity of an upload plan (informational while uploads use the caller's credentials)."""


# =========================================================================== versions


def _ref_problems(tenant_id: str, name: str, version: str, *, name_field: str) -> list[Problem]:
    return [
        *check_tenant_id(tenant_id),
        *check_adapter_name(name, name_field),
        *check_version(version),
    ]


async def _version_row(
    conn: asyncpg.Connection, tenant_id: str, name: str, version: str
) -> Any:
    return await conn.fetchrow(
        f"SELECT {VERSION_COLUMNS} FROM {VERSION_FROM} "
        "WHERE v.adapter_id = $1 AND v.version = $2",
        f"{tenant_id}/{name}", version,
    )


async def _require_version(
    conn: asyncpg.Connection, tenant_id: str, name: str, version: str
) -> Any:
    row = await _version_row(conn, tenant_id, name, version)
    if row is None:
        await tenant_row(conn, tenant_id)
        raise NotFound(f"version {tenant_id}/{name}@{version} does not exist")
    return row


def _version_json(row: Any) -> dict[str, Any]:
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
        *_ref_problems(tenant_id, adapter_name, version, name_field="adapter_name"),
        *check_adapter_name_free(adapter_name, base_model),
        *check_base_model(base_model),
        *check_files(files),
    ]
    if files and SIGNATURE_FILENAME not in {f[0] for f in files}:
        problems.append(Problem("files", f"must include the signature bundle {SIGNATURE_FILENAME}"))
    require(problems)
    await tenant_row(conn, tenant_id)
    digest = content_digest((p, d) for p, _, d in files)
    existing = await _version_row(conn, tenant_id, adapter_name, version)
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


async def _lock_adapter(conn: asyncpg.Connection, tenant_id: str, name: str) -> Any:
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
    await _lock_adapter(conn, tenant_id, name)
    await conn.execute(
        "INSERT INTO release_pointers (adapter_id) VALUES ($1) ON CONFLICT DO NOTHING", adapter_id
    )
    existing = await _version_row(conn, tenant_id, name, version)
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
    row = await _version_row(conn, tenant_id, name, version)
    stored = version_pb(row)
    await audit.write(conn, actor=ctx.actor, action="version.register",
                      subject=audit.subject_version(tenant_id, name, version),
                      before=None, after=_version_json(row))
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
    require(_ref_problems(tenant_id, adapter_name, version, name_field="adapter_name"))
    return version_pb(await _require_version(conn, tenant_id, adapter_name, version))


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


# =========================================================================== releases


@dataclass
class _Release:
    adapter_id: str
    pointers: Pointers
    rows: dict[str, Any]
    """version → version row."""
    updated_at: datetime | None = None
    paused: bool = False
    """The canary analysis is paused for the current canary (``canary_paused``)."""
    cleared: bool = True
    """The current canary may receive tenant traffic (``canary_cleared``)."""


async def _load_release(
    conn: asyncpg.Connection, tenant_id: str, name: str, *, lock: bool
) -> _Release:
    if lock:
        await _lock_adapter(conn, tenant_id, name)
    adapter_id = f"{tenant_id}/{name}"
    ptr = await conn.fetchrow(
        "SELECT * FROM release_pointers WHERE adapter_id = $1" + (" FOR UPDATE" if lock else ""),
        adapter_id,
    )
    if ptr is None:
        exists = await conn.fetchval("SELECT 1 FROM adapters WHERE adapter_id = $1", adapter_id)
        if exists is None:
            await tenant_row(conn, tenant_id)
            raise NotFound(f"adapter {adapter_id} does not exist")
    rows = await conn.fetch(
        f"SELECT {VERSION_COLUMNS} FROM {VERSION_FROM} WHERE v.adapter_id = $1", adapter_id
    )
    pointers = Pointers(
        stable=ptr["stable_version"] if ptr else None,
        canary=ptr["canary_version"] if ptr else None,
        canary_percent=ptr["canary_percent"] if ptr else 0,
        rollback_to=ptr["rollback_to"] if ptr else None,
        history=tuple(ptr["stable_history"]) if ptr else (),
    )
    return _Release(adapter_id, pointers, {r["version"]: r for r in rows},
                    ptr["updated_at"] if ptr else None,
                    bool(ptr["canary_paused"]) if ptr else False,
                    bool(ptr["canary_cleared"]) if ptr else True)


def _paused_after(rel: _Release, new: Pointers) -> bool:
    """``canary_paused`` after a pointer change: kept while the canary stays the same
    version (the UPDATE in :func:`_apply_plan` resets it otherwise)."""
    return rel.paused and new.canary == rel.pointers.canary


def _flags_after(rel: _Release, new: Pointers, ctx: Ctx) -> tuple[bool, bool]:
    """``(canary_paused, canary_cleared)`` after a pointer change: both kept while the
    canary stays the same version; a new canary is cleared only without clearance."""
    same = new.canary == rel.pointers.canary
    return rel.paused and same, rel.cleared if same else not ctx.canary_clearance


async def _unwithdraw(conn: asyncpg.Connection, rel: _Release, version: str) -> None:
    """A person made ``version`` stable or canary again: it is no longer withdrawn (the
    action's own audit entry and event say so)."""
    if version and (rel.rows.get(version) or {}).get("withdrawn_reason"):
        await conn.execute("UPDATE adapter_versions SET withdrawn_reason = '' "
                           "WHERE adapter_id = $1 AND version = $2", rel.adapter_id, version)


def _statuses(rel: _Release) -> dict[str, Status]:
    return {v: Status(r["status"]) for v, r in rel.rows.items()}


def _pointers_json(p: Pointers) -> dict[str, Any]:
    return {
        "stable_version": p.stable,
        "canary_version": p.canary,
        "canary_percent": p.canary_percent,
        "rollback_to": p.rollback_to,
    }


def release_pb(
    tenant_id: str, name: str, p: Pointers, rows: dict[str, Any], updated_at: datetime | None,
    paused: bool = False, cleared: bool = True,
) -> registry_pb2.ReleasePointers:
    """Pointers → ``ReleasePointers`` (``paused``: the canary analysis is paused;
    ``cleared``: the canary may receive tenant traffic)."""
    out = registry_pb2.ReleasePointers(
        adapter_id=f"{tenant_id}/{name}",
        tenant_id=tenant_id,
        adapter_name=name,
        stable_version=p.stable or "",
        canary_version=p.canary or "",
        canary_percent=p.canary_percent,
        rollback_to=p.rollback_to or "",
        base_model=rows[p.stable]["base_model"] if p.stable in rows else "",
        canary_paused=paused and bool(p.canary),
        canary_cleared=cleared or not p.canary,
    )
    if updated_at is not None:
        out.updated_at.FromDatetime(updated_at)
    return out


async def _apply_plan(
    conn: asyncpg.Connection,
    ctx: Ctx,
    rel: _Release,
    plan: ReleasePlan,
    *,
    tenant_id: str,
    name: str,
    action: str,
    reason: str,
) -> datetime | None:
    """Write the plan's status changes and pointers, and the audit entry."""
    for version, status in plan.status_changes.items():
        await conn.execute(
            "UPDATE adapter_versions SET status = $3::version_status, "
            "retired_at = CASE WHEN $3::version_status = 'retired' THEN now() "
            "ELSE retired_at END "
            "WHERE adapter_id = $1 AND version = $2",
            rel.adapter_id, version, status.value,
        )
    p = plan.pointers
    updated_at = await conn.fetchval(
        "UPDATE release_pointers SET stable_version = $2, canary_version = $3, "
        "canary_percent = $4, rollback_to = $5, stable_history = $6, updated_at = now(), "
        "canary_paused = canary_paused AND canary_version IS NOT DISTINCT FROM $3, "
        "canary_cleared = CASE WHEN canary_version IS NOT DISTINCT FROM $3 "
        "THEN canary_cleared ELSE $7 END "
        "WHERE adapter_id = $1 RETURNING updated_at",
        rel.adapter_id, p.stable, p.canary, p.canary_percent, p.rollback_to, list(p.history),
        not ctx.canary_clearance,
    )
    before = _pointers_json(rel.pointers)
    after = _pointers_json(p)
    before["statuses"] = {v: rel.rows[v]["status"] for v in plan.status_changes}
    after["statuses"] = {v: s.value for v, s in plan.status_changes.items()}
    if reason:
        after["reason"] = reason
    await audit.write(conn, actor=ctx.actor, action=action,
                      subject=audit.subject_adapter(tenant_id, name), before=before, after=after)
    return updated_at  # type: ignore[no-any-return]


async def _emit(
    conn: asyncpg.Connection, ctx: Ctx, event: events_pb2.LifecycleEvent, row: Any
) -> None:
    await outbox.enqueue(conn, event, topic_prefix=ctx.topic_prefix,
                         tenant_id=row["tenant_id"], base_model=row["base_model"])


def _ref_problems_release(tenant_id: str, name: str) -> list[Problem]:
    return [*check_tenant_id(tenant_id), *check_adapter_name(name)]


async def promote(
    conn: asyncpg.Connection, ctx: Ctx, *, tenant_id: str, adapter_name: str, version: str,
    reason: str = "",
) -> registry_pb2.ReleasePointers:
    """Make an admitted (or canary) version stable; emits ``AdapterPromoted``."""
    require(_ref_problems(tenant_id, adapter_name, version, name_field="adapter_name"))
    rel = await _load_release(conn, tenant_id, adapter_name, lock=True)
    subject = f"{tenant_id}/{adapter_name}"
    plan = plan_promote(rel.pointers, version, _statuses(rel), subject)
    withdrawn = bool(rel.rows[version]["withdrawn_reason"]) if version in rel.rows else False
    if not plan.changed and not withdrawn:
        return release_pb(tenant_id, adapter_name, rel.pointers, rel.rows, rel.updated_at,
                          rel.paused, rel.cleared)
    # promoting the stable version again ends its withdrawal (audited, AdapterPromoted)
    updated = await _apply_plan(conn, ctx, rel, plan, tenant_id=tenant_id, name=adapter_name,
                                action="release.promote", reason=reason)
    await _unwithdraw(conn, rel, version)
    row = rel.rows[version]
    event = events_pb2.LifecycleEvent()
    event.promoted.CopyFrom(events_pb2.AdapterPromoted(
        meta=new_meta(ctx.producer, adapter_ref(row), clock=ctx.clock),
        previous_stable_version=rel.pointers.stable or "",
        engine_id=row["engine_id"],
    ))
    await _emit(conn, ctx, event, row)
    return release_pb(tenant_id, adapter_name, plan.pointers, rel.rows, updated,
                      *_flags_after(rel, plan.pointers, ctx))


async def set_canary(
    conn: asyncpg.Connection, ctx: Ctx, *, tenant_id: str, adapter_name: str, version: str,
    percent: int, reason: str = "",
) -> registry_pb2.ReleasePointers:
    """Set (or, with version "" and percent 0, clear) the canary; emits ``CanaryChanged``."""
    problems = _ref_problems_release(tenant_id, adapter_name)
    if version:
        problems += check_version(version)
    if not 0 <= percent <= 100:
        problems.append(Problem("percent", f"{percent} is outside [0, 100]"))
    require(problems)
    rel = await _load_release(conn, tenant_id, adapter_name, lock=True)
    plan = plan_canary(rel.pointers, version, percent, _statuses(rel),
                       f"{tenant_id}/{adapter_name}")
    if not plan.changed:
        return release_pb(tenant_id, adapter_name, rel.pointers, rel.rows, rel.updated_at,
                          rel.paused, rel.cleared)
    updated = await _apply_plan(conn, ctx, rel, plan, tenant_id=tenant_id, name=adapter_name,
                                action="release.canary", reason=reason)
    await _unwithdraw(conn, rel, version)
    await _emit_canary(conn, ctx, rel, plan.pointers)
    return release_pb(tenant_id, adapter_name, plan.pointers, rel.rows, updated,
                      *_flags_after(rel, plan.pointers, ctx))


async def _emit_canary(conn: asyncpg.Connection, ctx: Ctx, rel: _Release, new: Pointers) -> None:
    old = rel.pointers
    row = rel.rows[new.canary] if new.canary else rel.rows[old.canary or ""]
    ref = adapter_ref(row)
    if not new.canary:
        ref.version = ""
    event = events_pb2.LifecycleEvent()
    event.canary_changed.CopyFrom(events_pb2.CanaryChanged(
        meta=new_meta(ctx.producer, ref, clock=ctx.clock),
        canary_version=new.canary or "",
        percent=new.canary_percent,
        previous=old.canary or "",
        previous_percent=old.canary_percent,
        engine_id=row["engine_id"] if new.canary else 0,
        cleared=bool(new.canary) and _flags_after(rel, new, ctx)[1],
    ))
    await _emit(conn, ctx, event, row)


async def rollback(
    conn: asyncpg.Connection, ctx: Ctx, *, tenant_id: str, adapter_name: str,
    to_version: str = "", reason: str = "", withdraw: bool = False,
) -> registry_pb2.ReleasePointers:
    """Move the stable pointer back; emits ``RolledBack``. ``withdraw`` (the canary
    analysis): the version rolled back from is withdrawn in the same transaction
    (``VersionWithdrawn``; the rollback's audit entry carries the reason)."""
    problems = _ref_problems_release(tenant_id, adapter_name)
    if to_version:
        problems += check_version(to_version, "to_version")
    require(problems)
    rel = await _load_release(conn, tenant_id, adapter_name, lock=True)
    plan = plan_rollback(rel.pointers, to_version, _statuses(rel), f"{tenant_id}/{adapter_name}")
    updated = await _apply_plan(conn, ctx, rel, plan, tenant_id=tenant_id, name=adapter_name,
                                action="release.rollback", reason=reason)
    target = plan.pointers.stable or ""
    await _unwithdraw(conn, rel, target)
    row = rel.rows[target]
    event = events_pb2.LifecycleEvent()
    event.rolled_back.CopyFrom(events_pb2.RolledBack(
        meta=new_meta(ctx.producer, adapter_ref(row), clock=ctx.clock),
        from_version=rel.pointers.stable or "",
        to_version=target,
        engine_id=row["engine_id"],
    ))
    await _emit(conn, ctx, event, row)
    if withdraw and rel.pointers.stable and rel.pointers.stable != target:
        await _withdraw(conn, ctx, rel, rel.pointers.stable, reason or "rolled back")
    return release_pb(tenant_id, adapter_name, plan.pointers, rel.rows, updated,
                      *_flags_after(rel, plan.pointers, ctx))


async def retire(
    conn: asyncpg.Connection, ctx: Ctx, *, tenant_id: str, adapter_name: str, version: str,
    reason: str = "",
) -> registry_pb2.AdapterVersion:
    """Retire a version (not the stable one); emits ``AdapterRetired`` (and
    ``CanaryChanged`` when it was the canary)."""
    require(_ref_problems(tenant_id, adapter_name, version, name_field="adapter_name"))
    rel = await _load_release(conn, tenant_id, adapter_name, lock=True)
    plan = plan_retire(rel.pointers, version, _statuses(rel), f"{tenant_id}/{adapter_name}")
    if plan.changed:
        await _apply_plan(conn, ctx, rel, plan, tenant_id=tenant_id, name=adapter_name,
                          action="version.retire", reason=reason)
        if rel.pointers.canary == version:
            await _emit_canary(conn, ctx, rel, plan.pointers)
        row = rel.rows[version]
        event = events_pb2.LifecycleEvent()
        event.retired.CopyFrom(events_pb2.AdapterRetired(
            meta=new_meta(ctx.producer, adapter_ref(row), clock=ctx.clock),
            engine_id=row["engine_id"],
        ))
        await _emit(conn, ctx, event, row)
    return version_pb(await _require_version(conn, tenant_id, adapter_name, version))


async def get_release(
    conn: asyncpg.Connection, *, tenant_id: str, adapter_name: str
) -> registry_pb2.ReleasePointers:
    """Read the release pointers of an adapter name."""
    require(_ref_problems_release(tenant_id, adapter_name))
    rel = await _load_release(conn, tenant_id, adapter_name, lock=False)
    return release_pb(tenant_id, adapter_name, rel.pointers, rel.rows, rel.updated_at,
                      rel.paused, rel.cleared)


async def pause_canary(
    conn: asyncpg.Connection, ctx: Ctx, *, tenant_id: str, adapter_name: str, paused: bool,
    reason: str = "",
) -> registry_pb2.ReleasePointers:
    """Pause (or resume) the automated canary analysis of the adapter's canary: audited
    (``release.canary_pause`` / ``release.canary_resume``); FAILED_PRECONDITION when the
    adapter has no canary. Idempotent (no audit entry when nothing changes)."""
    require(_ref_problems_release(tenant_id, adapter_name))
    rel = await _load_release(conn, tenant_id, adapter_name, lock=True)
    if not rel.pointers.canary:
        raise FailedPrecondition(f"{tenant_id}/{adapter_name} has no canary to "
                                 f"{'pause' if paused else 'resume'}")
    if rel.paused != paused:
        await conn.execute(
            "UPDATE release_pointers SET canary_paused = $2 WHERE adapter_id = $1",
            rel.adapter_id, paused)
        after: dict[str, Any] = {"canary_version": rel.pointers.canary, "canary_paused": paused}
        if reason:
            after["reason"] = reason
        await audit.write(conn, actor=ctx.actor,
                          action="release.canary_pause" if paused else "release.canary_resume",
                          subject=audit.subject_adapter(tenant_id, adapter_name),
                          before={"canary_version": rel.pointers.canary,
                                  "canary_paused": rel.paused}, after=after)
    return release_pb(tenant_id, adapter_name, rel.pointers, rel.rows, rel.updated_at, paused,
                      rel.cleared)


async def clear_canary(
    conn: asyncpg.Connection, ctx: Ctx, *, tenant_id: str, adapter_name: str, version: str,
    reason: str = "",
) -> registry_pb2.ReleasePointers:
    """Clear the adapter's canary for tenant traffic (the canary analysis, once its golden
    set passed): audited (``release.canary_clear``), ``CanaryChanged`` with ``cleared``.
    FAILED_PRECONDITION when ``version`` is no longer the canary. Idempotent."""
    require([*_ref_problems_release(tenant_id, adapter_name), *check_version(version)])
    rel = await _load_release(conn, tenant_id, adapter_name, lock=True)
    if rel.pointers.canary != version:
        raise FailedPrecondition(f"{version} is not the canary of {tenant_id}/{adapter_name} "
                                 f"(canary: {rel.pointers.canary or 'none'})")
    if not rel.cleared:
        await conn.execute(
            "UPDATE release_pointers SET canary_cleared = true, updated_at = now() "
            "WHERE adapter_id = $1",
            rel.adapter_id)
        after: dict[str, Any] = {"canary_version": version, "canary_cleared": True}
        if reason:
            after["reason"] = reason
        await audit.write(conn, actor=ctx.actor, action="release.canary_clear",
                          subject=audit.subject_adapter(tenant_id, adapter_name),
                          before={"canary_version": version, "canary_cleared": False},
                          after=after)
        rel.cleared = True
        await _emit_canary(conn, ctx, rel, rel.pointers)
    return release_pb(tenant_id, adapter_name, rel.pointers, rel.rows, rel.updated_at,
                      rel.paused, True)


async def _withdraw(conn: asyncpg.Connection, ctx: Ctx, rel: _Release, version: str,
                    reason: str) -> bool:
    """Mark ``version`` withdrawn and emit ``VersionWithdrawn`` (False: it already was)."""
    row = rel.rows[version]
    if row["withdrawn_reason"]:
        return False
    await conn.execute("UPDATE adapter_versions SET withdrawn_reason = $3 "
                       "WHERE adapter_id = $1 AND version = $2", rel.adapter_id, version, reason)
    event = events_pb2.LifecycleEvent()
    event.withdrawn.CopyFrom(events_pb2.VersionWithdrawn(
        meta=new_meta(ctx.producer, adapter_ref(row), clock=ctx.clock),
        engine_id=row["engine_id"], reason=reason))
    await _emit(conn, ctx, event, row)
    return True


async def withdraw_version(
    conn: asyncpg.Connection, ctx: Ctx, *, tenant_id: str, adapter_name: str, version: str,
    reason: str,
) -> registry_pb2.AdapterVersion:
    """Withdraw a failing version with no version to fall back to (the canary analysis):
    audited (``version.withdraw``), ``VersionWithdrawn``; the gateways refuse its requests
    naming the withdrawal until a person promotes it again. Idempotent."""
    problems = _ref_problems(tenant_id, adapter_name, version, name_field="adapter_name")
    if not reason.strip():
        problems.append(Problem("reason", "a withdrawal needs a reason (it is shown to "
                                          "callers)"))
    require(problems)
    rel = await _load_release(conn, tenant_id, adapter_name, lock=True)
    if version not in rel.rows:
        raise NotFound(f"version {tenant_id}/{adapter_name}@{version} does not exist")
    if await _withdraw(conn, ctx, rel, version, reason):
        await audit.write(conn, actor=ctx.actor, action="version.withdraw",
                          subject=audit.subject_adapter(tenant_id, adapter_name),
                          before={"version": version, "withdrawn_reason": ""},
                          after={"version": version, "withdrawn_reason": reason,
                                 "reason": reason})
    return version_pb(await _require_version(conn, tenant_id, adapter_name, version))


# =========================================================================== admission


ADMISSIONS_CONSUMER = "registry.admissions"
"""``processed_events.consumer`` of the admission verdict consumer."""


async def apply_verdict(
    conn: asyncpg.Connection, *, event: events_pb2.AdmissionEvent, actor: str = "system/admission"
) -> str:
    """Apply an admission verdict idempotently; returns what happened:

    ``applied``, ``duplicate`` (event id seen before), ``unknown_version``,
    ``digest_mismatch`` (verdict about other content), ``not_pending`` (already
    decided or retired), ``empty`` (no verdict set). Only ``applied`` changes state.
    """
    arm = event.WhichOneof("verdict")
    if arm is None:
        return "empty"
    verdict = getattr(event, arm)
    meta = verdict.meta
    if not await claim(conn, ADMISSIONS_CONSUMER, meta.event_id):
        return "duplicate"
    ref = meta.adapter
    adapter_id = f"{ref.tenant_id}/{ref.adapter_name}"
    if not await conn.fetchval("SELECT 1 FROM adapters WHERE adapter_id = $1", adapter_id):
        return "unknown_version"
    await conn.execute("SELECT 1 FROM adapters WHERE adapter_id = $1 FOR UPDATE", adapter_id)
    row = await _version_row(conn, ref.tenant_id, ref.adapter_name, ref.version)
    if row is None:
        return "unknown_version"
    if row["sha256"] != verdict.sha256:
        return "digest_mismatch"
    if row["status"] != Status.PENDING.value:
        return "not_pending"
    if arm == "admitted":
        await conn.execute(
            "UPDATE adapter_versions SET status = 'admitted', admitted_at = coalesce($3, now()), "
            "reasons = '[]' WHERE adapter_id = $1 AND version = $2",
            adapter_id, ref.version,
            meta.occurred_at.ToDatetime(tzinfo=UTC) if meta.HasField("occurred_at") else None,
        )
        action = "version.admit"
    else:
        await conn.execute(
            "UPDATE adapter_versions SET status = 'rejected', reasons = $3 "
            "WHERE adapter_id = $1 AND version = $2",
            adapter_id, ref.version, reasons_json(verdict.reasons),
        )
        action = "version.reject"
    after = await _version_row(conn, ref.tenant_id, ref.adapter_name, ref.version)
    await audit.write(conn, actor=actor, action=action,
                      subject=audit.subject_version(ref.tenant_id, ref.adapter_name, ref.version),
                      before=_version_json(row),
                      after={**_version_json(after), "event_id": meta.event_id})
    return "applied"

