from loraplane.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("adapter", "prompt", "max_tokens", "temperature", "top_p", "seed", "request_class", "request_key", "stop", "base_model", "n", "logprobs", "echo", "presence_penalty", "frequency_penalty", "logit_bias")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_CLASS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_KEY_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ECHO_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    adapter: str
    prompt: str
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    request_class: _common_pb2.RequestClass
    request_key: str
    stop: _containers.RepeatedScalarFieldContainer[str]
    base_model: str
    n: int
    logprobs: int
    echo: bool
    presence_penalty: float
    frequency_penalty: float
    logit_bias: _containers.ScalarMap[int, float]
    def __init__(self, adapter: _Optional[str] = ..., prompt: _Optional[str] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., request_class: _Optional[_Union[_common_pb2.RequestClass, str]] = ..., request_key: _Optional[str] = ..., stop: _Optional[_Iterable[str]] = ..., base_model: _Optional[str] = ..., n: _Optional[int] = ..., logprobs: _Optional[int] = ..., echo: _Optional[bool] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., logit_bias: _Optional[_Mapping[int, float]] = ...) -> None: ...

class ResolvedAdapter(_message.Message):
    __slots__ = ("adapter", "tier_at_arrival", "degraded_to_base", "canary", "worker_id", "request_id")
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    TIER_AT_ARRIVAL_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_TO_BASE_FIELD_NUMBER: _ClassVar[int]
    CANARY_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    adapter: _common_pb2.AdapterRef
    tier_at_arrival: _common_pb2.Tier
    degraded_to_base: bool
    canary: bool
    worker_id: str
    request_id: str
    def __init__(self, adapter: _Optional[_Union[_common_pb2.AdapterRef, _Mapping]] = ..., tier_at_arrival: _Optional[_Union[_common_pb2.Tier, str]] = ..., degraded_to_base: _Optional[bool] = ..., canary: _Optional[bool] = ..., worker_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "output_tokens", "ttft_ms", "duration_ms")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    output_tokens: int
    ttft_ms: float
    duration_ms: float
    def __init__(self, prompt_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., ttft_ms: _Optional[float] = ..., duration_ms: _Optional[float] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("text", "token_ids", "finished", "finish_reason", "resolved", "usage", "index", "logprobs")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finished: bool
    finish_reason: str
    resolved: ResolvedAdapter
    usage: Usage
    index: int
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finished: _Optional[bool] = ..., finish_reason: _Optional[str] = ..., resolved: _Optional[_Union[ResolvedAdapter, _Mapping]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., index: _Optional[int] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "token", "logprob", "top")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: str
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[str] = ..., logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token_id", "token", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: str
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[str] = ..., logprob: _Optional[float] = ...) -> None: ...
