"""Tansu (Kafka wire protocol) with real aiokafka clients: groups, manual commits, durability."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from loraplane.stack.stack import Stack

FAST_GROUP = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 500, "rebalance_timeout_ms": 1000}


async def _create_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    finally:
        await admin.close()


async def _produce(bootstrap: str, topic: str, values: list[bytes], key: bytes = b"k") -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for v in values:
            await producer.send_and_wait(topic, v, key=key)
    finally:
        await producer.stop()


async def _consume(bootstrap: str, topic: str, group: str, n: int, commit: bool) -> list[bytes]:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **FAST_GROUP,
    )
    await consumer.start()
    got: list[bytes] = []
    try:
        async with asyncio.timeout(30):
            while len(got) < n:
                batch = await consumer.getmany(timeout_ms=500, max_records=n - len(got))
                for records in batch.values():
                    got.extend(r.value for r in records)
        if commit:
            await consumer.commit()
    finally:
        await consumer.stop()
    return got


async def test_consumer_group_manual_commit_resumes(stack: Stack, unique: str) -> None:
    bootstrap = stack.settings.kafka_bootstrap
    topic, group = f"t-commit-{unique}", f"g-{unique}"
    await _create_topic(bootstrap, topic)
    await _produce(bootstrap, topic, [f"m{i}".encode() for i in range(6)])

    first = await _consume(bootstrap, topic, group, 3, commit=True)
    assert first == [b"m0", b"m1", b"m2"]
    # The next member of the group resumes after the committed offset.
    rest = await _consume(bootstrap, topic, group, 3, commit=False)
    assert rest == [b"m3", b"m4", b"m5"]
    # Nothing was committed by the second member: a third one sees the same three again.
    again = await _consume(bootstrap, topic, group, 3, commit=True)
    assert again == [b"m3", b"m4", b"m5"]


async def test_broker_kill_and_restart_keeps_topics_and_offsets(stack: Stack, unique: str) -> None:
    bootstrap = stack.settings.kafka_bootstrap
    topic, group = f"t-durable-{unique}", f"g-durable-{unique}"
    await _create_topic(bootstrap, topic)
    await _produce(bootstrap, topic, [b"a", b"b", b"c", b"d"])
    assert await _consume(bootstrap, topic, group, 2, commit=True) == [b"a", b"b"]

    stack.tansu.kill()  # SIGKILL: no clean shutdown
    assert stack.tansu.pid() is None
    stack.tansu.start()

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        assert topic in await admin.list_topics()
    finally:
        await admin.close()
    # Committed offset survived: the group resumes at c.
    assert await _consume(bootstrap, topic, group, 2, commit=True) == [b"c", b"d"]
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, **FAST_GROUP)
    await consumer.start()
    try:
        committed = await consumer.committed(TopicPartition(topic, 0))
    finally:
        await consumer.stop()
    assert committed == 4


async def test_tenant_events_never_expire(stack: Stack) -> None:
    """The gateway rebuilds its keys and shares by replaying ``tenant.events`` from the start,
    so ``ensure_topics`` creates it with infinite retention (others keep the default)."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    from loraplane.shared.topics import CACHE_STATE, TENANT_EVENTS

    admin = AIOKafkaAdminClient(bootstrap_servers=stack.settings.kafka_bootstrap)
    await admin.start()
    try:
        described = await admin.describe_configs([
            ConfigResource(ConfigResourceType.TOPIC, TENANT_EVENTS),
            ConfigResource(ConfigResourceType.TOPIC, CACHE_STATE),
        ])
    finally:
        await admin.close()
    configs = {
        res[3]: {entry[0]: entry[1] for entry in res[4]}
        for resp in described for res in resp.resources
    }
    assert configs[TENANT_EVENTS].get("retention.ms") == "-1", configs
    assert configs[CACHE_STATE].get("retention.ms") != "-1", configs


async def test_every_creation_path_gives_a_topic_its_configs(stack: Stack, unique: str) -> None:
    """Whichever service creates a topic first fixes its configs (Tansu has no AlterConfigs):
    the registry's prefixed creation and admission's renamed topics take the table row's
    configs too, so a ``tenant.events`` the registry created first still never expires."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    from loraplane.shared.kafka_admin import create_missing, ensure_topics
    from loraplane.shared.topics import CACHE_STATE, TENANT_EVENTS, topic_spec

    prefix = f"cfg-{unique}."
    renamed = f"renamed-{unique}"
    kafka = stack.settings.kafka()
    created = await ensure_topics(kafka, [TENANT_EVENTS, CACHE_STATE], prefix=prefix)
    assert created == [prefix + TENANT_EVENTS, prefix + CACHE_STATE]
    assert await create_missing(kafka, {renamed: topic_spec(TENANT_EVENTS)}) == [renamed]
    assert await create_missing(kafka, {renamed: topic_spec(TENANT_EVENTS)}) == []  # idempotent

    admin = AIOKafkaAdminClient(bootstrap_servers=stack.settings.kafka_bootstrap)
    await admin.start()
    try:
        described = await admin.describe_configs([
            ConfigResource(ConfigResourceType.TOPIC, name)
            for name in (prefix + TENANT_EVENTS, prefix + CACHE_STATE, renamed)
        ])
    finally:
        await admin.close()
    configs = {
        res[3]: {entry[0]: entry[1] for entry in res[4]}
        for resp in described for res in resp.resources
    }
    assert configs[prefix + TENANT_EVENTS].get("retention.ms") == "-1", configs
    assert configs[renamed].get("retention.ms") == "-1", configs
    assert configs[prefix + CACHE_STATE].get("retention.ms") != "-1", configs
