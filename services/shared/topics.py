"""Kafka topics of loraplane: names, message types, partition counts and keys.

Every topic carries exactly one protobuf message type (``TOPICS[name].message_type``).
Keys keep order per entity:

* adapter topics (``adapter.*``) are keyed by the adapter id ``"{tenant_id}/{adapter_name}"``
  taken from the event's ``meta.adapter`` (for the oneof wrappers ``AdmissionEvent`` and
  ``LifecycleEvent``, from the ``meta`` of the arm that is set);
* ``cache.commands`` and ``cache.state`` are keyed by ``worker_id``;
* ``tenant.events`` is keyed by tenant id.

Use :func:`key_for` to compute the key bytes of a message for its topic and :func:`new_meta`
to build the event envelope.

Partitions, keys, consumers and the order each consumer relies on
------------------------------------------------------------------

Kafka orders records within a partition only, and one key always lands on one partition:
every order guarantee below is *per key*. Delivery is at-least-once everywhere (Tansu
refuses idempotent producers): every consumer deduplicates on ``meta.event_id``.
"Every partition, no group" means the consumer assigns the partitions itself (no
membership, no rebalance); "group G, N members" means a Kafka consumer group whose
members split the partitions.

=====================  ====  ==========  =========================  ==========================================
topic                  part  key         consumers (group, members) order relied on
=====================  ====  ==========  =========================  ==========================================
``adapter.releases``   4     adapter id  admission: group           per adapter, releases in registry commit
                                         ``loraplane-admission``,   order (the outbox relays in ``id`` order,
                                         every replica a member     writers lock the adapter); a partition is
                                                                    handled in order, verdicts stored before
                                                                    publish (a redelivery republishes it)
``adapter.admissions`` 4     adapter id  registry: group            none across adapters; per version one
                                         ``loraplane-registry``,    verdict (stored, deduplicated); the cache
                                         every replica a member;    manager keeps a registry status
                                         cache manager: every       (active/canary/retired) over a replayed
                                         partition, no group (each  "admitted", the gateway's catalog is
                                         leader; offsets under its  idempotent
                                         deployment's or shard's
                                         group); gateway: every
                                         partition, no group,
                                         replayed from the start
``adapter.lifecycle``  4     adapter id  cache manager (each        per adapter, pointer changes in registry
                                         leader) and gateway, as    commit order (outbox); the gateway also
                                         above                      takes the newest event time per pointer
``adapter.heat``       8     adapter id  cache manager only (each   none: requests count by their own event
                                         leader, its "heat"         time (decayed rates) and once per request
                                         consumer; a shard drops    id, so batches of gateways and workers may
                                         other base models'         interleave or replay
                                         completions)
``adapter.prewarm``    4     adapter id  cache manager (each        none: a boost with a TTL, idempotent
                                         leader)
``cache.commands``     8     worker id   workers: group             per worker, commands in the order its
                                         ``loraplane-worker-<id>``  leaders published them; executed in order
                                         each (1 member: a worker   per adapter version (several versions at
                                         reads every partition and  once), committed once executed and
                                         keeps its own commands)    reported; a command past its deadline is
                                                                    ignored. Shard leaders of one worker
                                                                    command different base models' versions
``cache.state``        8     worker id   cache manager (each        per worker, reports in publish order; a
                                         leader, every partition,   snapshot carries ``(started_at, seq)`` so
                                         its "control" consumer);   a stale or replayed one is ignored, and a
                                         gateway (no group, replay) report older than the snapshot held only
                                                                    answers its command
``tenant.events``      2     tenant id   gateway (no group, replay  per tenant, key and share changes in
                                         from the start; kept       commit order (outbox); revoked keys stay
                                         forever)                   revoked (sticky)
=====================  ====  ==========  =========================  ==========================================

Consumer-group sizes follow: admission and registry scale by replicas up to 4 members (the
partitions of their topics); workers and gateways read every partition whatever their
number; the cache manager reads every partition once per leader, i.e. once per shard
(``LORAPLANE_CACHE_MANAGER_SHARDS``, :mod:`loraplane.cache_manager.sharding`): ``adapter.heat``
is read by every shard's leader, which drops other base models' completions as it applies
them (``make bench-cache``'s heat-apply figure is what one process absorbs).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType

from google.protobuf.message import Message

from loraplane.shared.errors import InvalidArgument
from loraplane.v1 import common_pb2, events_pb2

ADAPTER_RELEASES = "adapter.releases"
"""Registry → admission: a version was registered (``AdapterReleased``)."""
ADAPTER_ADMISSIONS = "adapter.admissions"
"""Admission → registry, cache manager: verdicts (``AdmissionEvent``)."""
ADAPTER_LIFECYCLE = "adapter.lifecycle"
"""Registry → gateway, cache manager: release pointer changes (``LifecycleEvent``)."""
ADAPTER_HEAT = "adapter.heat"
"""Gateway/worker → cache manager: completed requests (``HeatBatch``)."""
ADAPTER_PREWARM = "adapter.prewarm"
"""Gateway, registry → cache manager: please make an adapter HOT (``PrewarmRequested``)."""
CACHE_COMMANDS = "cache.commands"
"""Cache manager → worker: load / evict / pin / unpin (``CacheCommand``)."""
CACHE_STATE = "cache.state"
"""Worker → cache manager, gateway: command outcomes and snapshots (``WorkerReport``)."""
TENANT_EVENTS = "tenant.events"
"""Registry → gateway: tenants and API keys (``TenantEvent``)."""

_META_FIELD = "meta"  # field 1 of every event: the EventMeta envelope

Clock = Callable[[], datetime]
"""Returns the current time as a timezone-aware datetime."""


class TopicError(InvalidArgument, ValueError):
    """A topic name or a message does not fit the topic table. Not retriable."""


class UnknownTopicError(TopicError):
    """The topic name is not in :data:`TOPICS`."""


class MissingKeyError(TopicError):
    """The message lacks the field its topic is keyed by (e.g. an empty tenant id)."""


def utc_now() -> datetime:
    """Default clock: the current UTC time."""
    return datetime.now(UTC)


def adapter_id(ref: common_pb2.AdapterRef) -> str:
    """The adapter id ``"{tenant_id}/{adapter_name}"`` of an adapter reference."""
    return f"{ref.tenant_id}/{ref.adapter_name}"


def event_meta(msg: Message) -> common_pb2.EventMeta | None:
    """Return the ``EventMeta`` envelope of an event, or ``None`` if it has none.

    Looks at the ``meta`` field first; for oneof wrappers without one
    (``AdmissionEvent``, ``LifecycleEvent``) it uses the ``meta`` of the arm that is set.
    """
    if _META_FIELD in msg.DESCRIPTOR.fields_by_name:
        meta = getattr(msg, _META_FIELD)
        return meta if isinstance(meta, common_pb2.EventMeta) else None
    for oneof in msg.DESCRIPTOR.oneofs:
        arm = msg.WhichOneof(oneof.name)
        if arm is not None:
            inner = getattr(msg, arm)
            if isinstance(inner, Message):
                return event_meta(inner)
    return None


def _adapter_key(msg: Message) -> str:
    meta = event_meta(msg)
    if meta is None or not meta.adapter.tenant_id:
        raise MissingKeyError(f"{msg.DESCRIPTOR.full_name} has no meta.adapter.tenant_id to key by")
    return adapter_id(meta.adapter)


def _worker_key(msg: Message) -> str:
    worker_id = getattr(msg, "worker_id", "")
    if not isinstance(worker_id, str) or not worker_id:
        raise MissingKeyError(f"{msg.DESCRIPTOR.full_name} has no worker_id to key by")
    return worker_id


def _tenant_key(msg: Message) -> str:
    tenant_id = ""
    for oneof in msg.DESCRIPTOR.oneofs:
        arm = msg.WhichOneof(oneof.name)
        if arm is not None:
            tenant_id = getattr(getattr(msg, arm), "tenant_id", "")
    if not tenant_id:
        raise MissingKeyError(f"{msg.DESCRIPTOR.full_name} has no tenant_id to key by")
    return str(tenant_id)


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One row of the topic table."""

    name: str
    """Kafka topic name."""
    message_type: type[Message]
    """The only protobuf message class carried by the topic."""
    partitions: int
    """Partition count to create the topic with."""
    key: Callable[[Message], str]
    """Returns the partition key (text) of a message of this topic."""
    key_kind: str
    """What the key is: ``"adapter_id"``, ``"worker_id"`` or ``"tenant_id"``."""
    description: str
    """Who produces what, for humans."""
    configs: Mapping[str, str] = field(default_factory=dict, hash=False, compare=False)
    """Topic configs set when the topic is created (e.g. ``retention.ms``)."""

    def key_bytes(self, msg: Message) -> bytes:
        """The UTF-8 key of ``msg``; refuses a message of another type."""
        if not isinstance(msg, self.message_type):
            raise TopicError(
                f"topic {self.name} carries {self.message_type.DESCRIPTOR.full_name}, "
                f"not {msg.DESCRIPTOR.full_name}"
            )
        return self.key(msg).encode("utf-8")


def _spec(
    name: str,
    message_type: type[Message],
    partitions: int,
    key_kind: str,
    description: str,
    configs: Mapping[str, str] | None = None,
) -> TopicSpec:
    keys = {"adapter_id": _adapter_key, "worker_id": _worker_key, "tenant_id": _tenant_key}
    return TopicSpec(name, message_type, partitions, keys[key_kind], key_kind, description,
                     MappingProxyType(dict(configs or {})))


TOPICS: Mapping[str, TopicSpec] = MappingProxyType(
    {
        s.name: s
        for s in (
            _spec(
                ADAPTER_RELEASES,
                events_pb2.AdapterReleased,
                4,
                "adapter_id",
                "registry outbox: version registered, asks for admission",
            ),
            _spec(
                ADAPTER_ADMISSIONS,
                events_pb2.AdmissionEvent,
                4,
                "adapter_id",
                "admission: admitted or rejected with every reason",
            ),
            _spec(
                ADAPTER_LIFECYCLE,
                events_pb2.LifecycleEvent,
                4,
                "adapter_id",
                "registry outbox: promote / canary / rollback / retire",
            ),
            _spec(
                ADAPTER_HEAT,
                events_pb2.HeatBatch,
                8,
                "adapter_id",
                "gateway/worker: completed requests of one adapter",
            ),
            _spec(
                ADAPTER_PREWARM,
                events_pb2.PrewarmRequested,
                4,
                "adapter_id",
                "gateway/registry: make an adapter HOT soon",
            ),
            _spec(
                CACHE_COMMANDS,
                events_pb2.CacheCommand,
                8,
                "worker_id",
                "cache manager: load / evict / pin / unpin for one worker",
            ),
            _spec(
                CACHE_STATE,
                events_pb2.WorkerReport,
                8,
                "worker_id",
                "worker: command outcomes and state snapshots",
            ),
            _spec(
                TENANT_EVENTS,
                events_pb2.TenantEvent,
                2,
                "tenant_id",
                "registry outbox: tenants, API keys and adapter shares for the gateway views",
                # the gateway rebuilds keys and shares by replaying it from the start
                {"retention.ms": "-1"},
            ),
        )
    }
)
"""Topic name → :class:`TopicSpec`, in a fixed order."""


def topic_spec(topic: str) -> TopicSpec:
    """The spec of ``topic``; raises :class:`UnknownTopicError` for unknown names."""
    try:
        return TOPICS[topic]
    except KeyError:
        raise UnknownTopicError(f"unknown topic {topic!r}; known: {sorted(TOPICS)}") from None


def topic_for(msg: Message | type[Message]) -> TopicSpec:
    """The topic that carries messages of this type (each type belongs to one topic)."""
    cls: type[Message] = msg if isinstance(msg, type) else type(msg)
    for spec in TOPICS.values():
        if spec.message_type is cls:
            return spec
    raise UnknownTopicError(f"no topic carries {cls.DESCRIPTOR.full_name}")


def key_for(topic: str, msg: Message) -> bytes:
    """Partition key bytes of ``msg`` on ``topic`` (checks the message type)."""
    return topic_spec(topic).key_bytes(msg)


def new_meta(
    producer: str,
    adapter: common_pb2.AdapterRef | None = None,
    *,
    clock: Clock = utc_now,
    causation_id: str = "",
    correlation_id: str = "",
    id_factory: Callable[[], uuid.UUID] = uuid.uuid4,
) -> common_pb2.EventMeta:
    """Build an event envelope: fresh UUID4 ``event_id``, ``occurred_at`` from ``clock``.

    ``producer`` is ``"service/instance"``. ``clock`` must return an aware datetime.
    """
    now = clock()
    if now.tzinfo is None:
        raise ValueError("clock must return a timezone-aware datetime")
    meta = common_pb2.EventMeta(
        event_id=str(id_factory()),
        producer=producer,
        causation_id=causation_id,
        correlation_id=correlation_id,
    )
    meta.occurred_at.FromDatetime(now.astimezone(UTC))
    if adapter is not None:
        meta.adapter.CopyFrom(adapter)
    return meta
