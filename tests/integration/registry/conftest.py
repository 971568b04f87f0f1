"""Fixtures of the registry integration tests: one in-process registry on the test stack.

The registry runs in the session event loop on a free port, against the session stack's
PostgreSQL and Tansu, with its own Prometheus registry (metric assertions are exact) and
a unique admission consumer group and topic namespace. Tests isolate themselves with fresh tenant ids.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import grpc
import pytest
from prometheus_client import CollectorRegistry

from loraplane.registry.app import RegistryApp
from loraplane.registry.testing import Registry, registry_settings
from loraplane.shared.outbox import PublishedRow
from loraplane.stack.stack import Stack
from loraplane.v1 import registry_pb2_grpc


@pytest.fixture(scope="session")
async def registry(stack: Stack) -> AsyncIterator[Registry]:
    """The in-process registry (gRPC server + outbox relay + admission consumer)."""
    metrics = CollectorRegistry()
    published: list[PublishedRow] = []
    # Own topic namespace: admission services of other test packages (consuming the real
    # adapter.releases) never decide this registry's made-up versions.
    settings = registry_settings(stack, registry_topic_prefix=f"rt{uuid.uuid4().hex[:8]}.")
    app = RegistryApp(settings, registry=metrics, serve_metrics=False, on_published=published)
    await app.start()
    channel = grpc.aio.insecure_channel(app.address)
    try:
        yield Registry(app=app, stub=registry_pb2_grpc.RegistryAdminStub(channel),
                       metrics=metrics, published=published,
                       bootstrap=settings.kafka_bootstrap, bucket=settings.artifact_bucket,
                       prefix=settings.registry_topic_prefix)
    finally:
        await channel.close()
        await app.stop()
