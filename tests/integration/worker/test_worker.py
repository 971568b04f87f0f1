"""The inference worker against the real vLLM engine and the real test stack.

One engine for the whole module (vLLM start ~20-30 s, ~3 GB RAM); the restart test
restarts the worker's host-tier and control layers around it. Commands travel through
Tansu (``cache.commands`` → ``cache.state``), artifacts come from SeaweedFS, requests
through gRPC.

Run: ``.venv/bin/python -m pytest tests/integration/worker -s`` (``-s`` prints the
measured load times).
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from worker_support import MAX_TOKENS, PROMPT, Running, Uploaded

from loraplane.shared import codec, topics
from loraplane.shared.topics import new_meta
from loraplane.v1 import common_pb2, events_pb2, inference_pb2, worker_pb2

pytestmark = pytest.mark.engine

HOT, WARM, COLD = common_pb2.TIER_HOT, common_pb2.TIER_WARM, common_pb2.TIER_COLD
_n = itertools.count(1)

# ----------------------------------------------------------------------------- helpers


def command(run: Running, up: Uploaded, **action: object) -> events_pb2.CacheCommand:
    cmd = events_pb2.CacheCommand(
        meta=new_meta("cache-manager/test", up.ref), command_id=str(uuid.uuid4()),
        worker_id=run.settings.worker_id, reason="test")
    cmd.issued_at.GetCurrentTime()
    for kind, msg in action.items():
        getattr(cmd, kind).CopyFrom(msg)
    return cmd


def load_cmd(run: Running, up: Uploaded, tier: int = HOT, pin: bool = False
             ) -> events_pb2.CacheCommand:
    s = up.spec
    return command(run, up, load=events_pb2.LoadAdapter(
        target_tier=tier, pin=pin, engine_id=s.engine_id, artifact_uri=s.artifact_uri,
        sha256=s.sha256, size_bytes=s.size_bytes, rank=s.rank))


def evict_cmd(run: Running, up: Uploaded, to: int = COLD) -> events_pb2.CacheCommand:
    return command(run, up, evict=events_pb2.EvictAdapter(
        to_tier=to, reason="test", engine_id=up.spec.engine_id))


async def execute(run: Running, cmd: events_pb2.CacheCommand) -> events_pb2.WorkerReport:
    await run.send(cmd)
    return await run.watcher.answer(cmd.command_id, timeout=60)


def request(
    up: Uploaded | None, *, max_tokens: int = MAX_TOKENS, use_base: bool = False,
    request_class: int = common_pb2.REQUEST_CLASS_INTERACTIVE, cold_budget_ms: int = 0,
    rank: int | None = None, prompt: str = PROMPT,
) -> worker_pb2.WorkerGenerateRequest:
    params = inference_pb2.GenerateRequest(prompt=prompt, max_tokens=max_tokens, temperature=0)
    req = worker_pb2.WorkerGenerateRequest(
        request_id=f"req-{next(_n)}-{uuid.uuid4().hex[:6]}", params=params,
        request_class=request_class, cold_budget_ms=cold_budget_ms, use_base=use_base,
        base_model="loraplane/tiny-llama")
    if up is not None:
        s = up.spec
        req.adapter.CopyFrom(up.ref)
        req.engine_id = s.engine_id
        req.sha256 = s.sha256
        req.artifact_uri = s.artifact_uri
        req.rank = s.rank if rank is None else rank
        req.size_bytes = s.size_bytes
    else:
        req.adapter.tenant_id = "acme"
    return req


async def generate(run: Running, req: worker_pb2.WorkerGenerateRequest, timeout: float = 60
                   ) -> list[inference_pb2.GenerateResponse]:
    return [m async for m in run.stub.Generate(req, timeout=timeout)]


def token_ids(msgs: list[inference_pb2.GenerateResponse]) -> tuple[int, ...]:
    return tuple(t for m in msgs for t in m.token_ids)


async def status_of(run: Running, req: worker_pb2.WorkerGenerateRequest
                    ) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await generate(run, req)
    return err.value.code(), err.value.details() or ""


async def until(pred, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


def key(up: Uploaded) -> str:
    return f"{up.spec.adapter_name}@{up.spec.version}"


# ----------------------------------------------------------------------------- tests


async def test_three_adapters_loaded_by_command_match_the_engine(running: Running) -> None:
    env = running.env
    ups = [env.adapters["support@2026-11-01.1"], env.adapters["code@2026-11-01.1"],
           env.adapters["legal@2026-11-01.1"]]
    reports = [await execute(running, load_cmd(running, up)) for up in ups]
    for up, rep in zip(ups, reports, strict=True):
        assert rep.WhichOneof("report") == "loaded", rep
        assert (rep.loaded.tier, rep.loaded.source_tier) == (HOT, COLD)
        assert rep.loaded.engine_id == up.spec.engine_id and rep.loaded.bytes > 0
        print(f"[measure] COLD->HOT by command {key(up)} ({rep.loaded.bytes} B): "
              f"{rep.loaded.duration_ms:.1f} ms")
    registered = await running.app.engine.inner.list()
    assert {up.spec.engine_id for up in ups} <= registered  # the registry's ids
    outputs = []
    for up in ups:
        msgs = await generate(running, request(up))
        assert msgs[0].resolved.tier_at_arrival == HOT
        assert msgs[0].resolved.adapter == up.ref
        assert msgs[-1].finished and msgs[-1].usage.output_tokens == len(token_ids(msgs))
        outputs.append(token_ids(msgs))
        assert token_ids(msgs) == env.reference[key(up)], key(up)
    assert len(set(outputs)) == 3 and env.reference["base"] not in outputs


async def test_base_request_concurrent_with_lora_requests_gets_base_output(
    running: Running,
) -> None:
    env = running.env
    ups = [env.adapters["support@2026-11-01.1"], env.adapters["code@2026-11-01.1"]]
    for up in ups:
        await running.app.manager.load(up.spec, HOT)
    for _ in range(3):
        base, *loras = await asyncio.gather(
            generate(running, request(None, use_base=False)),
            *(generate(running, request(up)) for up in ups))
        assert token_ids(base) == env.reference["base"]
        assert [token_ids(m) for m in loras] == [env.reference[key(up)] for up in ups]
        assert base[0].resolved.adapter.adapter_name == ""


async def test_adapter_evicted_during_a_stream_finishes_the_stream_first(
    running: Running,
) -> None:
    up = running.env.adapters["chat@2026-11-01.1"]
    assert (await execute(running, load_cmd(running, up))).loaded.tier == HOT
    long_tokens = 200
    stream = running.stub.Generate(request(up, max_tokens=long_tokens, prompt="Tell me"),
                                   timeout=120)
    first = await stream.read()
    assert first.resolved.tier_at_arrival == HOT
    p = running.app.manager.placements[up.spec.engine_id]
    assert p.in_flight == 1
    cmd = evict_cmd(running, up, COLD)
    await running.send(cmd)
    await until(lambda: p.draining, 30)
    msgs = [first]
    while (m := await stream.read()) is not grpc.aio.EOF:
        msgs.append(m)
    stream_done = datetime.now(UTC)
    assert msgs[-1].finished and msgs[-1].finish_reason in ("length", "stop")
    assert len(token_ids(msgs)) > 20, "the stream must outlive the eviction command"
    rep = await running.watcher.answer(cmd.command_id, timeout=30)
    assert rep.WhichOneof("report") == "evicted"
    assert (rep.evicted.from_tier, rep.evicted.to_tier) == (HOT, COLD)
    assert rep.meta.occurred_at.ToDatetime(tzinfo=UTC) >= stream_done - timedelta(seconds=1)
    assert up.spec.engine_id not in await running.app.engine.inner.list()
    assert running.app.host.get(up.spec.engine_id) is None


async def test_corrupted_host_file_is_detected_and_never_registered(running: Running) -> None:
    up = running.env.adapters["support@2026-11-15.1"]
    warm = await execute(running, load_cmd(running, up, WARM))
    assert (warm.loaded.tier, warm.loaded.source_tier) == (WARM, COLD)
    entry = running.app.host.get(up.spec.engine_id)
    assert entry is not None
    weights = entry.files_dir / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    rep = await execute(running, load_cmd(running, up, HOT))
    assert rep.WhichOneof("report") == "failed", rep
    assert rep.failed.code == events_pb2.LOAD_ERROR_CODE_DIGEST_MISMATCH
    assert "adapter_model.safetensors" in rep.failed.message
    assert up.spec.engine_id not in await running.app.engine.inner.list()
    assert running.app.host.get(up.spec.engine_id) is None and not entry.dir.exists()
    dropped = running.app.metrics.host_dropped._value.get()
    assert dropped >= 1


async def test_pin_all_is_refused_and_the_engine_keeps_serving(running: Running) -> None:
    env = running.env
    ups = [env.adapters[k] for k in ("support@2026-11-01.1", "code@2026-11-01.1",
                                     "legal@2026-11-01.1", "chat@2026-11-01.1")]
    max_loras = running.settings.worker_max_loras
    assert len(ups) == max_loras
    for up in ups[: max_loras - 1]:
        rep = await execute(running, load_cmd(running, up, HOT, pin=True))
        assert rep.loaded.pinned, rep
    refused = await execute(running, load_cmd(running, ups[-1], HOT, pin=True))
    assert refused.failed.code == events_pb2.LOAD_ERROR_CODE_NO_CAPACITY, refused
    assert "would leave no unpinned slot" in refused.failed.message
    assert len(running.app.engine.pinned) == max_loras - 1
    # what kills vLLM after pin-all: a request for yet another adapter -- it is served
    fresh = env.adapters["support@2026-11-15.1"]
    msgs = await generate(running, request(fresh, request_class=common_pb2.REQUEST_CLASS_BACKGROUND))
    assert msgs[0].resolved.tier_at_arrival == COLD
    assert token_ids(msgs) == env.reference[key(fresh)]
    base = await generate(running, request(None))
    assert token_ids(base) == env.reference["base"]
    assert not running.app.engine.dead
    for up in ups[: max_loras - 1]:
        unpin = command(running, up, unpin=events_pb2.UnpinAdapter(engine_id=up.spec.engine_id))
        assert not (await execute(running, unpin)).loaded.pinned
    assert running.app.engine.pinned == frozenset()


async def test_rank_above_engine_max_is_refused_with_a_clear_status(running: Running) -> None:
    big = running.env.adapters["big-rank"]
    code, details = await status_of(running, request(big))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "rank 32 > max_lora_rank 16" in details
    # rank not declared: the host tier reads it from the verified files and refuses
    code, details = await status_of(
        running, request(big, rank=0, request_class=common_pb2.REQUEST_CLASS_BACKGROUND))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "rank 32" in details
    rep = await execute(running, load_cmd(running, big, HOT))
    assert rep.failed.code == events_pb2.LOAD_ERROR_CODE_RANK_TOO_LARGE
    assert "rank 32 > max_lora_rank 16" in rep.failed.message
    assert big.spec.engine_id not in await running.app.engine.inner.list()
    assert not running.app.engine.dead
    assert token_ids(await generate(running, request(None))) == running.env.reference["base"]


async def test_statuses_are_specific(running: Running) -> None:
    env = running.env
    up = env.adapters["legal@2026-11-01.1"]
    await running.app.manager.evict(up.spec.engine_id, COLD, "test")
    empty = request(up)
    empty.params.prompt = ""
    assert (await status_of(running, empty))[0] == grpc.StatusCode.INVALID_ARGUMENT
    other = request(up)
    other.base_model = "someone/else"
    assert (await status_of(running, other))[0] == grpc.StatusCode.FAILED_PRECONDITION
    cold = await status_of(running, request(up))  # interactive, no cold budget
    assert cold[0] == grpc.StatusCode.UNAVAILABLE and "not on this worker" in cold[1]
    wrong_digest = request(up, request_class=common_pb2.REQUEST_CLASS_BACKGROUND)
    wrong_digest.sha256 = "0" * 64
    assert (await status_of(running, wrong_digest))[0] == grpc.StatusCode.FAILED_PRECONDITION
    assert running.app.host.get(up.spec.engine_id) is None
    no_id = request(up)
    no_id.request_id = ""
    assert (await status_of(running, no_id))[0] == grpc.StatusCode.INVALID_ARGUMENT


async def test_cold_request_with_budget_loads_and_reports(running: Running) -> None:
    up = running.env.adapters["legal@2026-11-01.1"]
    await running.app.manager.evict(up.spec.engine_id, COLD, "test")
    msgs = await generate(running, request(up, cold_budget_ms=20_000))
    assert msgs[0].resolved.tier_at_arrival == COLD
    assert token_ids(msgs) == running.env.reference[key(up)]
    rep = await running.watcher.wait_for(
        lambda r: r.WhichOneof("report") == "loaded" and not r.command_id
        and r.loaded.engine_id == up.spec.engine_id and r.loaded.source_tier == COLD)
    assert rep.loaded.tier == HOT
    again = await generate(running, request(up))
    assert again[0].resolved.tier_at_arrival == HOT


async def test_deadline_and_cancellation_abort_the_engine_request(running: Running) -> None:
    engine = running.app.engine
    await until(lambda: engine.unfinished_requests() == 0)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await generate(running, request(None, max_tokens=400, prompt="Tell me"), timeout=0.3)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await until(lambda: engine.unfinished_requests() == 0, 5)
    call = running.stub.Generate(request(None, max_tokens=400, prompt="Tell me"), timeout=60)
    await call.read()
    assert engine.unfinished_requests() == 1
    call.cancel()
    await until(lambda: engine.unfinished_requests() == 0, 5)
    # the request's own deadline bounds the time to the first token
    late = request(None)
    late.deadline.FromDatetime(datetime.now(UTC) - timedelta(seconds=1))
    assert (await status_of(running, late))[0] == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_heat_metrics_and_state_are_reported(running: Running) -> None:
    up = running.env.adapters["support@2026-11-01.1"]
    await running.app.manager.load(up.spec, HOT)
    req = request(up)
    # read from the topic's end before the request, not from its earliest offset: the
    # session's other tests (the isolation floods) leave many thousand heat records there,
    # and scanning them all once took longer than the wait below
    consumer = AIOKafkaConsumer(
        bootstrap_servers=running.env.stack.settings.kafka_bootstrap, enable_auto_commit=False)
    await consumer.start()
    await consumer.topics()  # the cluster's metadata, partitions of every topic
    parts = [TopicPartition(topics.ADAPTER_HEAT, p)
             for p in sorted(consumer.partitions_for_topic(topics.ADAPTER_HEAT) or ())]
    assert parts, "adapter.heat has no partitions"
    consumer.assign(parts)
    for tp, end in (await consumer.end_offsets(parts)).items():
        consumer.seek(tp, end)
    msgs = await generate(running, req)
    found = None
    try:
        async with asyncio.timeout(30):
            while found is None:
                for records in (await consumer.getmany(timeout_ms=300)).values():
                    for rec in records:
                        batch = codec.decode_record(rec)
                        assert isinstance(batch, events_pb2.HeatBatch)
                        for c in batch.completions:
                            if c.request_id == req.request_id:
                                found = (rec, batch, c)
    finally:
        await consumer.stop()
    rec, batch, c = found
    assert rec.key == b"acme/support" and batch.source_id == f"worker/{running.settings.worker_id}"
    assert c.tier_at_arrival == HOT and c.engine_id == up.spec.engine_id
    assert c.meta.adapter.version == up.spec.version and c.status_code == 0
    assert c.output_tokens == len(token_ids(msgs)) and c.ttft_ms > 0
    labels = {"base_model": up.spec.base_model, "tenant": "acme", "adapter": "support",
              "version": up.spec.version}
    reg = running.registry
    assert reg.get_sample_value("loraplane_worker_requests_total",
                                {**labels, "tier": "hot", "code": "OK"}) >= 1
    assert reg.get_sample_value("loraplane_worker_ttft_seconds_count",
                                {**labels, "tier": "hot"}) >= 1
    assert reg.get_sample_value("loraplane_worker_adapter_loads_total",
                                {**labels, "source_tier": "cold", "target_tier": "hot"}) >= 1
    assert reg.get_sample_value("loraplane_worker_engine_slots",
                                {"base_model": up.spec.base_model, "state": "capacity"}) == 4
    state = await running.stub.GetState(worker_pb2.GetStateRequest())
    assert state.ready and state.worker_id == running.settings.worker_id
    placement = {p.engine_id: p for p in state.placements}[up.spec.engine_id]
    assert placement.tier == HOT and placement.sha256 == up.spec.sha256
    snap = await running.watcher.wait_for(lambda r: r.WhichOneof("report") == "state")
    assert snap.state.capacities[0].max_lora_rank == 16


async def test_warm_to_hot_and_cold_to_hot_load_times(running: Running) -> None:
    """Measured on the demo adapters (~0.1-1 MB); see bench_cold for 1-100 MB."""
    manager = running.app.manager
    for k in ("support@2026-11-01.1", "code@2026-11-01.1"):
        up = running.env.adapters[k]
        await manager.evict(up.spec.engine_id, COLD, "measure")
        cold = await manager.load(up.spec, HOT)
        await manager.evict(up.spec.engine_id, WARM, "measure")
        warm = await manager.load(up.spec, HOT)
        assert (cold.source_tier, warm.source_tier) == (COLD, WARM)
        print(f"[measure] {k} {manager.placements[up.spec.engine_id].host.size_bytes} B: "
              f"COLD->HOT {cold.duration_s * 1000:.1f} ms (fetch "
              f"{cold.fetch.download_s * 1000:.1f}, verify {cold.fetch.verify_s * 1000:.1f}, "
              f"register {cold.register_s * 1000:.1f}); WARM->HOT {warm.duration_s * 1000:.1f} "
              f"ms (re-verify {warm.verify_s * 1000:.1f}, register {warm.register_s * 1000:.1f})")
        # WARM → HOT reads nothing from the object store; COLD → HOT downloads the artifact
        # (the times are printed above; which is faster is a benchmark's question, not a
        # test's: a noisy machine reversed them once)
        assert cold.fetch is not None and cold.bytes_read > 0
        assert warm.fetch is None and warm.bytes_read == 0


async def test_commands_flow_again_after_a_broker_restart(running: Running) -> None:
    app, stack = running.app, running.env.stack
    restarts = app.consumer.restarts
    stack.tansu.kill()
    await until(lambda: app.publisher.broker_lost, 60)  # a snapshot could not be sent
    stack.tansu.start()
    await until(lambda: app.consumer.restarts > restarts, 90)  # recreated on recovery
    await running.restart_watcher()
    up = running.env.adapters["chat@2026-11-01.1"]
    await app.manager.evict(up.spec.engine_id, COLD, "test")
    rep = await execute(running, load_cmd(running, up, WARM))
    assert (rep.loaded.tier, rep.loaded.source_tier) == (WARM, COLD)
    assert running.registry.get_sample_value("loraplane_worker_consumer_restarts_total") >= 1


async def test_restart_keeps_the_verified_host_tier(running: Running) -> None:
    env = running.env
    keep, spoil = env.adapters["code@2026-11-01.1"], env.adapters["support@2026-11-01.1"]
    for up in (keep, spoil):
        await running.app.manager.load(up.spec, WARM)
    spoiled = running.app.host.get(spoil.spec.engine_id)
    assert spoiled is not None
    held_before = {e.spec.engine_id for e in running.app.host.entries()}

    def tamper() -> None:
        cfg = spoiled.files_dir / "adapter_config.json"
        cfg.write_text(cfg.read_text() + " ")

    app = await running.restart(before_start=tamper)
    assert app.rescan is not None
    assert [d for d, _ in app.rescan.dropped] == [spoil.spec.dirname]
    kept = {e.spec.engine_id for e in app.host.entries()}
    assert kept == held_before - {spoil.spec.engine_id}
    state = await running.stub.GetState(worker_pb2.GetStateRequest())
    tiers = {p.engine_id: p.tier for p in state.placements}
    assert tiers[keep.spec.engine_id] == WARM and spoil.spec.engine_id not in tiers
    assert all(t == WARM for t in tiers.values())  # nothing is HOT after a restart
    msgs = await generate(running, request(keep))  # interactive: no cold load allowed
    assert msgs[0].resolved.tier_at_arrival == WARM
    assert token_ids(msgs) == env.reference[key(keep)]
    snap = await running.watcher.wait_for(
        lambda r: r.WhichOneof("report") == "state" and r.state.started_at
        == state.started_at and r.state.ready)
    assert keep.spec.engine_id in {p.engine_id for p in snap.state.placements}
