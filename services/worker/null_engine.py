"""A null engine: no model, fixed tokens. For control-plane benchmarks ONLY.

It lets a benchmark measure the worker's own overhead (gRPC, admission of the version,
in-flight accounting, heat events) or drive many workers on one machine. It is never a
default, never what a test of the worker's behaviour runs on, and never started by
``python -m loraplane.worker``: a benchmark builds it explicitly::

    engine = NullEngine(settings.limits, settings.base_model_dir, token_delay_s=0.0)
    app = WorkerApp(settings, engine)

Every generated token id is ``engine_id % 1000`` of the request's adapter (the base
model goes through the zero adapter, like on a real engine). ``tokens_per_chunk`` > 1
puts up to that many tokens in one chunk, as vLLM does with ``RequestOutputKind.DELTA``
when tokens are produced faster than the consumer reads them (its output collector merges
the deltas it holds); 1 (the default) is one chunk per token.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from loraplane.worker.engine import EngineAdapter, EngineChunk, EngineLimits, EngineRequest


class NullEngine:
    """:class:`~loraplane.worker.engine.Engine` that generates fixed tokens instantly."""

    def __init__(self, limits: EngineLimits, base_model_dir: Path, *,
                 token_delay_s: float = 0.0, prompt_tokens: int = 8,
                 tokens_per_chunk: int = 1) -> None:
        """``token_delay_s``: simulated time per output token; ``tokens_per_chunk``: most
        tokens in one chunk (see the module doc)."""
        if tokens_per_chunk < 1:
            raise ValueError("tokens_per_chunk must be >= 1")
        self._limits = limits
        self._base_model_dir = Path(base_model_dir)
        self.token_delay_s = token_delay_s
        self.prompt_tokens = prompt_tokens
        self.tokens_per_chunk = tokens_per_chunk
        self._registered: dict[int, EngineAdapter] = {}
        self._pinned: set[int] = set()
        self._running: set[str] = set()
        self._aborted: set[str] = set()

    @property
    def limits(self) -> EngineLimits:
        """The limits it pretends to have."""
        return self._limits

    @property
    def base_model_dir(self) -> Path:
        """The base model directory (only its config.json is read, for the zero adapter)."""
        return self._base_model_dir

    @property
    def dead(self) -> bool:
        """Never dies."""
        return False

    async def register(self, adapter: EngineAdapter) -> None:
        """Remember the adapter."""
        self._registered[adapter.engine_id] = adapter

    async def unregister(self, engine_id: int) -> None:
        """Forget the adapter."""
        self._registered.pop(engine_id, None)
        self._pinned.discard(engine_id)

    async def pin(self, engine_id: int) -> None:
        """Mark pinned."""
        self._pinned.add(engine_id)

    async def unpin(self, adapter: EngineAdapter) -> None:
        """Mark unpinned."""
        self._pinned.discard(adapter.engine_id)

    async def list(self) -> set[int]:
        """Registered ids."""
        return set(self._registered)

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        """``max_tokens`` tokens, ``tokens_per_chunk`` (or fewer, at the end) per chunk."""
        token = request.adapter.engine_id % 1000
        n = request.sampling.max_tokens
        per = self.tokens_per_chunk
        self._running.add(request.request_id)
        try:
            for start in range(0, n, per):
                k = min(per, n - start)
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s * k)
                if request.request_id in self._aborted:
                    yield EngineChunk("", (), True, "abort", self.prompt_tokens)
                    return
                last = start + k == n
                yield EngineChunk(f"t{token} " * k, (token,) * k, last,
                                  "length" if last else None, self.prompt_tokens)
        finally:
            self._running.discard(request.request_id)
            self._aborted.discard(request.request_id)

    async def abort(self, request_id: str) -> None:
        """Stop a running request at its next token."""
        if request_id in self._running:
            self._aborted.add(request_id)

    def unfinished_requests(self) -> int:
        """Requests running now."""
        return len(self._running)

    async def close(self) -> None:
        """Nothing to release."""
