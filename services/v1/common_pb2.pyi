import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Priority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRIORITY_UNSPECIFIED: _ClassVar[Priority]
    PRIORITY_PLATINUM: _ClassVar[Priority]
    PRIORITY_GOLD: _ClassVar[Priority]
    PRIORITY_SILVER: _ClassVar[Priority]
    PRIORITY_BRONZE: _ClassVar[Priority]

class RequestClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REQUEST_CLASS_UNSPECIFIED: _ClassVar[RequestClass]
    REQUEST_CLASS_INTERACTIVE: _ClassVar[RequestClass]
    REQUEST_CLASS_BACKGROUND: _ClassVar[RequestClass]
    REQUEST_CLASS_CANARY: _ClassVar[RequestClass]

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_UNSPECIFIED: _ClassVar[Tier]
    TIER_HOT: _ClassVar[Tier]
    TIER_WARM: _ClassVar[Tier]
    TIER_COLD: _ClassVar[Tier]

class VersionStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERSION_STATUS_UNSPECIFIED: _ClassVar[VersionStatus]
    VERSION_STATUS_PENDING: _ClassVar[VersionStatus]
    VERSION_STATUS_ADMITTED: _ClassVar[VersionStatus]
    VERSION_STATUS_REJECTED: _ClassVar[VersionStatus]
    VERSION_STATUS_ACTIVE: _ClassVar[VersionStatus]
    VERSION_STATUS_CANARY: _ClassVar[VersionStatus]
    VERSION_STATUS_RETIRED: _ClassVar[VersionStatus]
PRIORITY_UNSPECIFIED: Priority
PRIORITY_PLATINUM: Priority
PRIORITY_GOLD: Priority
PRIORITY_SILVER: Priority
PRIORITY_BRONZE: Priority
REQUEST_CLASS_UNSPECIFIED: RequestClass
REQUEST_CLASS_INTERACTIVE: RequestClass
REQUEST_CLASS_BACKGROUND: RequestClass
REQUEST_CLASS_CANARY: RequestClass
TIER_UNSPECIFIED: Tier
TIER_HOT: Tier
TIER_WARM: Tier
TIER_COLD: Tier
VERSION_STATUS_UNSPECIFIED: VersionStatus
VERSION_STATUS_PENDING: VersionStatus
VERSION_STATUS_ADMITTED: VersionStatus
VERSION_STATUS_REJECTED: VersionStatus
VERSION_STATUS_ACTIVE: VersionStatus
VERSION_STATUS_CANARY: VersionStatus
VERSION_STATUS_RETIRED: VersionStatus

class AdapterRef(_message.Message):
    __slots__ = ("tenant_id", "adapter_name", "version", "base_model")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    adapter_name: str
    version: str
    base_model: str
    def __init__(self, tenant_id: _Optional[str] = ..., adapter_name: _Optional[str] = ..., version: _Optional[str] = ..., base_model: _Optional[str] = ...) -> None: ...

class EventMeta(_message.Message):
    __slots__ = ("event_id", "occurred_at", "producer", "adapter", "causation_id", "correlation_id")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    CAUSATION_ID_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    occurred_at: _timestamp_pb2.Timestamp
    producer: str
    adapter: AdapterRef
    causation_id: str
    correlation_id: str
    def __init__(self, event_id: _Optional[str] = ..., occurred_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., producer: _Optional[str] = ..., adapter: _Optional[_Union[AdapterRef, _Mapping]] = ..., causation_id: _Optional[str] = ..., correlation_id: _Optional[str] = ...) -> None: ...
