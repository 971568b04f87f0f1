"""The leader lock's session check: concurrent callers share one connection in turn."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from loraplane.cache_manager.election import LeaderLock


class OneQueryAtATime:
    """Like an asyncpg connection: a second query while one runs is refused."""

    def __init__(self) -> None:
        self.busy = False
        self.queries = 0
        self.closed = False

    async def fetchval(self, _sql: str, *_args: Any, timeout: float | None = None) -> int:
        if self.busy:
            raise asyncpg.InterfaceError(
                "cannot perform operation: another operation is in progress")
        self.busy = True
        try:
            await asyncio.sleep(0.02)
            self.queries += 1
            return 1
        finally:
            self.busy = False

    async def close(self) -> None:
        self.closed = True

    def terminate(self) -> None:
        self.closed = True


async def test_concurrent_checks_take_turns_and_keep_the_lock() -> None:
    lock = LeaderLock("postgresql://unused", 42)
    conn = OneQueryAtATime()
    lock._conn = conn  # type: ignore[assignment]  # a session that holds the lock
    results = await asyncio.gather(*(lock.still_held() for _ in range(5)))
    assert results == [True] * 5
    assert conn.queries == 5 and not conn.closed and lock.held


async def test_a_failed_check_drops_the_session() -> None:
    class Gone(OneQueryAtATime):
        async def fetchval(self, _sql: str, *_args: Any, timeout: float | None = None) -> int:
            raise asyncpg.InterfaceError("connection is closed")

    lock = LeaderLock("postgresql://unused", 42)
    conn = Gone()
    lock._conn = conn  # type: ignore[assignment]
    assert await lock.still_held() is False
    assert conn.closed and not lock.held
