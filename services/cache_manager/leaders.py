"""One process standing for several shards (:mod:`~loraplane.cache_manager.sharding`).

:class:`ShardedCacheManager` runs one :class:`~loraplane.cache_manager.leader.CacheManagerService`
per shard the process may lead, each with its own leader lock, consumers and decision core,
so it leads every shard whose lock it wins and stands by for the others. With ``*`` the
shards are the registry's base models, read again every ``leader_poll_s`` (a new base model
gets a leader within about one poll). Unsharded (``LORAPLANE_CACHE_MANAGER_SHARDS`` empty) it
runs the one service of the deployment, as before.

The read API, the placement page and the scrape-time gauges show one core: the first shard
(by name) this process leads. Every shard follows every worker, so workers and placements
are whole there; ``ListDecisions`` merges the decisions of every shard it leads (newest
first; decision ids are per shard); the page's moves and the pending-commands gauge are the
first shard's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import REGISTRY, CollectorRegistry

from loraplane.cache_manager import store
from loraplane.cache_manager.core import CacheCore
from loraplane.cache_manager.leader import CacheManagerService, _holder
from loraplane.cache_manager.rules import RulesConfig
from loraplane.cache_manager.settings import CacheManagerSettings
from loraplane.policy.config import PolicyConfig
from loraplane.shared.db import connect
from loraplane.shared.errors import Unavailable

log = logging.getLogger(__name__)

Discover = Callable[[], Awaitable[list[str]]]
"""Reads the base models of the registry (the shards of ``*``)."""


class ShardedCacheManager:
    """The shards of one process: a service each, started as shards appear."""

    def __init__(
        self, settings: CacheManagerSettings, rules: RulesConfig, policy_config: PolicyConfig,
        *, registry: CollectorRegistry = REGISTRY, discover: Discover | None = None,
    ) -> None:
        self.settings = settings
        self.rules = rules
        self.policy_config = policy_config
        self.registry = registry
        self.selection = settings.shard_selection
        self.discover = discover or self._read_base_models
        self.services: dict[str, CacheManagerService] = {}
        """By shard name (``*`` when unsharded)."""
        _holder(registry).core = lambda: self.core

    @property
    def core(self) -> CacheCore | None:
        """The core the read API shows: the first shard (by name) this process leads."""
        for name in sorted(self.services):
            core = self.services[name].core
            if core is not None:
                return core
        return None

    def cores(self) -> list[CacheCore]:
        """The cores of every shard this process leads now, by shard name."""
        return [c for name in sorted(self.services)
                if (c := self.services[name].core) is not None]

    def _service(self, shard: str | None) -> CacheManagerService:
        svc = CacheManagerService(self.settings, self.rules, self.policy_config,
                                  registry=self.registry, shard=shard)
        _holder(self.registry).core = lambda: self.core  # the service set its own
        return svc

    async def run(self, stop: asyncio.Event) -> None:
        """Stand for every wanted shard until ``stop`` is set."""
        if self.selection is None:
            svc = self.services["*"] = self._service(None)
            await svc.run(stop)
            return
        tasks: dict[str, asyncio.Task[None]] = {}
        try:
            while not stop.is_set():
                discovered: list[str] = []
                if self.selection.every:
                    try:
                        discovered = await self.discover()
                    except (Unavailable, OSError) as exc:
                        log.info("shard discovery: database unavailable: %s", exc)
                    except Exception as exc:  # noqa: BLE001 - retried next poll
                        log.warning("shard discovery failed: %s", exc)
                for shard in self.selection.wanted(discovered):
                    task = tasks.get(shard)
                    if task is not None and not task.done():
                        continue
                    if task is not None and not task.cancelled() and task.exception():
                        log.error("shard %s stopped by an error (restarted): %r", shard,
                                  task.exception())
                    svc = self.services.get(shard) or self._service(shard)
                    self.services[shard] = svc
                    tasks[shard] = asyncio.create_task(svc.run(stop), name=f"cm-shard-{shard}")
                    log.info("cache manager %s: standing for shard %s", self.settings.instance,
                             shard)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(),
                                           timeout=self.settings.cache_manager_leader_poll_s)
        finally:
            if tasks:
                await asyncio.gather(*tasks.values(), return_exceptions=True)

    async def _read_base_models(self) -> list[str]:
        conn = await connect(self.settings.postgres_dsn, timeout=5.0)
        try:
            return await store.base_models(conn, self.settings.tenant_set)
        finally:
            await conn.close()
