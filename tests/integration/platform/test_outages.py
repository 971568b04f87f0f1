"""Outages of the broker, PostgreSQL and the object store under steady HOT load.

Real parts: the session's Tansu, PostgreSQL and SeaweedFS are killed (SIGKILL) and
started again mid-test; registry, admission, a worker on the real vLLM engine and the
gateway run in this process. The gateway's staleness window is 5 s, so the broker
outage of 15 s is 3 × that window: before the gateway took liveness from its own gRPC
probes, it un-routed every worker after 5 s of silent ``cache.state``.

Each case: HOT requests keep being answered by the adapter (zero refused, none
degraded); what cannot happen without the component fails fast and names it; after
the restart it works again without restarting any service. Each case releases the
versions it needs itself (the object-store case its own COLD one), so each passes alone
(``-k``) and one failing case does not fail the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from loraplane.devkit.builder import DemoManifest, build_demo
from loraplane.gateway.app import GatewayApp
from loraplane.gateway.placement import ANSWERING
from loraplane.shared.tls import GATEWAY, WORKER
from loraplane.stack.components import Component
from loraplane.stack.stack import Stack
from loraplane.v1 import common_pb2, inference_pb2, inference_pb2_grpc, worker_pb2, worker_pb2_grpc
from loraplane.worker.app import WorkerApp
from tests.integration.platform.support import (
    adapter_copy,
    catalog_shows,
    control_plane,
    eventually,
    gateway_settings,
    release,
    run_cli,
    serving_worker,
    tenant_with_key,
)
from tests.support.tls import internal_channel, tenant_channel

pytestmark = pytest.mark.engine

STALE_S = 5.0
"""The gateway's ``worker_stale_after_s`` in this test."""
BACKGROUND = common_pb2.REQUEST_CLASS_BACKGROUND
TENANT = "outage-acme"


@dataclass
class Platform:
    stack: Stack
    demo: DemoManifest
    gateway: GatewayApp
    worker: WorkerApp
    cli_env: dict[str, str]
    workdir: Path
    key: str = ""

    async def release(self, version: str, *, ok: bool = True, wait_s: int = 120) -> Any:
        """Release a new version of ``support`` (the demo's support weights, new version)."""
        return await release(
            self.cli_env, self.demo,
            adapter_copy(self.demo, self.workdir, "support", self.demo_version),
            tenant=TENANT, name="support", version=version, wait_s=wait_s, ok=ok)

    async def release_cold(self, version: str) -> None:
        """Release ``version`` of ``support`` (admitted, never promoted, so nothing loads
        it) and wait until the gateway's catalogue has it."""
        result = await self.release(version)
        assert json.loads(result.stdout)["verdict"] == "admitted", result.stdout
        await catalog_shows(self.gateway, TENANT, "support",
                            lambda entry: version in entry.versions)

    async def admitted_after_outage(self, version: str, *, timeout_s: float) -> None:
        """Release ``version`` until one attempt is admitted (2 s apart, within
        ``timeout_s``): the services take releases again without a restart."""

        async def admitted() -> bool:
            r = await self.release(version, ok=False, wait_s=120)
            return r.exit_code == 0 and json.loads(r.stdout)["verdict"] == "admitted"

        await eventually(admitted, timeout_s=timeout_s, every_s=2)

    @property
    def demo_version(self) -> str:
        return next(a.version for a in self.demo.adapters if a.name == "support")


@pytest.fixture(scope="module")
async def platform(stack: Stack, tmp_path_factory: pytest.TempPathFactory
                   ) -> AsyncIterator[Platform]:
    unique = uuid.uuid4().hex[:8]
    work = tmp_path_factory.mktemp("outages")
    demo = build_demo()
    async with (
        control_plane(stack, work, demo, name="outage", unique=unique,
                      actor="ci/outages") as cp,
        serving_worker(stack, demo, work, f"w-outage-{unique}", worker_max_loras=2,
                       worker_max_cpu_loras=4) as worker,
    ):
        gateway = GatewayApp(
            gateway_settings(stack, cp, demo, instance_id=f"gw-outage-{unique}", http_port=0,
                             worker_stale_after_s=STALE_S, worker_probe_interval_s=0.5),
            registry=CollectorRegistry(), serve_metrics=False,
        )
        await gateway.start()
        try:
            await gateway.wait_ready(60)
            p = Platform(stack, demo, gateway, worker, cp.cli_env, work,
                         key=await tenant_with_key(cp.cli_env, TENANT, priority="gold"))
            await p.release("2026-11-01.1")
            await run_cli(cp.cli_env, "promote", f"{TENANT}/support", "2026-11-01.1",
                          "--reason", "outage test")
            g = gateway.gateway
            await catalog_shows(gateway, TENANT, "support", lambda entry: (
                entry.release.stable == "2026-11-01.1" and TENANT in g.auth.tenants
                and g.placement.routable(demo.base_model.name)))
            yield p
        finally:
            for comp in (stack.seaweedfs, stack.tansu, stack.postgres):
                comp.start()  # a failed case must not leave the session's stack down
            await gateway.stop(1)


@dataclass
class Load:
    """Steady interactive load on the HOT adapter: every outcome, by kind."""

    outcomes: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    versions: Counter[str] = field(default_factory=Counter)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def total(self) -> int:
        return sum(self.outcomes.values())


async def _client(stub: inference_pb2_grpc.InferenceStub, key: str, load: Load) -> None:
    req = inference_pb2.GenerateRequest(adapter="support", prompt="Hello, how are you?",
                                        max_tokens=2)
    md = (("authorization", f"Bearer {key}"),)
    while not load.stop.is_set():
        try:
            msgs = [m async for m in stub.Generate(req, metadata=md, timeout=30)]
        except grpc.aio.AioRpcError as err:
            load.outcomes[err.code().name] += 1
            load.errors.append(f"{err.code().name}: {err.details()}")
            await asyncio.sleep(0.05)
            continue
        r = msgs[0].resolved
        if r.degraded_to_base:
            load.outcomes["degraded"] += 1
        elif r.tier_at_arrival != common_pb2.TIER_HOT:
            load.outcomes["not_hot"] += 1
        else:
            load.outcomes["ok"] += 1
        load.versions[r.adapter.version] += 1


@contextlib.asynccontextmanager
async def steady_load(p: Platform, clients: int = 3) -> AsyncIterator[Load]:
    load = Load()
    async with tenant_channel(p.stack, f"127.0.0.1:{p.gateway.grpc_port}") as ch:
        stub = inference_pb2_grpc.InferenceStub(ch)
        tasks = [asyncio.create_task(_client(stub, p.key, load)) for _ in range(clients)]
        try:
            yield load
        finally:
            load.stop.set()
            await asyncio.gather(*tasks)


@contextlib.asynccontextmanager
async def outage(p: Platform, component: Component, *, before_s: float = 1.0,
                 after_s: float = 1.0) -> AsyncIterator[Load]:
    """Under :func:`steady_load`: ``before_s`` of load, then ``component`` of the stack
    killed (SIGKILL) for the body and started again after it (also when it fails), then
    ``after_s`` more of load. The body starts right after the kill."""
    async with steady_load(p) as load:
        await asyncio.sleep(before_s)
        component.kill()
        try:
            yield load
        finally:
            component.start()
        await asyncio.sleep(after_s)


async def _make_hot(p: Platform) -> None:
    """One background request loads the stable version; then it is HOT on the worker."""
    async with tenant_channel(p.stack, f"127.0.0.1:{p.gateway.grpc_port}") as ch:
        stub = inference_pb2_grpc.InferenceStub(ch)
        req = inference_pb2.GenerateRequest(adapter="support", prompt="Hi", max_tokens=1,
                                            request_class=BACKGROUND)
        msgs = [m async for m in stub.Generate(
            req, metadata=(("authorization", f"Bearer {p.key}"),), timeout=120)]
        assert not msgs[0].resolved.degraded_to_base
    g = p.gateway.gateway
    info = g.catalog.lookup(TENANT, "support")
    engine_id = info.versions[info.release.stable].engine_id

    async def hot() -> bool:
        return g.placement.tier(p.worker.settings.worker_id, engine_id) == common_pb2.TIER_HOT

    await eventually(hot)


def _assert_all_hot(load: Load, what: str) -> None:
    assert load.total > 0, what
    assert set(load.outcomes) == {"ok"}, (what, load.outcomes, load.errors[:5])


async def test_broker_outage_of_three_staleness_windows_refuses_nothing(
    platform: Platform,
) -> None:
    p = platform
    g = p.gateway.gateway
    wid = p.worker.settings.worker_id
    await _make_hot(p)
    async with outage(p, p.stack.tansu, before_s=2, after_s=2) as load:
        before = load.total
        heat_before = g.heat.recorded
        killed = time.monotonic()
        while time.monotonic() - killed < 3 * STALE_S:
            await asyncio.sleep(0.5)
            w = g.placement.worker(wid)
            assert w is not None and g.placement.liveness(w) == ANSWERING
            assert g.placement.routable(p.demo.base_model.name), "worker un-routed"
        during = load.total - before
        # the worker's cache.state reports have been silent for longer than the window
        w = g.placement.worker(wid)
        assert w is not None and time.time() - w.last_seen > STALE_S
    _assert_all_hot(load, "broker outage")
    assert during > 10, during
    print(f"\n[measure] broker down {3 * STALE_S:.0f}s: {load.total} requests, "
          f"{during} during the outage, outcomes {dict(load.outcomes)}")

    # heat of the outage: delivered once the broker is back, or counted as dropped
    async def heat_settled() -> bool:
        return g.heat.pending == 0
    await eventually(heat_settled, timeout_s=60)
    assert g.heat.recorded >= heat_before + during
    assert g.heat.published + g.heat.dropped == g.heat.recorded
    print(f"[measure] gateway heat after the outage: published {g.heat.published}, "
          f"dropped {g.heat.dropped}; worker events sent {p.worker.publisher.sent}, "
          f"dropped {p.worker.publisher.dropped}")

    # the broker is back: a release goes all the way to admitted, and the view sees it
    await p.release_cold("2026-11-02.1")


async def test_postgres_outage_keeps_hot_serving_and_release_fails_fast(
    platform: Platform,
) -> None:
    p = platform
    await _make_hot(p)
    async with outage(p, p.stack.postgres) as load:
        t0 = time.monotonic()
        result = await p.release("2026-11-03.1", ok=False, wait_s=5)
        failed_in = time.monotonic() - t0
        await asyncio.sleep(3)
    _assert_all_hot(load, "postgres outage")
    out = result.stdout + result.stderr
    assert result.exit_code not in (0, 3), out
    assert "database unavailable" in out, out
    print(f"\n[measure] postgres down: {load.total} HOT requests {dict(load.outcomes)}; "
          f"release refused in {failed_in:.1f}s: {out.strip()[:160]}")
    # back: the same services take a release again (their pools reconnect by themselves)
    await p.admitted_after_outage("2026-11-03.1", timeout_s=120)


async def _cold_load(p: Platform, version: str) -> grpc.aio.AioRpcError | None:
    """A background request for a COLD version, straight to the worker (as the gateway
    routes it): the worker must fetch it from the object store."""
    info = p.gateway.gateway.catalog.lookup(TENANT, "support").versions[version]
    req = worker_pb2.WorkerGenerateRequest(
        request_id=uuid.uuid4().hex, request_class=BACKGROUND, cold_budget_ms=30_000,
        engine_id=info.engine_id, sha256=info.sha256, artifact_uri=info.artifact_uri,
        rank=info.rank, size_bytes=info.size_bytes, base_model=p.demo.base_model.name,
        params=inference_pb2.GenerateRequest(adapter="support", prompt="Hi", max_tokens=1),
    )
    req.adapter.tenant_id, req.adapter.adapter_name, req.adapter.version = (
        TENANT, "support", version)
    req.adapter.base_model = p.demo.base_model.name
    async with internal_channel(p.stack, p.worker.grpc_address, caller=GATEWAY,
                                server=WORKER) as ch:
        try:
            [m async for m in worker_pb2_grpc.WorkerInternalStub(ch).Generate(req, timeout=60)]
        except grpc.aio.AioRpcError as err:
            return err
    return None


async def test_object_store_outage_keeps_hot_serving_and_cold_work_fails_fast(
    platform: Platform,
) -> None:
    p = platform
    await _make_hot(p)
    cold = "2026-11-04.1"  # this case's own version: admitted, never promoted nor loaded
    await p.release_cold(cold)
    g = p.gateway.gateway
    assert g.placement.tier(p.worker.settings.worker_id, g.catalog.lookup(
        TENANT, "support").versions[cold].engine_id) == common_pb2.TIER_COLD
    async with outage(p, p.stack.seaweedfs) as load:
        t0 = time.monotonic()
        result = await p.release("2026-11-05.1", ok=False, wait_s=5)
        release_in = time.monotonic() - t0
        t0 = time.monotonic()
        err = await _cold_load(p, cold)
        cold_in = time.monotonic() - t0
    _assert_all_hot(load, "object store outage")
    out = result.stdout + result.stderr
    assert result.exit_code == 5, out  # the documented "a component is unreachable"
    assert "object store" in out, out
    assert err is not None and err.code() == grpc.StatusCode.UNAVAILABLE, err
    assert "cannot reach the object store" in (err.details() or ""), err.details()
    print(f"\n[measure] object store down: {load.total} HOT requests "
          f"{dict(load.outcomes)}; release refused in {release_in:.1f}s: {out.strip()[:160]}; "
          f"cold load refused in {cold_in:.1f}s: {err.details()[:120]}")
    # back: the same worker loads it without a restart
    assert await _cold_load(p, cold) is None
    # back: a release is admitted again without restarting a service
    await p.admitted_after_outage("2026-11-05.1", timeout_s=180)
