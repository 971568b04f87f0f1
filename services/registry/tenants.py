"""Tenants: create, read, list, set the default priority; each change audited and
published on ``tenant.events`` (every registry operation's conventions:
:mod:`loraplane.registry.context`)."""

from __future__ import annotations

from typing import Any

import asyncpg

from loraplane.registry import audit
from loraplane.registry.context import Ctx
from loraplane.registry.convert import priority_db, tenant_pb
from loraplane.registry.grammar import (
    MAX_DISPLAY_NAME_LEN,
    Problem,
    check_priority_value,
    check_tenant_id,
    require,
)
from loraplane.registry.paging import decode_token, encode_token, page_size
from loraplane.shared import outbox
from loraplane.shared.errors import AlreadyExists, NotFound
from loraplane.shared.topics import new_meta
from loraplane.v1 import common_pb2, events_pb2, registry_pb2


async def tenant_row(conn: asyncpg.Connection, tenant_id: str, *, lock: str = "") -> Any:
    """The tenant's row (``lock``: a ``FOR ...`` clause); NOT_FOUND when it does not exist."""
    row = await conn.fetchrow(f"SELECT * FROM tenants WHERE tenant_id = $1 {lock}", tenant_id)
    if row is None:
        raise NotFound(f"tenant {tenant_id!r} does not exist")
    return row


def _tenant_json(row: Any) -> dict[str, Any]:
    return {
        "tenant_id": row["tenant_id"],
        "display_name": row["display_name"],
        "default_priority": row["default_priority"],
    }


async def _tenant_event(conn: asyncpg.Connection, ctx: Ctx, row: Any) -> None:
    event = events_pb2.TenantEvent(meta=new_meta(ctx.producer, clock=ctx.clock))
    event.tenant_upserted.CopyFrom(events_pb2.TenantUpserted(
        tenant_id=row["tenant_id"],
        display_name=row["display_name"],
        default_priority=tenant_pb(row).default_priority,
        disabled=False,
    ))
    await outbox.enqueue(conn, event, topic_prefix=ctx.topic_prefix, tenant_id=row["tenant_id"])


async def create_tenant(
    conn: asyncpg.Connection,
    ctx: Ctx,
    *,
    tenant_id: str,
    display_name: str = "",
    default_priority: int = common_pb2.PRIORITY_UNSPECIFIED,
) -> registry_pb2.Tenant:
    """Create a tenant (PRIORITY_UNSPECIFIED → bronze). ALREADY_EXISTS if the id is taken."""
    problems = [
        *check_tenant_id(tenant_id),
        *check_priority_value(default_priority, "default_priority", allow_unspecified=True),
    ]
    if len(display_name) > MAX_DISPLAY_NAME_LEN:
        problems.append(Problem("display_name", f"longer than {MAX_DISPLAY_NAME_LEN} characters"))
    require(problems)
    prio = priority_db(default_priority) or "bronze"
    row = await conn.fetchrow(
        "INSERT INTO tenants (tenant_id, display_name, default_priority) VALUES ($1, $2, $3) "
        "ON CONFLICT (tenant_id) DO NOTHING RETURNING *",
        tenant_id, display_name, prio,
    )
    if row is None:
        raise AlreadyExists(f"tenant {tenant_id!r} already exists")
    await audit.write(conn, actor=ctx.actor, action="tenant.create",
                      subject=audit.subject_tenant(tenant_id), before=None,
                      after=_tenant_json(row))
    await _tenant_event(conn, ctx, row)
    return tenant_pb(row)


async def get_tenant(conn: asyncpg.Connection, *, tenant_id: str) -> registry_pb2.Tenant:
    """Read one tenant; NOT_FOUND if unknown."""
    require(check_tenant_id(tenant_id))
    return tenant_pb(await tenant_row(conn, tenant_id))


async def list_tenants(
    conn: asyncpg.Connection, *, size: int = 0, token: str = ""
) -> tuple[list[registry_pb2.Tenant], str]:
    """Tenants ordered by id; returns (tenants, next page token)."""
    limit = page_size(size)
    after = decode_token(token)
    rows = await conn.fetch(
        "SELECT * FROM tenants WHERE tenant_id > $1 ORDER BY tenant_id LIMIT $2",
        after, limit + 1,
    )
    more = len(rows) > limit
    rows = rows[:limit]
    return [tenant_pb(r) for r in rows], encode_token(rows[-1]["tenant_id"]) if more else ""


async def set_tenant_priority(
    conn: asyncpg.Connection, ctx: Ctx, *, tenant_id: str, priority: int
) -> registry_pb2.Tenant:
    """Change a tenant's default priority (must be set: 1..4)."""
    require([
        *check_tenant_id(tenant_id),
        *check_priority_value(priority, "priority", allow_unspecified=False),
    ])
    before = await tenant_row(conn, tenant_id, lock="FOR UPDATE")
    label = priority_db(priority)
    if before["default_priority"] == label:
        return tenant_pb(before)
    row = await conn.fetchrow(
        "UPDATE tenants SET default_priority = $2, updated_at = now() WHERE tenant_id = $1 "
        "RETURNING *",
        tenant_id, label,
    )
    await audit.write(conn, actor=ctx.actor, action="tenant.set_priority",
                      subject=audit.subject_tenant(tenant_id), before=_tenant_json(before),
                      after=_tenant_json(row))
    await _tenant_event(conn, ctx, row)
    return tenant_pb(row)
