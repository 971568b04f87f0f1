"""vLLM smoke test: the tiny model and the demo adapters on a real ``AsyncLLM``.

One engine per module (start ~15-20 s, ~3 GB RAM), shut down at the end.
Requests are sent one at a time unless a test says otherwise: on the CPU
backend a no-LoRA request batched with LoRA requests gets an adapter's output
(FACTS.md), which is what the zero adapter works around.

Run: ``.venv/bin/python -m pytest -m engine tests/integration/engine -s``
(``-s`` shows the measured start / add_lora times).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from loraplane.devkit.builder import DemoManifest, build_demo
from loraplane.devkit.engine import (
    EngineOptions,
    Generation,
    generate_greedy,
    lora_request,
    shutdown_engine,
    start_engine,
)

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = pytest.mark.engine

PROMPT = "Hello, how can I help you today?"
MAX_TOKENS = 16


@dataclass
class Served:
    demo: DemoManifest
    engine: AsyncLLM
    start_seconds: float
    build_seconds: float


@pytest.fixture(scope="module")
def demo_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[DemoManifest, float]:
    started = time.perf_counter()
    demo = build_demo(tmp_path_factory.mktemp("engine") / "models")
    return demo, time.perf_counter() - started


@pytest.fixture(scope="module")
async def served(demo_build: tuple[DemoManifest, float]) -> AsyncIterator[Served]:
    demo, build_seconds = demo_build
    started = await start_engine(demo.base_model.dir, EngineOptions())
    print(f"\n[measure] demo build {build_seconds:.2f}s, engine start {started.start_seconds:.1f}s")
    served = Served(demo, started.engine, started.start_seconds, build_seconds)
    del started
    try:
        yield served
    finally:
        shutdown_engine(served.engine)
        # Collect the engine now: AsyncLLM.__del__ shuts down again and fails if it
        # only runs at interpreter exit, after vLLM's module globals are gone.
        del served.engine
        gc.collect()


async def _gen(served: Served, lora: LoRARequest | None = None) -> Generation:
    return await generate_greedy(served.engine, PROMPT, max_tokens=MAX_TOKENS, lora=lora)


async def test_base_model_generates_deterministically(served: Served) -> None:
    first = await _gen(served)
    second = await _gen(served)
    assert len(first.token_ids) == MAX_TOKENS
    assert first.token_ids == second.token_ids


async def test_adapters_change_output_and_zero_adapter_does_not(served: Served) -> None:
    demo = served.demo
    support = demo.adapter("acme", "support", "2026-11-01.1")
    chat = demo.adapter("globex", "chat")
    engine = served.engine
    reqs = {
        "support": lora_request(1, "acme/support@2026-11-01.1", support.dir),
        "chat": lora_request(2, "globex/chat@2026-11-01.1", chat.dir),
        "zero": lora_request(3, "_system/zero@r8", demo.zero_adapter.dir),
    }
    add_ms = {}
    for key, req in reqs.items():
        t0 = time.perf_counter()
        assert await engine.add_lora(req)
        add_ms[key] = (time.perf_counter() - t0) * 1000
    t0 = time.perf_counter()
    await engine.add_lora(reqs["support"])
    readd_ms = (time.perf_counter() - t0) * 1000
    print(
        f"\n[measure] add_lora cold (ms) { ({k: round(v, 1) for k, v in add_ms.items()}) }, "
        f"re-add {readd_ms:.1f} ms"
    )
    assert {1, 2, 3} <= set(await engine.list_loras())

    base = await _gen(served)
    out = {key: await _gen(served, req) for key, req in reqs.items()}
    print(f"[measure] base {base.text!r}; " + "; ".join(f"{k} {v.text!r}" for k, v in out.items()))
    assert out["support"].token_ids != base.token_ids
    assert out["chat"].token_ids != base.token_ids
    assert out["support"].token_ids != out["chat"].token_ids
    assert out["zero"].token_ids == base.token_ids
    # Same adapter again: same output (greedy, no state leaks between requests).
    assert (await _gen(served, reqs["support"])).token_ids == out["support"].token_ids


async def test_zero_adapter_gives_base_output_when_batched_with_adapters(served: Served) -> None:
    """The CPU-bug workaround: base traffic through the zero adapter, batched with LoRA."""
    demo = served.demo
    base = await _gen(served)
    code = lora_request(4, "acme/code@2026-11-01.1", demo.adapter("acme", "code").dir)
    zero = lora_request(3, "_system/zero@r8", demo.zero_adapter.dir)
    alone = await _gen(served, code)
    together = await asyncio.gather(_gen(served, zero), _gen(served, code), _gen(served, zero))
    assert together[0].token_ids == base.token_ids == together[2].token_ids
    assert together[1].token_ids == alone.token_ids != base.token_ids


async def test_upstream_cpu_bug_base_batched_with_two_adapters(served: Served) -> None:
    """Why the zero adapter exists: a no-LoRA request batched with requests for two
    adapters (every slot busy) gets the last slot's output (vLLM PRs 49656, 48421).

    If this starts failing, upstream fixed the bug and the workaround can go.
    """
    demo = served.demo
    base = await _gen(served)
    code = lora_request(4, "acme/code@2026-11-01.1", demo.adapter("acme", "code").dir)
    support = lora_request(
        1, "acme/support@2026-11-01.1", demo.adapter("acme", "support", "2026-11-01.1").dir
    )
    wrong = 0
    for _ in range(3):
        batch = await asyncio.gather(_gen(served, code), _gen(served, support), _gen(served))
        wrong += batch[2].token_ids != base.token_ids
    assert wrong > 0


async def test_rank_16_all_linear_and_next_version(served: Served) -> None:
    """Rank 16 (max) adapter and a new version of the same name beside the old one."""
    demo = served.demo
    v1 = lora_request(
        1, "acme/support@2026-11-01.1", demo.adapter("acme", "support", "2026-11-01.1").dir
    )
    v2 = lora_request(
        5, "acme/support@2026-11-15.1", demo.adapter("acme", "support", "2026-11-15.1").dir
    )
    legal = lora_request(6, "globex/legal@2026-11-01.1", demo.adapter("globex", "legal").dir)
    a, b, c = await _gen(served, v1), await _gen(served, v2), await _gen(served, legal)
    assert a.token_ids != b.token_ids
    assert c.token_ids not in (a.token_ids, b.token_ids)


def test_engine_paths_are_local(served: Served) -> None:
    assert Path(served.demo.base_model.dir).is_dir()
    assert served.start_seconds > 0
