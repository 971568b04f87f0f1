"""More adapter versions than HOT slots, live, through the gateway (issue 14, part 1).

Real services on the test stack (Kafka, S3, Postgres): registry, admission, one worker on
the real vLLM engine with 4 HOT slots (``max_loras`` 4, ``max_cpu_loras`` 5: the zero
adapter takes the fifth registration) and the gateway. Ten rank-8 q,v adapters with
distinct random weights are released with the ``loraplane`` CLI and promoted, each is
answered once alone, then ``CHURN_REQUESTS`` requests, ``CONCURRENCY`` at a time, two
thirds background and one third interactive, spread over the ten. It must show:

* ≥ 99 % of background requests answered by their adapter within their budget (a
  background request past its budget is refused by the platform, never served late);
* every interactive request answered by its adapter or degraded to the base model (the
  default interactive policy), nothing else;
* no refusal while an evictable victim exists: a refusal may only be the worker's
  ``no_slot`` (budget spent, every HOT version busy / pinned / protected) with a retry
  hint, never "evict one first" / "max_cpu_loras";
* zero answers that differ from the greedy reference of the version the platform
  reported (the base model's when degraded), computed engine-direct before the worker
  takes the engine;
* every on-demand change reported on ``cache.state`` (what the cache manager consumes):
  the request path's HOT loads and demotions seen there are exactly those the worker
  counted, and the HOT set they add up to is the worker's.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from loraplane.cache_manager.state import State
from loraplane.devkit.builder import DemoManifest, build_demo
from loraplane.devkit.engine import generate_greedy, lora_request
from loraplane.gateway.app import GatewayApp
from loraplane.shared.errors import LoraplaneError
from loraplane.stack.stack import Stack
from loraplane.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from loraplane.worker.app import WorkerApp
from loraplane.worker.lora_files import LlamaDims, write_lora
from loraplane.worker.vllm_engine import VllmEngine

sys.path.insert(0, str(Path(__file__).parents[1] / "worker"))
from worker_support import ReportWatcher

from tests.integration.platform.support import (
    control_plane,
    eventually,
    gateway_settings,
    run_cli,
    worker_settings,
)
from tests.support.tls import tenant_channel

pytestmark = pytest.mark.engine

N_ADAPTERS = 10
CHURN_REQUESTS = 400
CONCURRENCY = 16
MAX_TOKENS = 8
PROMPT = "Hello, how are you?"
BACKGROUND = common_pb2.REQUEST_CLASS_BACKGROUND
INTERACTIVE = common_pb2.REQUEST_CLASS_INTERACTIVE
HOT = common_pb2.TIER_HOT


@dataclass
class Churn:
    stack: Stack
    demo: DemoManifest
    worker: WorkerApp
    metrics: CollectorRegistry
    gateway: GatewayApp
    watcher: ReportWatcher
    cli_env: dict[str, str]
    tenant: str
    adapters: dict[str, Path]
    """Adapter name → its files."""
    reference: dict[str, tuple[int, ...]]
    """Greedy token ids of PROMPT per adapter name (``"base"``: the base model)."""

    async def cli(self, *args: str) -> str:
        return str((await run_cli(self.cli_env, *args)).stdout)


@pytest.fixture(scope="module")
async def churn(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Churn]:
    unique = uuid.uuid4().hex[:8]
    work = tmp_path_factory.mktemp("churn")
    demo = build_demo()
    s = stack.settings

    # ten rank-8 q,v adapters with distinct random weights
    dims = LlamaDims.from_model_dir(demo.base_model.dir)
    adapters: dict[str, Path] = {}
    for i in range(N_ADAPTERS):
        rng = np.random.default_rng(1000 + i)
        adapters[f"churn-{i}"] = write_lora(
            work / "adapters" / f"churn-{i}", dims, base_model=demo.base_model.name, rank=8,
            modules=("q_proj", "v_proj"),
            fill=lambda shape, _, rng=rng: (rng.standard_normal(shape) * 0.3).astype(np.float32),
        )

    wsettings = worker_settings(stack, demo, work, f"w-churn-{unique}", worker_max_loras=4,
                                worker_max_cpu_loras=5, worker_drain_timeout_s=10.0)
    engine = await VllmEngine.start(demo.base_model.dir, wsettings.engine_options())
    print(f"\n[measure] vLLM engine start {engine.start_seconds:.1f}s")
    llm = engine._llm
    reference = {"base": (await generate_greedy(llm, PROMPT, max_tokens=MAX_TOKENS,
                                                ignore_eos=False)).token_ids}
    for i, (name, path) in enumerate(adapters.items()):
        lora = lora_request(900_000 + i, f"ref/{name}", path)
        out = await generate_greedy(llm, PROMPT, max_tokens=MAX_TOKENS, lora=lora,
                                    ignore_eos=False)
        reference[name] = out.token_ids
        await llm.remove_lora(900_000 + i)
    # the check below can only catch a wrong adapter if the answers tell them apart
    assert len(set(reference.values())) == len(reference), reference

    try:
        async with control_plane(stack, work, demo, name="churn", unique=unique,
                                 actor="ci/churn") as cp:
            watcher = ReportWatcher(s.kafka_bootstrap, wsettings.worker_id,
                                    f"churn-watch-{unique}")
            await watcher.start()
            worker_metrics = CollectorRegistry()
            worker = WorkerApp(wsettings, engine, registry=worker_metrics)
            await worker.start()

            budgets = work / "budgets.yaml"
            budgets.write_text("interactive: {budget_ms: 300, on_cold: degrade}\n"
                               "background: {budget_ms: 30000, on_cold: wait}\n")
            gateway = GatewayApp(
                gateway_settings(stack, cp, demo, instance_id=f"gw-{unique}",
                                 budgets_file=budgets),
                registry=CollectorRegistry(), serve_metrics=False,
            )
            await gateway.start()
            await gateway.wait_ready(60)
            try:
                yield Churn(stack, demo, worker, worker_metrics, gateway, watcher, cp.cli_env,
                            f"churn-{unique[:6]}", adapters, reference)
            finally:
                await gateway.stop(1)
                await worker.stop()
                await watcher.stop()
    finally:
        await engine.close()
        del engine, llm
        gc.collect()


@dataclass
class Outcome:
    klass: int
    adapter: str
    code: grpc.StatusCode
    version: str = ""
    degraded: bool = False
    tokens: tuple[int, ...] = ()
    message: str = ""
    trailing: dict[str, str] = field(default_factory=dict)


def metric_sum(registry: CollectorRegistry, family: str, **match: str) -> float:
    total = 0.0
    for fam in registry.collect():
        for sample in fam.samples:
            if sample.name == family and all(sample.labels.get(k) == v for k, v in match.items()):
                total += sample.value
    return total


async def test_ten_versions_over_four_hot_slots_sixteen_at_a_time(churn: Churn) -> None:
    c = churn
    g = c.gateway.gateway
    base = c.demo.base_model.name
    await c.cli("tenants", "create", c.tenant, "--priority", "gold")
    key = json.loads(await c.cli("keys", "create", c.tenant, "--json"))["secret"]
    t0 = time.monotonic()
    for name, path in c.adapters.items():
        await c.cli("release", str(path), "--tenant", c.tenant, "--name", name,
                    "--version", "v1", "--base-model", base,
                    "--signing-key", str(c.demo.keys.private_key), "--wait", "90")
        await c.cli("promote", f"{c.tenant}/{name}", "v1", "--reason", "churn")

    def released() -> bool:
        try:
            return all(g.catalog.lookup(c.tenant, n).release.stable == "v1" for n in c.adapters)
        except LoraplaneError:
            return False

    await eventually(released, timeout_s=60)
    await eventually(lambda: bool(g.placement.routable(base)))
    print(f"[measure] {N_ADAPTERS} releases (CLI) admitted, promoted, visible: "
          f"{time.monotonic() - t0:.1f}s")

    meta = (("authorization", f"Bearer {key}"),)
    async with tenant_channel(c.stack, f"127.0.0.1:{c.gateway.grpc_port}") as ch:
        stub = inference_pb2_grpc.InferenceStub(ch)

        async def call(adapter: str, klass: int) -> Outcome:
            req = inference_pb2.GenerateRequest(adapter=adapter, prompt=PROMPT,
                                                max_tokens=MAX_TOKENS,
                                                request_class=klass)  # type: ignore[arg-type]
            stream = stub.Generate(req, metadata=meta, timeout=120)
            try:
                msgs = [m async for m in stream]
            except grpc.aio.AioRpcError as err:
                trailing = {k: v if isinstance(v, str) else v.decode()
                            for k, v in (err.trailing_metadata() or ())}
                return Outcome(klass, adapter, err.code(), message=err.details() or "",
                               trailing=trailing)
            r = msgs[0].resolved
            assert msgs[-1].finished
            tokens = tuple(t for m in msgs for t in m.token_ids)
            return Outcome(klass, adapter, grpc.StatusCode.OK, r.adapter.version,
                           r.degraded_to_base, tokens)

        # each answered once alone (background: waits for its cold load)
        for name in c.adapters:
            first = await call(name, BACKGROUND)
            assert first.code == grpc.StatusCode.OK and not first.degraded, first
            assert first.tokens == c.reference[name], name

        rng = random.Random(14)
        plan = [(rng.choice(sorted(c.adapters)), BACKGROUND if i % 3 else INTERACTIVE)
                for i in range(CHURN_REQUESTS)]
        sem = asyncio.Semaphore(CONCURRENCY)

        async def bounded(adapter: str, klass: int) -> Outcome:
            async with sem:
                return await call(adapter, klass)

        t1 = time.monotonic()
        outcomes = await asyncio.gather(*(bounded(a, k) for a, k in plan))
        wall = time.monotonic() - t1

    # -- tally ----------------------------------------------------------------------------
    table: Counter[tuple[str, str]] = Counter()
    for o in outcomes:
        kind = "degraded" if o.code == grpc.StatusCode.OK and o.degraded else o.code.name
        table[("background" if o.klass == BACKGROUND else "interactive", kind)] += 1
    waits = {k: metric_sum(c.metrics, "loraplane_worker_slot_waits_total", outcome=k)
             for k in ("served", "budget", "queue_full")}
    evictions = metric_sum(c.metrics, "loraplane_worker_adapter_evictions_total")
    print(f"[measure] churn {CHURN_REQUESTS} requests, {CONCURRENCY} at a time, "
          f"{wall:.1f}s: {dict(sorted(table.items()))}; slot waits {waits}; "
          f"on-demand demotions {evictions:.0f}")
    for o in outcomes:
        if o.code != grpc.StatusCode.OK:
            print(f"[measure] refused: {o.adapter} class {o.klass}: {o.code.name} {o.message} "
                  f"{o.trailing}")

    # zero answers differing from the reported version's reference
    wrong = [o for o in outcomes if o.code == grpc.StatusCode.OK and o.tokens != (
        c.reference["base"] if o.degraded else c.reference[o.adapter])]
    assert not wrong, wrong[:3]
    assert all(o.version == "v1" for o in outcomes if o.code == grpc.StatusCode.OK)

    background = [o for o in outcomes if o.klass == BACKGROUND]
    served = [o for o in background if o.code == grpc.StatusCode.OK and not o.degraded]
    assert len(served) >= 0.99 * len(background), table
    assert not any(o.degraded for o in background)  # background waits, never degrades

    interactive = [o for o in outcomes if o.klass == INTERACTIVE]
    assert all(o.code == grpc.StatusCode.OK for o in interactive), [
        o for o in interactive if o.code != grpc.StatusCode.OK][:3]

    # a refusal only when no victim could be found within the budget, naming the cause
    for o in outcomes:
        if o.code == grpc.StatusCode.OK:
            continue
        assert o.code == grpc.StatusCode.RESOURCE_EXHAUSTED, o
        assert o.trailing.get("loraplane-reason") == "no_slot", o
        assert "no HOT slot" in o.message and "busy" in o.message, o
        assert int(o.trailing["retry-after-ms"]) >= 1000, o
    assert not [o for o in outcomes if "evict one" in o.message or "max_cpu_loras" in o.message]

    # every on-demand change reached cache.state, and adds up to what the worker holds
    manager = c.worker.manager

    def on_demand() -> tuple[int, int]:
        loads = sum(1 for r in c.watcher.reports if r.WhichOneof("report") == "loaded"
                    and not r.command_id and r.loaded.tier == HOT)
        demotions = sum(1 for r in c.watcher.reports if r.WhichOneof("report") == "evicted"
                        and not r.command_id)
        return loads, demotions

    hot_loads = metric_sum(c.metrics, "loraplane_worker_adapter_loads_total", target_tier="hot")
    await eventually(lambda: on_demand() == (int(hot_loads), int(evictions)), timeout_s=30)
    assert evictions > 0  # ten versions over four slots: room was made on the request path
    # the cache manager's own view, built by its state code from those reports alone
    # (no WorkerState snapshot: only the on-demand changes), is what the worker holds
    view = State()
    for r in c.watcher.reports:
        kind = r.WhichOneof("report")
        if kind == "evicted":
            assert r.evicted.reason.startswith("on_demand_"), r.evicted
        if kind in ("loaded", "evicted"):
            view.apply(r, time.time())
    held = {p.spec.name for p in manager.placements.values() if p.hot}
    assert set(view.workers[c.worker.settings.worker_id].hot()) == held
    assert len(held) == manager.hot_capacity == 4
