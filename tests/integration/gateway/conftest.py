"""Fixtures of the gateway integration tests: Kafka publishing/reading on the test stack,
free ports, a gateway app in the session loop."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from aiokafka import AIOKafkaConsumer
from google.protobuf.message import Message
from prometheus_client import CollectorRegistry

from loraplane.gateway.app import GatewayApp
from loraplane.gateway.emit import KafkaPublisher
from loraplane.gateway.settings import GatewaySettings
from loraplane.shared.codec import decode_record
from loraplane.shared.tls import GATEWAY, WORKER, TlsFiles
from loraplane.stack.stack import Stack
from tests.support.tls import edge_tls_settings, tls_files, tls_settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def publisher(stack: Stack) -> AsyncIterator[KafkaPublisher]:
    pub = KafkaPublisher(stack.settings.kafka(), client_id="gateway-test")
    await pub.start()
    try:
        yield pub
    finally:
        await pub.stop()


@asynccontextmanager
async def gateway_app(stack: Stack, **over: Any) -> AsyncIterator[GatewayApp]:
    """A gateway in this loop, fed by the test stack's Kafka (no registry bootstrap),
    dialling workers with mutual TLS as the ``gateway`` of the stack's dev CA, its public
    ports serving TLS as the stack's gateways do (tenants: ``tenant_channel``,
    ``tenant_http``)."""
    values: dict[str, Any] = {
        "kafka_bootstrap": stack.settings.kafka_bootstrap, "grpc_port": free_port(),
        "http_port": free_port(), "metrics_port": 0, "bootstrap": False,
        "heat_flush_interval_s": 0.2, "instance_id": f"itest-{free_port()}",
        **tls_settings(stack, GATEWAY), **edge_tls_settings(stack),
    }
    values.update(over)
    app = GatewayApp(GatewaySettings(**values), registry=CollectorRegistry(),
                     serve_metrics=False)
    await app.start()
    try:
        await app.wait_ready(60)
        yield app
    finally:
        await app.stop(1)


def worker_tls(stack: Stack) -> TlsFiles | None:
    """What a fake worker (``serve_echo_worker``) serves with: the ``worker`` certificate
    of the stack's dev CA (the gateway dials it with mutual TLS)."""
    return tls_files(stack, WORKER)


async def read_topic(stack: Stack, topic: str, match: Callable[[Message], bool], *,
                     timeout_s: float = 20.0) -> list[Message]:
    """Events of ``topic`` (from the beginning) for which ``match`` holds, once any arrived."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=stack.settings.kafka_bootstrap,
                                group_id=None, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    found: list[Message] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=300)
            for records in batch.values():
                for r in records:
                    msg = decode_record(r)
                    if match(msg):
                        found.append(msg)
            if found and not batch:
                return found
        return found
    finally:
        await consumer.stop()


async def eventually(check: Callable[[], Any], *, timeout_s: float = 20.0,
                     every_s: float = 0.1) -> Any:
    """Poll an async ``check`` until it returns a truthy value; returns it."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(every_s)
    raise AssertionError(f"condition not met within {timeout_s}s (last: {last!r})")
