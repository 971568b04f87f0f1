"""The topic table: every topic maps to one message type, keys are as specified."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import pytest
from google.protobuf.message import Message

from loraplane.shared import topics
from loraplane.v1 import common_pb2, events_pb2

REF = common_pb2.AdapterRef(
    tenant_id="acme", adapter_name="support-bot", version="v3", base_model="tiny"
)


def _meta() -> common_pb2.EventMeta:
    return topics.new_meta("test/0", REF)


def test_topic_names() -> None:
    assert list(topics.TOPICS) == [
        "adapter.releases",
        "adapter.admissions",
        "adapter.lifecycle",
        "adapter.heat",
        "adapter.prewarm",
        "cache.commands",
        "cache.state",
        "tenant.events",
    ]
    assert topics.ADAPTER_RELEASES == "adapter.releases"
    assert topics.CACHE_COMMANDS == "cache.commands"
    assert topics.TENANT_EVENTS == "tenant.events"


def test_every_topic_maps_to_its_own_message_type() -> None:
    expected = {
        "adapter.releases": events_pb2.AdapterReleased,
        "adapter.admissions": events_pb2.AdmissionEvent,
        "adapter.lifecycle": events_pb2.LifecycleEvent,
        "adapter.heat": events_pb2.HeatBatch,
        "adapter.prewarm": events_pb2.PrewarmRequested,
        "cache.commands": events_pb2.CacheCommand,
        "cache.state": events_pb2.WorkerReport,
        "tenant.events": events_pb2.TenantEvent,
    }
    assert {name: spec.message_type for name, spec in topics.TOPICS.items()} == expected
    for name, spec in topics.TOPICS.items():
        assert spec.name == name
        assert spec.partitions >= 1
        assert topics.topic_for(spec.message_type) is spec
        assert topics.topic_for(spec.message_type()) is spec


def test_key_kinds() -> None:
    kinds = {name: spec.key_kind for name, spec in topics.TOPICS.items()}
    assert kinds == {
        "adapter.releases": "adapter_id",
        "adapter.admissions": "adapter_id",
        "adapter.lifecycle": "adapter_id",
        "adapter.heat": "adapter_id",
        "adapter.prewarm": "adapter_id",
        "cache.commands": "worker_id",
        "cache.state": "worker_id",
        "tenant.events": "tenant_id",
    }


@pytest.mark.parametrize(
    ("topic", "msg"),
    [
        (topics.ADAPTER_RELEASES, events_pb2.AdapterReleased(meta=_meta())),
        (
            topics.ADAPTER_ADMISSIONS,
            events_pb2.AdmissionEvent(admitted=events_pb2.AdapterAdmitted(meta=_meta())),
        ),
        (
            topics.ADAPTER_ADMISSIONS,
            events_pb2.AdmissionEvent(rejected=events_pb2.AdapterRejected(meta=_meta())),
        ),
        (
            topics.ADAPTER_LIFECYCLE,
            events_pb2.LifecycleEvent(promoted=events_pb2.AdapterPromoted(meta=_meta())),
        ),
        (
            topics.ADAPTER_LIFECYCLE,
            events_pb2.LifecycleEvent(canary_changed=events_pb2.CanaryChanged(meta=_meta())),
        ),
        (
            topics.ADAPTER_LIFECYCLE,
            events_pb2.LifecycleEvent(rolled_back=events_pb2.RolledBack(meta=_meta())),
        ),
        (
            topics.ADAPTER_LIFECYCLE,
            events_pb2.LifecycleEvent(retired=events_pb2.AdapterRetired(meta=_meta())),
        ),
        (topics.ADAPTER_HEAT, events_pb2.HeatBatch(meta=_meta())),
        (topics.ADAPTER_PREWARM, events_pb2.PrewarmRequested(meta=_meta())),
    ],
    ids=lambda v: v if isinstance(v, str) else type(v).__name__,
)
def test_adapter_topics_keyed_by_adapter_id(topic: str, msg: Message) -> None:
    assert topics.key_for(topic, msg) == b"acme/support-bot"


def test_adapter_key_ignores_version() -> None:
    """All versions of one adapter share a partition, so their events stay ordered."""
    other = common_pb2.AdapterRef()
    other.CopyFrom(REF)
    other.version = "v4"
    a = events_pb2.AdapterReleased(meta=topics.new_meta("t/0", REF))
    b = events_pb2.AdapterReleased(meta=topics.new_meta("t/0", other))
    assert topics.key_for(topics.ADAPTER_RELEASES, a) == topics.key_for(topics.ADAPTER_RELEASES, b)


@pytest.mark.parametrize(
    ("topic", "msg"),
    [
        (
            topics.CACHE_COMMANDS,
            events_pb2.CacheCommand(
                meta=_meta(), worker_id="worker-7", pin=events_pb2.PinAdapter(engine_id=1)
            ),
        ),
        (
            topics.CACHE_STATE,
            events_pb2.WorkerReport(
                meta=_meta(),
                worker_id="worker-7",
                state=events_pb2.WorkerState(worker_id="worker-7"),
            ),
        ),
    ],
    ids=["cache.commands", "cache.state"],
)
def test_cache_topics_keyed_by_worker(topic: str, msg: Message) -> None:
    assert topics.key_for(topic, msg) == b"worker-7"


@pytest.mark.parametrize(
    "event",
    [
        events_pb2.TenantEvent(tenant_upserted=events_pb2.TenantUpserted(tenant_id="t-1")),
        events_pb2.TenantEvent(api_key_created=events_pb2.ApiKeyCreated(tenant_id="t-1")),
        events_pb2.TenantEvent(api_key_revoked=events_pb2.ApiKeyRevoked(tenant_id="t-1")),
    ],
    ids=["upserted", "key_created", "key_revoked"],
)
def test_tenant_events_keyed_by_tenant(event: events_pb2.TenantEvent) -> None:
    event.meta.CopyFrom(topics.new_meta("registry/0"))
    assert topics.key_for(topics.TENANT_EVENTS, event) == b"t-1"


@pytest.mark.parametrize(
    ("topic", "msg"),
    [
        (topics.ADAPTER_RELEASES, events_pb2.AdapterReleased()),
        (topics.ADAPTER_ADMISSIONS, events_pb2.AdmissionEvent()),
        (topics.CACHE_COMMANDS, events_pb2.CacheCommand(meta=_meta())),
        (topics.CACHE_STATE, events_pb2.WorkerReport(meta=_meta())),
        (topics.TENANT_EVENTS, events_pb2.TenantEvent(meta=_meta(), tenant_upserted={})),
    ],
    ids=lambda v: v if isinstance(v, str) else type(v).__name__,
)
def test_missing_key_is_refused(topic: str, msg: Message) -> None:
    with pytest.raises(topics.MissingKeyError):
        topics.key_for(topic, msg)


def test_key_for_refuses_wrong_type_and_unknown_topic() -> None:
    with pytest.raises(topics.TopicError, match="carries loraplane.v1.CacheCommand"):
        topics.key_for(topics.CACHE_COMMANDS, events_pb2.AdapterReleased(meta=_meta()))
    with pytest.raises(topics.UnknownTopicError):
        topics.key_for("adapter.nope", events_pb2.AdapterReleased(meta=_meta()))
    with pytest.raises(topics.UnknownTopicError):
        topics.topic_for(events_pb2.LoadAdapter)


def test_event_meta_finds_envelope_in_oneof_arm() -> None:
    meta = _meta()
    assert topics.event_meta(events_pb2.AdapterReleased(meta=meta)) == meta
    wrapped = events_pb2.LifecycleEvent(rolled_back=events_pb2.RolledBack(meta=meta))
    assert topics.event_meta(wrapped) == meta
    assert topics.event_meta(events_pb2.AdmissionEvent()) is None
    assert topics.event_meta(events_pb2.LoadAdapter()) is None


def test_new_meta_uses_injected_clock_and_ids() -> None:
    fixed = datetime(2026, 11, 29, 12, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    ids: Callable[[], uuid.UUID] = lambda: uuid.UUID(int=42)
    meta = topics.new_meta(
        "gateway/gw-1", REF, clock=lambda: fixed, id_factory=ids, causation_id="c-1"
    )
    assert meta.event_id == str(uuid.UUID(int=42))
    assert meta.occurred_at.ToDatetime(tzinfo=UTC) == fixed
    assert meta.producer == "gateway/gw-1"
    assert meta.adapter == REF
    assert meta.causation_id == "c-1"
    # the caller's AdapterRef is copied, not aliased
    REF_COPY = common_pb2.AdapterRef()
    REF_COPY.CopyFrom(REF)
    meta.adapter.version = "changed"
    assert REF == REF_COPY


def test_new_meta_defaults() -> None:
    before = datetime.now(UTC)
    a, b = topics.new_meta("x/1"), topics.new_meta("x/1")
    assert uuid.UUID(a.event_id).version == 4
    assert a.event_id != b.event_id
    assert not a.HasField("adapter")
    assert a.occurred_at.ToDatetime(tzinfo=UTC) >= before - timedelta(seconds=1)


def test_new_meta_refuses_naive_clock() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        topics.new_meta("x/1", clock=lambda: datetime(2026, 1, 1))
