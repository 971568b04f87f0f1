"""Every sampling field of ``GenerateRequest`` through the worker service on the null
engine (no model): honoured (``n`` choices by index, ``logprobs``, ``echo``, stop strings,
``logit_bias``) or refused with INVALID_ARGUMENT naming it, as the vLLM engine does; and
the mapping onto the engine's :class:`Sampling` of every field."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry
from worker_fakes import BASE, DIMS, LIMITS, DirStore

from loraplane.devkit.keys import DevKeyPair
from loraplane.v1 import inference_pb2, worker_pb2, worker_pb2_grpc
from loraplane.worker.app import WorkerApp
from loraplane.worker.engine import EngineRequest, Sampling
from loraplane.worker.null_engine import NullEngine
from loraplane.worker.settings import ZERO_ADAPTER_ENGINE_ID, WorkerSettings

TOKEN = ZERO_ADAPTER_ENGINE_ID % 1000


class Recording(NullEngine):
    """The null engine, remembering the engine requests it got."""

    requests: list[EngineRequest]

    def generate(self, request: EngineRequest) -> AsyncIterator:  # type: ignore[override]
        self.requests.append(request)
        return super().generate(request)


@pytest.fixture
async def app(tmp_path: Path, store: DirStore, keys: DevKeyPair) -> AsyncIterator[WorkerApp]:
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text(json.dumps({
        "num_hidden_layers": DIMS.num_layers, "hidden_size": DIMS.hidden,
        "num_attention_heads": DIMS.heads, "num_key_value_heads": DIMS.kv_heads,
        "head_dim": DIMS.head_dim, "intermediate_size": DIMS.intermediate}))
    settings = WorkerSettings(
        worker_id="w-fields", worker_grpc_port=0, worker_metrics_port=0, base_model=BASE,
        base_model_dir=base, trusted_keys=str(keys.public_key), worker_host_dir=tmp_path / "h",
        worker_max_loras=LIMITS.max_loras, worker_max_cpu_loras=LIMITS.max_cpu_loras,
        worker_max_lora_rank=LIMITS.max_lora_rank)
    engine = Recording(LIMITS, base)
    engine.requests = []
    worker = WorkerApp(settings, engine, store=store, registry=CollectorRegistry(), kafka=False)
    await worker.start()
    try:
        yield worker
    finally:
        await worker.stop(grace_s=0.5)


def base_request(**params: object) -> worker_pb2.WorkerGenerateRequest:
    req = worker_pb2.WorkerGenerateRequest(
        request_id="r1", base_model=BASE, use_base=True,
        params=inference_pb2.GenerateRequest(prompt="hi ", max_tokens=3, **params))
    req.adapter.tenant_id = "acme"
    return req


async def call(app: WorkerApp, req: worker_pb2.WorkerGenerateRequest
               ) -> list[inference_pb2.GenerateResponse]:
    async with grpc.aio.insecure_channel(app.grpc_address) as ch:
        stub = worker_pb2_grpc.WorkerInternalStub(ch)
        return [m async for m in stub.Generate(req, timeout=10)]


def choices(msgs: list[inference_pb2.GenerateResponse]) -> dict[int, str]:
    out: dict[int, str] = {}
    for m in msgs:
        out[m.index] = out.get(m.index, "") + m.text
    return out


def sampling_of(app: WorkerApp) -> Sampling:
    engine = app.engine.inner
    assert isinstance(engine, Recording)
    return engine.requests[-1].sampling


async def test_every_field_reaches_the_engine(app: WorkerApp) -> None:
    await call(app, base_request(temperature=0.5, top_p=0.75, seed=3, stop=["x"], n=2,
                                 logprobs=4, presence_penalty=1.0, frequency_penalty=-1.0,
                                 logit_bias={5: 2.5, 1: -3.0}))
    assert sampling_of(app) == Sampling(
        max_tokens=3, temperature=0.5, top_p=0.75, seed=3, stop=("x",), n=2, logprobs=4,
        presence_penalty=1.0, frequency_penalty=-1.0, logit_bias=((1, -3.0), (5, 2.5)))
    await call(app, base_request())
    assert sampling_of(app) == Sampling(max_tokens=3, temperature=0.0)  # the defaults


async def test_n_choices_logprobs_echo_stop_and_bias_are_honoured(app: WorkerApp) -> None:
    msgs = await call(app, base_request(n=3, temperature=1.0, logprobs=2))
    word = f"t{TOKEN} "
    assert choices(msgs) == {0: word * 3, 1: word * 3, 2: word * 3}
    assert [m.index for m in msgs if m.finish_reason] == [0, 1, 2]
    assert msgs[-1].finished and msgs[-1].usage.output_tokens == 9
    assert sum(len(m.logprobs) for m in msgs) == 9
    lp = next(m.logprobs[0] for m in msgs if m.logprobs)
    assert (lp.token_id, lp.logprob, [t.token_id for t in lp.top]) == (TOKEN, 0.0, [TOKEN])
    assert msgs[0].resolved.worker_id == "w-fields"

    echoed = await call(app, base_request(echo=True, n=2, temperature=1.0))
    assert choices(echoed) == {0: "hi " + word * 3, 1: "hi " + word * 3}
    assert echoed[-1].usage.output_tokens == 6  # the prompt is no output

    stopped = await call(app, base_request(stop=[f"{word}{word}"]))
    assert choices(stopped) == {0: word} and stopped[-1].finish_reason == "stop"

    biased = await call(app, base_request(logit_bias={42: 100.0}))
    assert [t for m in biased for t in m.token_ids] == [42, 42, 42]
    plain = await call(app, base_request())
    assert not any(m.logprobs for m in plain) and [m.index for m in plain] == [0] * len(plain)


@pytest.mark.parametrize(("params", "named"), [
    ({"n": 17}, "n 17 is not within 1..16"),
    ({"n": 2}, "n 2 needs a temperature > 0"),
    ({"logprobs": 21}, "logprobs 21 is not within 0..20"),
    ({"logprobs": 1, "echo": True}, "echo with logprobs is not supported"),
    ({"presence_penalty": 2.5}, "presence_penalty 2.5 is not within -2..2"),
    ({"frequency_penalty": -3.0}, "frequency_penalty -3.0 is not within -2..2"),
    ({"logit_bias": {1: 150.0}}, "logit_bias 1: 150.0"),
])
async def test_out_of_range_values_are_invalid_argument(app: WorkerApp, params: dict[str, object],
                                                        named: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(app, base_request(**params))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert named in (err.value.details() or "")


async def test_background_streams_in_chunks_interactive_every_token(app: WorkerApp) -> None:
    """Background and canary requests reach the engine with the worker's
    ``worker_background_stream_tokens`` (16) tokens per chunk; interactive ones with 1."""
    from loraplane.v1 import common_pb2

    engine = app.engine.inner
    assert isinstance(engine, Recording)
    for klass, tokens in ((common_pb2.REQUEST_CLASS_INTERACTIVE, 1),
                          (common_pb2.REQUEST_CLASS_BACKGROUND, 16),
                          (common_pb2.REQUEST_CLASS_CANARY, 16),
                          (common_pb2.REQUEST_CLASS_UNSPECIFIED, 1)):
        req = base_request()
        req.request_id = f"r-{klass}"
        req.request_class = klass
        await call(app, req)
        assert engine.requests[-1].stream_tokens == tokens, klass


def test_vllm_request_stats_become_engine_timing() -> None:
    """vLLM's ``RequestOutput.metrics`` (engine-core monotonic timestamps) → the phases;
    no stats (vLLM's stats off, or a request never scheduled) → no timing."""
    from types import SimpleNamespace

    from loraplane.worker.engine import EngineTiming
    from loraplane.worker.vllm_engine import _timing

    stats = SimpleNamespace(queued_ts=10.0, scheduled_ts=10.25, first_token_ts=10.5,
                            last_token_ts=11.5, num_generation_tokens=8)
    t = _timing(SimpleNamespace(metrics=stats))
    assert t == EngineTiming(10.0, 10.25, 10.5, 11.5, 8)
    assert (t.queue_s, t.prefill_s, t.decode_s) == (0.25, 0.25, 1.0)
    assert _timing(SimpleNamespace(metrics=None)) is None
    assert _timing(SimpleNamespace(metrics=SimpleNamespace(
        queued_ts=10.0, scheduled_ts=0.0, first_token_ts=0.0, last_token_ts=0.0))) is None


async def test_engine_timing_is_recorded_by_class_and_phase(app: WorkerApp) -> None:
    """The last chunk's timing lands in ``loraplane_worker_engine_seconds``."""
    from loraplane.worker.engine import EngineChunk, EngineTiming

    engine = app.engine.inner
    assert isinstance(engine, Recording)
    timing = EngineTiming(1.0, 1.5, 2.0, 4.0, 3)
    plain = NullEngine.generate

    async def timed(self: NullEngine, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        async for chunk in plain(self, request):
            if chunk.finished:
                chunk = EngineChunk(chunk.text, chunk.token_ids, True, chunk.finish_reason,
                                    chunk.prompt_tokens, timing=timing)
            yield chunk

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(NullEngine, "generate", timed)
        await call(app, base_request())
    reg = app.metrics_registry
    for phase, seconds in (("queue", 0.5), ("prefill", 0.5), ("decode", 2.0)):
        labels = {"base_model": BASE, "request_class": "interactive", "phase": phase}
        assert reg.get_sample_value("loraplane_worker_engine_seconds_sum", labels) == seconds
