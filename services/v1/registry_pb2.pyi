import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from loraplane.v1 import common_pb2 as _common_pb2
from loraplane.v1 import events_pb2 as _events_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tenant(_message.Message):
    __slots__ = ("tenant_id", "display_name", "default_priority", "created_at", "disabled")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    DISABLED_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    display_name: str
    default_priority: _common_pb2.Priority
    created_at: _timestamp_pb2.Timestamp
    disabled: bool
    def __init__(self, tenant_id: _Optional[str] = ..., display_name: _Optional[str] = ..., default_priority: _Optional[_Union[_common_pb2.Priority, str]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., disabled: _Optional[bool] = ...) -> None: ...

class ApiKeyInfo(_message.Message):
    __slots__ = ("key_id", "tenant_id", "prefix", "description", "created_at", "revoked_at")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    REVOKED_AT_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    tenant_id: str
    prefix: str
    description: str
    created_at: _timestamp_pb2.Timestamp
    revoked_at: _timestamp_pb2.Timestamp
    def __init__(self, key_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., prefix: _Optional[str] = ..., description: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., revoked_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class AdapterVersion(_message.Message):
    __slots__ = ("adapter_id", "tenant_id", "name", "version", "base_model", "rank", "format", "target_modules", "artifact_uri", "sha256", "size_bytes", "signature_uri", "signer_identity", "tokenizer_revision", "status", "priority", "engine_id", "created_at", "admitted_at", "reasons", "files", "lora_alpha", "effective_priority", "withdrawn_reason")
    ADAPTER_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    TARGET_MODULES_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_URI_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_URI_FIELD_NUMBER: _ClassVar[int]
    SIGNER_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_REVISION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    LORA_ALPHA_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    WITHDRAWN_REASON_FIELD_NUMBER: _ClassVar[int]
    adapter_id: str
    tenant_id: str
    name: str
    version: str
    base_model: str
    rank: int
    format: str
    target_modules: _containers.RepeatedScalarFieldContainer[str]
    artifact_uri: str
    sha256: str
    size_bytes: int
    signature_uri: str
    signer_identity: str
    tokenizer_revision: str
    status: _common_pb2.VersionStatus
    priority: _common_pb2.Priority
    engine_id: int
    created_at: _timestamp_pb2.Timestamp
    admitted_at: _timestamp_pb2.Timestamp
    reasons: _containers.RepeatedCompositeFieldContainer[_events_pb2.RejectionReason]
    files: _containers.RepeatedCompositeFieldContainer[_events_pb2.ArtifactFile]
    lora_alpha: float
    effective_priority: _common_pb2.Priority
    withdrawn_reason: str
    def __init__(self, adapter_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., name: _Optional[str] = ..., version: _Optional[str] = ..., base_model: _Optional[str] = ..., rank: _Optional[int] = ..., format: _Optional[str] = ..., target_modules: _Optional[_Iterable[str]] = ..., artifact_uri: _Optional[str] = ..., sha256: _Optional[str] = ..., size_bytes: _Optional[int] = ..., signature_uri: _Optional[str] = ..., signer_identity: _Optional[str] = ..., tokenizer_revision: _Optional[str] = ..., status: _Optional[_Union[_common_pb2.VersionStatus, str]] = ..., priority: _Optional[_Union[_common_pb2.Priority, str]] = ..., engine_id: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., admitted_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reasons: _Optional[_Iterable[_Union[_events_pb2.RejectionReason, _Mapping]]] = ..., files: _Optional[_Iterable[_Union[_events_pb2.ArtifactFile, _Mapping]]] = ..., lora_alpha: _Optional[float] = ..., effective_priority: _Optional[_Union[_common_pb2.Priority, str]] = ..., withdrawn_reason: _Optional[str] = ...) -> None: ...

class ReleasePointers(_message.Message):
    __slots__ = ("adapter_id", "tenant_id", "adapter_name", "stable_version", "canary_version", "canary_percent", "rollback_to", "updated_at", "base_model", "canary_paused", "canary_cleared")
    ADAPTER_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    STABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CANARY_VERSION_FIELD_NUMBER: _ClassVar[int]
    CANARY_PERCENT_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_TO_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    CANARY_PAUSED_FIELD_NUMBER: _ClassVar[int]
    CANARY_CLEARED_FIELD_NUMBER: _ClassVar[int]
    adapter_id: str
    tenant_id: str
    adapter_name: str
    stable_version: str
    canary_version: str
    canary_percent: int
    rollback_to: str
    updated_at: _timestamp_pb2.Timestamp
    base_model: str
    canary_paused: bool
    canary_cleared: bool
    def __init__(self, adapter_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., adapter_name: _Optional[str] = ..., stable_version: _Optional[str] = ..., canary_version: _Optional[str] = ..., canary_percent: _Optional[int] = ..., rollback_to: _Optional[str] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., base_model: _Optional[str] = ..., canary_paused: _Optional[bool] = ..., canary_cleared: _Optional[bool] = ...) -> None: ...

class AuditEntry(_message.Message):
    __slots__ = ("id", "at", "actor", "action", "subject", "before_json", "after_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    BEFORE_JSON_FIELD_NUMBER: _ClassVar[int]
    AFTER_JSON_FIELD_NUMBER: _ClassVar[int]
    id: int
    at: _timestamp_pb2.Timestamp
    actor: str
    action: str
    subject: str
    before_json: str
    after_json: str
    def __init__(self, id: _Optional[int] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., actor: _Optional[str] = ..., action: _Optional[str] = ..., subject: _Optional[str] = ..., before_json: _Optional[str] = ..., after_json: _Optional[str] = ...) -> None: ...

class CreateTenantRequest(_message.Message):
    __slots__ = ("tenant_id", "display_name", "default_priority")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    display_name: str
    default_priority: _common_pb2.Priority
    def __init__(self, tenant_id: _Optional[str] = ..., display_name: _Optional[str] = ..., default_priority: _Optional[_Union[_common_pb2.Priority, str]] = ...) -> None: ...

class CreateTenantResponse(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: Tenant
    def __init__(self, tenant: _Optional[_Union[Tenant, _Mapping]] = ...) -> None: ...

class GetTenantRequest(_message.Message):
    __slots__ = ("tenant_id",)
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    def __init__(self, tenant_id: _Optional[str] = ...) -> None: ...

class GetTenantResponse(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: Tenant
    def __init__(self, tenant: _Optional[_Union[Tenant, _Mapping]] = ...) -> None: ...

class ListTenantsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTenantsResponse(_message.Message):
    __slots__ = ("tenants", "next_page_token")
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenants: _containers.RepeatedCompositeFieldContainer[Tenant]
    next_page_token: str
    def __init__(self, tenants: _Optional[_Iterable[_Union[Tenant, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class SetTenantPriorityRequest(_message.Message):
    __slots__ = ("tenant_id", "priority")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    priority: _common_pb2.Priority
    def __init__(self, tenant_id: _Optional[str] = ..., priority: _Optional[_Union[_common_pb2.Priority, str]] = ...) -> None: ...

class SetTenantPriorityResponse(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: Tenant
    def __init__(self, tenant: _Optional[_Union[Tenant, _Mapping]] = ...) -> None: ...

class TenantQuota(_message.Message):
    __slots__ = ("tenant_id", "adapter_name", "max_in_flight", "tokens_per_s", "updated_at")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    adapter_name: str
    max_in_flight: int
    tokens_per_s: float
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, tenant_id: _Optional[str] = ..., adapter_name: _Optional[str] = ..., max_in_flight: _Optional[int] = ..., tokens_per_s: _Optional[float] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SetTenantQuotaRequest(_message.Message):
    __slots__ = ("tenant_id", "adapter_name", "max_in_flight", "tokens_per_s", "clear")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    adapter_name: str
    max_in_flight: int
    tokens_per_s: float
    clear: bool
    def __init__(self, tenant_id: _Optional[str] = ..., adapter_name: _Optional[str] = ..., max_in_flight: _Optional[int] = ..., tokens_per_s: _Optional[float] = ..., clear: _Optional[bool] = ...) -> None: ...

class SetTenantQuotaResponse(_message.Message):
    __slots__ = ("quota",)
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    quota: TenantQuota
    def __init__(self, quota: _Optional[_Union[TenantQuota, _Mapping]] = ...) -> None: ...

class ListTenantQuotasRequest(_message.Message):
    __slots__ = ("tenant_id",)
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    def __init__(self, tenant_id: _Optional[str] = ...) -> None: ...

class ListTenantQuotasResponse(_message.Message):
    __slots__ = ("quotas",)
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    quotas: _containers.RepeatedCompositeFieldContainer[TenantQuota]
    def __init__(self, quotas: _Optional[_Iterable[_Union[TenantQuota, _Mapping]]] = ...) -> None: ...

class CreateApiKeyRequest(_message.Message):
    __slots__ = ("tenant_id", "description")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    description: str
    def __init__(self, tenant_id: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class CreateApiKeyResponse(_message.Message):
    __slots__ = ("key", "secret")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    key: ApiKeyInfo
    secret: str
    def __init__(self, key: _Optional[_Union[ApiKeyInfo, _Mapping]] = ..., secret: _Optional[str] = ...) -> None: ...

class RevokeApiKeyRequest(_message.Message):
    __slots__ = ("tenant_id", "key_id")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    key_id: str
    def __init__(self, tenant_id: _Optional[str] = ..., key_id: _Optional[str] = ...) -> None: ...

class RevokeApiKeyResponse(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: ApiKeyInfo
    def __init__(self, key: _Optional[_Union[ApiKeyInfo, _Mapping]] = ...) -> None: ...

class ListApiKeysRequest(_message.Message):
    __slots__ = ("tenant_id", "include_revoked")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_REVOKED_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    include_revoked: bool
    def __init__(self, tenant_id: _Optional[str] = ..., include_revoked: _Optional[bool] = ...) -> None: ...

class ListApiKeysResponse(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[ApiKeyInfo]
    def __init__(self, keys: _Optional[_Iterable[_Union[ApiKeyInfo, _Mapping]]] = ...) -> None: ...

class UploadFile(_message.Message):
    __slots__ = ("path", "size_bytes", "sha256")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    path: str
    size_bytes: int
    sha256: str
    def __init__(self, path: _Optional[str] = ..., size_bytes: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class UploadTarget(_message.Message):
    __slots__ = ("path", "key", "url")
    PATH_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    path: str
    key: str
    url: str
    def __init__(self, path: _Optional[str] = ..., key: _Optional[str] = ..., url: _Optional[str] = ...) -> None: ...

class RequestUploadRequest(_message.Message):
    __slots__ = ("tenant_id", "adapter_name", "version", "base_model", "files")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    adapter_name: str
    version: str
    base_model: str
    files: _containers.RepeatedCompositeFieldContainer[UploadFile]
    def __init__(self, tenant_id: _Optional[str] = ..., adapter_name: _Optional[str] = ..., version: _Optional[str] = ..., base_model: _Optional[str] = ..., files: _Optional[_Iterable[_Union[UploadFile, _Mapping]]] = ...) -> None: ...

class RequestUploadResponse(_message.Message):
    __slots__ = ("bucket", "key_prefix", "artifact_uri", "targets", "expires_at")
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    KEY_PREFIX_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_URI_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    bucket: str
    key_prefix: str
    artifact_uri: str
    targets: _containers.RepeatedCompositeFieldContainer[UploadTarget]
    expires_at: _timestamp_pb2.Timestamp
    def __init__(self, bucket: _Optional[str] = ..., key_prefix: _Optional[str] = ..., artifact_uri: _Optional[str] = ..., targets: _Optional[_Iterable[_Union[UploadTarget, _Mapping]]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RegisterVersionRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: AdapterVersion
    def __init__(self, version: _Optional[_Union[AdapterVersion, _Mapping]] = ...) -> None: ...

class RegisterVersionResponse(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: AdapterVersion
    def __init__(self, version: _Optional[_Union[AdapterVersion, _Mapping]] = ...) -> None: ...

class GetVersionRequest(_message.Message):
    __slots__ = ("tenant_id", "adapter_name", "version")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    adapter_name: str
    version: str
    def __init__(self, tenant_id: _Optional[str] = ..., adapter_name: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class GetVersionResponse(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: AdapterVersion
    def __init__(self, version: _Optional[_Union[AdapterVersion, _Mapping]] = ...) -> None: ...

class ListVersionsRequest(_message.Message):
    __slots__ = ("tenant_id", "base_model", "status", "adapter_name", "page_size", "page_token")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    base_model: str
    status: _common_pb2.VersionStatus
    adapter_name: str
    page_size: int
    page_token: str
    def __init__(self, tenant_id: _Optional[str] = ..., base_model: _Optional[str] = ..., status: _Optional[_Union[_common_pb2.VersionStatus, str]] = ..., adapter_name: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListVersionsResponse(_message.Message):
    __slots__ = ("versions", "next_page_token")
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    versions: _containers.RepeatedCompositeFieldContainer[AdapterVersion]
    next_page_token: str
    def __init__(self, versions: _Optional[_Iterable[_Union[AdapterVersion, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class PromoteRequest(_message.Message):
    __slots__ = ("tenant_id", "adapter_name", "version", "reason")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    adapter_name: str
    version: str
    reason: str
    def __init__(self, tenant_id: _Optional[str] = ..., adapter_name: _Optional[str] = ..., version: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class PromoteResponse(_message.Message):
    __slots__ = ("release",)
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    release: ReleasePointers
    def __init__(self, release: _Optional[_Union[ReleasePointers, _Mapping]] = ...) -> None: ...

class SetCanaryRequest(_message.Message):
    __slots__ = ("tenant_id", "adapter_name", "version", "percent", "reason")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PERCENT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    adapter_name: str
    version: str
    percent: int
    reason: str
    def __init__(self, tenant_id: _Optional[str] = ..., adapter_name: _Optional[str] = ..., version: _Optional[str] = ..., percent: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class SetCanaryResponse(_message.Message):
    __slots__ = ("release",)
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    release: ReleasePointers
    def __init__(self, release: _Optional[_Union[ReleasePointers, _Mapping]] = ...) -> None: ...

class PauseCanaryRequest(_message.Message):
    __slots__ = ("tenant_id", "adapter_name", "paused", "reason")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    adapter_name: str
    paused: bool
    reason: str
    def __init__(self, tenant_id: _Optional[str] = ..., adapter_name: _Optional[str] = ..., paused: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class PauseCanaryResponse(_message.Message):
    __slots__ = ("release",)
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    release: ReleasePointers
    def __init__(self, release: _Optional[_Union[ReleasePointers, _Mapping]] = ...) -> None: ...

class ClearCanaryRequest(_message.Message):
    __slots__ = ("tenant_id", "adapter_name", "version", "reason")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    adapter_name: str
    version: str
    reason: str
    def __init__(self, tenant_id: _Optional[str] = ..., adapter_name: _Optional[str] = ..., version: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ClearCanaryResponse(_message.Message):
    __slots__ = ("release",)
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    release: ReleasePointers
    def __init__(self, release: _Optional[_Union[ReleasePointers, _Mapping]] = ...) -> None: ...

class RollbackRequest(_message.Message):
    __slots__ = ("tenant_id", "adapter_name", "to_version", "reason", "withdraw")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    TO_VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    WITHDRAW_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    adapter_name: str
    to_version: str
    reason: str
    withdraw: bool
    def __init__(self, tenant_id: _Optional[str] = ..., adapter_name: _Optional[str] = ..., to_version: _Optional[str] = ..., reason: _Optional[str] = ..., withdraw: _Optional[bool] = ...) -> None: ...

class WithdrawVersionRequest(_message.Message):
    __slots__ = ("tenant_id", "adapter_name", "version", "reason")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    adapter_name: str
    version: str
    reason: str
    def __init__(self, tenant_id: _Optional[str] = ..., adapter_name: _Optional[str] = ..., version: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class WithdrawVersionResponse(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: AdapterVersion
    def __init__(self, version: _Optional[_Union[AdapterVersion, _Mapping]] = ...) -> None: ...

class RollbackResponse(_message.Message):
    __slots__ = ("release",)
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    release: ReleasePointers
    def __init__(self, release: _Optional[_Union[ReleasePointers, _Mapping]] = ...) -> None: ...

class RetireRequest(_message.Message):
    __slots__ = ("tenant_id", "adapter_name", "version", "reason")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    adapter_name: str
    version: str
    reason: str
    def __init__(self, tenant_id: _Optional[str] = ..., adapter_name: _Optional[str] = ..., version: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RetireResponse(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: AdapterVersion
    def __init__(self, version: _Optional[_Union[AdapterVersion, _Mapping]] = ...) -> None: ...

class GetReleaseRequest(_message.Message):
    __slots__ = ("tenant_id", "adapter_name")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    adapter_name: str
    def __init__(self, tenant_id: _Optional[str] = ..., adapter_name: _Optional[str] = ...) -> None: ...

class GetReleaseResponse(_message.Message):
    __slots__ = ("release",)
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    release: ReleasePointers
    def __init__(self, release: _Optional[_Union[ReleasePointers, _Mapping]] = ...) -> None: ...

class ListAuditRequest(_message.Message):
    __slots__ = ("subject_prefix", "actor", "action", "since", "until", "page_size", "page_token")
    SUBJECT_PREFIX_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    subject_prefix: str
    actor: str
    action: str
    since: _timestamp_pb2.Timestamp
    until: _timestamp_pb2.Timestamp
    page_size: int
    page_token: str
    def __init__(self, subject_prefix: _Optional[str] = ..., actor: _Optional[str] = ..., action: _Optional[str] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListAuditResponse(_message.Message):
    __slots__ = ("entries", "next_page_token")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[AuditEntry]
    next_page_token: str
    def __init__(self, entries: _Optional[_Iterable[_Union[AuditEntry, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ShareAdapterRequest(_message.Message):
    __slots__ = ("tenant_id", "adapter_name", "grantee_tenant_id")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    GRANTEE_TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    adapter_name: str
    grantee_tenant_id: str
    def __init__(self, tenant_id: _Optional[str] = ..., adapter_name: _Optional[str] = ..., grantee_tenant_id: _Optional[str] = ...) -> None: ...

class ShareAdapterResponse(_message.Message):
    __slots__ = ("changed", "grantee_tenant_ids")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    GRANTEE_TENANT_IDS_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    grantee_tenant_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, changed: _Optional[bool] = ..., grantee_tenant_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class UnshareAdapterRequest(_message.Message):
    __slots__ = ("tenant_id", "adapter_name", "grantee_tenant_id")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    GRANTEE_TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    adapter_name: str
    grantee_tenant_id: str
    def __init__(self, tenant_id: _Optional[str] = ..., adapter_name: _Optional[str] = ..., grantee_tenant_id: _Optional[str] = ...) -> None: ...

class UnshareAdapterResponse(_message.Message):
    __slots__ = ("changed", "grantee_tenant_ids")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    GRANTEE_TENANT_IDS_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    grantee_tenant_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, changed: _Optional[bool] = ..., grantee_tenant_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ListSharesRequest(_message.Message):
    __slots__ = ("tenant_id", "adapter_name")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    adapter_name: str
    def __init__(self, tenant_id: _Optional[str] = ..., adapter_name: _Optional[str] = ...) -> None: ...

class AdapterShare(_message.Message):
    __slots__ = ("tenant_id", "adapter_name", "grantee_tenant_id", "created_at")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    GRANTEE_TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    adapter_name: str
    grantee_tenant_id: str
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, tenant_id: _Optional[str] = ..., adapter_name: _Optional[str] = ..., grantee_tenant_id: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListSharesResponse(_message.Message):
    __slots__ = ("shares",)
    SHARES_FIELD_NUMBER: _ClassVar[int]
    shares: _containers.RepeatedCompositeFieldContainer[AdapterShare]
    def __init__(self, shares: _Optional[_Iterable[_Union[AdapterShare, _Mapping]]] = ...) -> None: ...
