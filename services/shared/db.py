"""PostgreSQL access for services: one asyncpg pool per process, explicit transactions.

Usage::

    pool = await create_pool(settings.postgres_dsn)
    async with transaction(pool) as conn:      # BEGIN ... COMMIT (ROLLBACK on error)
        await conn.execute("insert ...")
        await outbox.enqueue(conn, event)       # same transaction as the state change
    await pool.close()

Connection failures (server down, refused, reset) surface as
:class:`loraplane.shared.errors.Unavailable` (retriable, gRPC UNAVAILABLE) instead
of leaking driver exceptions; constraint violations and other SQL errors are
left to the caller, which knows what they mean.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Literal

import asyncpg

from loraplane.shared.errors import Unavailable

Isolation = Literal["read_committed", "repeatable_read", "serializable"]

CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.InterfaceError,
    ConnectionError,
    OSError,
)
"""Exceptions that mean "the database cannot be reached right now"."""


async def _init_connection(conn: asyncpg.Connection) -> None:
    """Decode ``json``/``jsonb`` columns to Python objects and encode them from Python."""
    for typename in ("json", "jsonb"):
        await conn.set_type_codec(
            typename, encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
        )


async def connect(dsn: str, *, timeout: float = 10.0) -> asyncpg.Connection:
    """One standalone connection with the same codecs as the pool's (e.g. for ``LISTEN``)."""
    try:
        conn = await asyncpg.connect(dsn, timeout=timeout)
    except CONNECTION_ERRORS as exc:
        raise Unavailable(f"database unavailable: {type(exc).__name__}: {exc}") from exc
    await _init_connection(conn)
    return conn


async def create_pool(
    dsn: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    command_timeout: float = 30.0,
    timeout: float = 10.0,
) -> asyncpg.Pool:
    """Create and open an asyncpg pool (json/jsonb decoded to Python objects).

    Raises :class:`Unavailable` when the server cannot be reached.
    """
    try:
        pool = await asyncpg.create_pool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            command_timeout=command_timeout,
            timeout=timeout,
            init=_init_connection,
        )
    except CONNECTION_ERRORS as exc:
        raise Unavailable(f"database unavailable: {type(exc).__name__}: {exc}") from exc
    assert pool is not None
    return pool


@asynccontextmanager
async def transaction(
    pool: asyncpg.Pool, *, isolation: Isolation = "read_committed", readonly: bool = False
) -> AsyncIterator[asyncpg.Connection]:
    """Acquire a connection and run the block in one transaction.

    Commits when the block exits normally, rolls back when it raises. Connection
    failures are re-raised as :class:`Unavailable`.
    """
    try:
        async with pool.acquire() as conn, conn.transaction(
            isolation=isolation, readonly=readonly
        ):
            yield conn
    except CONNECTION_ERRORS as exc:
        raise Unavailable(f"database unavailable: {type(exc).__name__}: {exc}") from exc
