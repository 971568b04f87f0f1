"""A tenant's API keys: create (the secret shown once, its hash stored and published on
``tenant.events``), revoke, list (every registry operation's conventions:
:mod:`loraplane.registry.context`)."""

from __future__ import annotations

import hashlib
import secrets

import asyncpg

from loraplane.registry import audit
from loraplane.registry.context import Ctx
from loraplane.registry.convert import api_key_pb
from loraplane.registry.grammar import MAX_DESCRIPTION_LEN, Problem, check_tenant_id, require
from loraplane.registry.tenants import tenant_row
from loraplane.shared import outbox
from loraplane.shared.errors import NotFound
from loraplane.shared.topics import new_meta
from loraplane.v1 import events_pb2, registry_pb2

API_KEY_PREFIX = "lp_"
"""Every API key secret starts with this (so leaked keys are recognisable)."""
API_KEY_PREFIX_LEN = 11
"""Characters of the secret kept for display (``lp_`` + 8)."""


def hash_secret(secret: str) -> str:
    """SHA-256 hex of an API key secret (what is stored and sent to the gateway)."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


async def create_api_key(
    conn: asyncpg.Connection, ctx: Ctx, *, tenant_id: str, description: str = ""
) -> tuple[registry_pb2.ApiKeyInfo, str]:
    """Create a key; returns (info, secret). Only the hash is stored; the secret is
    returned here and never again."""
    problems = check_tenant_id(tenant_id)
    if len(description) > MAX_DESCRIPTION_LEN:
        problems.append(Problem("description", f"longer than {MAX_DESCRIPTION_LEN} characters"))
    require(problems)
    await tenant_row(conn, tenant_id, lock="FOR SHARE")
    secret = API_KEY_PREFIX + secrets.token_urlsafe(32)
    key_id = "key_" + secrets.token_hex(8)
    row = await conn.fetchrow(
        "INSERT INTO api_keys (key_id, tenant_id, prefix, key_hash, description, created_by) "
        "VALUES ($1, $2, $3, $4, $5, $6) RETURNING *",
        key_id, tenant_id, secret[:API_KEY_PREFIX_LEN], hash_secret(secret), description,
        ctx.actor,
    )
    info = api_key_pb(row)
    await audit.write(conn, actor=ctx.actor, action="apikey.create",
                      subject=audit.subject_tenant(tenant_id), before=None,
                      after={"key_id": key_id, "prefix": info.prefix,
                             "description": description})
    event = events_pb2.TenantEvent(meta=new_meta(ctx.producer, clock=ctx.clock))
    event.api_key_created.CopyFrom(events_pb2.ApiKeyCreated(
        tenant_id=tenant_id, key_id=key_id, prefix=info.prefix, key_hash=row["key_hash"],
    ))
    await outbox.enqueue(conn, event, topic_prefix=ctx.topic_prefix, tenant_id=tenant_id)
    return info, secret


async def revoke_api_key(
    conn: asyncpg.Connection, ctx: Ctx, *, tenant_id: str, key_id: str
) -> registry_pb2.ApiKeyInfo:
    """Revoke a key (idempotent: revoking a revoked key changes nothing)."""
    problems = check_tenant_id(tenant_id)
    if not key_id:
        problems.append(Problem("key_id", "is required"))
    require(problems)
    await tenant_row(conn, tenant_id)
    row = await conn.fetchrow(
        "SELECT * FROM api_keys WHERE key_id = $1 AND tenant_id = $2 FOR UPDATE",
        key_id, tenant_id,
    )
    if row is None:
        raise NotFound(f"API key {key_id!r} of tenant {tenant_id!r} does not exist")
    if row["revoked_at"] is not None:
        return api_key_pb(row)
    row = await conn.fetchrow(
        "UPDATE api_keys SET revoked_at = now() WHERE key_id = $1 RETURNING *", key_id
    )
    await audit.write(conn, actor=ctx.actor, action="apikey.revoke",
                      subject=audit.subject_tenant(tenant_id),
                      before={"key_id": key_id, "revoked": False},
                      after={"key_id": key_id, "revoked": True})
    event = events_pb2.TenantEvent(meta=new_meta(ctx.producer, clock=ctx.clock))
    event.api_key_revoked.CopyFrom(events_pb2.ApiKeyRevoked(tenant_id=tenant_id, key_id=key_id))
    await outbox.enqueue(conn, event, topic_prefix=ctx.topic_prefix, tenant_id=tenant_id)
    return api_key_pb(row)


async def list_api_keys(
    conn: asyncpg.Connection, *, tenant_id: str, include_revoked: bool = False
) -> list[registry_pb2.ApiKeyInfo]:
    """A tenant's keys, oldest first (prefixes only)."""
    require(check_tenant_id(tenant_id))
    await tenant_row(conn, tenant_id)
    rows = await conn.fetch(
        "SELECT * FROM api_keys WHERE tenant_id = $1 AND ($2 OR revoked_at IS NULL) "
        "ORDER BY created_at, key_id",
        tenant_id, include_revoked,
    )
    return [api_key_pb(r) for r in rows]
