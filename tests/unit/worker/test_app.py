"""The assembled worker (Kafka off) over the engine double: gRPC statuses, the base model
through the zero adapter, GetState, and engine death making the worker not ready."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry
from worker_fakes import BASE, DIMS, LIMITS, DirStore, MakeAdapter, VllmModel

from loraplane.devkit.keys import DevKeyPair
from loraplane.v1 import common_pb2, inference_pb2, worker_pb2, worker_pb2_grpc
from loraplane.worker.app import WorkerApp
from loraplane.worker.errors import PinLimit
from loraplane.worker.host_tier import ArtifactSpec
from loraplane.worker.settings import ZERO_ADAPTER_ENGINE_ID, WorkerSettings


@pytest.fixture
async def app(tmp_path: Path, store: DirStore, keys: DevKeyPair) -> AsyncIterator[WorkerApp]:
    worker = await start_app(tmp_path, store, keys)
    try:
        yield worker
    finally:
        await worker.stop(grace_s=0.5)


async def start_app(tmp_path: Path, store: DirStore, keys: DevKeyPair, **settings_kw: object
                    ) -> WorkerApp:
    """A started worker over the engine double (``settings_kw``: more WorkerSettings)."""
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text(json.dumps({
        "num_hidden_layers": DIMS.num_layers, "hidden_size": DIMS.hidden,
        "num_attention_heads": DIMS.heads, "num_key_value_heads": DIMS.kv_heads,
        "head_dim": DIMS.head_dim, "intermediate_size": DIMS.intermediate}))
    settings = WorkerSettings(
        worker_id="w-unit", worker_grpc_port=0, worker_metrics_port=0, base_model=BASE,
        base_model_dir=base, trusted_keys=str(keys.public_key), worker_host_dir=tmp_path / "h",
        worker_max_loras=LIMITS.max_loras, worker_max_cpu_loras=LIMITS.max_cpu_loras,
        worker_max_lora_rank=LIMITS.max_lora_rank, **settings_kw)
    model = VllmModel(LIMITS, step_delay_s=0.001)
    worker = WorkerApp(settings, model, store=store, registry=CollectorRegistry(), kafka=False)
    await worker.start()
    return worker


def request(spec: ArtifactSpec | None, **kw: object) -> worker_pb2.WorkerGenerateRequest:
    req = worker_pb2.WorkerGenerateRequest(
        request_id="r1", params=inference_pb2.GenerateRequest(prompt="hi", max_tokens=3),
        base_model=BASE, **kw)
    req.adapter.tenant_id = "acme"
    if spec is not None:
        req.adapter.adapter_name, req.adapter.version = spec.adapter_name, spec.version
        req.engine_id, req.sha256, req.rank = spec.engine_id, spec.sha256, spec.rank
        req.artifact_uri, req.size_bytes = spec.artifact_uri, spec.size_bytes
    return req


async def call(app: WorkerApp, req: worker_pb2.WorkerGenerateRequest
               ) -> list[inference_pb2.GenerateResponse]:
    async with grpc.aio.insecure_channel(app.grpc_address) as ch:
        stub = worker_pb2_grpc.WorkerInternalStub(ch)
        return [m async for m in stub.Generate(req, timeout=10)]


async def status(app: WorkerApp, req: worker_pb2.WorkerGenerateRequest) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(app, req)
    return err.value.code()


async def test_base_requests_run_through_the_zero_adapter(app: WorkerApp) -> None:
    msgs = await call(app, request(None))
    assert [t for m in msgs for t in m.token_ids] == [ZERO_ADAPTER_ENGINE_ID % 1000] * 3
    assert msgs[0].resolved.tier_at_arrival == common_pb2.TIER_HOT
    assert msgs[-1].finished and msgs[-1].usage.output_tokens == 3
    model = app.engine.inner
    assert isinstance(model, VllmModel) and model.violations == []
    assert (app.settings.host_dir / "system" / "zero" / "adapter_config.json").is_file()


async def test_cold_adapter_loaded_for_a_background_request(
    app: WorkerApp, make_adapter: MakeAdapter
) -> None:
    spec = make_adapter()
    assert await status(app, request(spec)) == grpc.StatusCode.UNAVAILABLE  # interactive
    req = request(spec, request_class=common_pb2.REQUEST_CLASS_BACKGROUND)
    msgs = await call(app, req)
    assert msgs[0].resolved.tier_at_arrival == common_pb2.TIER_COLD
    assert [t for m in msgs for t in m.token_ids] == [spec.engine_id % 1000] * 3


async def test_statuses(app: WorkerApp, make_adapter: MakeAdapter) -> None:
    spec = make_adapter()
    over_rank = request(spec)
    over_rank.rank = 32
    assert await status(app, over_rank) == grpc.StatusCode.FAILED_PRECONDITION
    empty = request(None)
    empty.params.prompt = ""
    assert await status(app, empty) == grpc.StatusCode.INVALID_ARGUMENT
    bad_top_p = request(None)
    bad_top_p.params.top_p = 2.0
    assert await status(app, bad_top_p) == grpc.StatusCode.INVALID_ARGUMENT
    other = request(None)
    other.base_model = "x/y"
    assert await status(app, other) == grpc.StatusCode.FAILED_PRECONDITION


async def test_get_state_and_engine_death(app: WorkerApp) -> None:
    async with grpc.aio.insecure_channel(app.grpc_address) as ch:
        state = await worker_pb2_grpc.WorkerInternalStub(ch).GetState(
            worker_pb2.GetStateRequest())
    assert state.ready and state.worker_id == "w-unit" and state.base_models == [BASE]
    cap = state.capacities[0]
    assert (cap.hot_slots_capacity, cap.max_lora_rank) == (LIMITS.max_loras, 16)
    # HOT's second level: the zero (base) adapter was registered, so it sits in a slot
    assert (cap.gpu_slots, cap.gpu_slots_used) == (LIMITS.max_loras, 1)
    model = app.engine.inner
    assert isinstance(model, VllmModel)
    model.died = True
    await asyncio.wait_for(app.engine_failed.wait(), 5)
    assert not app.ready and not app.state().ready


async def test_state_reports_registered_and_slot_resident_versions_apart(
    app: WorkerApp, make_adapter: MakeAdapter,
) -> None:
    """More versions registered than the engine has GPU slots: each HOT one is reported with
    whether it sits in a slot now (the least recently used ones were moved out)."""
    specs = [make_adapter() for _ in range(LIMITS.max_loras + 1)]
    for spec in specs:  # loaded one after the other: each activation pushes the oldest out
        await call(app, request(spec, request_class=common_pb2.REQUEST_CLASS_BACKGROUND))
    state = app.state()
    hot = {p.engine_id: p for p in state.placements if p.tier == common_pb2.TIER_HOT}
    cap = state.capacities[0]
    assert cap.gpu_slots == LIMITS.max_loras == cap.gpu_slots_used
    in_slot = {e for e, p in hot.items() if p.slot_resident}
    # registered: the HOT versions and the zero (base) adapter, one more than the slots;
    # the zero adapter, activated first and never used since, was moved out
    assert len(app.engine.registered) == len(hot) + 1 == LIMITS.max_loras + 1
    assert in_slot == set(hot) == app.engine.slots.resident
    assert app.zero_adapter.engine_id not in app.engine.slots.resident


async def test_hot_level_registered_plans_hot_beyond_the_gpu_slots(
    tmp_path: Path, store: DirStore, keys: DevKeyPair, make_adapter: MakeAdapter,
) -> None:
    """``worker_hot_level`` ``registered``: HOT capacity is ``max_cpu_loras - 1`` (4 here,
    against 3 at ``slots``), more versions stay HOT than the engine has GPU slots (the least
    recently used one moved out of its slot, still registered), and pins stay within the GPU
    slots (``max_loras - 1``)."""
    app = await start_app(tmp_path, store, keys, worker_hot_level="registered")
    try:
        assert app.manager.hot_capacity == LIMITS.max_cpu_loras - 1 > LIMITS.max_loras
        specs = [make_adapter() for _ in range(LIMITS.max_cpu_loras - 1)]
        for spec in specs:
            await call(app, request(spec, request_class=common_pb2.REQUEST_CLASS_BACKGROUND))
        state = app.state()
        cap = state.capacities[0]
        assert (cap.hot_slots_capacity, cap.hot_slots_used) == (4, 4)
        assert (cap.gpu_slots, cap.gpu_slots_used) == (LIMITS.max_loras, LIMITS.max_loras)
        hot = [p for p in state.placements if p.tier == common_pb2.TIER_HOT]
        assert len(hot) == 4  # none demoted to make room: the first is registered, not in a slot
        assert {p.engine_id for p in hot if not p.slot_resident} == {specs[0].engine_id}
        for spec in specs[:LIMITS.max_loras - 1]:
            await app.manager.pin(spec.engine_id)
        with pytest.raises(PinLimit, match="engine slots are pinned"):
            await app.manager.pin(specs[-1].engine_id)
    finally:
        await app.stop(grace_s=0.5)


def test_hot_level_registered_needs_registrations_beyond_the_slots() -> None:
    """``registered`` with no registration beyond the GPU slots is refused, naming both."""
    with pytest.raises(ValueError, match=r"worker_max_cpu_loras - 1 \(3.*worker_max_loras \(3\)"):
        WorkerSettings(worker_max_loras=3, worker_max_cpu_loras=4, worker_hot_level="registered")
    with pytest.raises(ValueError, match="worker_hot_level"):
        WorkerSettings(worker_hot_level="gpu")  # type: ignore[arg-type]
    assert WorkerSettings(worker_max_loras=3, worker_max_cpu_loras=5,
                          worker_hot_level="registered").worker_hot_level == "registered"
