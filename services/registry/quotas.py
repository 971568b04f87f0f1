"""Tenant quotas in the registry: stored in ``tenant_quotas``, audited, sent to the gateways.

A quota belongs to a tenant (``adapter_name = ''``) or to one adapter name of a tenant,
and limits requests in flight and output tokens per second (0 = unlimited). Setting or
clearing one writes the row, an audit entry and a ``TenantQuotaSet`` on ``tenant.events``
through the outbox, in one transaction; the gateways enforce it
(:mod:`loraplane.gateway.quotas`). CLI: ``loraplane tenants set-quota``.
"""

from __future__ import annotations

import math
from typing import Any

import asyncpg

from loraplane.registry import audit
from loraplane.registry.context import Ctx
from loraplane.registry.convert import ts
from loraplane.registry.grammar import Problem, check_adapter_name, check_tenant_id, require
from loraplane.shared import outbox
from loraplane.shared.errors import NotFound
from loraplane.shared.topics import new_meta
from loraplane.v1 import events_pb2, registry_pb2

MAX_IN_FLIGHT_LIMIT = 1_000_000
"""Largest ``max_in_flight`` accepted."""
MAX_TOKENS_PER_S = 1e9
"""Largest ``tokens_per_s`` accepted."""


def check_quota(max_in_flight: int, tokens_per_s: float) -> list[Problem]:
    """Every problem of a quota's values."""
    problems = []
    if not 0 <= max_in_flight <= MAX_IN_FLIGHT_LIMIT:
        problems.append(Problem("max_in_flight", f"must be within 0..{MAX_IN_FLIGHT_LIMIT} "
                                                 "(0 = unlimited)"))
    if not (math.isfinite(tokens_per_s) and 0 <= tokens_per_s <= MAX_TOKENS_PER_S):
        problems.append(Problem("tokens_per_s", f"must be a number within 0..{MAX_TOKENS_PER_S:g} "
                                                "(0 = unlimited)"))
    return problems


def quota_pb(row: Any) -> registry_pb2.TenantQuota:
    """A ``tenant_quotas`` row as a message."""
    q = registry_pb2.TenantQuota(
        tenant_id=row["tenant_id"], adapter_name=row["adapter_name"],
        max_in_flight=row["max_in_flight"], tokens_per_s=row["tokens_per_s"],
    )
    ts(row["updated_at"], q.updated_at)
    return q


def _json(row: Any) -> dict[str, Any] | None:
    if row is None:
        return None
    return {"max_in_flight": row["max_in_flight"], "tokens_per_s": row["tokens_per_s"]}


async def set_tenant_quota(
    conn: asyncpg.Connection,
    ctx: Ctx,
    *,
    tenant_id: str,
    adapter_name: str = "",
    max_in_flight: int = 0,
    tokens_per_s: float = 0.0,
    clear: bool = False,
) -> registry_pb2.TenantQuota | None:
    """Set (or with ``clear`` remove) a quota; returns it (None when cleared)."""
    problems = [*check_tenant_id(tenant_id), *check_quota(max_in_flight, tokens_per_s)]
    if adapter_name:
        problems.extend(check_adapter_name(adapter_name))
    require(problems)
    if await conn.fetchval("SELECT 1 FROM tenants WHERE tenant_id = $1", tenant_id) is None:
        raise NotFound(f"tenant {tenant_id!r} does not exist")
    before = await conn.fetchrow(
        "SELECT * FROM tenant_quotas WHERE tenant_id = $1 AND adapter_name = $2 FOR UPDATE",
        tenant_id, adapter_name,
    )
    row = None
    if clear:
        if before is None:
            return None
        await conn.execute("DELETE FROM tenant_quotas WHERE tenant_id = $1 AND adapter_name = $2",
                           tenant_id, adapter_name)
    else:
        row = await conn.fetchrow(
            "INSERT INTO tenant_quotas (tenant_id, adapter_name, max_in_flight, tokens_per_s) "
            "VALUES ($1, $2, $3, $4) ON CONFLICT (tenant_id, adapter_name) DO UPDATE SET "
            "max_in_flight = EXCLUDED.max_in_flight, tokens_per_s = EXCLUDED.tokens_per_s, "
            "updated_at = now() RETURNING *",
            tenant_id, adapter_name, max_in_flight, float(tokens_per_s),
        )
    subject = (audit.subject_adapter(tenant_id, adapter_name) if adapter_name
               else audit.subject_tenant(tenant_id))
    await audit.write(conn, actor=ctx.actor, action="tenant.set_quota", subject=subject,
                      before=_json(before), after=_json(row))
    event = events_pb2.TenantEvent(meta=new_meta(ctx.producer, clock=ctx.clock))
    event.tenant_quota_set.CopyFrom(events_pb2.TenantQuotaSet(
        tenant_id=tenant_id, adapter_name=adapter_name,
        max_in_flight=0 if row is None else row["max_in_flight"],
        tokens_per_s=0.0 if row is None else row["tokens_per_s"],
        cleared=row is None,
    ))
    await outbox.enqueue(conn, event, topic_prefix=ctx.topic_prefix, tenant_id=tenant_id)
    return None if row is None else quota_pb(row)


async def list_tenant_quotas(
    conn: asyncpg.Connection, *, tenant_id: str
) -> list[registry_pb2.TenantQuota]:
    """The tenant's quotas: tenant-wide first, then per adapter by name."""
    require(check_tenant_id(tenant_id))
    if await conn.fetchval("SELECT 1 FROM tenants WHERE tenant_id = $1", tenant_id) is None:
        raise NotFound(f"tenant {tenant_id!r} does not exist")
    rows = await conn.fetch(
        "SELECT * FROM tenant_quotas WHERE tenant_id = $1 ORDER BY adapter_name", tenant_id
    )
    return [quota_pb(r) for r in rows]
