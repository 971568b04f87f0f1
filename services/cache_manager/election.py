"""Leader election through a Postgres session advisory lock.

Only the instance holding ``pg_try_advisory_lock(key)`` on its dedicated
connection commands workers; the others are standbys that retry every
``poll_s``. The lock belongs to the database session, so it is released the
moment the leader's connection ends: process exit or crash (the kernel closes
the socket, the server backend ends), or a network cut detected by the
server. The leader checks its session before every batch of commands
(:meth:`LeaderLock.still_held`) and steps down when that fails.

A shard's leader (:mod:`~loraplane.cache_manager.sharding`) takes two locks on its one
session: the deployment key in shared mode (``pg_try_advisory_lock_shared``), then its
shard key exclusively; failing either closes the session, which releases both.

Hand-over bound after the leader dies (measured in
``tests/integration/cache_manager/test_failover.py``)::

    detect   ≤ poll_s                      (standby's next try gets the lock)
  + rebuild  registry read + GetState of known workers (~10–100 ms)
             or at most bootstrap_grace_s when a worker does not answer
  + first round

With the defaults (``poll_s`` 1 s, ``bootstrap_grace_s`` 12 s) commands resume
within about 1–2 s when every worker answers GetState, 13 s at worst. A leader
cut off from Postgres (rather than dead) may overlap for at most one planning
round before its check fails.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from loraplane.shared.db import CONNECTION_ERRORS, connect
from loraplane.shared.errors import Unavailable

log = logging.getLogger(__name__)


class LeaderLock:
    """One instance's attempt at the leader lock."""

    def __init__(self, dsn: str, key: int, *, shared_key: int | None = None,
                 check_timeout_s: float = 2.0) -> None:
        self.dsn = dsn
        self.key = key
        self.shared_key = shared_key
        """Also held, in shared mode, on the same session (a shard leader's hold on the
        deployment key: :mod:`~loraplane.cache_manager.sharding`); None: the key alone."""
        self.check_timeout_s = check_timeout_s
        self._conn: asyncpg.Connection | None = None
        self._checking = asyncio.Lock()
        # the round (before its commands) and the housekeeping loop both check: one
        # connection runs one query at a time, and asyncpg refuses a second one ("another
        # operation is in progress"), which must not read as a lost lock

    @property
    def held(self) -> bool:
        """Whether this instance believes it holds the lock."""
        return self._conn is not None

    async def try_acquire(self) -> bool:
        """One attempt; True when this instance now holds the lock."""
        if self._conn is not None:
            return True
        try:
            conn = await connect(self.dsn, timeout=self.check_timeout_s)
        except Unavailable as exc:
            log.info("leader lock: database unavailable: %s", exc)
            return False
        try:
            got = self.shared_key is None or bool(await conn.fetchval(
                "SELECT pg_try_advisory_lock_shared($1)", self.shared_key,
                timeout=self.check_timeout_s))
            got = got and bool(await conn.fetchval("SELECT pg_try_advisory_lock($1)", self.key,
                                                   timeout=self.check_timeout_s))
        except (*CONNECTION_ERRORS, asyncpg.PostgresError, TimeoutError) as exc:
            log.info("leader lock: attempt failed: %s", exc)
            got = False
        if not got:
            await _close(conn)  # ends the session: a shared hold taken above goes with it
            return False
        self._conn = conn
        return True

    async def acquire(self, stop: asyncio.Event, poll_s: float) -> bool:
        """Try every ``poll_s`` until the lock is held (True) or ``stop`` is set (False)."""
        while not stop.is_set():
            if await self.try_acquire():
                return True
            try:
                await asyncio.wait_for(stop.wait(), timeout=poll_s)
            except TimeoutError:
                pass
        return False

    async def still_held(self) -> bool:
        """Whether the lock session is alive (a round trip on it); drops it when not.
        Concurrent callers take turns on the one session."""
        async with self._checking:
            return await self._check()

    async def _check(self) -> bool:
        conn = self._conn
        if conn is None:
            return False
        try:
            held = await conn.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND pid = pg_backend_pid() AND ((classid::bigint << 32) | objid::bigint) = $1",
                self.key, timeout=self.check_timeout_s,
            )
        except (*CONNECTION_ERRORS, asyncpg.PostgresError, TimeoutError) as exc:
            log.warning("leader lock lost: %s", exc)
            held = 0
        if not held:
            self._conn = None
            await _close(conn)
            return False
        return True

    async def release(self) -> None:
        """Give up the lock (closing the session releases it)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await _close(conn)


async def _close(conn: asyncpg.Connection) -> None:
    try:
        await asyncio.wait_for(conn.close(), timeout=2.0)
    except Exception:  # noqa: BLE001 - closing a broken connection may fail; terminate then
        conn.terminate()
