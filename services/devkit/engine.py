"""Drive a vLLM ``AsyncLLM`` on the tiny model directly (smoke test, references of the
stress run): :func:`lora_request` and :func:`generate_greedy`. Starting and stopping the
engine is the worker's (:mod:`loraplane.worker.engine_start`, re-exported here).

vLLM is imported lazily: importing this module costs nothing. vLLM starts its
engine-core process with ``spawn`` (on CPU and when CUDA is initialised), so a
script that starts an engine must guard its entry point with
``if __name__ == "__main__":``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loraplane.worker.engine_start import (
    VLLM_LORA_RANKS,
    EngineOptions,
    StartedEngine,
    engine_args,
    engine_environment,
    shutdown_engine,
    start_engine,
)

__all__ = [
    "VLLM_LORA_RANKS", "EngineOptions", "Generation", "StartedEngine", "engine_args",
    "engine_environment", "generate_greedy", "lora_request", "shutdown_engine", "start_engine",
]

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest
    from vllm.v1.engine.async_llm import AsyncLLM


def lora_request(lora_id: int, name: str, path: Path) -> LoRARequest:
    """A ``LoRARequest``; ``lora_id`` must be a stable id > 0 (from the registry)."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name=name, lora_int_id=lora_id, lora_path=str(path))


@dataclass(frozen=True)
class Generation:
    """Result of one greedy generation."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None


async def generate_greedy(
    engine: AsyncLLM,
    prompt: str,
    *,
    max_tokens: int = 16,
    lora: LoRARequest | None = None,
    ignore_eos: bool = True,
    request_id: str | None = None,
) -> Generation:
    """Greedy (temperature 0) completion of ``prompt``; fixed length by default."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)
    final: Any = None
    async for output in engine.generate(
        prompt, params, request_id=request_id or uuid.uuid4().hex, lora_request=lora
    ):
        final = output
    if final is None or not final.outputs:
        raise RuntimeError("engine returned no output")
    completion = final.outputs[0]
    return Generation(
        text=completion.text,
        token_ids=tuple(completion.token_ids),
        finish_reason=completion.finish_reason,
    )
