"""Generic protobuf message filling for the contract tests.

``fill(cls)`` builds a message where every field holds a non-default value (scalars,
enums, nested messages, repeated fields with two items), choosing for each oneof the arm
given in ``arms`` (by default the first arm). ``variants(cls)`` yields one filled message
per arm of each top-level oneof, so every arm is exercised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, OneofDescriptor
from google.protobuf.message import Message

MAX_DEPTH = 6


def is_real_oneof(oneof: OneofDescriptor | None) -> bool:
    """True for a declared oneof; False for the synthetic oneof of a proto3 ``optional``."""
    if oneof is None:
        return False
    return not (len(oneof.fields) == 1 and oneof.name == "_" + oneof.fields[0].name)


def _scalar(field: FieldDescriptor, salt: int) -> Any:
    t = field.type
    n = field.number + salt
    if t in (FieldDescriptor.TYPE_STRING,):
        return f"{field.name}-{n}"
    if t == FieldDescriptor.TYPE_BYTES:
        return f"{field.name}-{n}".encode()
    if t == FieldDescriptor.TYPE_BOOL:
        return True
    if t in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return n + 0.5  # exactly representable in float32
    if t == FieldDescriptor.TYPE_ENUM:
        values = [v.number for v in field.enum_type.values if v.number != 0]
        return values[n % len(values)]
    if t in (
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_SFIXED32,
    ):
        return -(n + 1) if n % 2 else n + 1
    if t in (
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_SFIXED64,
    ):
        return (n + 1) * 10_000_000_000  # needs 64 bits
    if t in (
        FieldDescriptor.TYPE_UINT32,
        FieldDescriptor.TYPE_FIXED32,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_FIXED64,
    ):
        return n + 1
    raise AssertionError(f"unhandled field type {t} of {field.full_name}")


def fill_into(msg: Message, arms: dict[str, str], depth: int = 0, salt: int = 0) -> None:
    """Set every field of ``msg`` (one arm per oneof) to a non-default value."""
    if depth > MAX_DEPTH:
        raise AssertionError(f"message nesting deeper than {MAX_DEPTH}: recursive type?")
    desc: Descriptor = msg.DESCRIPTOR
    for field in desc.fields:
        oneof = field.containing_oneof
        if is_real_oneof(oneof):
            assert oneof is not None
            chosen = arms.get(oneof.full_name, oneof.fields[0].name)
            if field.name != chosen:
                continue
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.is_repeated:
                container = getattr(msg, field.name)
                for i in range(2):
                    fill_into(container.add(), arms, depth + 1, salt + i + 1)
            else:
                fill_into(getattr(msg, field.name), arms, depth + 1, salt)
        elif field.is_repeated:
            getattr(msg, field.name).extend([_scalar(field, salt), _scalar(field, salt + 1)])
        else:
            setattr(msg, field.name, _scalar(field, salt))


def fill(cls: type[Message], arms: dict[str, str] | None = None) -> Message:
    """A ``cls`` instance with every field set (see module doc)."""
    msg = cls()
    fill_into(msg, arms or {})
    return msg


def variants(cls: type[Message]) -> Iterator[tuple[str, Message]]:
    """``(label, message)`` for each arm of each top-level oneof (or once if none)."""
    oneofs = [o for o in cls.DESCRIPTOR.oneofs if is_real_oneof(o)]
    if not oneofs:
        yield cls.DESCRIPTOR.name, fill(cls)
        return
    for oneof in oneofs:
        for arm in oneof.fields:
            yield f"{cls.DESCRIPTOR.name}.{arm.name}", fill(cls, {oneof.full_name: arm.name})


@pytest.fixture
def filled() -> Callable[..., Message]:
    """The :func:`fill` function."""
    return fill


@pytest.fixture
def message_variants() -> Callable[[type[Message]], Iterator[tuple[str, Message]]]:
    """The :func:`variants` function."""
    return variants
