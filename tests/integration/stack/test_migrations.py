"""Migrations with dbmate against the real PostgreSQL: up, down, up on a fresh database."""

from __future__ import annotations

import asyncpg

from loraplane.shared.migrations import dbmate, migration_files
from loraplane.stack.stack import Stack

TABLES = {"tenants", "api_keys", "adapters", "adapter_versions", "release_pointers",
          "adapter_shares", "audit_log", "outbox", "processed_events",
          "admission_verdicts", "cache_workers", "cache_version_stats", "tenant_quotas",
          "canary_runs"}


async def _tables(dsn: str) -> set[str]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "select tablename from pg_tables where schemaname = 'public' and tablename <> 'schema_migrations'")
        return {r["tablename"] for r in rows}
    finally:
        await conn.close()


async def test_migrations_up_down_up(stack: Stack, unique: str) -> None:
    s = stack.settings
    db = f"mig_{unique}"
    admin = await asyncpg.connect(s.postgres_dsn)
    try:
        await admin.execute(f'create database "{db}"')
        dsn = s.dsn_for(db)
        dbmate(dsn, "up")
        assert await _tables(dsn) == TABLES
        for _ in migration_files():
            dbmate(dsn, "rollback")
        assert await _tables(dsn) == set()
        dbmate(dsn, "up")
        assert await _tables(dsn) == TABLES
        # The engine id sequence hands out positive, increasing ids.
        conn = await asyncpg.connect(dsn)
        try:
            a = await conn.fetchval("select nextval('adapter_version_engine_id_seq')")
            b = await conn.fetchval("select nextval('adapter_version_engine_id_seq')")
            assert 0 < a < b
            # Constraints hold: a canary percent outside [0, 100] is refused.
            await conn.execute("insert into tenants (tenant_id) values ('acme')")
            await conn.execute("insert into adapters (adapter_id, tenant_id, name, base_model) "
                               "values ('acme/support', 'acme', 'support', 'm')")
            try:
                await conn.execute("insert into release_pointers (adapter_id, canary_percent) "
                                   "values ('acme/support', 101)")
            except asyncpg.CheckViolationError:
                pass
            else:
                raise AssertionError("canary_percent 101 was accepted")
        finally:
            await conn.close()
    finally:
        await admin.execute(f'drop database if exists "{db}" with (force)')
        await admin.close()


async def test_session_database_is_migrated(stack: Stack) -> None:
    assert await _tables(stack.settings.postgres_dsn) == TABLES
