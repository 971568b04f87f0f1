"""A null engine: no model, fixed tokens. For control-plane benchmarks ONLY.

It lets a benchmark measure the worker's own overhead (gRPC, admission of the version,
in-flight accounting, heat events) or drive many workers on one machine. It is never a
default, never what a test of the worker's behaviour runs on, and never started by
``python -m loraplane.worker``: a benchmark builds it explicitly::

    engine = NullEngine(settings.limits, settings.base_model_dir, token_delay_s=0.0)
    app = WorkerApp(settings, engine)

Every generated token id is ``engine_id % 1000`` of the request's adapter (the base
model goes through the zero adapter, like on a real engine), or the token with the
largest positive ``logit_bias``: the null "model" puts all probability on that one token,
so temperature, ``top_p``, seeds and penalties leave its output as it is. It honours the
rest of the request as vLLM does: ``n`` choices (chunks carry their ``index``), stop
strings (the text ends before the first one, ``finish_reason`` ``"stop"``) and
``logprobs`` (log probability 0.0, the token itself the only alternative). ``tokens_per_chunk`` > 1
puts up to that many tokens in one chunk, as vLLM does with ``RequestOutputKind.DELTA``
when tokens are produced faster than the consumer reads them (its output collector merges
the deltas it holds); 1 (the default) is one chunk per token.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from loraplane.worker.engine import (
    EngineAdapter,
    EngineChunk,
    EngineLimits,
    EngineRequest,
    TokenLogprob,
)


def _stop_at(text: str, stops: tuple[str, ...]) -> int | None:
    """Where ``text`` ends before its first stop string (None: none occurs)."""
    found = [i for i in (text.find(stop) for stop in stops) if i >= 0]
    return min(found) if found else None


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
        """``max_tokens`` tokens per choice, ``tokens_per_chunk`` (or fewer, at the end) per
        chunk, the choices one after the other."""
        s = request.sampling
        token = request.adapter.engine_id % 1000
        biased = [(v, t) for t, v in s.logit_bias if v > 0]
        if biased:
            token = max(biased)[1]
        word = f"t{token} "
        n = s.max_tokens
        per = self.tokens_per_chunk
        self._running.add(request.request_id)
        try:
            for index in range(s.n):
                text = ""
                for start in range(0, n, per):
                    k = min(per, n - start)
                    if self.token_delay_s:
                        await asyncio.sleep(self.token_delay_s * k)
                    if request.request_id in self._aborted:
                        yield EngineChunk("", (), True, "abort", self.prompt_tokens, index)
                        return
                    delta, reason = word * k, "length" if start + k == n else None
                    cut = _stop_at(text + delta, s.stop)
                    if cut is not None:  # the text ends before the stop string
                        delta, reason = (text + delta)[:cut][len(text):], "stop"
                        k = -(-len(delta) // len(word))
                    text += delta
                    lps = ((TokenLogprob(token, word, 0.0, ((token, word, 0.0),)),) * k
                           if s.logprobs is not None else ())
                    yield EngineChunk(delta, (token,) * k, reason is not None and index == s.n - 1,
                                      reason, self.prompt_tokens, index, lps)
                    if reason is not None:
                        break
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
