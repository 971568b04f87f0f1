"""Adapters shared with other tenants: share, unshare, list; each change audited and
published on ``tenant.events`` (every registry operation's conventions:
:mod:`loraplane.registry.context`)."""

from __future__ import annotations

import asyncpg

from loraplane.registry import audit
from loraplane.registry.context import Ctx
from loraplane.registry.grammar import Problem, check_adapter_name, check_tenant_id, require
from loraplane.registry.tenants import tenant_row
from loraplane.shared import outbox
from loraplane.shared.errors import FailedPrecondition, NotFound
from loraplane.shared.topics import new_meta
from loraplane.v1 import events_pb2, registry_pb2


async def _share_target(
    conn: asyncpg.Connection, *, tenant_id: str, adapter_name: str, grantee_tenant_id: str
) -> str:
    """Validate a share's three names (every problem at once); lock the adapter row;
    returns the adapter id."""
    problems = check_tenant_id(tenant_id)
    problems += check_adapter_name(adapter_name)
    problems += check_tenant_id(grantee_tenant_id, "grantee_tenant_id")
    if tenant_id and tenant_id == grantee_tenant_id:
        problems.append(Problem("grantee_tenant_id", "is the owner itself"))
    require(problems)
    await tenant_row(conn, tenant_id, lock="FOR SHARE")
    adapter_id = f"{tenant_id}/{adapter_name}"
    if await conn.fetchval(
        "SELECT 1 FROM adapters WHERE adapter_id = $1 FOR UPDATE", adapter_id
    ) is None:
        raise NotFound(f"adapter {adapter_id!r} does not exist")
    return adapter_id


async def _grantees(conn: asyncpg.Connection, adapter_id: str) -> list[str]:
    rows = await conn.fetch(
        "SELECT tenant_id FROM adapter_shares WHERE adapter_id = $1 ORDER BY tenant_id",
        adapter_id,
    )
    return [r["tenant_id"] for r in rows]


async def _share_event(
    conn: asyncpg.Connection, ctx: Ctx, *, tenant_id: str, adapter_name: str,
    grantee_tenant_id: str, shared: bool,
) -> None:
    event = events_pb2.TenantEvent(meta=new_meta(ctx.producer, clock=ctx.clock))
    event.adapter_share_changed.CopyFrom(events_pb2.AdapterShareChanged(
        tenant_id=tenant_id, adapter_name=adapter_name, grantee_tenant_id=grantee_tenant_id,
        shared=shared,
    ))
    await outbox.enqueue(conn, event, topic_prefix=ctx.topic_prefix, tenant_id=tenant_id)


async def share_adapter(
    conn: asyncpg.Connection, ctx: Ctx, *, tenant_id: str, adapter_name: str,
    grantee_tenant_id: str,
) -> tuple[bool, list[str]]:
    """Let ``grantee_tenant_id`` call ``tenant_id/adapter_name`` by name; returns
    (changed, every grantee). Idempotent: an existing share changes nothing and emits
    nothing. A name the grantee could not resolve to this adapter is refused
    (FAILED_PRECONDITION): its own adapter of that name, or another owner's shared under
    that name."""
    adapter_id = await _share_target(conn, tenant_id=tenant_id, adapter_name=adapter_name,
                                     grantee_tenant_id=grantee_tenant_id)
    await tenant_row(conn, grantee_tenant_id, lock="FOR SHARE")
    # one share decision per grantee at a time (an advisory lock, not a row lock: two
    # tenants sharing with each other must not deadlock)
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                       f"loraplane.share:{grantee_tenant_id}")
    if await conn.fetchval("SELECT 1 FROM adapters WHERE tenant_id = $1 AND name = $2",
                           grantee_tenant_id, adapter_name):
        raise FailedPrecondition(
            f"tenant {grantee_tenant_id!r} has its own adapter {adapter_name!r}; a share of "
            f"{adapter_id!r} would never be used"
        )
    other = await conn.fetchval(
        "SELECT a.adapter_id FROM adapter_shares s JOIN adapters a ON a.adapter_id = s.adapter_id "
        "WHERE s.tenant_id = $1 AND a.name = $2 AND a.adapter_id <> $3",
        grantee_tenant_id, adapter_name, adapter_id,
    )
    if other is not None:
        raise FailedPrecondition(
            f"tenant {grantee_tenant_id!r} already has {other!r} shared under the name "
            f"{adapter_name!r}; unshare it first"
        )
    inserted = await conn.fetchval(
        "INSERT INTO adapter_shares (adapter_id, tenant_id) VALUES ($1, $2) "
        "ON CONFLICT DO NOTHING RETURNING 1",
        adapter_id, grantee_tenant_id,
    )
    if inserted is None:
        return False, await _grantees(conn, adapter_id)
    await audit.write(conn, actor=ctx.actor, action="adapter.share",
                      subject=audit.subject_adapter(tenant_id, adapter_name),
                      before=None, after={"grantee_tenant_id": grantee_tenant_id})
    await _share_event(conn, ctx, tenant_id=tenant_id, adapter_name=adapter_name,
                       grantee_tenant_id=grantee_tenant_id, shared=True)
    return True, await _grantees(conn, adapter_id)


async def unshare_adapter(
    conn: asyncpg.Connection, ctx: Ctx, *, tenant_id: str, adapter_name: str,
    grantee_tenant_id: str,
) -> tuple[bool, list[str]]:
    """End a share; returns (changed, the grantees left). Idempotent."""
    adapter_id = await _share_target(conn, tenant_id=tenant_id, adapter_name=adapter_name,
                                     grantee_tenant_id=grantee_tenant_id)
    await tenant_row(conn, grantee_tenant_id)  # an unknown grantee is NOT_FOUND, not "no-op"
    deleted = await conn.fetchval(
        "DELETE FROM adapter_shares WHERE adapter_id = $1 AND tenant_id = $2 RETURNING 1",
        adapter_id, grantee_tenant_id,
    )
    if deleted is None:
        return False, await _grantees(conn, adapter_id)
    await audit.write(conn, actor=ctx.actor, action="adapter.unshare",
                      subject=audit.subject_adapter(tenant_id, adapter_name),
                      before={"grantee_tenant_id": grantee_tenant_id}, after=None)
    await _share_event(conn, ctx, tenant_id=tenant_id, adapter_name=adapter_name,
                       grantee_tenant_id=grantee_tenant_id, shared=False)
    return True, await _grantees(conn, adapter_id)


async def list_shares(
    conn: asyncpg.Connection, *, tenant_id: str, adapter_name: str = ""
) -> list[registry_pb2.AdapterShare]:
    """Shares of one adapter of the tenant, or of all its adapters (``adapter_name`` "")."""
    problems = check_tenant_id(tenant_id)
    if adapter_name:
        problems += check_adapter_name(adapter_name)
    require(problems)
    await tenant_row(conn, tenant_id)
    if adapter_name and await conn.fetchval(
        "SELECT 1 FROM adapters WHERE adapter_id = $1", f"{tenant_id}/{adapter_name}"
    ) is None:
        raise NotFound(f"adapter {tenant_id + '/' + adapter_name!r} does not exist")
    rows = await conn.fetch(
        "SELECT a.tenant_id AS owner, a.name, s.tenant_id AS grantee, s.created_at "
        "FROM adapter_shares s JOIN adapters a ON a.adapter_id = s.adapter_id "
        "WHERE a.tenant_id = $1 AND ($2 = '' OR a.name = $2) ORDER BY a.name, s.tenant_id",
        tenant_id, adapter_name,
    )
    out = []
    for r in rows:
        share = registry_pb2.AdapterShare(tenant_id=r["owner"], adapter_name=r["name"],
                                          grantee_tenant_id=r["grantee"])
        share.created_at.FromDatetime(r["created_at"])
        out.append(share)
    return out
