"""The codec with FastStream 0.7.8's in-memory Kafka broker (``TestKafkaBroker``).

The same subscribers run against a real broker with ``TestKafkaBroker(broker,
with_real=True)`` (see tests/integration)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from faststream import AckPolicy
from faststream.kafka import KafkaBroker, KafkaMessage, TestKafkaBroker
from google.protobuf.message import Message

from loraplane.shared import codec, topics
from loraplane.v1 import common_pb2, events_pb2

REF = common_pb2.AdapterRef(tenant_id="acme", adapter_name="bot", version="v1", base_model="tiny")


def _command(worker: str = "worker-1") -> events_pb2.CacheCommand:
    return events_pb2.CacheCommand(
        meta=topics.new_meta("cache-manager/0", REF),
        command_id="cmd-1",
        worker_id=worker,
        reason="heat 0.9",
        load=events_pb2.LoadAdapter(
            target_tier=common_pb2.TIER_HOT,
            pin=True,
            engine_id=17,
            artifact_uri="s3://adapters/acme/bot/abc/",
            sha256="ab" * 32,
            size_bytes=1234,
            rank=8,
        ),
    )


async def test_publish_and_consume_with_decoder_and_manual_ack() -> None:
    broker = KafkaBroker()
    received: list[tuple[events_pb2.CacheCommand, dict[str, Any], bytes]] = []

    @broker.subscriber(
        topics.CACHE_COMMANDS,
        group_id="worker-worker-1",
        decoder=codec.protobuf_decoder(topics.CACHE_COMMANDS),
        ack_policy=AckPolicy.MANUAL,
    )
    async def on_command(cmd: events_pb2.CacheCommand, msg: KafkaMessage) -> None:
        received.append((cmd, dict(msg.headers), msg.raw_message.key))
        await msg.ack()

    sent = _command()
    async with TestKafkaBroker(broker):
        await codec.publish(broker, topics.CACHE_COMMANDS, sent)
        on_command.mock.assert_called_once()  # type: ignore[attr-defined]

    assert len(received) == 1
    cmd, headers, key = received[0]
    assert isinstance(cmd, events_pb2.CacheCommand)
    assert cmd == sent
    assert key == b"worker-1"
    assert headers["content-type"] == "application/x-protobuf"
    assert headers["x-proto-type"] == "loraplane.v1.CacheCommand"
    assert headers["x-event-id"] == sent.meta.event_id


async def test_oneof_wrapper_event_through_codec_object(filled: Callable[..., Message]) -> None:
    """``codec=ProtobufCodec.for_topic(...)`` works in place of ``decoder=``."""
    broker = KafkaBroker()
    got: list[events_pb2.AdmissionEvent] = []

    @broker.subscriber(
        topics.ADAPTER_ADMISSIONS,
        group_id="cache-manager",
        codec=codec.ProtobufCodec.for_topic(topics.ADAPTER_ADMISSIONS),
    )
    async def on_verdict(event: events_pb2.AdmissionEvent) -> None:
        got.append(event)

    event = filled(events_pb2.AdmissionEvent, {"loraplane.v1.AdmissionEvent.verdict": "rejected"})
    async with TestKafkaBroker(broker):
        await codec.publish(broker, topics.ADAPTER_ADMISSIONS, event)

    assert got == [event]
    assert got[0].WhichOneof("verdict") == "rejected"
    assert len(got[0].rejected.reasons) == 2


async def test_wrong_type_is_refused_by_subscriber() -> None:
    broker = KafkaBroker()
    handled: list[Message] = []

    @broker.subscriber(
        topics.CACHE_COMMANDS,
        group_id="worker-worker-1",
        decoder=codec.protobuf_decoder(topics.CACHE_COMMANDS),
    )
    async def on_command(cmd: events_pb2.CacheCommand) -> None:
        handled.append(cmd)

    released = events_pb2.AdapterReleased(meta=topics.new_meta("registry/0", REF), engine_id=3)
    body, headers = codec.encode(released)
    async with TestKafkaBroker(broker):
        with pytest.raises(codec.WrongMessageTypeError, match="loraplane.v1.AdapterReleased"):
            await broker.publish(body, topics.CACHE_COMMANDS, key=b"worker-1", headers=headers)
    assert handled == []


async def test_publish_refuses_message_of_another_topic() -> None:
    broker = KafkaBroker()
    async with TestKafkaBroker(broker):
        with pytest.raises(topics.TopicError):
            await codec.publish(
                broker,
                topics.CACHE_COMMANDS,
                events_pb2.AdapterReleased(meta=topics.new_meta("registry/0", REF)),
            )


async def test_codec_encode_refuses_other_types() -> None:
    pc = codec.ProtobufCodec(events_pb2.CacheCommand)
    cmd = _command()
    body, content_type = await pc.encode(cmd)
    assert content_type == "application/x-protobuf"
    assert events_pb2.CacheCommand.FromString(body) == cmd
    with pytest.raises(TypeError):
        await pc.encode(events_pb2.HeatBatch())
