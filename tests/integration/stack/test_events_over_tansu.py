"""Protobuf events through the real broker: FastStream (publisher + manual-ack subscriber)
and bare aiokafka, both with the shared codec, keys and topic table."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from faststream import AckPolicy
from faststream.kafka import KafkaBroker, KafkaMessage

from loraplane.shared import codec, topics
from loraplane.stack.stack import Stack
from loraplane.v1 import common_pb2, events_pb2


def _released(tenant: str, version: str) -> events_pb2.AdapterReleased:
    ref = common_pb2.AdapterRef(tenant_id=tenant, adapter_name="support", version=version,
                                base_model="loraplane/tiny-llama")
    return events_pb2.AdapterReleased(meta=topics.new_meta("test", ref), engine_id=7, rank=8,
                                      sha256="ab" * 32, size_bytes=1234,
                                      target_modules=["q_proj", "v_proj"])


async def test_faststream_publish_and_manual_ack_subscriber(stack: Stack, unique: str) -> None:
    broker = KafkaBroker(stack.settings.kafka_bootstrap)
    got: list[events_pb2.AdapterReleased] = []
    done = asyncio.Event()

    @broker.subscriber(topics.ADAPTER_RELEASES, group_id=f"fs-{unique}",
                       decoder=codec.protobuf_decoder(topics.ADAPTER_RELEASES),
                       ack_policy=AckPolicy.MANUAL, auto_offset_reset="earliest",
                       session_timeout_ms=6000, heartbeat_interval_ms=500)
    async def handle(event: events_pb2.AdapterReleased, msg: KafkaMessage) -> None:
        if event.meta.adapter.tenant_id == f"t{unique}":
            got.append(event)
            done.set()
        await msg.ack()

    sent = _released(f"t{unique}", "v1")
    async with broker:
        await broker.start()
        await codec.publish(broker, topics.ADAPTER_RELEASES, sent)
        await asyncio.wait_for(done.wait(), timeout=45)
    assert got == [sent]


async def test_aiokafka_codec_key_and_headers(stack: Stack, unique: str) -> None:
    bootstrap = stack.settings.kafka_bootstrap
    sent = _released(f"a{unique}", "v2")
    value, headers = codec.encode(sent)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topics.ADAPTER_RELEASES, value,
                                     key=topics.key_for(topics.ADAPTER_RELEASES, sent),
                                     headers=codec.kafka_headers(headers))
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topics.ADAPTER_RELEASES, bootstrap_servers=bootstrap,
                                group_id=f"ak-{unique}", auto_offset_reset="earliest",
                                enable_auto_commit=False, session_timeout_ms=6000,
                                heartbeat_interval_ms=500)
    await consumer.start()
    found = None
    try:
        async with asyncio.timeout(30):
            while found is None:
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    for rec in records:
                        msg = codec.decode_record(rec)
                        if msg.meta.adapter.tenant_id == f"a{unique}":  # type: ignore[attr-defined]
                            found = (rec, msg)
    finally:
        await consumer.stop()
    rec, msg = found
    assert msg == sent
    assert rec.key == f"a{unique}/support".encode()
    assert codec.header_event_id(rec.headers) == sent.meta.event_id


async def test_every_topic_exists_with_its_partitions(stack: Stack) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=stack.settings.kafka_bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(list(topics.TOPICS))
    finally:
        await admin.close()
    partitions = {d["topic"]: len(d["partitions"]) for d in described}
    assert partitions == {name: spec.partitions for name, spec in topics.TOPICS.items()}
