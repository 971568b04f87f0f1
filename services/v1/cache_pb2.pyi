import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from loraplane.v1 import common_pb2 as _common_pb2
from loraplane.v1 import events_pb2 as _events_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DecisionAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECISION_ACTION_UNSPECIFIED: _ClassVar[DecisionAction]
    DECISION_ACTION_LOAD_WARM: _ClassVar[DecisionAction]
    DECISION_ACTION_LOAD_HOT: _ClassVar[DecisionAction]
    DECISION_ACTION_DEMOTE: _ClassVar[DecisionAction]
    DECISION_ACTION_EVICT: _ClassVar[DecisionAction]
    DECISION_ACTION_PIN: _ClassVar[DecisionAction]
    DECISION_ACTION_UNPIN: _ClassVar[DecisionAction]
DECISION_ACTION_UNSPECIFIED: DecisionAction
DECISION_ACTION_LOAD_WARM: DecisionAction
DECISION_ACTION_LOAD_HOT: DecisionAction
DECISION_ACTION_DEMOTE: DecisionAction
DECISION_ACTION_EVICT: DecisionAction
DECISION_ACTION_PIN: DecisionAction
DECISION_ACTION_UNPIN: DecisionAction

class Decision(_message.Message):
    __slots__ = ("id", "at", "action", "adapter", "worker_id", "from_tier", "to_tier", "reason", "heat_score", "command_id", "policy")
    ID_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_TIER_FIELD_NUMBER: _ClassVar[int]
    TO_TIER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    HEAT_SCORE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    id: int
    at: _timestamp_pb2.Timestamp
    action: DecisionAction
    adapter: _common_pb2.AdapterRef
    worker_id: str
    from_tier: _common_pb2.Tier
    to_tier: _common_pb2.Tier
    reason: str
    heat_score: float
    command_id: str
    policy: str
    def __init__(self, id: _Optional[int] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., action: _Optional[_Union[DecisionAction, str]] = ..., adapter: _Optional[_Union[_common_pb2.AdapterRef, _Mapping]] = ..., worker_id: _Optional[str] = ..., from_tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., to_tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., reason: _Optional[str] = ..., heat_score: _Optional[float] = ..., command_id: _Optional[str] = ..., policy: _Optional[str] = ...) -> None: ...

class WorkerPlacement(_message.Message):
    __slots__ = ("worker_id", "grpc_address", "placement")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    grpc_address: str
    placement: _events_pb2.AdapterPlacement
    def __init__(self, worker_id: _Optional[str] = ..., grpc_address: _Optional[str] = ..., placement: _Optional[_Union[_events_pb2.AdapterPlacement, _Mapping]] = ...) -> None: ...

class GetPlacementRequest(_message.Message):
    __slots__ = ("adapter",)
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    adapter: _common_pb2.AdapterRef
    def __init__(self, adapter: _Optional[_Union[_common_pb2.AdapterRef, _Mapping]] = ...) -> None: ...

class GetPlacementResponse(_message.Message):
    __slots__ = ("placements",)
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    placements: _containers.RepeatedCompositeFieldContainer[WorkerPlacement]
    def __init__(self, placements: _Optional[_Iterable[_Union[WorkerPlacement, _Mapping]]] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ("base_model",)
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    base_model: str
    def __init__(self, base_model: _Optional[str] = ...) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("state", "last_seen", "alive")
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    state: _events_pb2.WorkerState
    last_seen: _timestamp_pb2.Timestamp
    alive: bool
    def __init__(self, state: _Optional[_Union[_events_pb2.WorkerState, _Mapping]] = ..., last_seen: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., alive: _Optional[bool] = ...) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ...) -> None: ...

class GetWorkerRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class GetWorkerResponse(_message.Message):
    __slots__ = ("worker",)
    WORKER_FIELD_NUMBER: _ClassVar[int]
    worker: WorkerInfo
    def __init__(self, worker: _Optional[_Union[WorkerInfo, _Mapping]] = ...) -> None: ...

class ListDecisionsRequest(_message.Message):
    __slots__ = ("limit", "worker_id", "tenant_id", "adapter_name")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    limit: int
    worker_id: str
    tenant_id: str
    adapter_name: str
    def __init__(self, limit: _Optional[int] = ..., worker_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., adapter_name: _Optional[str] = ...) -> None: ...

class ListDecisionsResponse(_message.Message):
    __slots__ = ("decisions",)
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[Decision]
    def __init__(self, decisions: _Optional[_Iterable[_Union[Decision, _Mapping]]] = ...) -> None: ...
