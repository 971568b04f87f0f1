"""Every event message of events.proto survives serialize → parse unchanged, and the
codec turns it into bytes + headers and back, refusing the wrong type."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, OneofDescriptor
from google.protobuf.message import Message

from loraplane.shared import codec, topics
from loraplane.v1 import common_pb2, events_pb2


def is_real_oneof(oneof: OneofDescriptor | None) -> bool:
    """True for a declared oneof; False for the synthetic oneof of a proto3 ``optional``."""
    if oneof is None:
        return False
    return not (len(oneof.fields) == 1 and oneof.name == "_" + oneof.fields[0].name)


EVENT_TYPES = {
    name: events_pb2.DESCRIPTOR.message_types_by_name[name]
    for name in sorted(events_pb2.DESCRIPTOR.message_types_by_name)
}


def _cases() -> list[tuple[str, str | None, str | None]]:
    """(message, oneof full name, arm) for every message and every arm of its oneofs."""
    cases: list[tuple[str, str | None, str | None]] = []
    for name, desc in EVENT_TYPES.items():
        oneofs = [o for o in desc.oneofs if is_real_oneof(o)]
        if not oneofs:
            cases.append((name, None, None))
        for oneof in oneofs:
            cases.extend((name, oneof.full_name, arm.name) for arm in oneof.fields)
    return cases


CASES = _cases()


def _message_class(name: str) -> type[Message]:
    cls = getattr(events_pb2, name)
    assert isinstance(cls, type)
    return cls


def _count_set_fields(msg: Message) -> int:
    """Number of fields set anywhere in ``msg`` (recursively)."""
    total = 0
    for field, value in msg.ListFields():
        total += 1
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            items = value if field.is_repeated else [value]
            total += sum(_count_set_fields(v) for v in items)
    return total


def _expected_set_fields(desc: Descriptor, arms: dict[str, str]) -> int:
    """Fields a fully filled message of ``desc`` has set (the chosen arm of each oneof,
    by default the first)."""
    total = 0
    for field in desc.fields:
        oneof = field.containing_oneof
        if is_real_oneof(oneof):
            assert oneof is not None
            if field.name != arms.get(oneof.full_name, oneof.fields[0].name):
                continue
        total += 1
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            mult = 2 if field.is_repeated else 1
            total += mult * _expected_set_fields(field.message_type, arms)
    return total


def test_events_proto_has_the_contract_messages() -> None:
    """The names other services code against exist."""
    required = {
        "AdapterReleased", "AdapterAdmitted", "AdapterRejected", "RejectionReason",
        "AdmissionEvent", "AdapterPromoted", "CanaryChanged", "RolledBack", "AdapterRetired",
        "LifecycleEvent", "LoadAdapter", "EvictAdapter", "PinAdapter", "UnpinAdapter",
        "CacheCommand", "AdapterLoaded", "AdapterEvicted", "LoadFailed", "WorkerState",
        "AdapterPlacement", "WorkerReport", "RequestCompleted", "HeatBatch",
        "PrewarmRequested", "TenantUpserted", "ApiKeyCreated", "ApiKeyRevoked", "TenantEvent",
    }  # fmt: skip
    assert required <= set(EVENT_TYPES)
    assert len(CASES) > len(EVENT_TYPES)  # oneof arms add cases


@pytest.mark.parametrize(
    ("name", "oneof", "arm"), CASES, ids=[f"{n}.{a}" if a else n for n, _, a in CASES]
)
def test_round_trip_every_field(
    name: str, oneof: str | None, arm: str | None, filled: Callable[..., Message]
) -> None:
    cls = _message_class(name)
    arms = {oneof: arm} if oneof and arm else {}
    msg = filled(cls, arms)

    # every field really holds a non-default value (else the round trip proves little)
    assert _count_set_fields(msg) == _expected_set_fields(cls.DESCRIPTOR, arms)
    if oneof and arm:
        assert msg.WhichOneof(oneof.rsplit(".", 1)[1]) == arm

    data = msg.SerializeToString(deterministic=True)
    back = cls.FromString(data)
    assert back == msg
    assert back.SerializeToString(deterministic=True) == data
    assert back != cls()


def test_round_trip_detects_a_lost_field(filled: Callable[..., Message]) -> None:
    """Sanity check of the comparison itself: clearing one nested field breaks equality."""
    msg = filled(events_pb2.CacheCommand)
    other = events_pb2.CacheCommand.FromString(msg.SerializeToString())
    other.load.ClearField("sha256")
    assert other != msg


@pytest.mark.parametrize("name", sorted(EVENT_TYPES))
def test_meta_is_field_one(name: str) -> None:
    """Every message that carries the envelope carries it as field 1 ``meta``."""
    desc = EVENT_TYPES[name]
    meta = desc.fields_by_name.get("meta")
    by_number = desc.fields_by_number.get(1)
    if meta is not None:
        assert meta.number == 1
        assert meta.message_type is common_pb2.EventMeta.DESCRIPTOR
    elif by_number is not None and by_number.type == FieldDescriptor.TYPE_MESSAGE:
        assert by_number.message_type is not common_pb2.EventMeta.DESCRIPTOR


@pytest.mark.parametrize("topic", list(topics.TOPICS))
def test_every_topic_message_has_an_envelope(topic: str, filled: Callable[..., Message]) -> None:
    """A topic's message has ``meta`` itself or in every oneof arm."""
    desc = topics.TOPICS[topic].message_type.DESCRIPTOR
    if "meta" in desc.fields_by_name:
        return
    oneofs = [o for o in desc.oneofs if is_real_oneof(o)]
    assert oneofs, f"{desc.full_name} has neither meta nor a oneof"
    for oneof in oneofs:
        for arm in oneof.fields:
            assert "meta" in arm.message_type.fields_by_name, f"{arm.full_name} lacks meta"


# --------------------------------------------------------------------------- codec


def _topic_cases() -> list[tuple[str, str | None]]:
    """(topic, oneof arm) for every arm of every topic's message (arm None: no oneof)."""
    cases: list[tuple[str, str | None]] = []
    for topic, spec in topics.TOPICS.items():
        arms = [
            f.name
            for o in spec.message_type.DESCRIPTOR.oneofs
            if is_real_oneof(o)
            for f in o.fields
        ]
        cases.extend((topic, a) for a in arms) if arms else cases.append((topic, None))
    return cases


TOPIC_CASES = _topic_cases()


@pytest.mark.parametrize(
    ("topic", "arm"), TOPIC_CASES, ids=[f"{t}:{a}" if a else t for t, a in TOPIC_CASES]
)
def test_codec_round_trip_per_topic(
    topic: str, arm: str | None, filled: Callable[..., Message]
) -> None:
    spec = topics.TOPICS[topic]
    desc = spec.message_type.DESCRIPTOR
    arms = {o.full_name: arm for o in desc.oneofs if is_real_oneof(o)} if arm else None
    msg = filled(spec.message_type, arms)

    body, headers = codec.encode(msg)

    assert headers[codec.HEADER_CONTENT_TYPE] == "application/x-protobuf"
    assert headers[codec.HEADER_PROTO_TYPE] == f"loraplane.v1.{desc.name}"
    meta = topics.event_meta(msg)
    assert meta is not None and meta.event_id
    assert headers[codec.HEADER_EVENT_ID] == meta.event_id

    assert codec.decode(topic, body, headers) == msg
    # aiokafka gives headers as a list of (str, bytes)
    assert codec.decode(topic, body, codec.kafka_headers(headers)) == msg


def test_encode_is_deterministic(filled: Callable[..., Message]) -> None:
    msg = filled(events_pb2.WorkerReport, {"loraplane.v1.WorkerReport.report": "state"})
    assert (
        codec.encode(msg)[0]
        == codec.encode(events_pb2.WorkerReport.FromString(codec.encode(msg)[0]))[0]
    )


def test_decode_refuses_wrong_proto_type(filled: Callable[..., Message]) -> None:
    released = filled(events_pb2.AdapterReleased)
    body, headers = codec.encode(released)
    with pytest.raises(codec.WrongMessageTypeError, match=r"loraplane\.v1\.AdapterReleased"):
        codec.decode(topics.CACHE_COMMANDS, body, headers)
    with pytest.raises(codec.WrongMessageTypeError) as info:
        codec.decode_as(events_pb2.CacheCommand, body, headers)
    assert "expected 'loraplane.v1.CacheCommand'" in str(info.value)
    assert info.value.retriable is False
    assert info.value.grpc_code == grpc.StatusCode.INVALID_ARGUMENT


def test_decode_refuses_missing_type_header(filled: Callable[..., Message]) -> None:
    body, headers = codec.encode(filled(events_pb2.AdapterReleased))
    del headers[codec.HEADER_PROTO_TYPE]
    with pytest.raises(codec.WrongMessageTypeError, match="no x-proto-type"):
        codec.decode(topics.ADAPTER_RELEASES, body, headers)


def test_decode_refuses_other_content_type(filled: Callable[..., Message]) -> None:
    body, headers = codec.encode(filled(events_pb2.AdapterReleased))
    headers[codec.HEADER_CONTENT_TYPE] = "application/json"
    with pytest.raises(codec.WrongMessageTypeError, match="content-type"):
        codec.decode(topics.ADAPTER_RELEASES, body, headers)


def test_decode_refuses_garbage_body() -> None:
    headers = {codec.HEADER_PROTO_TYPE: "loraplane.v1.AdapterReleased"}
    with pytest.raises(codec.MalformedMessageError):
        codec.decode(topics.ADAPTER_RELEASES, b"\xff\xff\xff\xff", headers)


def test_decode_unknown_topic() -> None:
    with pytest.raises(topics.UnknownTopicError):
        codec.decode("no.such.topic", b"", {})


def test_encode_without_envelope_has_no_event_id() -> None:
    _, headers = codec.encode(events_pb2.LoadAdapter(engine_id=1))
    assert codec.HEADER_EVENT_ID not in headers
    with pytest.raises(TypeError):
        codec.encode({"not": "a message"})  # type: ignore[arg-type]


def test_decode_record_and_event_id_header(filled: Callable[..., Message]) -> None:
    """The aiokafka path: a ConsumerRecord-shaped object with list-of-bytes headers."""
    from aiokafka.structs import ConsumerRecord

    msg = filled(events_pb2.HeatBatch)
    body, headers = codec.encode(msg)
    record = ConsumerRecord(
        topic=topics.ADAPTER_HEAT, partition=0, offset=5, timestamp=0, timestamp_type=0,
        key=topics.key_for(topics.ADAPTER_HEAT, msg), value=body, checksum=None,
        serialized_key_size=0, serialized_value_size=len(body),
        headers=tuple(codec.kafka_headers(headers)),
    )  # fmt: skip
    assert codec.decode_record(record) == msg
    assert codec.header_event_id(record.headers) == msg.meta.event_id
    assert codec.header_event_id({}) is None
