"""One process standing for several shards: a leadership per shard, started as shards appear
(``*``), restarted after an error; unsharded: the one leadership of the deployment."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ClassVar

import pytest
from prometheus_client import CollectorRegistry

from loraplane.cache_manager import leaders
from loraplane.cache_manager.rules import RulesConfig
from loraplane.cache_manager.settings import CacheManagerSettings
from loraplane.policy.config import PolicyConfig


class FakeShardService:
    """Stands in for :class:`CacheManagerService`: records its shard, fails once if told."""

    started: ClassVar[list[str | None]] = []
    fail_once: ClassVar[set[str]] = set()

    def __init__(self, settings: object, rules: object, policy_config: object, *,
                 registry: object, shard: str | None) -> None:
        self.shard = shard
        self.core = None

    async def run(self, stop: asyncio.Event) -> None:
        FakeShardService.started.append(self.shard)
        if self.shard in FakeShardService.fail_once:
            FakeShardService.fail_once.discard(self.shard)
            raise RuntimeError("lost the database")
        await stop.wait()


@pytest.fixture(autouse=True)
def fake_service(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeShardService.started = []
    FakeShardService.fail_once = set()
    monkeypatch.setattr(leaders, "CacheManagerService", FakeShardService)


def manager(shards: str, discovered: list[list[str]]) -> leaders.ShardedCacheManager:
    answers = iter(discovered)
    last: list[str] = []

    async def discover() -> list[str]:
        nonlocal last
        last = next(answers, last)
        return last

    settings = CacheManagerSettings(cache_manager_shards=shards,
                                    cache_manager_leader_poll_s=0.01)
    return leaders.ShardedCacheManager(settings, RulesConfig(), PolicyConfig(),
                                       registry=CollectorRegistry(), discover=discover)


async def run_for(m: leaders.ShardedCacheManager, seconds: float) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(m.run(stop))
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.wait_for(task, 5)


async def run_until(m: leaders.ShardedCacheManager, reached: Callable[[], bool]) -> None:
    """Runs ``m`` until ``reached()`` (polled; a loaded machine may need many of its 0.01 s
    discovery polls), then a few polls more, so a second start would still show."""
    stop = asyncio.Event()
    task = asyncio.create_task(m.run(stop))
    async with asyncio.timeout(30):
        while not reached():
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    stop.set()
    await asyncio.wait_for(task, 5)


async def test_every_base_model_gets_a_leadership_as_it_appears() -> None:
    m = manager("*", [[], ["a"], ["a"], ["b", "a"]])
    await run_until(m, lambda: {"a", "b"} <= set(FakeShardService.started))
    assert sorted(FakeShardService.started, key=str) == ["a", "b"]
    assert sorted(m.services) == ["a", "b"]


async def test_a_shard_stopped_by_an_error_is_stood_for_again() -> None:
    FakeShardService.fail_once = {"b"}
    m = manager("a,b", [])
    await run_until(m, lambda: FakeShardService.started.count("b") >= 2
                    and "a" in FakeShardService.started)
    assert FakeShardService.started.count("a") == 1
    assert FakeShardService.started.count("b") == 2


async def test_unsharded_runs_one_leadership_and_discovers_nothing() -> None:
    m = manager("", [["a", "b"]])
    await run_for(m, 0.1)
    assert FakeShardService.started == [None]
    assert list(m.services) == ["*"]
