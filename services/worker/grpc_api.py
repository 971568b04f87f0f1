"""``loraplane.v1.WorkerInternal``: the gateway's ``Generate`` and ``GetState``.

``Generate`` streams tokens of one request on an exact adapter version:

* validation first (ids, prompt, base model, rank: a rank above the engine's max is
  refused here with FAILED_PRECONDITION, before the engine sees it);
* the version is held for the whole stream (:meth:`AdapterManager.use`): promoted from
  WARM, or loaded from COLD when the request may wait (``cold_budget_ms`` > 0 or a
  background / canary request with an ``artifact_uri``), else UNAVAILABLE; on a full
  worker room is made (the policy's victim) or the request queues for a HOT slot within
  ``cold_budget_ms`` (what is left of its class budget; without one, until ``deadline``),
  then RESOURCE_EXHAUSTED with a retry hint;
* the first message carries ``resolved`` (version, tier at arrival, worker), the last
  ``finished``, ``finish_reason`` and ``usage``;
* the request's ``deadline`` bounds the time to the first token; the gRPC deadline and
  client cancellation end the handler, which aborts the request in the engine;
* every failure is a classified error (see :mod:`loraplane.worker.errors`) mapped to its
  status by the shared interceptor; a ``RequestCompleted`` heat event is emitted for
  every request, with its final status.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import grpc

from loraplane.policy.model import RequestClass
from loraplane.shared.errors import DeadlineExceeded, LoraplaneError
from loraplane.shared.ordering import engine_priority
from loraplane.shared.topics import new_meta
from loraplane.v1 import common_pb2, events_pb2, inference_pb2, worker_pb2, worker_pb2_grpc
from loraplane.worker.engine import EngineRequest, EngineTiming, Sampling, TokenLogprob
from loraplane.worker.errors import BadRequest, BaseModelNotServed
from loraplane.worker.guard import SafeEngine, check_rank
from loraplane.worker.host_tier import ArtifactSpec
from loraplane.worker.manager import POLICY_CLASSES, TIER_NAMES, AdapterManager, Tier

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
HeatSink = Callable[[events_pb2.RequestCompleted], None]
StateFn = Callable[[], events_pb2.WorkerState]

WAITING_CLASSES = (common_pb2.REQUEST_CLASS_BACKGROUND, common_pb2.REQUEST_CLASS_CANARY)
"""Request classes that may wait for a cold load without a cold budget."""
MAX_CHOICES = 16
"""Largest ``n`` (choices of one request)."""
MAX_LOGPROBS = 20
"""Largest ``logprobs`` (alternatives per token; vLLM's default ``max_logprobs``)."""


def _now() -> datetime:
    return datetime.now(UTC)


def _logprob_msg(lp: TokenLogprob) -> inference_pb2.TokenLogprob:
    return inference_pb2.TokenLogprob(
        token_id=lp.token_id, token=lp.token, logprob=lp.logprob,
        top=[inference_pb2.TopLogprob(token_id=t, token=text, logprob=v)
             for t, text, v in lp.top],
    )


class WorkerService(worker_pb2_grpc.WorkerInternalServicer):
    """Implementation of ``WorkerInternal``."""

    def __init__(
        self,
        manager: AdapterManager,
        engine: SafeEngine,
        *,
        worker_id: str,
        heat: HeatSink,
        state: StateFn,
        default_max_tokens: int = 64,
        default_temperature: float = 0.0,
        clock: Clock = _now,
        background_stream_tokens: int = 1,
    ) -> None:
        """``heat`` receives one ``RequestCompleted`` per request; ``state`` builds snapshots;
        ``background_stream_tokens``: tokens per chunk of background and canary requests."""
        self.manager = manager
        self.engine = engine
        self.worker_id = worker_id
        self.heat = heat
        self.state = state
        self.default_max_tokens = default_max_tokens
        self.default_temperature = default_temperature
        self.clock = clock
        self.background_stream_tokens = background_stream_tokens

    async def GetState(
        self, request: worker_pb2.GetStateRequest, context: grpc.aio.ServicerContext
    ) -> events_pb2.WorkerState:
        """Current snapshot of the worker."""
        return self.state()

    # ------------------------------------------------------------------ validation

    def _spec(self, request: worker_pb2.WorkerGenerateRequest) -> ArtifactSpec | None:
        ref = request.adapter
        if request.use_base or not ref.adapter_name:
            return None
        if not ref.tenant_id or not ref.version:
            raise BadRequest("adapter needs tenant_id, adapter_name and version")
        if request.engine_id < 1:
            raise BadRequest("engine_id must be the registry's id of the version (> 0)")
        if not request.sha256:
            raise BadRequest("sha256 of the version is required")
        return ArtifactSpec(
            engine_id=request.engine_id, tenant_id=ref.tenant_id, adapter_name=ref.adapter_name,
            version=ref.version, base_model=ref.base_model or request.base_model,
            artifact_uri=request.artifact_uri, sha256=request.sha256,
            size_bytes=request.size_bytes, rank=request.rank,
        )

    def _sampling(self, params: inference_pb2.GenerateRequest) -> Sampling:
        max_tokens = params.max_tokens or self.default_max_tokens
        if max_tokens < 0:
            raise BadRequest(f"max_tokens {max_tokens} is negative")
        temperature = params.temperature if params.HasField("temperature") else (
            self.default_temperature
        )
        if temperature < 0:
            raise BadRequest(f"temperature {temperature} is negative")
        top_p = params.top_p if params.HasField("top_p") else 1.0
        if not 0 < top_p <= 1:
            raise BadRequest(f"top_p {top_p} is not in (0, 1]")
        n = params.n or 1
        if not 1 <= n <= MAX_CHOICES:
            raise BadRequest(f"n {n} is not within 1..{MAX_CHOICES}")
        if n > 1 and temperature == 0:
            raise BadRequest(f"n {n} needs a temperature > 0 (greedy sampling has one answer; "
                             f"an unset temperature is this worker's default "
                             f"{self.default_temperature:g})")
        logprobs = params.logprobs if params.HasField("logprobs") else None
        if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
            raise BadRequest(f"logprobs {logprobs} is not within 0..{MAX_LOGPROBS}")
        penalties = {}
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(params, name) if params.HasField(name) else 0.0
            if not -2.0 <= value <= 2.0:
                raise BadRequest(f"{name} {value} is not within -2..2")
            penalties[name] = value
        if logprobs is not None and params.echo:
            raise BadRequest("echo with logprobs is not supported (prompt log probabilities "
                             "are not returned)")
        bias = tuple(sorted(params.logit_bias.items()))
        for token_id, value in bias:
            if token_id < 0 or not -100.0 <= value <= 100.0:
                raise BadRequest(f"logit_bias {token_id}: {value} is not a token id >= 0 "
                                 "with a bias within -100..100")
        return Sampling(
            max_tokens=max_tokens, temperature=temperature, top_p=top_p,
            seed=params.seed if params.HasField("seed") else None, stop=tuple(params.stop),
            n=n, logprobs=logprobs, logit_bias=bias, **penalties,
        )

    def _validate(
        self, request: worker_pb2.WorkerGenerateRequest
    ) -> tuple[ArtifactSpec | None, Sampling]:
        if not request.request_id:
            raise BadRequest("request_id is required")
        if not request.params.prompt:
            raise BadRequest("prompt is empty")
        base_model = request.base_model or request.adapter.base_model
        if base_model and base_model != self.manager.base_model:
            raise BaseModelNotServed(
                f"base model {base_model!r} is not served here ({self.manager.base_model!r})"
            )
        spec = self._spec(request)
        if spec is not None and spec.rank:
            check_rank(spec.rank, self.engine.limits)
        return spec, self._sampling(request.params)

    # ------------------------------------------------------------------ Generate

    async def Generate(
        self, request: worker_pb2.WorkerGenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        """Stream one generation (see the module docstring)."""
        started = time.perf_counter()
        spec: ArtifactSpec | None = None
        labels = self.manager.labels(None)
        labels["tenant"] = request.adapter.tenant_id
        tier: Tier = common_pb2.TIER_UNSPECIFIED
        code = grpc.StatusCode.OK
        ttft_s: float | None = None
        prompt_tokens = output_tokens = 0
        in_flight = None
        try:
            spec, sampling = self._validate(request)
            if spec is not None:
                labels = self.manager.labels(spec)
            in_flight = self.manager.metrics.in_flight.labels(**labels)
            in_flight.inc()
            allow_cold = bool(request.artifact_uri) and (
                request.cold_budget_ms > 0 or request.request_class in WAITING_CLASSES
            )
            cold_timeout = request.cold_budget_ms / 1000.0 if request.cold_budget_ms > 0 else None
            first_token_timeout = self._first_token_timeout(request)
            async with self.manager.use(
                spec, allow_cold=allow_cold, cold_timeout_s=cold_timeout,
                never_evict=request.never_evict, request_class=request.request_class,
                wait_s=first_token_timeout, priority=request.priority,
            ) as lease:
                tier = lease.tier_at_arrival
                engine_request = EngineRequest(
                    request_id=request.request_id, prompt=request.params.prompt,
                    sampling=sampling, adapter=lease.adapter,
                    priority=engine_priority(request.request_class, request.priority),
                    stream_tokens=(self.background_stream_tokens
                                   if request.request_class in WAITING_CLASSES else 1),
                )
                stream = self.engine.generate(engine_request)
                finished = False
                echo = request.params.prompt if request.params.echo else None
                echoed: set[int] = set()
                try:
                    resolved: inference_pb2.ResolvedAdapter | None = self._resolved(
                        request, tier
                    )
                    while True:
                        timeout = None
                        if ttft_s is None and first_token_timeout is not None:
                            timeout = first_token_timeout - (time.perf_counter() - started)
                            if timeout <= 0:
                                raise DeadlineExceeded("request deadline passed before the "
                                                       "first token")
                        try:
                            chunk = await asyncio.wait_for(anext(stream), timeout)
                        except StopAsyncIteration:
                            break
                        except TimeoutError:
                            raise DeadlineExceeded(
                                "no first token before the request deadline"
                            ) from None
                        if ttft_s is None and (chunk.token_ids or chunk.finished):
                            ttft_s = time.perf_counter() - started
                        prompt_tokens = chunk.prompt_tokens or prompt_tokens
                        output_tokens += len(chunk.token_ids)
                        text = chunk.text
                        if echo is not None and chunk.index not in echoed:
                            echoed.add(chunk.index)  # each choice starts with the prompt
                            text = echo + text
                        msg = inference_pb2.GenerateResponse(
                            text=text, token_ids=list(chunk.token_ids),
                            finished=chunk.finished, index=chunk.index,
                            finish_reason=chunk.finish_reason or "",
                            logprobs=[_logprob_msg(lp) for lp in chunk.logprobs],
                        )
                        if resolved is not None:
                            msg.resolved.CopyFrom(resolved)
                            resolved = None
                        if chunk.timing is not None:
                            self._record_engine_time(request.request_class, chunk.timing)
                        if chunk.finished:
                            finished = True
                            msg.finish_reason = chunk.finish_reason or "stop"
                            msg.usage.CopyFrom(inference_pb2.Usage(
                                prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                                ttft_ms=(ttft_s or 0.0) * 1000.0,
                                duration_ms=(time.perf_counter() - started) * 1000.0,
                            ))
                        yield msg
                        if finished:
                            break
                finally:
                    await stream.aclose()  # type: ignore[attr-defined]
                    if not finished:
                        await self.engine.abort(request.request_id)
        except LoraplaneError as exc:
            code = exc.grpc_code
            raise
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except GeneratorExit:
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception:
            code = grpc.StatusCode.INTERNAL
            raise
        finally:
            if in_flight is not None:
                in_flight.dec()
            self._record(request, spec, labels, tier, code, started, ttft_s, prompt_tokens,
                         output_tokens)

    def _record_engine_time(self, request_class: int, timing: EngineTiming) -> None:
        m = self.manager.metrics
        klass = POLICY_CLASSES.get(request_class, RequestClass.BACKGROUND).value
        for phase, seconds in (("queue", timing.queue_s), ("prefill", timing.prefill_s),
                               ("decode", timing.decode_s)):
            m.engine_seconds.labels(self.manager.base_model, klass, phase).observe(seconds)

    def _first_token_timeout(self, request: worker_pb2.WorkerGenerateRequest) -> float | None:
        if not request.HasField("deadline"):
            return None
        deadline: datetime = request.deadline.ToDatetime(tzinfo=UTC)
        return (deadline - self.clock()).total_seconds()

    def _resolved(
        self, request: worker_pb2.WorkerGenerateRequest, tier: Tier
    ) -> inference_pb2.ResolvedAdapter:
        ref = common_pb2.AdapterRef()
        ref.CopyFrom(request.adapter)
        if request.use_base:
            ref.adapter_name = ""
            ref.version = ""
        ref.base_model = self.manager.base_model
        return inference_pb2.ResolvedAdapter(
            adapter=ref, tier_at_arrival=tier,
            degraded_to_base=request.use_base and bool(request.adapter.adapter_name),
            worker_id=self.worker_id, request_id=request.request_id,
        )

    def _record(
        self,
        request: worker_pb2.WorkerGenerateRequest,
        spec: ArtifactSpec | None,
        labels: dict[str, str],
        tier: Tier,
        code: grpc.StatusCode,
        started: float,
        ttft_s: float | None,
        prompt_tokens: int,
        output_tokens: int,
    ) -> None:
        m = self.manager.metrics
        tier_name = TIER_NAMES.get(tier, "unknown")
        duration_s = time.perf_counter() - started
        m.requests.labels(**labels, tier=tier_name, code=code.name).inc()
        if ttft_s is not None:
            m.ttft.labels(**labels, tier=tier_name).observe(ttft_s)
        if prompt_tokens:
            m.tokens.labels(**labels, kind="prompt").inc(prompt_tokens)
        if output_tokens:
            m.tokens.labels(**labels, kind="output").inc(output_tokens)
        ref = common_pb2.AdapterRef()
        ref.CopyFrom(request.adapter)
        if spec is None:
            ref.adapter_name = ""
            ref.version = ""
        ref.base_model = ref.base_model or self.manager.base_model
        completed = events_pb2.RequestCompleted(
            meta=new_meta(f"worker/{self.worker_id}", ref, clock=self.clock,
                          correlation_id=request.request_id),
            request_id=request.request_id, worker_id=self.worker_id,
            request_class=request.request_class, tier_at_arrival=tier,
            ttft_ms=(ttft_s or 0.0) * 1000.0, duration_ms=duration_s * 1000.0,
            prompt_tokens=prompt_tokens, output_tokens=output_tokens,
            status_code=code.value[0],
            degraded_to_base=request.use_base and bool(request.adapter.adapter_name),
            engine_id=spec.engine_id if spec is not None else 0,
        )
        try:
            self.heat(completed)
        except Exception:
            log.exception("heat sink failed")
