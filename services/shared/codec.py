"""Protobuf codec for Kafka: bytes + headers on the way out, typed messages on the way in.

Wire format of every loraplane event: the body is the serialized protobuf message, and
the record carries the headers

* ``content-type: application/x-protobuf``
* ``x-proto-type: loraplane.v1.<Name>`` (the message's full protobuf name)
* ``x-event-id: <meta.event_id>`` (when the message has an envelope)

Decoding checks ``x-proto-type`` against the message type of the topic (see
:mod:`loraplane.shared.topics`) and refuses a mismatch with :class:`WrongMessageTypeError`
instead of parsing garbage (protobuf would happily parse most bytes as most messages).

Bare aiokafka::

    value, headers = encode(msg)
    await producer.send_and_wait(topic, value, key=key_for(topic, msg),
                                 headers=kafka_headers(headers))
    ...
    event = decode_record(record)  # = decode(record.topic, record.value, record.headers)

Consumers read through :class:`loraplane.shared.consumer.ConsumerLoop` and decode each
record with :func:`decode_record`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, TypeVar

from google.protobuf.message import DecodeError, Message

from loraplane.shared.errors import InvalidArgument
from loraplane.shared.topics import event_meta, topic_spec

CONTENT_TYPE = "application/x-protobuf"
"""Value of the ``content-type`` header of every loraplane event."""
HEADER_CONTENT_TYPE = "content-type"
"""Header naming the body encoding."""
HEADER_PROTO_TYPE = "x-proto-type"
"""Header naming the full protobuf type of the body, e.g. ``loraplane.v1.CacheCommand``."""
HEADER_EVENT_ID = "x-event-id"
"""Header repeating ``meta.event_id`` so consumers can dedupe without parsing."""

M = TypeVar("M", bound=Message)

RawHeaders = Mapping[str, str | bytes] | Iterable[tuple[str, str | bytes]]
"""Headers as a dict of str or as aiokafka gives them (list of (str, bytes))."""


class CodecError(InvalidArgument, ValueError):
    """A record cannot be turned into the expected message. Not retriable: the same bytes
    will fail the same way, so consumers should log, skip (ack) and count it."""

    reason = "codec_error"


class WrongMessageTypeError(CodecError):
    """``x-proto-type`` (or ``content-type``) names another type than the topic carries."""

    reason = "wrong_message_type"


class MalformedMessageError(CodecError):
    """The body does not parse as the expected protobuf message."""

    reason = "malformed_message"


def proto_type_name(msg: Message | type[Message]) -> str:
    """Full protobuf name of a message or message class, e.g. ``loraplane.v1.HeatBatch``."""
    return str(msg.DESCRIPTOR.full_name)


def encode(msg: Message) -> tuple[bytes, dict[str, str]]:
    """Serialize ``msg`` deterministically and return ``(body, headers)``."""
    if not isinstance(msg, Message):
        raise TypeError(f"expected a protobuf message, got {type(msg).__name__}")
    headers = {
        HEADER_CONTENT_TYPE: CONTENT_TYPE,
        HEADER_PROTO_TYPE: proto_type_name(msg),
    }
    meta = event_meta(msg)
    if meta is not None and meta.event_id:
        headers[HEADER_EVENT_ID] = meta.event_id
    return msg.SerializeToString(deterministic=True), headers


def kafka_headers(headers: Mapping[str, str]) -> list[tuple[str, bytes]]:
    """Headers in aiokafka's ``send(headers=...)`` form."""
    return [(k, v.encode("utf-8")) for k, v in headers.items()]


def normalize_headers(headers: RawHeaders | None) -> dict[str, str]:
    """Headers as a ``{name: text}`` dict (names lowercased; the last value wins)."""
    if headers is None:
        return {}
    items = headers.items() if isinstance(headers, Mapping) else headers
    out: dict[str, str] = {}
    for name, value in items:
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        out[name.lower()] = text
    return out


def decode_as(message_type: type[M], value: bytes | None, headers: RawHeaders | None) -> M:
    """Parse ``value`` as ``message_type`` after checking the type headers.

    Raises :class:`WrongMessageTypeError` when ``x-proto-type`` is missing or names another
    type, or ``content-type`` is set to something else than protobuf; raises
    :class:`MalformedMessageError` when the body does not parse.
    """
    hdrs = normalize_headers(headers)
    expected = proto_type_name(message_type)
    got = hdrs.get(HEADER_PROTO_TYPE)
    if got is None:
        raise WrongMessageTypeError(
            f"record has no {HEADER_PROTO_TYPE} header; expected {expected}"
        )
    if got != expected:
        raise WrongMessageTypeError(f"{HEADER_PROTO_TYPE} is {got!r}, expected {expected!r}")
    content_type = hdrs.get(HEADER_CONTENT_TYPE, "")
    if content_type and content_type != CONTENT_TYPE:
        raise WrongMessageTypeError(
            f"{HEADER_CONTENT_TYPE} is {content_type!r}, expected {CONTENT_TYPE!r}"
        )
    msg: M = message_type()
    try:
        msg.ParseFromString(value or b"")
    except DecodeError as exc:
        raise MalformedMessageError(f"body does not parse as {expected}: {exc}") from exc
    return msg


def decode(topic: str, value: bytes | None, headers: RawHeaders | None) -> Message:
    """Parse a record of ``topic`` into the topic's message type (see :func:`decode_as`)."""
    return decode_as(topic_spec(topic).message_type, value, headers)


class _RecordLike(Protocol):
    """What :func:`decode_record` reads from an aiokafka ``ConsumerRecord``."""

    @property
    def topic(self) -> str:
        """Topic the record came from."""

    @property
    def value(self) -> bytes | None:
        """Record body."""

    @property
    def headers(self) -> Any:
        """Record headers, a sequence of ``(str, bytes)``."""


def decode_record(record: _RecordLike) -> Message:
    """Decode an aiokafka ``ConsumerRecord`` into its topic's message type."""
    return decode(record.topic, record.value, record.headers)


def header_event_id(headers: RawHeaders | None) -> str | None:
    """The ``x-event-id`` header, for deduplication before parsing (``None`` if absent)."""
    return normalize_headers(headers).get(HEADER_EVENT_ID)
