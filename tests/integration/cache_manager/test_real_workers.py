"""The cache manager commanding real workers (``WorkerApp``) on a real vLLM engine.

One vLLM engine (the tiny local model, CPU) is started for the module; each test runs
a real worker on it (its own worker id, host directory, Kafka loops, S3 fetch and
signature verification, engine registration) and cache-manager processes. Adapters
are the signed demo adapters uploaded to the test stack's S3 and registered (SQL) under
a tenant of this module.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from minio import Minio
from prometheus_client import CollectorRegistry

from loraplane.cache_manager.model import Ref
from loraplane.devkit.builder import DemoManifest, build_demo
from loraplane.shared.tls import OPERATOR, WORKER
from loraplane.stack.stack import Stack
from loraplane.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from loraplane.worker.app import WorkerApp
from loraplane.worker.settings import WorkerSettings
from loraplane.worker.vllm_engine import VllmEngine
from tests.support import eventgen as ev
from tests.support.cache_manager import Bus, Launcher, Registry, describe, is_cmd
from tests.support.tls import internal_channel, tls_settings

pytestmark = pytest.mark.engine
HOT = common_pb2.TIER_HOT
HOT_SLOTS = 3
"""The worker's HOT capacity: min(max_loras 3, max_cpu_loras 4 - its all-zero adapter)."""


@dataclass
class Env:
    stack: Stack
    demo: DemoManifest
    engine: VllmEngine
    s3: Minio
    tmp: Path

    async def tenant(self, tenant: str) -> Tenant:
        """A tenant with every demo adapter uploaded under its prefix (not registered yet)."""
        s = self.stack.settings
        registry = Registry(s.postgres_dsn, tenant)
        await registry.tenant_row()
        versions: dict[str, dict[str, object]] = {}
        for a in self.demo.adapters:
            key = f"{a.tenant}-{a.name}-{a.version}".replace(".", "-")
            prefix = f"adapters/{tenant}/{key}/v1/"
            for f in sorted(Path(a.dir).iterdir()):
                self.s3.fput_object(s.artifact_bucket, prefix + f.name, str(f))
            versions[key] = {"name": key, "artifact_uri": f"s3://{s.artifact_bucket}/{prefix}",
                             "sha256": a.manifest_digest, "size": a.size_bytes, "rank": a.rank}
        return Tenant(registry, versions)


@dataclass
class Tenant:
    registry: Registry
    versions: dict[str, dict[str, object]]
    """Keyword arguments of :meth:`Registry.version` per demo adapter key."""

    async def register(self, index: int, **over: object) -> Ref:
        """Register the ``index``-th demo adapter (sorted by key) as version ``v1``."""
        kw = dict(self.versions[sorted(self.versions)[index]])
        kw.update(over)
        name = str(kw.pop("name"))
        return await self.registry.version(name, "v1", **kw)  # type: ignore[arg-type]


def _worker_settings(stack: Stack, demo: DemoManifest, tmp: Path, worker_id: str
                     ) -> WorkerSettings:
    s = stack.settings
    return WorkerSettings(
        worker_id=worker_id, worker_grpc_port=0, worker_metrics_port=0,
        kafka_bootstrap=s.kafka_bootstrap, **s.s3_settings(),
        artifact_bucket=s.artifact_bucket, base_model=demo.base_model.name,
        base_model_dir=demo.base_model.dir, trusted_keys=str(demo.keys.public_key),
        tokenizer_revision=demo.base_model.tokenizer_revision,
        worker_host_dir=tmp / worker_id, worker_max_loras=HOT_SLOTS, worker_max_cpu_loras=4,
        worker_max_lora_rank=16, worker_state_interval_s=1.0, worker_heat_flush_s=0.5,
        worker_drain_timeout_s=10.0, **tls_settings(stack, WORKER),
    )


@pytest.fixture(scope="module")
async def env(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Env]:
    demo = build_demo()
    s = stack.settings
    s3 = s.s3_client()
    tmp = tmp_path_factory.mktemp("cm-real")
    options = _worker_settings(stack, demo, tmp, "probe").engine_options()
    started = time.monotonic()
    engine = await VllmEngine.start(demo.base_model.dir, options)
    print(f"\n[measure] vLLM engine start {time.monotonic() - started:.1f}s")
    try:
        yield Env(stack, demo, engine, s3, tmp)
    finally:
        await engine.close()
        del engine
        gc.collect()


@pytest.fixture
async def tenant(env: Env, unique: str) -> Tenant:
    """This test's tenant with the demo adapters uploaded."""
    return await env.tenant(f"cmr-{unique}")


class RealWorker:
    """A real worker on the module's engine; :meth:`restart` starts a new incarnation."""

    def __init__(self, env: Env, worker_id: str) -> None:
        self.env = env
        self.settings = _worker_settings(env.stack, env.demo, env.tmp, worker_id)
        self.app: WorkerApp | None = None

    @property
    def worker_id(self) -> str:
        return self.settings.worker_id

    @property
    def grpc_address(self) -> str:
        assert self.app is not None
        return self.app.grpc_address

    async def start(self) -> None:
        self.app = WorkerApp(self.settings, self.env.engine, registry=CollectorRegistry())
        await self.app.start()

    async def stop(self) -> None:
        if self.app is not None:
            await self.app.stop()
            self.app = None

    async def restart(self) -> None:
        """Stop and start again: same id and host directory, empty engine, new started_at."""
        await self.stop()
        await self.start()


@pytest.fixture
async def worker(env: Env, bus: Bus, unique: str) -> AsyncIterator[RealWorker]:
    """A real worker on the module's engine (fresh id and host directory)."""
    w = RealWorker(env, f"wr-{unique}")
    await w.start()
    try:
        yield w
    finally:
        await w.stop()


async def _worker_hot(app: RealWorker) -> set[str]:
    async with internal_channel(app.env.stack, app.grpc_address, caller=OPERATOR,
                                server=WORKER) as ch:
        state = await worker_pb2_grpc.WorkerInternalStub(ch).GetState(
            worker_pb2.GetStateRequest(), timeout=5)
    return {f"{p.adapter.tenant_id}/{p.adapter.adapter_name}@{p.adapter.version}"
            for p in state.placements if p.tier == HOT}


async def _wait_hot(app: RealWorker, refs: list[Ref], timeout: float = 20.0) -> float:
    start = time.monotonic()
    want = {r.version_id for r in refs}
    while time.monotonic() - start < timeout:
        if want <= await _worker_hot(app):
            return time.monotonic() - start
        await asyncio.sleep(0.05)
    raise AssertionError(f"{want - await _worker_hot(app)} not HOT on {app.worker_id}")


def _launcher(env: Env, tenant: Tenant, tmp_path: Path, unique: str) -> Launcher:
    return Launcher(env.stack.settings.client_env(), tmp_path, unique,
                    tenants=tenant.registry.tenant, stack=env.stack)


async def test_burst_loads_on_real_worker_then_manager_restart_changes_nothing(
    env: Env, bus: Bus, tenant: Tenant, worker: RealWorker, tmp_path: Path, unique: str
) -> None:
    a = await tenant.register(0)
    b = await tenant.register(1)
    managers = _launcher(env, tenant, tmp_path, unique)
    try:
        cm1 = managers.start()
        await cm1.wait_planning()
        t0 = time.monotonic()
        await bus.publish(ev.heat(a, 20, time.time()), ev.heat(b, 5, time.time()))
        await bus.wait_for(is_cmd("load_hot", a, worker.worker_id), timeout=15)
        await _wait_hot(worker, [a, b])
        print(f"\n[measure] burst -> HOT on the real worker (fetch, verify, register): "
              f"{time.monotonic() - t0:.2f}s")
        for _ in range(40):
            if await cm1.placement(a) == [(worker.worker_id, HOT)]:
                break
            await asyncio.sleep(0.1)
        assert await cm1.placement(a) == [(worker.worker_id, HOT)]
        await asyncio.sleep(1.0)  # let the statistics and the worker directory be saved
        before = len(bus.commands)

        cm1.stop()
        cm2 = managers.start()
        t1 = time.monotonic()
        await cm2.wait_planning()
        takeover = time.monotonic() - t1
        assert "all workers synced" in cm2.log.read_text()  # GetState, no grace wait
        await asyncio.sleep(3.0)
        after = bus.commands[before:]
        assert after == [], [describe(c) for c in after]  # no duplicate load, no eviction
        assert {a.version_id, b.version_id} <= await _worker_hot(worker)
        print(f"[measure] manager restart -> planning (incl. process start): {takeover:.2f}s")
    finally:
        managers.stop_all()


async def test_capacity_pressure_evicts_in_policy_order_protected_stay(
    env: Env, bus: Bus, tenant: Tenant, worker: RealWorker, tmp_path: Path, unique: str
) -> None:
    plat = await tenant.register(0, priority="platinum")
    canary = await tenant.register(1, status="canary")
    cool = await tenant.register(2, priority="bronze")
    hot_new = await tenant.register(3)
    wid = worker.worker_id
    now = time.time()
    await bus.publish(ev.heat(plat, 3, now), ev.heat(canary, 3, now), ev.heat(cool, 2, now))
    managers = _launcher(env, tenant, tmp_path, unique)
    try:
        # One pinned slot each for platinum and canaries (0.34 * 3 slots), one free slot.
        cm = managers.start(policy={"never_evict": {"hot_share_canary": 0.34,
                                                    "hot_share_priority": 0.34}})
        await cm.wait_planning()
        await _wait_hot(worker, [plat, canary, cool])
        await asyncio.sleep(1.0)
        await bus.publish(ev.heat(hot_new, 60, time.time()))
        [demote] = await bus.wait_for(is_cmd("demote", None, wid), timeout=15)
        assert Ref.of(demote.meta.adapter) == cool, describe(demote)
        await bus.wait_for(is_cmd("load_hot", hot_new, wid), timeout=15)
        await _wait_hot(worker, [plat, canary, hot_new])
        for protected in (plat, canary):
            for kind in ("demote", "evict", "unpin"):
                assert not bus.matching(is_cmd(kind, protected)), [describe(c) for c in
                                                                   bus.commands]
        pinned = {Ref.of(c.meta.adapter) for c in bus.commands
                  if (c.WhichOneof("command") == "load" and c.load.pin)
                  or c.WhichOneof("command") == "pin"}
        assert {plat, canary} <= pinned, [describe(c) for c in bus.commands]
        assert len(await _worker_hot(worker)) <= HOT_SLOTS
    finally:
        managers.stop_all()


async def test_real_worker_restart_is_reconciled_and_leader_kill_hands_over(
    env: Env, bus: Bus, tenant: Tenant, worker: RealWorker, tmp_path: Path, unique: str
) -> None:
    a = await tenant.register(0)
    late = await tenant.register(4)
    await bus.publish(ev.heat(a, 20, time.time()))
    managers = _launcher(env, tenant, tmp_path, unique)
    try:
        leader = managers.start()
        await leader.wait_planning()
        standby = managers.start()
        await standby.wait_up()
        await asyncio.sleep(0.5)
        assert standby.metric("loraplane_cache_leader") == 0.0
        await _wait_hot(worker, [a])

        # Worker restart: same host directory (WARM survives), empty engine, new incarnation.
        n0 = len(bus.commands)
        await worker.restart()
        t0 = time.monotonic()
        while not [c for c in bus.commands[n0:] if is_cmd("load_hot", a, worker.worker_id)(c)]:
            assert time.monotonic() - t0 < 10, [describe(c) for c in bus.commands[n0:]]
            await asyncio.sleep(0.05)
        reload_s = time.monotonic() - t0
        await _wait_hot(worker, [a], timeout=30)
        print(f"\n[measure] worker restart -> reload command {reload_s:.2f}s, -> HOT again "
              f"{time.monotonic() - t0:.2f}s (worker consumes its commands after its group "
              f"rejoin)")

        # Leader killed: the standby takes over and commands.
        await asyncio.sleep(1.0)
        leader.kill()
        t1 = time.monotonic()
        became = await standby.wait_leader(timeout=10)
        await standby.wait_planning(timeout=10)
        planning = time.monotonic() - t1
        # Bound (docs): leader_poll_s (0.3) + GetState of known workers, else the grace (2.5)
        assert became <= 0.3 + 1.5 and planning <= 0.3 + 2.5 + 1.5, (became, planning)
        await bus.publish(ev.heat(late, 20, time.time()))
        await bus.wait_for(is_cmd("load_hot", late, worker.worker_id), timeout=10)
        await _wait_hot(worker, [late])
        print(f"[measure] leader kill -> standby leader {became:.2f}s, planning {planning:.2f}s")
    finally:
        managers.stop_all()



async def test_staged_canary_is_warmed_and_exercised_with_the_golden_set(
    env: Env, bus: Bus, tenant: Tenant, worker: RealWorker, tmp_path: Path, unique: str
) -> None:
    await tenant.register(0)  # the stable version
    canary = await tenant.register(1, status="admitted")
    managers = _launcher(env, tenant, tmp_path, unique)
    try:
        cm = managers.start(rules={"canary": {"golden_set": ["Hello there", "What is 2+2?"],
                                              "golden_max_tokens": 4}})
        await cm.wait_planning()
        await bus.publish(ev.canary(canary, 0, time.time()))  # staged: no traffic yet
        [load] = await bus.wait_for(is_cmd("load_hot", canary, worker.worker_id), timeout=10)
        assert load.reason.startswith("canary_warmup")
        await _wait_hot(worker, [canary])

        def shadow(result: str) -> float:
            for line in cm.metric_lines("loraplane_cache_shadow_requests_total"):
                if f'result="{result}"' in line:
                    return float(line.split()[-1])
            return 0.0

        start = time.monotonic()
        while shadow("ok") < 2 and time.monotonic() - start < 20:
            await asyncio.sleep(0.1)
        assert (shadow("ok"), shadow("failed")) == (2.0, 0.0)
        assert not bus.matching(is_cmd("demote", canary))
    finally:
        managers.stop_all()
