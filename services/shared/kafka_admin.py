"""Create loraplane's topics with their partition counts (idempotent)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from loraplane.shared.kafka_client import KafkaConnection
from loraplane.shared.topics import TOPICS, TopicSpec, topic_spec


async def ensure_topics(
    kafka: KafkaConnection,
    names: Iterable[str] | None = None,
    *,
    prefix: str = "",
    timeout_s: float = 15.0,
) -> list[str]:
    """Create the topics of :data:`TOPICS` that are missing, with the table's partition
    counts and configs (e.g. ``tenant.events`` never expires: the gateway replays it from
    the start); returns the names created. An existing topic keeps its configs (Tansu has
    no AlterConfigs), so whichever service creates a topic first must give it its configs.

    ``names`` restricts the set (unprefixed table names); ``prefix`` is prepended to every
    name created. Safe to run concurrently from several services.
    """
    wanted = [topic_spec(n) for n in (names if names is not None else TOPICS)]
    return await create_missing(kafka, {prefix + spec.name: spec for spec in wanted},
                                timeout_s=timeout_s)


async def create_missing(
    kafka: KafkaConnection, wanted: Mapping[str, TopicSpec], *, timeout_s: float = 15.0
) -> list[str]:
    """Create each topic of ``wanted`` (its name -> the table row whose partition count and
    configs it takes; a renamed test topic keeps its row's) that is missing; returns the
    names created."""
    admin = AIOKafkaAdminClient(**kafka.client_args(), request_timeout_ms=int(timeout_s * 1000))
    await asyncio.wait_for(admin.start(), timeout_s)
    created: list[str] = []
    try:
        existing = set(await admin.list_topics())
        for name, spec in wanted.items():
            if name in existing:
                continue
            try:
                await admin.create_topics([NewTopic(
                    name, num_partitions=spec.partitions, replication_factor=1,
                    topic_configs=dict(spec.configs) or None,
                )])
                created.append(name)
            except TopicAlreadyExistsError:
                pass
    finally:
        await admin.close()
    return created


GROUP_TUNING: dict[str, int] = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 500,
    "rebalance_timeout_ms": 1000,
    "metadata_max_age_ms": 5000,
}
"""Consumer-group settings that join in ~2 s on Tansu (see FACTS.md)."""

