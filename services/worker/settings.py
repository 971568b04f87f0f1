"""Settings of the inference worker (``LORAPLANE_WORKER_*`` plus the common ones).

Loaded once in ``main`` and passed down. The served model has no default: set
``LORAPLANE_BASE_MODEL``, ``LORAPLANE_BASE_MODEL_DIR`` and ``LORAPLANE_TRUSTED_KEYS``
(and ``LORAPLANE_TOKENIZER_REVISION``, reported to the gateway); a worker missing one
refuses to start, naming it (:data:`MODEL_SETTINGS`). ``make run`` passes the demo build's
(:mod:`loraplane.stack.seed`), Kubernetes and compose their mounted model and key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from loraplane.shared.resources import state_dir
from loraplane.shared.settings import CommonSettings
from loraplane.worker.engine import EngineLimits
from loraplane.worker.engine_start import EngineOptions

ZERO_ADAPTER_ENGINE_ID = 2_147_483_647
"""Engine id of the worker's all-zero adapter (int32 max; registry ids start at 1)."""

MODEL_SETTINGS = {
    "base_model": "LORAPLANE_BASE_MODEL",
    "base_model_dir": "LORAPLANE_BASE_MODEL_DIR",
    "trusted_keys": "LORAPLANE_TRUSTED_KEYS",
}
"""The settings a worker cannot start without (field: environment variable)."""


class WorkerSettings(CommonSettings):
    """Everything the worker process needs."""

    model_config = SettingsConfigDict(env_prefix="LORAPLANE_", extra="ignore")

    worker_id: str = "worker-0"
    """Stable worker id (Kafka key of cache.commands / cache.state)."""
    worker_grpc_host: str = "127.0.0.1"
    """Address the WorkerInternal gRPC server binds."""
    worker_grpc_port: int = 19054
    """WorkerInternal port (0 = any free port)."""
    worker_advertise_host: str = "127.0.0.1"
    """Host part of ``WorkerState.grpc_address`` (what the gateway dials)."""
    worker_metrics_port: int = 19064
    """Prometheus ``/metrics`` port (0 = off); it answers once the worker is ready."""

    base_model: str = ""
    """Name of the served base model (an entry of the base-model catalogue; required)."""
    base_model_dir: Path | None = None
    """Directory of the served base model (required)."""
    trusted_keys: str = ""
    """Comma-separated PEM public keys trusted for adapter signatures (required)."""
    tokenizer_revision: str = ""
    """Tokenizer revision reported in WorkerState (the catalogue entry's)."""

    worker_host_dir: Path | None = None
    """WARM tier directory (default ``.loraplane/worker/<worker_id>``)."""
    worker_host_bytes: int = Field(default=4 << 30, gt=0)
    """WARM tier byte budget."""
    artifact_prefix: str = "adapters"
    """Key prefix of adapter artifacts in the artifact bucket (``s3://bucket/<prefix>/<tenant>/...``)."""

    worker_max_loras: int = Field(default=4, ge=2)
    """Engine LoRA slots per batch (vLLM ``max_loras``); one always stays unpinned."""
    worker_max_cpu_loras: int = Field(default=5, ge=2)
    """Adapters registered in the engine at once (vLLM ``max_cpu_loras``), the all-zero
    base adapter included; HOT capacity is ``min(max_loras, max_cpu_loras - 1)`` (see
    :attr:`worker_hot_level`)."""
    worker_hot_level: Literal["slots", "registered"] = "slots"
    """Which of HOT's two levels the cache manager plans to. ``slots``: at most one HOT
    version per GPU slot, ``min(max_loras, max_cpu_loras - 1)``, so every HOT version can
    be in a slot at once. ``registered``: ``max_cpu_loras - 1`` HOT versions, more than the
    ``max_loras`` GPU slots; vLLM moves a registered version into a slot for the batch
    that needs it (its slot LRU, at host→GPU copy cost) and a request waits at the slot
    gate while every slot is busy. Pins stay within the GPU slots (``max_loras - 1``) at
    either level. ``registered`` needs ``max_cpu_loras - 1 > max_loras``."""
    worker_max_lora_rank: int = 16
    """Largest LoRA rank (vLLM ``max_lora_rank``; one of 1, 8, 16, 32, 64, 128, 256, 320, 512)."""
    worker_max_model_len: int = 512
    """Engine context length."""
    worker_kv_cache_gib: int = Field(default=1, gt=0)
    """KV cache size in GiB (CPU backend)."""
    worker_dtype: str = "float32"
    """Weights dtype."""
    worker_engine_executor: Literal["uni", "mp"] = "uni"
    """vLLM executor: ``uni`` runs the model in the engine-core process (one process to
    spawn at start, not two: a restarted worker serves sooner); ``mp`` is vLLM-CPU's
    default (see :class:`loraplane.worker.engine_start.EngineOptions`)."""
    worker_default_max_tokens: int = Field(default=64, gt=0)
    """max_tokens when a request leaves it at 0."""
    worker_default_temperature: float = Field(default=0.0, ge=0)
    """Temperature when a request leaves it unset (0 = greedy)."""
    worker_background_stream_tokens: int = Field(default=16, ge=1)
    """Tokens per streamed chunk of background and canary requests (vLLM
    ``stream_interval``; first and last chunk at once). Interactive requests stream every
    token. Fewer messages per background token leave the engine's front end, the worker
    and the gateway free for interactive requests during a flood (issue 22)."""

    worker_state_interval_s: float = Field(default=10.0, gt=0)
    """Period of the full WorkerState snapshot on cache.state."""
    worker_heat_flush_s: float = Field(default=2.0, gt=0)
    """Period of HeatBatch flushes on adapter.heat."""
    worker_drain_timeout_s: float = Field(default=120.0, ge=0)
    """Longest an eviction waits for in-flight requests when the command has no deadline."""
    worker_max_concurrent_commands: int = Field(default=8, gt=0)
    """Commands executed at once (different versions; one version's commands run in order)."""
    worker_command_slot_wait_s: float = Field(default=10.0, ge=0)
    """Longest a cache command's HOT load waits for a slot on a full worker (behind the
    waiting requests; bounded by the command's deadline too) before it fails NO_CAPACITY.
    A round's demotion and load run concurrently, and requests take freed slots: without a
    wait the load was refused before the demotion finished (84 NO_CAPACITY failures in one
    ``make stress`` run). 0: fail at once."""

    worker_slot_queue_depth: int = Field(default=64, gt=0)
    """Requests that may wait at once for a HOT slot (interactive, then canary, then
    background; FIFO within a class); one more is refused with RESOURCE_EXHAUSTED."""
    worker_slot_retry_after_s: float = Field(default=1.0, gt=0)
    """Retry hint given with a refusal for want of a HOT slot."""
    worker_policy_file: Path | None = None
    """Cache policy configuration (the cache manager's ``policy.yaml``) whose heat score,
    protections and demotion predicates rank the request path's HOT victims (default:
    ``config/policy.yaml`` when present, else the built-in defaults)."""

    @model_validator(mode="after")
    def _cross_checks(self) -> WorkerSettings:
        if self.worker_max_cpu_loras < self.worker_max_loras:
            raise ValueError("worker_max_cpu_loras must be >= worker_max_loras")
        if self.worker_hot_level == "registered" and \
                self.worker_max_cpu_loras - 1 <= self.worker_max_loras:
            raise ValueError(
                f"worker_hot_level 'registered' plans HOT beyond the GPU slots, but "
                f"worker_max_cpu_loras - 1 ({self.worker_max_cpu_loras - 1}: registrations "
                f"beside the zero adapter) is not above worker_max_loras "
                f"({self.worker_max_loras}); raise worker_max_cpu_loras or use 'slots'")
        return self

    @property
    def limits(self) -> EngineLimits:
        """The engine's LoRA limits."""
        return EngineLimits(
            max_loras=self.worker_max_loras, max_cpu_loras=self.worker_max_cpu_loras,
            max_lora_rank=self.worker_max_lora_rank,
        )

    def engine_options(self) -> EngineOptions:
        """vLLM engine options (see :mod:`loraplane.worker.engine_start`)."""
        return EngineOptions(
            max_loras=self.worker_max_loras, max_lora_rank=self.worker_max_lora_rank,
            max_cpu_loras=self.worker_max_cpu_loras, max_model_len=self.worker_max_model_len,
            dtype=self.worker_dtype, served_model_name=self.base_model or "base",
            cpu_kv_cache_gib=self.worker_kv_cache_gib,
            executor_backend=self.worker_engine_executor,
        )

    @property
    def host_dir(self) -> Path:
        """The WARM tier directory."""
        if self.worker_host_dir is not None:
            return self.worker_host_dir
        return state_dir() / "worker" / self.worker_id

    @property
    def instance(self) -> str:
        """Instance name (``instance_id`` or ``host:pid``)."""
        return self.instance_id or f"{os.uname().nodename}:{os.getpid()}"

    def trusted_key_paths(self) -> list[Path]:
        """``trusted_keys`` as paths."""
        return [Path(p.strip()) for p in self.trusted_keys.split(",") if p.strip()]

    def missing_model_settings(self) -> list[str]:
        """The environment variables of :data:`MODEL_SETTINGS` left unset (the worker
        starts only when this is empty)."""
        return [env for field, env in MODEL_SETTINGS.items() if not getattr(self, field)]
