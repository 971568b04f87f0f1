"""Fixtures of the cache-manager integration tests (harness: ``cache_manager.testing``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from loraplane.stack.stack import Stack
from tests.support.cache_manager import Bus, Launcher, Registry, reset_topics


@pytest_asyncio.fixture
async def fresh_topics(stack: Stack) -> None:
    """The cache-manager topics, empty."""
    await reset_topics(stack.settings.kafka_bootstrap)


@pytest_asyncio.fixture
async def registry(stack: Stack, unique: str) -> Registry:
    """Registry rows under a tenant of this test."""
    reg = Registry(stack.settings.postgres_dsn, f"cm-{unique}")
    await reg.tenant_row()
    return reg


@pytest_asyncio.fixture
async def bus(stack: Stack, fresh_topics: None) -> AsyncIterator[Bus]:
    """Publisher of events and collector of commands."""
    b = Bus(stack.settings.kafka_bootstrap)
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


@pytest.fixture
def managers(stack: Stack, unique: str, tmp_path: Path) -> Iterator[Launcher]:
    """Cache-manager processes of this test (one deployment: shared lock key and group)."""
    launcher = Launcher(stack.settings.client_env(), tmp_path, unique, tenants=f"cm-{unique}",
                        stack=stack)
    try:
        yield launcher
    finally:
        launcher.stop_all()
