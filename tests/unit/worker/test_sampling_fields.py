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
