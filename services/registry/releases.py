"""Registry releases: an adapter's release pointers (promote, canary and its share, pause,
clearance, rollback, retire, withdraw), each change audited and published on
``adapter.lifecycle`` (every registry operation's conventions, the per-adapter lock
that orders the outbox among them: :mod:`loraplane.registry.context`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from loraplane.registry import audit
from loraplane.registry.context import Ctx
from loraplane.registry.convert import (
    VERSION_COLUMNS,
    VERSION_FROM,
    adapter_ref,
    version_pb,
)
from loraplane.registry.grammar import (
    Problem,
    check_adapter_name,
    check_tenant_id,
    check_version,
    require,
)
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
from loraplane.registry.versions import (
    lock_adapter,
    ref_problems,
    require_version,
)
from loraplane.shared import outbox
from loraplane.shared.errors import FailedPrecondition, NotFound
from loraplane.shared.topics import new_meta
from loraplane.v1 import events_pb2, registry_pb2


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
        await lock_adapter(conn, tenant_id, name)
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
    require(ref_problems(tenant_id, adapter_name, version, name_field="adapter_name"))
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
    require(ref_problems(tenant_id, adapter_name, version, name_field="adapter_name"))
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
    return version_pb(await require_version(conn, tenant_id, adapter_name, version))


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
    problems = ref_problems(tenant_id, adapter_name, version, name_field="adapter_name")
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
    return version_pb(await require_version(conn, tenant_id, adapter_name, version))
