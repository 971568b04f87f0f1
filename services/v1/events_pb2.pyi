import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from loraplane.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RejectionCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REJECTION_CODE_UNSPECIFIED: _ClassVar[RejectionCode]
    REJECTION_CODE_SOURCE_NOT_ALLOWED: _ClassVar[RejectionCode]
    REJECTION_CODE_DOWNLOAD_FAILED: _ClassVar[RejectionCode]
    REJECTION_CODE_SIZE_LIMIT: _ClassVar[RejectionCode]
    REJECTION_CODE_SIGNATURE_INVALID: _ClassVar[RejectionCode]
    REJECTION_CODE_UNTRUSTED_SIGNER: _ClassVar[RejectionCode]
    REJECTION_CODE_DIGEST_MISMATCH: _ClassVar[RejectionCode]
    REJECTION_CODE_UNSIGNED_FILE: _ClassVar[RejectionCode]
    REJECTION_CODE_MISSING_FILE: _ClassVar[RejectionCode]
    REJECTION_CODE_FORBIDDEN_FILE: _ClassVar[RejectionCode]
    REJECTION_CODE_SYMLINK: _ClassVar[RejectionCode]
    REJECTION_CODE_CONFIG_INVALID: _ClassVar[RejectionCode]
    REJECTION_CODE_SAFETENSORS_INVALID: _ClassVar[RejectionCode]
    REJECTION_CODE_TENSOR_NAME: _ClassVar[RejectionCode]
    REJECTION_CODE_TENSOR_SHAPE: _ClassVar[RejectionCode]
    REJECTION_CODE_TENSOR_DTYPE: _ClassVar[RejectionCode]
    REJECTION_CODE_NON_FINITE: _ClassVar[RejectionCode]
    REJECTION_CODE_BASE_MODEL_MISMATCH: _ClassVar[RejectionCode]
    REJECTION_CODE_TOKENIZER_MISMATCH: _ClassVar[RejectionCode]
    REJECTION_CODE_RANK_TOO_LARGE: _ClassVar[RejectionCode]
    REJECTION_CODE_TARGET_MODULE_UNSUPPORTED: _ClassVar[RejectionCode]
    REJECTION_CODE_INTERNAL: _ClassVar[RejectionCode]

class LoadErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOAD_ERROR_CODE_UNSPECIFIED: _ClassVar[LoadErrorCode]
    LOAD_ERROR_CODE_DOWNLOAD_FAILED: _ClassVar[LoadErrorCode]
    LOAD_ERROR_CODE_DIGEST_MISMATCH: _ClassVar[LoadErrorCode]
    LOAD_ERROR_CODE_NO_CAPACITY: _ClassVar[LoadErrorCode]
    LOAD_ERROR_CODE_ENGINE_ERROR: _ClassVar[LoadErrorCode]
    LOAD_ERROR_CODE_DEADLINE_EXCEEDED: _ClassVar[LoadErrorCode]
    LOAD_ERROR_CODE_BASE_MODEL_NOT_SERVED: _ClassVar[LoadErrorCode]
    LOAD_ERROR_CODE_RANK_TOO_LARGE: _ClassVar[LoadErrorCode]
    LOAD_ERROR_CODE_NOT_PRESENT: _ClassVar[LoadErrorCode]
    LOAD_ERROR_CODE_IN_USE: _ClassVar[LoadErrorCode]
    LOAD_ERROR_CODE_INTERNAL: _ClassVar[LoadErrorCode]
REJECTION_CODE_UNSPECIFIED: RejectionCode
REJECTION_CODE_SOURCE_NOT_ALLOWED: RejectionCode
REJECTION_CODE_DOWNLOAD_FAILED: RejectionCode
REJECTION_CODE_SIZE_LIMIT: RejectionCode
REJECTION_CODE_SIGNATURE_INVALID: RejectionCode
REJECTION_CODE_UNTRUSTED_SIGNER: RejectionCode
REJECTION_CODE_DIGEST_MISMATCH: RejectionCode
REJECTION_CODE_UNSIGNED_FILE: RejectionCode
REJECTION_CODE_MISSING_FILE: RejectionCode
REJECTION_CODE_FORBIDDEN_FILE: RejectionCode
REJECTION_CODE_SYMLINK: RejectionCode
REJECTION_CODE_CONFIG_INVALID: RejectionCode
REJECTION_CODE_SAFETENSORS_INVALID: RejectionCode
REJECTION_CODE_TENSOR_NAME: RejectionCode
REJECTION_CODE_TENSOR_SHAPE: RejectionCode
REJECTION_CODE_TENSOR_DTYPE: RejectionCode
REJECTION_CODE_NON_FINITE: RejectionCode
REJECTION_CODE_BASE_MODEL_MISMATCH: RejectionCode
REJECTION_CODE_TOKENIZER_MISMATCH: RejectionCode
REJECTION_CODE_RANK_TOO_LARGE: RejectionCode
REJECTION_CODE_TARGET_MODULE_UNSUPPORTED: RejectionCode
REJECTION_CODE_INTERNAL: RejectionCode
LOAD_ERROR_CODE_UNSPECIFIED: LoadErrorCode
LOAD_ERROR_CODE_DOWNLOAD_FAILED: LoadErrorCode
LOAD_ERROR_CODE_DIGEST_MISMATCH: LoadErrorCode
LOAD_ERROR_CODE_NO_CAPACITY: LoadErrorCode
LOAD_ERROR_CODE_ENGINE_ERROR: LoadErrorCode
LOAD_ERROR_CODE_DEADLINE_EXCEEDED: LoadErrorCode
LOAD_ERROR_CODE_BASE_MODEL_NOT_SERVED: LoadErrorCode
LOAD_ERROR_CODE_RANK_TOO_LARGE: LoadErrorCode
LOAD_ERROR_CODE_NOT_PRESENT: LoadErrorCode
LOAD_ERROR_CODE_IN_USE: LoadErrorCode
LOAD_ERROR_CODE_INTERNAL: LoadErrorCode

class ArtifactFile(_message.Message):
    __slots__ = ("path", "size_bytes", "sha256")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    path: str
    size_bytes: int
    sha256: str
    def __init__(self, path: _Optional[str] = ..., size_bytes: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class AdapterReleased(_message.Message):
    __slots__ = ("meta", "engine_id", "rank", "format", "target_modules", "artifact_uri", "sha256", "size_bytes", "signer_identity", "tokenizer_revision", "priority", "signature_uri", "files", "lora_alpha")
    META_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    TARGET_MODULES_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_URI_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SIGNER_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_REVISION_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_URI_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    LORA_ALPHA_FIELD_NUMBER: _ClassVar[int]
    meta: _common_pb2.EventMeta
    engine_id: int
    rank: int
    format: str
    target_modules: _containers.RepeatedScalarFieldContainer[str]
    artifact_uri: str
    sha256: str
    size_bytes: int
    signer_identity: str
    tokenizer_revision: str
    priority: _common_pb2.Priority
    signature_uri: str
    files: _containers.RepeatedCompositeFieldContainer[ArtifactFile]
    lora_alpha: float
    def __init__(self, meta: _Optional[_Union[_common_pb2.EventMeta, _Mapping]] = ..., engine_id: _Optional[int] = ..., rank: _Optional[int] = ..., format: _Optional[str] = ..., target_modules: _Optional[_Iterable[str]] = ..., artifact_uri: _Optional[str] = ..., sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ..., signer_identity: _Optional[str] = ..., tokenizer_revision: _Optional[str] = ..., priority: _Optional[_Union[_common_pb2.Priority, str]] = ..., signature_uri: _Optional[str] = ..., files: _Optional[_Iterable[_Union[ArtifactFile, _Mapping]]] = ..., lora_alpha: _Optional[float] = ...) -> None: ...

class RejectionReason(_message.Message):
    __slots__ = ("code", "message", "path")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    code: RejectionCode
    message: str
    path: str
    def __init__(self, code: _Optional[_Union[RejectionCode, str]] = ..., message: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class AdapterAdmitted(_message.Message):
    __slots__ = ("meta", "engine_id", "sha256", "checks_passed", "duration_ms", "artifact_uri", "size_bytes", "rank", "priority", "target_modules")
    META_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    CHECKS_PASSED_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_URI_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TARGET_MODULES_FIELD_NUMBER: _ClassVar[int]
    meta: _common_pb2.EventMeta
    engine_id: int
    sha256: str
    checks_passed: _containers.RepeatedScalarFieldContainer[str]
    duration_ms: float
    artifact_uri: str
    size_bytes: int
    rank: int
    priority: _common_pb2.Priority
    target_modules: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, meta: _Optional[_Union[_common_pb2.EventMeta, _Mapping]] = ..., engine_id: _Optional[int] = ..., sha256: _Optional[str] = ..., checks_passed: _Optional[_Iterable[str]] = ..., duration_ms: _Optional[float] = ..., artifact_uri: _Optional[str] = ..., size_bytes: _Optional[int] = ..., rank: _Optional[int] = ..., priority: _Optional[_Union[_common_pb2.Priority, str]] = ..., target_modules: _Optional[_Iterable[str]] = ...) -> None: ...

class AdapterRejected(_message.Message):
    __slots__ = ("meta", "reasons", "engine_id", "sha256", "duration_ms")
    META_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    meta: _common_pb2.EventMeta
    reasons: _containers.RepeatedCompositeFieldContainer[RejectionReason]
    engine_id: int
    sha256: str
    duration_ms: float
    def __init__(self, meta: _Optional[_Union[_common_pb2.EventMeta, _Mapping]] = ..., reasons: _Optional[_Iterable[_Union[RejectionReason, _Mapping]]] = ..., engine_id: _Optional[int] = ..., sha256: _Optional[str] = ..., duration_ms: _Optional[float] = ...) -> None: ...

class AdmissionEvent(_message.Message):
    __slots__ = ("admitted", "rejected")
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    admitted: AdapterAdmitted
    rejected: AdapterRejected
    def __init__(self, admitted: _Optional[_Union[AdapterAdmitted, _Mapping]] = ..., rejected: _Optional[_Union[AdapterRejected, _Mapping]] = ...) -> None: ...

class AdapterPromoted(_message.Message):
    __slots__ = ("meta", "previous_stable_version", "engine_id")
    META_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_STABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    meta: _common_pb2.EventMeta
    previous_stable_version: str
    engine_id: int
    def __init__(self, meta: _Optional[_Union[_common_pb2.EventMeta, _Mapping]] = ..., previous_stable_version: _Optional[str] = ..., engine_id: _Optional[int] = ...) -> None: ...

class CanaryChanged(_message.Message):
    __slots__ = ("meta", "canary_version", "percent", "previous", "previous_percent", "engine_id", "cleared")
    META_FIELD_NUMBER: _ClassVar[int]
    CANARY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PERCENT_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_PERCENT_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    meta: _common_pb2.EventMeta
    canary_version: str
    percent: int
    previous: str
    previous_percent: int
    engine_id: int
    cleared: bool
    def __init__(self, meta: _Optional[_Union[_common_pb2.EventMeta, _Mapping]] = ..., canary_version: _Optional[str] = ..., percent: _Optional[int] = ..., previous: _Optional[str] = ..., previous_percent: _Optional[int] = ..., engine_id: _Optional[int] = ..., cleared: _Optional[bool] = ...) -> None: ...

class RolledBack(_message.Message):
    __slots__ = ("meta", "from_version", "to_version", "engine_id")
    META_FIELD_NUMBER: _ClassVar[int]
    FROM_VERSION_FIELD_NUMBER: _ClassVar[int]
    TO_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    meta: _common_pb2.EventMeta
    from_version: str
    to_version: str
    engine_id: int
    def __init__(self, meta: _Optional[_Union[_common_pb2.EventMeta, _Mapping]] = ..., from_version: _Optional[str] = ..., to_version: _Optional[str] = ..., engine_id: _Optional[int] = ...) -> None: ...

class AdapterRetired(_message.Message):
    __slots__ = ("meta", "engine_id")
    META_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    meta: _common_pb2.EventMeta
    engine_id: int
    def __init__(self, meta: _Optional[_Union[_common_pb2.EventMeta, _Mapping]] = ..., engine_id: _Optional[int] = ...) -> None: ...

class VersionWithdrawn(_message.Message):
    __slots__ = ("meta", "engine_id", "reason")
    META_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    meta: _common_pb2.EventMeta
    engine_id: int
    reason: str
    def __init__(self, meta: _Optional[_Union[_common_pb2.EventMeta, _Mapping]] = ..., engine_id: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class LifecycleEvent(_message.Message):
    __slots__ = ("promoted", "canary_changed", "rolled_back", "retired", "withdrawn")
    PROMOTED_FIELD_NUMBER: _ClassVar[int]
    CANARY_CHANGED_FIELD_NUMBER: _ClassVar[int]
    ROLLED_BACK_FIELD_NUMBER: _ClassVar[int]
    RETIRED_FIELD_NUMBER: _ClassVar[int]
    WITHDRAWN_FIELD_NUMBER: _ClassVar[int]
    promoted: AdapterPromoted
    canary_changed: CanaryChanged
    rolled_back: RolledBack
    retired: AdapterRetired
    withdrawn: VersionWithdrawn
    def __init__(self, promoted: _Optional[_Union[AdapterPromoted, _Mapping]] = ..., canary_changed: _Optional[_Union[CanaryChanged, _Mapping]] = ..., rolled_back: _Optional[_Union[RolledBack, _Mapping]] = ..., retired: _Optional[_Union[AdapterRetired, _Mapping]] = ..., withdrawn: _Optional[_Union[VersionWithdrawn, _Mapping]] = ...) -> None: ...

class LoadAdapter(_message.Message):
    __slots__ = ("target_tier", "pin", "engine_id", "artifact_uri", "sha256", "size_bytes", "rank", "never_evict", "hot_keep")
    TARGET_TIER_FIELD_NUMBER: _ClassVar[int]
    PIN_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_URI_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    NEVER_EVICT_FIELD_NUMBER: _ClassVar[int]
    HOT_KEEP_FIELD_NUMBER: _ClassVar[int]
    target_tier: _common_pb2.Tier
    pin: bool
    engine_id: int
    artifact_uri: str
    sha256: str
    size_bytes: int
    rank: int
    never_evict: bool
    hot_keep: float
    def __init__(self, target_tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., pin: _Optional[bool] = ..., engine_id: _Optional[int] = ..., artifact_uri: _Optional[str] = ..., sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ..., rank: _Optional[int] = ..., never_evict: _Optional[bool] = ..., hot_keep: _Optional[float] = ...) -> None: ...

class HotKeep(_message.Message):
    __slots__ = ("engine_id", "keep")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    KEEP_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    keep: float
    def __init__(self, engine_id: _Optional[int] = ..., keep: _Optional[float] = ...) -> None: ...

class HotOrder(_message.Message):
    __slots__ = ("keeps",)
    KEEPS_FIELD_NUMBER: _ClassVar[int]
    keeps: _containers.RepeatedCompositeFieldContainer[HotKeep]
    def __init__(self, keeps: _Optional[_Iterable[_Union[HotKeep, _Mapping]]] = ...) -> None: ...

class EvictAdapter(_message.Message):
    __slots__ = ("to_tier", "reason", "engine_id")
    TO_TIER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    to_tier: _common_pb2.Tier
    reason: str
    engine_id: int
    def __init__(self, to_tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., reason: _Optional[str] = ..., engine_id: _Optional[int] = ...) -> None: ...

class PinAdapter(_message.Message):
    __slots__ = ("engine_id",)
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    def __init__(self, engine_id: _Optional[int] = ...) -> None: ...

class UnpinAdapter(_message.Message):
    __slots__ = ("engine_id",)
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    engine_id: int
    def __init__(self, engine_id: _Optional[int] = ...) -> None: ...

class CacheCommand(_message.Message):
    __slots__ = ("meta", "command_id", "worker_id", "issued_at", "deadline", "reason", "load", "evict", "pin", "unpin", "hot_order")
    META_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    EVICT_FIELD_NUMBER: _ClassVar[int]
    PIN_FIELD_NUMBER: _ClassVar[int]
    UNPIN_FIELD_NUMBER: _ClassVar[int]
    HOT_ORDER_FIELD_NUMBER: _ClassVar[int]
    meta: _common_pb2.EventMeta
    command_id: str
    worker_id: str
    issued_at: _timestamp_pb2.Timestamp
    deadline: _timestamp_pb2.Timestamp
    reason: str
    load: LoadAdapter
    evict: EvictAdapter
    pin: PinAdapter
    unpin: UnpinAdapter
    hot_order: HotOrder
    def __init__(self, meta: _Optional[_Union[_common_pb2.EventMeta, _Mapping]] = ..., command_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., issued_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ..., load: _Optional[_Union[LoadAdapter, _Mapping]] = ..., evict: _Optional[_Union[EvictAdapter, _Mapping]] = ..., pin: _Optional[_Union[PinAdapter, _Mapping]] = ..., unpin: _Optional[_Union[UnpinAdapter, _Mapping]] = ..., hot_order: _Optional[_Union[HotOrder, _Mapping]] = ...) -> None: ...

class AdapterLoaded(_message.Message):
    __slots__ = ("tier", "duration_ms", "bytes", "source_tier", "engine_id", "pinned")
    TIER_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_TIER_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    tier: _common_pb2.Tier
    duration_ms: float
    bytes: int
    source_tier: _common_pb2.Tier
    engine_id: int
    pinned: bool
    def __init__(self, tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., duration_ms: _Optional[float] = ..., bytes: _Optional[int] = ..., source_tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., engine_id: _Optional[int] = ..., pinned: _Optional[bool] = ...) -> None: ...

class AdapterEvicted(_message.Message):
    __slots__ = ("from_tier", "to_tier", "reason", "engine_id")
    FROM_TIER_FIELD_NUMBER: _ClassVar[int]
    TO_TIER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    from_tier: _common_pb2.Tier
    to_tier: _common_pb2.Tier
    reason: str
    engine_id: int
    def __init__(self, from_tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., to_tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., reason: _Optional[str] = ..., engine_id: _Optional[int] = ...) -> None: ...

class LoadFailed(_message.Message):
    __slots__ = ("code", "message", "retriable", "engine_id")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRIABLE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    code: LoadErrorCode
    message: str
    retriable: bool
    engine_id: int
    def __init__(self, code: _Optional[_Union[LoadErrorCode, str]] = ..., message: _Optional[str] = ..., retriable: _Optional[bool] = ..., engine_id: _Optional[int] = ...) -> None: ...

class BaseModelCapacity(_message.Message):
    __slots__ = ("base_model", "hot_slots_capacity", "hot_slots_used", "hot_slots_pinned", "max_lora_rank", "tokenizer_revision", "gpu_slots", "gpu_slots_used")
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    HOT_SLOTS_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    HOT_SLOTS_USED_FIELD_NUMBER: _ClassVar[int]
    HOT_SLOTS_PINNED_FIELD_NUMBER: _ClassVar[int]
    MAX_LORA_RANK_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_REVISION_FIELD_NUMBER: _ClassVar[int]
    GPU_SLOTS_FIELD_NUMBER: _ClassVar[int]
    GPU_SLOTS_USED_FIELD_NUMBER: _ClassVar[int]
    base_model: str
    hot_slots_capacity: int
    hot_slots_used: int
    hot_slots_pinned: int
    max_lora_rank: int
    tokenizer_revision: str
    gpu_slots: int
    gpu_slots_used: int
    def __init__(self, base_model: _Optional[str] = ..., hot_slots_capacity: _Optional[int] = ..., hot_slots_used: _Optional[int] = ..., hot_slots_pinned: _Optional[int] = ..., max_lora_rank: _Optional[int] = ..., tokenizer_revision: _Optional[str] = ..., gpu_slots: _Optional[int] = ..., gpu_slots_used: _Optional[int] = ...) -> None: ...

class AdapterPlacement(_message.Message):
    __slots__ = ("adapter", "engine_id", "tier", "pinned", "in_flight", "size_bytes", "loaded_at", "last_used_at", "sha256", "rank", "slot_resident")
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOADED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_AT_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SLOT_RESIDENT_FIELD_NUMBER: _ClassVar[int]
    adapter: _common_pb2.AdapterRef
    engine_id: int
    tier: _common_pb2.Tier
    pinned: bool
    in_flight: int
    size_bytes: int
    loaded_at: _timestamp_pb2.Timestamp
    last_used_at: _timestamp_pb2.Timestamp
    sha256: str
    rank: int
    slot_resident: bool
    def __init__(self, adapter: _Optional[_Union[_common_pb2.AdapterRef, _Mapping]] = ..., engine_id: _Optional[int] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., pinned: _Optional[bool] = ..., in_flight: _Optional[int] = ..., size_bytes: _Optional[int] = ..., loaded_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_used_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., sha256: _Optional[str] = ..., rank: _Optional[int] = ..., slot_resident: _Optional[bool] = ...) -> None: ...

class WorkerState(_message.Message):
    __slots__ = ("worker_id", "base_models", "capacities", "warm_bytes_capacity", "warm_bytes_used", "placements", "grpc_address", "started_at", "seq", "ready")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    BASE_MODELS_FIELD_NUMBER: _ClassVar[int]
    CAPACITIES_FIELD_NUMBER: _ClassVar[int]
    WARM_BYTES_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    WARM_BYTES_USED_FIELD_NUMBER: _ClassVar[int]
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    base_models: _containers.RepeatedScalarFieldContainer[str]
    capacities: _containers.RepeatedCompositeFieldContainer[BaseModelCapacity]
    warm_bytes_capacity: int
    warm_bytes_used: int
    placements: _containers.RepeatedCompositeFieldContainer[AdapterPlacement]
    grpc_address: str
    started_at: _timestamp_pb2.Timestamp
    seq: int
    ready: bool
    def __init__(self, worker_id: _Optional[str] = ..., base_models: _Optional[_Iterable[str]] = ..., capacities: _Optional[_Iterable[_Union[BaseModelCapacity, _Mapping]]] = ..., warm_bytes_capacity: _Optional[int] = ..., warm_bytes_used: _Optional[int] = ..., placements: _Optional[_Iterable[_Union[AdapterPlacement, _Mapping]]] = ..., grpc_address: _Optional[str] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., seq: _Optional[int] = ..., ready: _Optional[bool] = ...) -> None: ...

class WorkerReport(_message.Message):
    __slots__ = ("meta", "worker_id", "command_id", "loaded", "evicted", "failed", "state")
    META_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    LOADED_FIELD_NUMBER: _ClassVar[int]
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    meta: _common_pb2.EventMeta
    worker_id: str
    command_id: str
    loaded: AdapterLoaded
    evicted: AdapterEvicted
    failed: LoadFailed
    state: WorkerState
    def __init__(self, meta: _Optional[_Union[_common_pb2.EventMeta, _Mapping]] = ..., worker_id: _Optional[str] = ..., command_id: _Optional[str] = ..., loaded: _Optional[_Union[AdapterLoaded, _Mapping]] = ..., evicted: _Optional[_Union[AdapterEvicted, _Mapping]] = ..., failed: _Optional[_Union[LoadFailed, _Mapping]] = ..., state: _Optional[_Union[WorkerState, _Mapping]] = ...) -> None: ...

class RequestCompleted(_message.Message):
    __slots__ = ("meta", "request_id", "worker_id", "request_class", "tier_at_arrival", "ttft_ms", "duration_ms", "prompt_tokens", "output_tokens", "status_code", "degraded_to_base", "engine_id")
    META_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_CLASS_FIELD_NUMBER: _ClassVar[int]
    TIER_AT_ARRIVAL_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_TO_BASE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    meta: _common_pb2.EventMeta
    request_id: str
    worker_id: str
    request_class: _common_pb2.RequestClass
    tier_at_arrival: _common_pb2.Tier
    ttft_ms: float
    duration_ms: float
    prompt_tokens: int
    output_tokens: int
    status_code: int
    degraded_to_base: bool
    engine_id: int
    def __init__(self, meta: _Optional[_Union[_common_pb2.EventMeta, _Mapping]] = ..., request_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., request_class: _Optional[_Union[_common_pb2.RequestClass, str]] = ..., tier_at_arrival: _Optional[_Union[_common_pb2.Tier, str]] = ..., ttft_ms: _Optional[float] = ..., duration_ms: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., status_code: _Optional[int] = ..., degraded_to_base: _Optional[bool] = ..., engine_id: _Optional[int] = ...) -> None: ...

class HeatBatch(_message.Message):
    __slots__ = ("meta", "completions", "source_id")
    META_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    meta: _common_pb2.EventMeta
    completions: _containers.RepeatedCompositeFieldContainer[RequestCompleted]
    source_id: str
    def __init__(self, meta: _Optional[_Union[_common_pb2.EventMeta, _Mapping]] = ..., completions: _Optional[_Iterable[_Union[RequestCompleted, _Mapping]]] = ..., source_id: _Optional[str] = ...) -> None: ...

class PrewarmRequested(_message.Message):
    __slots__ = ("meta", "request_class", "reason", "target_worker_id", "engine_id")
    META_FIELD_NUMBER: _ClassVar[int]
    REQUEST_CLASS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TARGET_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    meta: _common_pb2.EventMeta
    request_class: _common_pb2.RequestClass
    reason: str
    target_worker_id: str
    engine_id: int
    def __init__(self, meta: _Optional[_Union[_common_pb2.EventMeta, _Mapping]] = ..., request_class: _Optional[_Union[_common_pb2.RequestClass, str]] = ..., reason: _Optional[str] = ..., target_worker_id: _Optional[str] = ..., engine_id: _Optional[int] = ...) -> None: ...

class TenantUpserted(_message.Message):
    __slots__ = ("tenant_id", "display_name", "default_priority", "disabled")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    DISABLED_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    display_name: str
    default_priority: _common_pb2.Priority
    disabled: bool
    def __init__(self, tenant_id: _Optional[str] = ..., display_name: _Optional[str] = ..., default_priority: _Optional[_Union[_common_pb2.Priority, str]] = ..., disabled: _Optional[bool] = ...) -> None: ...

class TenantQuotaSet(_message.Message):
    __slots__ = ("tenant_id", "adapter_name", "max_in_flight", "tokens_per_s", "cleared")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    adapter_name: str
    max_in_flight: int
    tokens_per_s: float
    cleared: bool
    def __init__(self, tenant_id: _Optional[str] = ..., adapter_name: _Optional[str] = ..., max_in_flight: _Optional[int] = ..., tokens_per_s: _Optional[float] = ..., cleared: _Optional[bool] = ...) -> None: ...

class ApiKeyCreated(_message.Message):
    __slots__ = ("tenant_id", "key_id", "prefix", "key_hash")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    KEY_HASH_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    key_id: str
    prefix: str
    key_hash: str
    def __init__(self, tenant_id: _Optional[str] = ..., key_id: _Optional[str] = ..., prefix: _Optional[str] = ..., key_hash: _Optional[str] = ...) -> None: ...

class ApiKeyRevoked(_message.Message):
    __slots__ = ("tenant_id", "key_id")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    key_id: str
    def __init__(self, tenant_id: _Optional[str] = ..., key_id: _Optional[str] = ...) -> None: ...

class AdapterShareChanged(_message.Message):
    __slots__ = ("tenant_id", "adapter_name", "grantee_tenant_id", "shared")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    GRANTEE_TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    adapter_name: str
    grantee_tenant_id: str
    shared: bool
    def __init__(self, tenant_id: _Optional[str] = ..., adapter_name: _Optional[str] = ..., grantee_tenant_id: _Optional[str] = ..., shared: _Optional[bool] = ...) -> None: ...

class TenantEvent(_message.Message):
    __slots__ = ("meta", "tenant_upserted", "api_key_created", "api_key_revoked", "adapter_share_changed", "tenant_quota_set")
    META_FIELD_NUMBER: _ClassVar[int]
    TENANT_UPSERTED_FIELD_NUMBER: _ClassVar[int]
    API_KEY_CREATED_FIELD_NUMBER: _ClassVar[int]
    API_KEY_REVOKED_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_SHARE_CHANGED_FIELD_NUMBER: _ClassVar[int]
    TENANT_QUOTA_SET_FIELD_NUMBER: _ClassVar[int]
    meta: _common_pb2.EventMeta
    tenant_upserted: TenantUpserted
    api_key_created: ApiKeyCreated
    api_key_revoked: ApiKeyRevoked
    adapter_share_changed: AdapterShareChanged
    tenant_quota_set: TenantQuotaSet
    def __init__(self, meta: _Optional[_Union[_common_pb2.EventMeta, _Mapping]] = ..., tenant_upserted: _Optional[_Union[TenantUpserted, _Mapping]] = ..., api_key_created: _Optional[_Union[ApiKeyCreated, _Mapping]] = ..., api_key_revoked: _Optional[_Union[ApiKeyRevoked, _Mapping]] = ..., adapter_share_changed: _Optional[_Union[AdapterShareChanged, _Mapping]] = ..., tenant_quota_set: _Optional[_Union[TenantQuotaSet, _Mapping]] = ...) -> None: ...
