import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from loraplane.v1 import common_pb2 as _common_pb2
from loraplane.v1 import events_pb2 as _events_pb2
from loraplane.v1 import inference_pb2 as _inference_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerGenerateRequest(_message.Message):
    __slots__ = ("request_id", "adapter", "engine_id", "sha256", "params", "request_class", "deadline", "cold_budget_ms", "use_base", "artifact_uri", "rank", "size_bytes", "base_model", "never_evict", "priority")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_CLASS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    COLD_BUDGET_MS_FIELD_NUMBER: _ClassVar[int]
    USE_BASE_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_URI_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    NEVER_EVICT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    adapter: _common_pb2.AdapterRef
    engine_id: int
    sha256: str
    params: _inference_pb2.GenerateRequest
    request_class: _common_pb2.RequestClass
    deadline: _timestamp_pb2.Timestamp
    cold_budget_ms: int
    use_base: bool
    artifact_uri: str
    rank: int
    size_bytes: int
    base_model: str
    never_evict: bool
    priority: _common_pb2.Priority
    def __init__(self, request_id: _Optional[str] = ..., adapter: _Optional[_Union[_common_pb2.AdapterRef, _Mapping]] = ..., engine_id: _Optional[int] = ..., sha256: _Optional[str] = ..., params: _Optional[_Union[_inference_pb2.GenerateRequest, _Mapping]] = ..., request_class: _Optional[_Union[_common_pb2.RequestClass, str]] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cold_budget_ms: _Optional[int] = ..., use_base: _Optional[bool] = ..., artifact_uri: _Optional[str] = ..., rank: _Optional[int] = ..., size_bytes: _Optional[int] = ..., base_model: _Optional[str] = ..., never_evict: _Optional[bool] = ..., priority: _Optional[_Union[_common_pb2.Priority, str]] = ...) -> None: ...

class GetStateRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
