"""Fixtures of the registry integration tests: one in-process registry on the test stack.

The registry runs in the session event loop on a free port, against the session stack's
PostgreSQL and Tansu, with its own Prometheus registry (metric assertions are exact) and
a unique admission consumer group and topic namespace. Tests isolate themselves with fresh tenant ids.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from loraplane.registry.app import RegistryApp
from loraplane.registry.settings import RegistrySettings
from loraplane.shared.migrations import migrate_up
from loraplane.shared.outbox import PublishedRow
from loraplane.shared.tls import OPERATOR, REGISTRY_ID
from loraplane.stack.stack import Stack
from loraplane.v1 import registry_pb2 as R
from loraplane.v1 import registry_pb2_grpc
from tests.support.registry import Registry, registry_settings
from tests.support.tls import internal_channel


@asynccontextmanager
async def _running(stack: Stack, settings: RegistrySettings) -> AsyncIterator[Registry]:
    metrics = CollectorRegistry()
    published: list[PublishedRow] = []
    app = RegistryApp(settings, registry=metrics, serve_metrics=False, on_published=published)
    await app.start()
    channel = internal_channel(stack, app.address, caller=OPERATOR, server=REGISTRY_ID)
    try:
        yield Registry(app=app, stub=registry_pb2_grpc.RegistryAdminStub(channel),
                       metrics=metrics, published=published,
                       bootstrap=settings.kafka_bootstrap, bucket=settings.artifact_bucket,
                       prefix=settings.registry_topic_prefix)
    finally:
        await channel.close()
        await app.stop()


@pytest.fixture(scope="session")
async def registry(stack: Stack) -> AsyncIterator[Registry]:
    """The in-process registry (gRPC server + outbox relay + admission consumer).

    Its own topic namespace keeps admission services of other test packages (consuming
    the real adapter.releases) from deciding this registry's made-up versions. It shares
    the session database, so its relay may be on standby behind another registry's.
    """
    settings = registry_settings(stack, registry_topic_prefix=f"rt{uuid.uuid4().hex[:8]}.")
    async with _running(stack, settings) as reg:
        yield reg


@pytest.fixture
async def isolated_registry(stack: Stack, unique: str) -> AsyncIterator[Registry]:
    """A registry with its own database (fresh schema): its relay is surely the active one,
    so relay internals and lag metrics can be asserted."""
    admin = await asyncpg.connect(stack.settings.postgres_dsn)
    db = f"registry_{unique}"
    await admin.execute(f'CREATE DATABASE "{db}"')
    try:
        dsn = stack.settings.dsn_for(db)
        await asyncio.to_thread(migrate_up, dsn)
        settings = registry_settings(stack, postgres_dsn=dsn,
                                     registry_topic_prefix=f"ri{unique}.")
        async with _running(stack, settings) as reg:
            yield reg
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        await admin.close()


@pytest.fixture
async def stable_v1(registry: Registry, unique: str) -> tuple[str, str]:
    """A fresh tenant's adapter ``bot`` with v1, v2 and v3 admitted and v1 promoted (no
    canary yet): ``(tenant id, adapter name)``."""
    tid = await registry.tenant(unique)
    name = "bot"
    for v in ("v1", "v2", "v3"):
        await registry.admitted(tid, name, v)
    await registry.call("Promote", R.PromoteRequest(tenant_id=tid, adapter_name=name,
                                                    version="v1"))
    return tid, name
