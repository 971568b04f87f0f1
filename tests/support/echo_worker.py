"""A stand-in ``WorkerInternal`` server that streams fixed tokens (no engine).

Used by the gateway's tests and, when the worker's null engine is not available,
by ``python -m benchmarks.gateway``. It behaves like a worker on the wire:
the first message carries ``resolved.tier_at_arrival`` (HOT when the version is
in its hot set, else it "loads" it for ``load_ms`` and reports the tier it came
from), then ``max_tokens`` text deltas (``tok0 tok1 …``) for each of the ``n`` choices (by
``index``; with ``echo`` each starts with the prompt; with ``logprobs`` each token has a
log probability of 0.0), and a last message with ``finished`` and ``usage``. It records
the requests it received.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from loraplane.shared.tls import TlsFiles
from loraplane.v1 import common_pb2, events_pb2, inference_pb2, worker_pb2, worker_pb2_grpc

DEFAULT_TOKENS = 8
"""Tokens streamed when a request sets no ``max_tokens``."""


@dataclass
class EchoWorker(worker_pb2_grpc.WorkerInternalServicer):
    """Configurable fake worker (see the module doc)."""

    worker_id: str = "echo-0"
    """Worker id reported in the state."""
    base_models: tuple[str, ...] = ("tiny",)
    """Base models it claims to serve."""
    hot: set[int] = field(default_factory=set)
    """Engine ids that are HOT."""
    warm: set[int] = field(default_factory=set)
    """Engine ids that are WARM (loaded in ``warm_load_ms``)."""
    load_ms: float = 0.0
    """Time a COLD load takes."""
    warm_load_ms: float = 0.0
    """Time a WARM → HOT load takes."""
    token_delay_s: float = 0.0
    """Pause between tokens (0 = none)."""
    fail_with: grpc.StatusCode | None = None
    """Fail every call with this status before the first message."""
    fail_reason: str = ""
    """With ``fail_with``: the ``loraplane-reason`` trailing metadata to send (e.g.
    ``draining``), as the real worker's error interceptor does."""
    requests: list[worker_pb2.WorkerGenerateRequest] = field(default_factory=list)
    """Requests received (when ``record`` is set)."""
    record: bool = True
    """Keep received requests (off for benchmarks)."""
    cancelled: int = 0
    """Streams the caller cancelled."""
    address: str = ""
    """host:port once served."""

    async def Generate(
        self, request: worker_pb2.WorkerGenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        """Stream ``max_tokens`` fixed tokens."""
        if self.record:
            self.requests.append(request)
        if self.fail_with is not None:
            if self.fail_reason:
                context.set_trailing_metadata((("loraplane-reason", self.fail_reason),))
            await context.abort(self.fail_with, f"{self.worker_id} fails on purpose")
        tier = common_pb2.TIER_HOT
        if not request.use_base and request.engine_id not in self.hot:
            if request.engine_id in self.warm:
                tier = common_pb2.TIER_WARM
                delay = self.warm_load_ms
            else:
                tier = common_pb2.TIER_COLD
                delay = self.load_ms
            if delay:
                await asyncio.sleep(delay / 1000.0)
            self.hot.add(request.engine_id)
            self.warm.discard(request.engine_id)
        params = request.params
        n = params.max_tokens or DEFAULT_TOKENS
        choices = params.n or 1
        try:
            yield inference_pb2.GenerateResponse(
                resolved=inference_pb2.ResolvedAdapter(tier_at_arrival=tier),
                text=params.prompt if params.echo else "",
            )
            for index in range(choices):
                if index and params.echo:
                    yield inference_pb2.GenerateResponse(text=params.prompt, index=index)
                for i in range(n):
                    if self.token_delay_s:
                        await asyncio.sleep(self.token_delay_s)
                    msg = inference_pb2.GenerateResponse(text=f"tok{i} ", token_ids=[i],
                                                         index=index)
                    if params.HasField("logprobs"):
                        msg.logprobs.append(inference_pb2.TokenLogprob(
                            token_id=i, token=f"tok{i} ", logprob=0.0,
                            top=[inference_pb2.TopLogprob(token_id=i, token=f"tok{i} ")]))
                    if i == n - 1 and index < choices - 1:
                        msg.finish_reason = "length"
                    yield msg
            yield inference_pb2.GenerateResponse(
                finished=True,
                finish_reason="length",
                index=choices - 1,
                usage=inference_pb2.Usage(
                    prompt_tokens=len(params.prompt.split()), output_tokens=n * choices
                ),
            )
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def GetState(
        self, request: worker_pb2.GetStateRequest, context: grpc.aio.ServicerContext
    ) -> events_pb2.WorkerState:
        """The worker's state (HOT and WARM sets)."""
        return self.state()

    def state(self, seq: int = 1) -> events_pb2.WorkerState:
        """A snapshot as the worker would report it on ``cache.state``."""
        state = events_pb2.WorkerState(
            worker_id=self.worker_id,
            base_models=list(self.base_models),
            grpc_address=self.address,
            seq=seq,
            ready=True,
        )
        for eid in sorted(self.hot):
            state.placements.add(engine_id=eid, tier=common_pb2.TIER_HOT)
        for eid in sorted(self.warm):
            state.placements.add(engine_id=eid, tier=common_pb2.TIER_WARM)
        return state


async def serve_echo_worker(
    worker: EchoWorker, *, port: int = 0, host: str = "127.0.0.1",
    tls: TlsFiles | None = None,
) -> grpc.aio.Server:
    """Start ``worker`` on ``host:port`` (0 = any free port); sets ``worker.address``.
    ``tls``: serve mutual TLS with this (``worker``) certificate, as a real worker does
    (a caller needs a certificate of its CA); ``None``: plaintext."""
    server = grpc.aio.server(options=[("grpc.max_concurrent_streams", 1000)])
    worker_pb2_grpc.add_WorkerInternalServicer_to_server(worker, server)
    bound = (server.add_insecure_port(f"{host}:{port}") if tls is None
             else server.add_secure_port(f"{host}:{port}", tls.server_credentials()))
    await server.start()
    worker.address = f"{host}:{bound}"
    return server
