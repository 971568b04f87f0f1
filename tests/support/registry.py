"""Test support for the registry: valid records, real admission verdict events, a Kafka topic
reader and a handle on a running registry. Used by the integration tests of the registry
and of services that need a registry (gateway, cache manager)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from prometheus_client import CollectorRegistry

from loraplane.registry.admissions import apply_verdict
from loraplane.registry.app import RegistryApp
from loraplane.registry.grammar import artifact_prefix, artifact_uri, content_digest
from loraplane.registry.settings import RegistrySettings
from loraplane.shared.codec import decode_as, encode, kafka_headers
from loraplane.shared.db import transaction
from loraplane.shared.outbox import PublishedRow
from loraplane.shared.tls import REGISTRY_ID
from loraplane.shared.topics import ADAPTER_ADMISSIONS, key_for, new_meta, topic_spec
from loraplane.stack.stack import Stack
from loraplane.v1 import common_pb2, events_pb2, registry_pb2, registry_pb2_grpc
from tests.support.tls import tls_settings

TOKEN = "test-operator-token-0123456789"
FAST_GROUP = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 500,
              "rebalance_timeout_ms": 1000}
BASE = "loraplane/tiny-llama"


def registry_settings(stack: Stack, **over: object) -> RegistrySettings:
    """Registry settings pointing at the test stack (port 0 = free port), serving mutual
    TLS with the ``registry`` certificate of the stack's dev CA."""
    env = stack.settings.client_env()
    values: dict[str, object] = {
        "postgres_dsn": env["LORAPLANE_POSTGRES_DSN"],
        "kafka_bootstrap": env["LORAPLANE_KAFKA_BOOTSTRAP"],
        **stack.settings.s3_settings(),
        "artifact_bucket": env["LORAPLANE_ARTIFACT_BUCKET"],
        "registry_grpc_port": 0,
        "registry_metrics_port": 0,
        "registry_operator_token": TOKEN,
        "registry_consumer_group": f"registry-test-{uuid.uuid4().hex[:8]}",
        "registry_grace_s": 1.0,
        "instance_id": "registry-test",
        **tls_settings(stack, REGISTRY_ID),
    }
    values.update(over)
    return RegistrySettings(**values)  # type: ignore[arg-type]


@dataclass
class Registry:
    """The running registry and what tests need to talk to it."""

    app: RegistryApp
    stub: registry_pb2_grpc.RegistryAdminStub
    """The operator's (its certificate, and the operator token in :attr:`md`, as the CLI
    of ``make run`` calls)."""
    metrics: CollectorRegistry
    published: list[PublishedRow]
    bootstrap: str
    bucket: str
    prefix: str = ""
    """Topic namespace of this registry (``registry_topic_prefix``)."""

    md: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {TOKEN}"),
                                       ("x-loraplane-actor", "tests/registry"))

    async def call(self, method: str, request: object) -> object:
        """Call an RPC with the operator token."""
        return await getattr(self.stub, method)(request, metadata=self.md, timeout=10)

    async def status_of(self, method: str, request: object, md: object = None, *,
                        stub: registry_pb2_grpc.RegistryAdminStub | None = None
                        ) -> grpc.StatusCode:
        """The status code an RPC ends with (OK if it succeeds); ``stub``: another
        caller's (default: the operator's)."""
        try:
            await getattr(stub or self.stub, method)(
                request, metadata=self.md if md is None else md, timeout=10)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK

    async def read(
        self, topic: str, until: Callable[[list[Any]], bool], *, timeout: float = 30
    ) -> list[tuple[bytes, Any, str]]:
        """:func:`read_topic` on this registry's namespace."""
        return await read_topic(self.bootstrap, topic, until, prefix=self.prefix,
                                timeout=timeout)

    async def publish_verdict(self, event: events_pb2.AdmissionEvent) -> None:
        """:func:`publish_verdict` on this registry's namespace."""
        await publish_verdict(self.bootstrap, event, prefix=self.prefix)

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Current value of a sample in the registry's collector registry (0 if absent)."""
        value = self.metrics.get_sample_value(name, labels or {})
        return float(value or 0.0)

    # -- helpers ---------------------------------------------------------------------

    async def tenant(self, unique: str, suffix: str = "") -> str:
        """Create a fresh tenant and return its id."""
        tenant_id = f"t-{unique}{suffix}"
        await self.call("CreateTenant", registry_pb2.CreateTenantRequest(
            tenant_id=tenant_id, display_name="Test tenant",
            default_priority=common_pb2.PRIORITY_SILVER))
        return tenant_id

    async def register(
        self, tenant_id: str, name: str, version: str, *, seed: str = "", **over: object
    ) -> registry_pb2.AdapterVersion:
        """Register a version whose files are described (not uploaded)."""
        rec = record(tenant_id, name, version, self.bucket, seed=seed or version)
        for k, v in over.items():
            setattr(rec, k, v)
        resp = await self.call("RegisterVersion", registry_pb2.RegisterVersionRequest(version=rec))
        return resp.version  # type: ignore[attr-defined, no-any-return]

    async def verdict(self, v: registry_pb2.AdapterVersion, *, admit: bool = True) -> str:
        """Apply an admission verdict directly through the service layer (same function as
        the Kafka consumer)."""
        assert self.app.pool is not None
        event = verdict_event(v, admit=admit)
        async with transaction(self.app.pool) as conn:
            return await apply_verdict(conn, event=event)

    async def admitted(self, tenant_id: str, name: str, version: str) -> registry_pb2.AdapterVersion:
        """Register and admit a version."""
        v = await self.register(tenant_id, name, version)
        assert await self.verdict(v) == "applied"
        return v


def record(
    tenant_id: str, name: str, version: str, bucket: str, *, seed: str = "x"
) -> registry_pb2.AdapterVersion:
    """A complete, valid version record with made-up file digests."""
    import hashlib

    def h(s: str) -> str:
        return hashlib.sha256(f"{seed}:{s}".encode()).hexdigest()

    files = [events_pb2.ArtifactFile(path="adapter_config.json", size_bytes=700,
                                     sha256=h("config")),
             events_pb2.ArtifactFile(path="adapter_model.safetensors", size_bytes=90000,
                                     sha256=h("weights"))]
    digest = content_digest((f.path, f.sha256) for f in files)
    return registry_pb2.AdapterVersion(
        tenant_id=tenant_id, name=name, version=version, base_model=BASE, rank=8,
        format="peft", target_modules=["q_proj", "v_proj"], sha256=digest,
        size_bytes=sum(f.size_bytes for f in files), files=files,
        artifact_uri=artifact_uri(bucket, artifact_prefix(tenant_id, name, version, digest)),
        signer_identity="key:sha256:" + "0" * 64, tokenizer_revision="0" * 64, lora_alpha=16,
    )


def verdict_event(
    v: registry_pb2.AdapterVersion, *, admit: bool = True, event_id: str | None = None,
    reasons: list[events_pb2.RejectionReason] | None = None,
) -> events_pb2.AdmissionEvent:
    """A real AdmissionEvent about ``v`` (as the admission service publishes it)."""
    ref = common_pb2.AdapterRef(tenant_id=v.tenant_id, adapter_name=v.name, version=v.version,
                                base_model=v.base_model)
    meta = new_meta("admission/test", ref)
    if event_id:
        meta.event_id = event_id
    event = events_pb2.AdmissionEvent()
    if admit:
        event.admitted.CopyFrom(events_pb2.AdapterAdmitted(
            meta=meta, engine_id=v.engine_id, sha256=v.sha256, checks_passed=["all"],
            artifact_uri=v.artifact_uri, size_bytes=v.size_bytes, rank=v.rank))
    else:
        event.rejected.CopyFrom(events_pb2.AdapterRejected(
            meta=meta, engine_id=v.engine_id, sha256=v.sha256, reasons=reasons or [
                events_pb2.RejectionReason(code=events_pb2.REJECTION_CODE_RANK_TOO_LARGE,
                                           message="rank 64 > max_lora_rank 16"),
                events_pb2.RejectionReason(code=events_pb2.REJECTION_CODE_NON_FINITE,
                                           message="NaN", path="adapter_model.safetensors"),
            ]))
    return event


async def publish_verdict(
    bootstrap: str, event: events_pb2.AdmissionEvent, *, prefix: str = ""
) -> None:
    """Publish an AdmissionEvent on ``<prefix>adapter.admissions`` with the codec headers
    and key, as the admission service does."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        body, headers = encode(event)
        await producer.send_and_wait(prefix + ADAPTER_ADMISSIONS, body,
                                     key=key_for(ADAPTER_ADMISSIONS, event),
                                     headers=kafka_headers(headers))
    finally:
        await producer.stop()


async def read_topic(
    bootstrap: str, topic: str, until: Callable[[list[Any]], bool], *, prefix: str = "",
    timeout: float = 30,
) -> list[tuple[bytes, Any, str]]:
    """Read ``<prefix><topic>`` from the beginning (fresh group) until ``until(events)``
    holds. ``topic`` is a table name (it decides the message type).

    Returns ``(key, decoded event, x-event-id)`` for every record read.
    """
    message_type = topic_spec(topic).message_type
    consumer = AIOKafkaConsumer(prefix + topic, bootstrap_servers=bootstrap,
                                group_id=f"reader-{uuid.uuid4().hex[:8]}",
                                auto_offset_reset="earliest", enable_auto_commit=False,
                                **FAST_GROUP)
    await consumer.start()
    got: list[tuple[bytes, Any, str]] = []
    try:
        async with asyncio.timeout(timeout):
            while not until([e for _, e, _ in got]):
                batch = await consumer.getmany(timeout_ms=300)
                for records in batch.values():
                    for r in records:
                        ids = dict(r.headers or [])
                        event = decode_as(message_type, r.value, r.headers)
                        got.append((r.key, event, ids.get("x-event-id", b"").decode()))
    finally:
        await consumer.stop()
    return got


async def eventually(check: Callable[[], object], *, timeout: float = 20,
                     interval: float = 0.1) -> object:
    """Await ``check()`` (sync or async) until it returns a truthy value."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)
