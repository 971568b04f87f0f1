"""Fixtures of the worker integration tests: ONE real vLLM engine for the module, the demo
adapters uploaded to the test stack's S3, a worker app around the engine (restartable
without restarting vLLM), a command producer and a ``cache.state`` watcher.

Reference outputs ("what the engine gives directly") are computed on the raw engine
before the worker takes it over, one request at a time.
"""

from __future__ import annotations

import gc
import random
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from aiokafka import AIOKafkaProducer
from prometheus_client import CollectorRegistry

from loraplane.devkit.builder import build_demo
from loraplane.devkit.engine import generate_greedy, lora_request
from loraplane.shared.signing import sign_directory
from loraplane.stack.stack import Stack
from loraplane.v1 import worker_pb2_grpc
from loraplane.worker.app import WorkerApp
from loraplane.worker.host_tier import ArtifactSpec
from loraplane.worker.lora_files import LlamaDims, write_lora
from loraplane.worker.vllm_engine import VllmEngine

sys.path.insert(0, str(Path(__file__).parent))
from worker_support import (
    BUCKET,
    MAX_TOKENS,
    PROMPT,
    Env,
    ReportWatcher,
    Running,
    Uploaded,
    gateway_channel,
    upload,
    worker_settings,
)


@pytest.fixture(scope="module")
async def env(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Env]:
    demo = build_demo()
    s = stack.settings
    s3 = s.s3_client()
    run_id = uuid.uuid4().hex[:8]
    base_id = random.randint(100_000, 1_000_000_000)
    adapters: dict[str, Uploaded] = {}
    for i, a in enumerate(demo.adapters):
        prefix = f"adapters/{a.tenant}/{a.name}/{a.version}/{run_id}/"
        upload(s3, prefix, a.dir)
        spec = ArtifactSpec(
            engine_id=base_id + i, tenant_id=a.tenant, adapter_name=a.name, version=a.version,
            base_model=a.base_model, artifact_uri=f"s3://{BUCKET}/{prefix}",
            sha256=a.manifest_digest, size_bytes=a.size_bytes, rank=a.rank,
        )
        adapters[f"{a.name}@{a.version}"] = Uploaded(spec, a.dir)
    # an adapter signed with the trusted key whose rank (32) exceeds max_lora_rank (16)
    big_dir = tmp_path_factory.mktemp("big-rank") / "adapter"
    rng = np.random.default_rng(7)
    write_lora(big_dir, LlamaDims.from_model_dir(demo.base_model.dir),
               base_model=demo.base_model.name, rank=32, modules=("q_proj", "v_proj"),
               fill=lambda shape, _: (rng.standard_normal(shape) * 0.1).astype(np.float32))
    signed = sign_directory(big_dir, demo.keys.private_key)
    prefix = f"adapters/acme/big/v1/{run_id}/"
    upload(s3, prefix, big_dir)
    adapters["big-rank"] = Uploaded(ArtifactSpec(
        engine_id=base_id + 100, tenant_id="acme", adapter_name="big", version="v1",
        base_model=demo.base_model.name, artifact_uri=f"s3://{BUCKET}/{prefix}",
        sha256=signed.manifest_digest, size_bytes=signed.size_bytes, rank=32), big_dir)

    settings = worker_settings(stack, demo, tmp_path_factory.mktemp("worker-host"), run_id)
    engine = await VllmEngine.start(demo.base_model.dir, settings.engine_options())
    print(f"\n[measure] engine start {engine.start_seconds:.1f}s")
    reference: dict[str, tuple[int, ...]] = {}
    llm = engine._llm
    base = await generate_greedy(llm, PROMPT, max_tokens=MAX_TOKENS, ignore_eos=False)
    reference["base"] = base.token_ids
    for key, up in adapters.items():
        if key == "big-rank":
            continue
        lora = lora_request(up.spec.engine_id, f"ref/{key}", up.source_dir)
        out = await generate_greedy(llm, PROMPT, max_tokens=MAX_TOKENS, lora=lora,
                                    ignore_eos=False)
        reference[key] = out.token_ids
        await llm.remove_lora(up.spec.engine_id)
    try:
        yield Env(stack, demo, engine, run_id, adapters, reference,
                  settings.host_dir, s3)
    finally:
        await engine.close()
        del engine, llm
        gc.collect()


@pytest.fixture(scope="module")
async def running(env: Env) -> AsyncIterator[Running]:
    settings = worker_settings(env.stack, env.demo, env.host_dir, env.run_id)
    registry = CollectorRegistry()
    app = WorkerApp(settings, env.engine, registry=registry)
    await app.start()
    bootstrap = env.stack.settings.kafka_bootstrap
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    watcher = ReportWatcher(bootstrap, settings.worker_id, f"watch-{env.run_id}")
    await watcher.start()
    channel = gateway_channel(env.stack, app)
    run = Running(env, settings, app, registry, channel,
                  worker_pb2_grpc.WorkerInternalStub(channel), producer, watcher)
    try:
        yield run
    finally:
        await run.channel.close()
        await run.app.stop()
        await run.watcher.stop()
        await run.producer.stop()
