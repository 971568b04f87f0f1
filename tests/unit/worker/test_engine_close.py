"""``VllmEngine.close`` waits for vLLM's shutdown off the event loop: the shutdown waits for
the engine-core process to exit (up to 30 s), and whatever else runs on the loop — another
worker's state reports, a gateway — goes on meanwhile (issue h12: 16 s without a report
from the other worker of the same test process when it ran on the loop)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from loraplane.worker.engine_start import EngineOptions
from loraplane.worker.vllm_engine import VllmEngine

SHUTDOWN_S = 0.6


class SlowShutdown:
    """Stands in for ``AsyncLLM``: ``shutdown`` blocks as vLLM's does while the engine-core
    process exits."""

    def __init__(self) -> None:
        self.calls: list[tuple[float | None, bool, bool]] = []
        self.output_handler: asyncio.Task[None] | None = None

    def shutdown(self, timeout: float | None = None) -> None:
        handler = self.output_handler
        self.calls.append((timeout, threading.current_thread() is threading.main_thread(),
                           handler is None or handler.done()))
        time.sleep(SHUTDOWN_S)


async def test_close_leaves_the_loop_running_while_the_engine_core_exits() -> None:
    llm = SlowShutdown()
    # vLLM's output handler: it must not be running when the engine core exits
    handler = llm.output_handler = asyncio.create_task(asyncio.Event().wait())
    engine = VllmEngine(llm, Path("/nonexistent"), EngineOptions())  # type: ignore[arg-type]
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:  # a report loop on the same loop
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.02)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(ticker())
    started = time.monotonic()
    await engine.close()
    took = time.monotonic() - started
    done.set()
    await task
    # shut down once, with its timeout, not on the loop, the output handler cancelled first
    assert llm.calls == [(30.0, False, True)]
    assert handler.cancelled()
    assert took >= SHUTDOWN_S * 0.9  # close returns once the shutdown finished
    assert len(gaps) >= 10, gaps  # the loop ran while the shutdown waited
    assert max(gaps) < SHUTDOWN_S / 2, gaps
