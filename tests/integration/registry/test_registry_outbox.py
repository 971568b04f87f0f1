"""Transactional outbox and admission consumer against the real stack.

* with the broker stopped, state changes succeed; their events wait in the outbox and are
  delivered once the broker is back (new producer); the admission consumer is recreated
  and applies verdicts again;
* a duplicated delivery (same event id twice, or a relay resend) changes nothing;
* events of one adapter leave in commit order;
* a send failing in the middle of a batch marks only the rows before it (own database,
  fake producer).
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry

from loraplane.shared.migrations import dbmate
from loraplane.shared.outbox import OutboxRelay, enqueue, prune_published
from loraplane.shared.topics import ADAPTER_RELEASES, TENANT_EVENTS, new_meta
from loraplane.stack.stack import Stack
from loraplane.v1 import common_pb2, events_pb2, registry_pb2
from tests.support.registry import (
    BASE,
    Registry,
    eventually,
    verdict_event,
)

R = registry_pb2


async def _outbox_rows(registry: Registry, tenant_id: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(registry.app.settings.postgres_dsn)
    try:
        return await conn.fetch(
            "SELECT id, topic, key, event_id, published_at, attempts, last_error FROM outbox "
            "WHERE tenant_id = $1 ORDER BY id", tenant_id)
    finally:
        await conn.close()


async def test_broker_outage_changes_succeed_events_follow(
    isolated_registry: Registry, stack: Stack, unique: str
) -> None:
    registry = isolated_registry
    relay, consumer = registry.app.relay, registry.app.consumer
    assert relay is not None and consumer is not None
    await asyncio.wait_for(consumer.ready.wait(), 30)
    await eventually(lambda: relay.is_leader, timeout=10)
    producers_before = relay.producers_created
    consumers_before = consumer.consumers_started
    stack.tansu.stop()
    try:
        assert stack.tansu.pid() is None
        tid = await registry.tenant(unique)
        v1 = await registry.register(tid, "bot", "v1")
        key = await registry.call("CreateApiKey", R.CreateApiKeyRequest(tenant_id=tid))
        assert v1.status == common_pb2.VERSION_STATUS_PENDING
        rows = await _outbox_rows(registry, tid)
        assert [r["topic"] for r in rows] == [
            registry.prefix + t for t in (TENANT_EVENTS, ADAPTER_RELEASES, TENANT_EVENTS)]
        assert all(r["published_at"] is None for r in rows)
        # The relay keeps trying (and says so in the lag metrics) while rows wait.
        labels = {"topic": registry.prefix + ADAPTER_RELEASES, "tenant": tid,
                  "base_model": BASE}
        await eventually(lambda: registry.metric("loraplane_outbox_rows_waiting", labels) == 1,
                         timeout=30)
        await eventually(lambda: registry.metric("loraplane_outbox_oldest_age_seconds",
                                                 labels) > 0, timeout=30)
        failures = relay.broker_failures
        await eventually(lambda: relay.broker_failures > failures, timeout=30)
    finally:
        stack.tansu.start()

    async def delivered() -> bool:
        return all(r["published_at"] is not None for r in await _outbox_rows(registry, tid))

    await eventually(delivered, timeout=60)
    assert relay.producers_created > producers_before  # dropped and recreated
    rows = await _outbox_rows(registry, tid)
    events = await registry.read(ADAPTER_RELEASES, lambda evs: any(
        e.meta.adapter.tenant_id == tid for e in evs))
    released = [(k, e, eid) for k, e, eid in events if e.meta.adapter.tenant_id == tid]
    assert len(released) == 1
    k, rel, eid = released[0]
    assert (k, eid) == (f"{tid}/bot".encode(), str(rows[1]["event_id"]))
    assert (rel.engine_id, rel.sha256) == (v1.engine_id, v1.sha256)
    tenant_events = await registry.read(TENANT_EVENTS, lambda evs: any(
        e.api_key_created.key_id == key.key.key_id for e in evs))
    mine = [e.WhichOneof("event") for _, e, _ in tenant_events
            if e.WhichOneof("event") and getattr(e, e.WhichOneof("event")).tenant_id == tid]
    assert mine == ["tenant_upserted", "api_key_created"]  # order kept per tenant
    await eventually(lambda: registry.metric("loraplane_outbox_rows_waiting", labels) == 0,
                     timeout=10)

    # The admission consumer lost the broker: it is recreated and applies verdicts again.
    await eventually(lambda: consumer.consumers_started > consumers_before, timeout=30)
    await registry.publish_verdict(verdict_event(v1))

    async def admitted() -> bool:
        got = await registry.call("GetVersion", R.GetVersionRequest(
            tenant_id=tid, adapter_name="bot", version="v1"))
        return bool(got.version.status == common_pb2.VERSION_STATUS_ADMITTED)

    await eventually(admitted, timeout=30)


async def test_duplicated_delivery_changes_nothing(
    registry: Registry, stack: Stack, unique: str
) -> None:
    consumer = registry.app.consumer
    assert consumer is not None
    tid = await registry.tenant(unique)
    v = await registry.register(tid, "bot", "v1")
    event = verdict_event(v)
    duplicates_before = consumer.outcomes.get("duplicate", 0)
    await registry.publish_verdict(event)
    await registry.publish_verdict(event)  # same event id, delivered twice
    await eventually(lambda: consumer.outcomes.get("duplicate", 0) > duplicates_before,
                     timeout=30)
    got = (await registry.call("GetVersion", R.GetVersionRequest(
        tenant_id=tid, adapter_name="bot", version="v1"))).version
    assert got.status == common_pb2.VERSION_STATUS_ADMITTED
    first_admitted_at = got.admitted_at

    # A second verdict (new event id) about an already decided version changes nothing.
    late = verdict_event(v, admit=False)
    not_pending_before = consumer.outcomes.get("not_pending", 0)
    await registry.publish_verdict(late)
    await eventually(lambda: consumer.outcomes.get("not_pending", 0) > not_pending_before,
                     timeout=30)
    # A verdict about other content (digest mismatch) changes nothing either.
    other = registry_pb2.AdapterVersion()
    other.CopyFrom(v)
    other.sha256 = "f" * 64
    mismatch_before = consumer.outcomes.get("digest_mismatch", 0)
    await registry.publish_verdict(verdict_event(other, admit=False))
    await eventually(lambda: consumer.outcomes.get("digest_mismatch", 0) > mismatch_before,
                     timeout=30)

    got = (await registry.call("GetVersion", R.GetVersionRequest(
        tenant_id=tid, adapter_name="bot", version="v1"))).version
    assert got.status == common_pb2.VERSION_STATUS_ADMITTED
    assert got.admitted_at == first_admitted_at and list(got.reasons) == []
    audit = await registry.call("ListAudit", R.ListAuditRequest(subject_prefix=f"{tid}/"))
    assert [e.action for e in audit.entries] == ["version.admit", "version.register"]

    # A relay resend (crash between the broker ack and the mark) repeats the same record:
    # same event id, same bytes, so idempotent consumers drop it.
    rows = await _outbox_rows(registry, tid)
    release_row = next(r for r in rows if r["topic"] == registry.prefix + ADAPTER_RELEASES)
    conn = await asyncpg.connect(registry.app.settings.postgres_dsn)
    try:
        await conn.execute("UPDATE outbox SET published_at = NULL WHERE id = $1",
                           release_row["id"])
        await conn.execute("SELECT pg_notify('loraplane_outbox', '')")
    finally:
        await conn.close()
    eid = str(release_row["event_id"])
    events = await registry.read(ADAPTER_RELEASES, lambda evs: sum(
        1 for e in evs if e.meta.event_id == eid) >= 2)
    copies = [e for _, e, _ in events if e.meta.event_id == eid]
    assert len(copies) == 2 and copies[0].SerializeToString() == copies[1].SerializeToString()


async def test_events_of_one_adapter_leave_in_commit_order(
    registry: Registry, unique: str
) -> None:
    tid = await registry.tenant(unique)
    versions = await asyncio.gather(*(registry.register(tid, "bot", f"v{i}") for i in range(12)))
    by_engine = [v.version for v in sorted(versions, key=lambda v: v.engine_id)]
    events = await registry.read(ADAPTER_RELEASES, lambda evs: sum(
        1 for e in evs if e.meta.adapter.tenant_id == tid) >= 12)
    order = [e.meta.adapter.version for _, e, _ in events if e.meta.adapter.tenant_id == tid]
    assert order == by_engine


class _FlakyProducer:
    """Acks every send except the ``fail_at``-th (0-based) of its life."""

    def __init__(self, sent: list[tuple[str, bytes]], fail_at: int | None) -> None:
        self.sent, self.fail_at, self.count = sent, fail_at, 0

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def send(self, topic: str, value: bytes | None = None, key: bytes | None = None, *,
                   headers: Any = None) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.count == self.fail_at:
            fut.set_exception(ConnectionError("broker went away"))
        else:
            self.sent.append((topic, key or b""))
            fut.set_result(None)
        self.count += 1
        return fut


async def test_failed_send_marks_only_the_prefix_and_recreates_the_producer(
    stack: Stack, unique: str
) -> None:
    admin = await asyncpg.connect(stack.settings.postgres_dsn)
    db = f"outbox_{unique}"
    await admin.execute(f'CREATE DATABASE "{db}"')
    dsn = stack.settings.dsn_for(db)
    try:
        await asyncio.to_thread(dbmate, dsn, "up")
        conn = await asyncpg.connect(dsn)
        try:
            async with conn.transaction():
                for i in range(5):
                    await enqueue(conn, _tenant_event(f"tenant-{i}"), tenant_id=f"tenant-{i}")
            sent: list[tuple[str, bytes]] = []
            producers: list[_FlakyProducer] = []

            def factory() -> _FlakyProducer:
                p = _FlakyProducer(sent, fail_at=2 if not producers else None)
                producers.append(p)
                return p

            relay = OutboxRelay(dsn=dsn, kafka=stack.settings.kafka(),
                                producer_factory=factory, backoff_base_s=0.05,
                                registry=_fresh_registry())
            stop = asyncio.Event()
            task = asyncio.create_task(relay.run(stop))

            async def all_published() -> bool:
                n = await conn.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL")
                return bool(n == 0)

            await eventually(all_published, timeout=20)
            stop.set()
            await asyncio.wait_for(task, 10)
            keys = [k.decode() for _, k in sent]
            # First producer: rows 0 and 1 acked, row 2 failed, rows 3 and 4 acked but not
            # marked (after the failure); the second producer resends 2, 3, 4 in order.
            assert keys == ["tenant-0", "tenant-1", "tenant-3", "tenant-4",
                            "tenant-2", "tenant-3", "tenant-4"]
            assert len(producers) == 2 and relay.producers_created == 2
            rows = await conn.fetch("SELECT key, attempts FROM outbox ORDER BY id")
            assert [(r["key"], r["attempts"]) for r in rows] == [
                ("tenant-0", 1), ("tenant-1", 1), ("tenant-2", 2), ("tenant-3", 1),
                ("tenant-4", 1)]
            # Retention: published rows go, waiting rows stay.
            await enqueue(conn, _tenant_event("tenant-5"))
            assert await prune_published(conn, older_than_s=3600) == 0
            assert await prune_published(conn, older_than_s=0) == 5
            assert await conn.fetchval("SELECT count(*) FROM outbox") == 1
        finally:
            await conn.close()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        await admin.close()


def _tenant_event(tenant_id: str) -> events_pb2.TenantEvent:
    ev = events_pb2.TenantEvent(meta=new_meta("test/outbox"))
    ev.tenant_upserted.tenant_id = tenant_id
    return ev


def _fresh_registry() -> CollectorRegistry:
    return CollectorRegistry()
