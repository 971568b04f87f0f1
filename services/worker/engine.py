"""The inference engine interface the worker drives, and its value types.

:class:`Engine` is what the worker needs from an inference engine: register an adapter
version, unregister it, pin / unpin it, list what is registered, and stream a generation.
Implementations:

* :class:`loraplane.worker.vllm_engine.VllmEngine` — the real one, on vLLM's ``AsyncLLM``;
* :class:`loraplane.worker.guard.SafeEngine` — wraps any engine and makes vLLM's known
  killers unreachable (the worker only ever talks to a ``SafeEngine``);
* :class:`loraplane.worker.null_engine.NullEngine` — control-plane benchmarks only.

Engine integer ids (``engine_id``) are the registry's stable ids of adapter versions.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """The LoRA limits an engine was started with."""

    max_loras: int
    """Adapters that can run in one batch (vLLM ``max_loras``: GPU slots)."""
    max_cpu_loras: int
    """Adapters that can be registered at once (vLLM ``max_cpu_loras``)."""
    max_lora_rank: int
    """Largest rank accepted (vLLM ``max_lora_rank``)."""

    def __post_init__(self) -> None:
        if self.max_loras < 2:
            raise ValueError("max_loras must be >= 2 (one slot always stays unpinned)")
        if self.max_cpu_loras < self.max_loras:
            raise ValueError("max_cpu_loras must be >= max_loras")
        if self.max_lora_rank < 1:
            raise ValueError("max_lora_rank must be >= 1")


@dataclass(frozen=True, slots=True)
class EngineAdapter:
    """One adapter version as the engine sees it."""

    engine_id: int
    """Registry's stable integer id (vLLM ``lora_int_id``); > 0."""
    name: str
    """Unique name of the version, ``tenant/adapter@version`` (vLLM compares LoRA requests
    by name, so it must differ between versions)."""
    path: Path
    """Directory holding the verified ``adapter_config.json`` + ``adapter_model.safetensors``."""
    rank: int
    """LoRA rank r as read from the verified ``adapter_config.json``."""


@dataclass(frozen=True, slots=True)
class Sampling:
    """Sampling parameters of one generation (every field of the public request that
    reaches the engine; see the gateway README's field table)."""

    max_tokens: int
    temperature: float
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    """Choices to generate (chunks say which one by ``index``)."""
    logprobs: int | None = None
    """``None``: no log probabilities; k: the chosen token's and the top k per token."""
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias added to its logit), sorted by token id."""


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """Log probability of one generated token, with the top alternatives."""

    token_id: int
    token: str
    logprob: float
    top: tuple[tuple[int, str, float], ...] = ()
    """(token id, text, logprob) of the most likely tokens at this position."""


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One generation: the adapter is always set (the base model is served through the
    worker's all-zero adapter, never as a no-LoRA request)."""

    request_id: str
    prompt: str
    sampling: Sampling
    adapter: EngineAdapter
    priority: int = 0
    """Engine scheduling priority, lower first (vLLM ``priority`` under
    ``scheduling_policy="priority"``): the request's band, :mod:`loraplane.shared.ordering`."""
    stream_tokens: int = 1
    """Tokens per streamed chunk (vLLM ``stream_interval``; the first and last chunks come
    at once): more than 1 for work nobody reads token by token (background, canary)."""


@dataclass(frozen=True, slots=True)
class EngineTiming:
    """Where one generation spent its time inside the engine (on its last chunk).

    Timestamps are the engine core's ``time.monotonic()`` (CLOCK_MONOTONIC: the same clock
    as this process's on one host), in seconds."""

    queued_at: float
    """Entered the engine's waiting queue."""
    scheduled_at: float
    """First scheduled into a batch."""
    first_token_at: float
    """First output token."""
    last_token_at: float
    """Last output token."""
    output_tokens: int = 0
    """Tokens generated."""

    @property
    def queue_s(self) -> float:
        """Seconds in the engine's waiting queue."""
        return max(0.0, self.scheduled_at - self.queued_at)

    @property
    def prefill_s(self) -> float:
        """Seconds from scheduling to the first token (prefill, with the batch it shared)."""
        return max(0.0, self.first_token_at - self.scheduled_at)

    @property
    def decode_s(self) -> float:
        """Seconds from the first token to the last (every decode step it shared)."""
        return max(0.0, self.last_token_at - self.first_token_at)


@dataclass(frozen=True, slots=True)
class EngineChunk:
    """Output since the previous chunk of one generation."""

    text: str
    token_ids: tuple[int, ...]
    finished: bool
    """The whole generation (every choice) has ended: the last chunk."""
    finish_reason: str | None = None
    """``"stop"``, ``"length"`` or ``"abort"`` on the last chunk of choice ``index``."""
    prompt_tokens: int = 0
    """Prompt length in tokens (set on every chunk)."""
    index: int = 0
    """Choice the chunk belongs to (0 .. n-1)."""
    logprobs: tuple[TokenLogprob, ...] = ()
    """One per token of ``token_ids`` when the request asked for log probabilities."""
    timing: EngineTiming | None = None
    """On the last chunk, when the engine reports it: time in its queue, prefill, decode."""


@runtime_checkable
class Engine(Protocol):
    """An inference engine serving one base model with LoRA adapters."""

    @property
    def limits(self) -> EngineLimits:
        """The LoRA limits the engine was started with."""
        ...

    @property
    def base_model_dir(self) -> Path:
        """Directory of the served base model."""
        ...

    async def register(self, adapter: EngineAdapter) -> None:
        """Load the adapter into the engine (idempotent for an already registered id)."""
        ...

    async def unregister(self, engine_id: int) -> None:
        """Remove the adapter from the engine (no-op when absent)."""
        ...

    async def pin(self, engine_id: int) -> None:
        """Keep the registered adapter in the engine's slots (never evicted by the engine)."""
        ...

    async def unpin(self, adapter: EngineAdapter) -> None:
        """Release the pin of a registered adapter (it stays registered)."""
        ...

    async def list(self) -> set[int]:
        """Engine ids of every registered adapter."""
        ...

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        """Stream the generation; closing the iterator early aborts the request."""
        ...

    async def abort(self, request_id: str) -> None:
        """Abort a running request (no-op when it is unknown or finished)."""
        ...

    def unfinished_requests(self) -> int:
        """Requests the engine is still running."""
        ...

    @property
    def dead(self) -> bool:
        """True once the engine has failed for good."""
        ...

    async def close(self) -> None:
        """Shut the engine down."""
        ...
