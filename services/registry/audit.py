"""Append-only audit log: who changed what, when, before and after."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

from loraplane.registry.convert import dumps, ts
from loraplane.registry.paging import decode_int_token, encode_token, page_size
from loraplane.v1 import registry_pb2


def subject_tenant(tenant_id: str) -> str:
    """Audit subject of a tenant: ``acme``."""
    return tenant_id


def subject_adapter(tenant_id: str, name: str) -> str:
    """Audit subject of an adapter name: ``acme/support-bot``."""
    return f"{tenant_id}/{name}"


def subject_version(tenant_id: str, name: str, version: str) -> str:
    """Audit subject of a version: ``acme/support-bot@v3``."""
    return f"{tenant_id}/{name}@{version}"


async def write(
    conn: asyncpg.Connection,
    *,
    actor: str,
    action: str,
    subject: str,
    before: Any,
    after: Any,
) -> int:
    """Append one entry in the caller's transaction; returns its id."""
    entry_id = await conn.fetchval(
        "INSERT INTO audit_log (at, actor, action, subject, before, after) "
        "VALUES (clock_timestamp(), $1, $2, $3, $4, $5) RETURNING id",
        actor,
        action,
        subject,
        before,
        after,
    )
    return int(entry_id)


def entry_pb(row: Any) -> registry_pb2.AuditEntry:
    """``audit_log`` row → ``AuditEntry``."""
    e = registry_pb2.AuditEntry(
        id=row["id"],
        actor=row["actor"],
        action=row["action"],
        subject=row["subject"],
        before_json=dumps(row["before"]),
        after_json=dumps(row["after"]),
    )
    ts(row["at"], e.at)
    return e


async def list_entries(
    conn: asyncpg.Connection,
    *,
    subject_prefix: str = "",
    actor: str = "",
    action: str = "",
    since: datetime | None = None,
    until: datetime | None = None,
    size: int = 0,
    token: str = "",
) -> tuple[list[registry_pb2.AuditEntry], str]:
    """Entries matching every given filter, newest first; returns (entries, next token)."""
    limit = page_size(size)
    before_id = decode_int_token(token)
    like = subject_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    rows = await conn.fetch(
        """
        SELECT id, at, actor, action, subject, before, after FROM audit_log
        WHERE ($1 = '' OR subject LIKE $2)
          AND ($3 = '' OR actor = $3)
          AND ($4 = '' OR action = $4)
          AND ($5::timestamptz IS NULL OR at >= $5)
          AND ($6::timestamptz IS NULL OR at < $6)
          AND ($7 = 0 OR id < $7)
        ORDER BY id DESC LIMIT $8
        """,
        subject_prefix, like, actor, action, since, until, before_id, limit + 1,
    )
    more = len(rows) > limit
    rows = rows[:limit]
    next_token = encode_token(str(rows[-1]["id"])) if more and rows else ""
    return [entry_pb(r) for r in rows], next_token
