"""Create loraplane's topics with their partition counts (idempotent)."""

from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from loraplane.shared.kafka_client import KafkaConnection
from loraplane.shared.topics import TOPICS


async def ensure_topics(kafka: KafkaConnection) -> list[str]:
    """Create every topic of :data:`TOPICS` that is missing, with its configs (e.g.
    ``tenant.events`` never expires: the gateway replays it from the start); returns the
    ones created. An existing topic keeps its configs (Tansu has no AlterConfigs)."""
    admin = AIOKafkaAdminClient(**kafka.client_args())
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [spec for name, spec in TOPICS.items() if name not in existing]
        created: list[str] = []
        for spec in missing:
            try:
                await admin.create_topics([NewTopic(
                    spec.name, num_partitions=spec.partitions, replication_factor=1,
                    topic_configs=dict(spec.configs) or None,
                )])
                created.append(spec.name)
            except TopicAlreadyExistsError:
                pass
        return created
    finally:
        await admin.close()


GROUP_TUNING: dict[str, int] = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 500,
    "rebalance_timeout_ms": 1000,
    "metadata_max_age_ms": 5000,
}
"""Consumer-group settings that join in ~2 s on Tansu (see FACTS.md)."""

