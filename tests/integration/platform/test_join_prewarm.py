"""A worker that joins gets the hottest versions WARM before its first request for them,
and the requests before the join meet no demotion (issue 19), on the real platform.

Real services on the test stack: registry (own database) and admission in process, a worker
on a real vLLM engine, the gateway, and the cache manager as a process whose rules turn the
join prewarm on (``join_prewarm.top`` 2) and whose policy keeps one HOT replica of the
hottest versions (``placement.min_hot_replicas`` 1: the first worker's HOT copies are enough,
so nothing but the join prewarm sends the versions to the second worker). Three adapters are
released and requested 1 / 6 / 8 times through the gateway on the first worker alone; then a
second worker starts.

What is asserted: every request before the join is served by its adapter (none UNAVAILABLE:
before the fixes, the policy demoted a version loaded on the request path before its heat
came in, as never requested, and promoted it again a round later, and the requests that met
the drain failed ``being evicted``); the cache manager decided no demotion on the first
worker; the joining worker's own ``GetState`` shows the two most requested versions held
(WARM or HOT) and not the least requested one; its first requests for them arrive WARM or
HOT and it reads no byte of them from the object store after the prewarm's own fetch.
Prints, as ``[measure]``, the join → held time and the tiers.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from loraplane.devkit.builder import DemoManifest, build_demo
from loraplane.gateway.app import GatewayApp
from loraplane.shared.tls import CACHE_MANAGER, GATEWAY, OPERATOR, WORKER
from loraplane.stack.stack import Stack
from loraplane.v1 import (
    cache_pb2,
    cache_pb2_grpc,
    common_pb2,
    events_pb2,
    inference_pb2,
    inference_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from loraplane.worker.app import WorkerApp
from tests.integration.platform.support import (
    adapter_copy,
    catalog_shows,
    control_plane,
    eventually,
    managed_gateway,
    release,
    run_cli,
    serving_worker,
)
from tests.support.cache_manager import Manager
from tests.support.tls import internal_channel, tenant_channel

pytestmark = pytest.mark.engine

REQUESTS = {"chat": 1, "code": 6, "legal": 8}
"""Requests per adapter before the join: the two most requested are the join's hottest."""
TOP = 2
RULES = {"join_prewarm": {"top": TOP, "window_s": 600.0}}
POLICY = {"placement": {"min_hot_replicas": 1}}
HELD_BOUND_S = 90.0
"""Wait bound for the joining worker to hold the hottest versions (not a speed target)."""


@dataclass
class Platform:
    stack: Stack
    demo: DemoManifest
    cli_env: dict[str, str]
    gateway: GatewayApp
    first: WorkerApp
    manager: Manager
    manager_addr: str
    """The cache manager's gRPC address (the gateway's ``cache_manager_addr``)."""
    tenant: str
    key: str
    work: Path
    unique: str


def worker_overrides(work: Path, wid: str) -> dict[str, object]:
    # three HOT slots: the three versions fit on the first worker without a victim
    return {"worker_max_loras": 3, "worker_max_cpu_loras": 4,
            "worker_host_dir": work / f"host-{wid}"}


@pytest.fixture(scope="module")
async def platform(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Platform]:
    unique = uuid.uuid4().hex[:8]
    work = tmp_path_factory.mktemp("join-prewarm")
    demo = build_demo()
    tenant = f"join-{unique[:6]}"
    async with contextlib.AsyncExitStack() as es:
        cp = await es.enter_async_context(
            control_plane(stack, work, demo, name="joinpre", unique=unique, actor="ci/join",
                          canary_clearance=False)
        )
        wid = f"w0-join-{unique}"
        first = await es.enter_async_context(
            serving_worker(stack, demo, work, wid, **worker_overrides(work, wid))
        )
        m = await es.enter_async_context(
            managed_gateway(stack, cp, demo, work, unique=unique, tenant=tenant, rules=RULES,
                            policy=POLICY)
        )
        yield Platform(stack, demo, cp.cli_env, m.gateway, first, m.manager, m.manager_addr,
                       tenant, m.key, work, unique)


def version_of(p: Platform, name: str) -> str:
    return next(a.version for a in p.demo.adapters if a.name == name)


async def state_of(p: Platform, w: WorkerApp) -> events_pb2.WorkerState:
    """The worker's own answer to ``GetState`` (asked as an operator)."""
    async with internal_channel(p.stack, w.grpc_address, caller=OPERATOR,
                                server=WORKER) as ch:
        return await worker_pb2_grpc.WorkerInternalStub(ch).GetState(
            worker_pb2.GetStateRequest(), timeout=5
        )


def tiers(p: Platform, state: events_pb2.WorkerState) -> dict[str, int]:
    """Adapter name → tier of the test's versions the worker holds."""
    return {pl.adapter.adapter_name: pl.tier for pl in state.placements
            if pl.adapter.tenant_id == p.tenant and pl.adapter.adapter_name in REQUESTS}


def downloaded(p: Platform, w: WorkerApp, name: str) -> float:
    """Bytes of the adapter's version the worker read from the object store."""
    return w.metrics_registry.get_sample_value(
        "loraplane_worker_adapter_load_bytes_total",
        {"base_model": p.demo.base_model.name, "tenant": p.tenant, "adapter": name,
         "version": version_of(p, name)},
    ) or 0.0


async def through_gateway(p: Platform, stub: inference_pb2_grpc.InferenceStub, name: str,
                          key: str) -> inference_pb2.ResolvedAdapter:
    """One background request for ``name`` through the gateway; its ``resolved``."""
    req = inference_pb2.GenerateRequest(
        adapter=name, prompt="Hello", max_tokens=1, request_key=key,
        request_class=common_pb2.REQUEST_CLASS_BACKGROUND,
    )
    msgs = [m async for m in stub.Generate(
        req, metadata=(("authorization", f"Bearer {p.key}"),), timeout=90)]
    return msgs[0].resolved


async def on_worker(p: Platform, w: WorkerApp, name: str, rid: str) -> inference_pb2.ResolvedAdapter:
    """One background request for ``name`` sent to worker ``w`` itself (as the gateway
    sends it: the version from the gateway's catalogue); its ``resolved``."""
    info = p.gateway.gateway.catalog.lookup(p.tenant, name).versions[version_of(p, name)]
    wreq = worker_pb2.WorkerGenerateRequest(
        request_id=rid,
        params=inference_pb2.GenerateRequest(adapter=name, prompt="Hello", max_tokens=1),
        request_class=common_pb2.REQUEST_CLASS_BACKGROUND,
        base_model=p.demo.base_model.name, engine_id=info.engine_id, sha256=info.sha256,
        artifact_uri=info.artifact_uri, rank=info.rank, size_bytes=info.size_bytes,
    )
    wreq.adapter.CopyFrom(info.ref())
    async with internal_channel(p.stack, w.grpc_address, caller=GATEWAY,
                                server=WORKER) as ch:
        msgs = [m async for m in worker_pb2_grpc.WorkerInternalStub(ch).Generate(
            wreq, timeout=90)]
    return msgs[0].resolved


async def decisions(p: Platform, worker_id: str) -> list[cache_pb2.Decision]:
    async with internal_channel(p.stack, p.manager_addr, caller=OPERATOR,
                                server=CACHE_MANAGER) as ch:
        resp = await cache_pb2_grpc.CacheManagerStub(ch).ListDecisions(
            cache_pb2.ListDecisionsRequest(limit=500, worker_id=worker_id, tenant_id=p.tenant),
            timeout=5)
    return list(resp.decisions)


def counted(p: Platform) -> dict[str, int]:
    """Adapter name → completed requests of the test's tenant the cache manager has counted
    (``loraplane_cache_requests_total``, summed over the tiers at arrival)."""
    out: dict[str, int] = {}
    for line in p.manager.metric_lines("loraplane_cache_requests_total{"):
        labels, _, value = line.rpartition(" ")
        if f'tenant="{p.tenant}"' not in labels:
            continue
        name = labels.split('adapter="', 1)[1].split('"', 1)[0]
        out[name] = out.get(name, 0) + int(float(value))
    return out


async def decision_lines(p: Platform, worker_id: str) -> list[str]:
    """The worker's decisions, one line each (for an assertion's message)."""
    return [f"{cache_pb2.DecisionAction.Name(d.action)} {d.adapter.adapter_name}: {d.reason}"
            f" (heat {d.heat_score:.3g}, {d.policy})" for d in await decisions(p, worker_id)]


async def test_a_joining_worker_holds_the_hottest_versions_before_its_first_request(
    platform: Platform,
) -> None:
    p = platform
    for name in REQUESTS:
        version = version_of(p, name)
        await release(p.cli_env, p.demo, adapter_copy(p.demo, p.work, name, version),
                      tenant=p.tenant, name=name, version=version)
        await run_cli(p.cli_env, "promote", f"{p.tenant}/{name}", version, "--reason",
                      "join prewarm test")
        await catalog_shows(p.gateway, p.tenant, name,
                            lambda e, v=version: e.release.stable == v)
    first_id = p.first.settings.worker_id
    async with tenant_channel(p.stack, f"127.0.0.1:{p.gateway.grpc_port}") as ch:
        stub = inference_pb2_grpc.InferenceStub(ch)
        served: dict[str, list[inference_pb2.ResolvedAdapter]] = {n: [] for n in REQUESTS}
        for name, n in REQUESTS.items():  # back to back, as a client sends them
            for i in range(n):
                served[name].append(await through_gateway(p, stub, name, f"{name}-{i}"))
    # every request before the join served by its adapter on the first worker
    for name, rs in served.items():
        assert [(r.adapter.adapter_name, r.worker_id, r.degraded_to_base) for r in rs] == [
            (name, first_id, False)] * REQUESTS[name], rs
    # the gateway published every completion (the cache manager's heat)
    heat = p.gateway.gateway.heat
    await eventually(lambda: heat.pending == 0 and heat.published >= sum(REQUESTS.values()),
                     timeout_s=30)
    # ... and the cache manager counted every one of them before the join: published is not
    # consumed, and a prewarm ranked on part of the heat (legal's 8 not in yet) would load the
    # least requested version too (CI of 1b479c8: chat, code and legal all prewarmed)
    seen: list[dict[str, int]] = [{}]

    def all_counted() -> bool:
        seen[0] = counted(p)
        return seen[0] == REQUESTS

    try:
        await eventually(all_counted, timeout_s=30)
    except AssertionError:
        raise AssertionError(f"the cache manager counted {seen[0]}, not {REQUESTS}") from None
    assert not [d for d in await decisions(p, first_id)
                if d.action == cache_pb2.DECISION_ACTION_DEMOTE], "a version was demoted"

    fetched_first = {n: downloaded(p, p.first, n) for n in REQUESTS}
    wid = f"w1-join-{p.unique}"
    async with serving_worker(p.stack, p.demo, p.work, wid,
                              **worker_overrides(p.work, wid)) as joiner:
        joined = time.monotonic()
        hottest = sorted(REQUESTS, key=lambda n: -REQUESTS[n])[:TOP]

        async def holds_hottest() -> dict[str, int] | None:
            held = tiers(p, await state_of(p, joiner))
            return held if all(n in held for n in hottest) else None

        held = await eventually(holds_hottest, timeout_s=HELD_BOUND_S, every_s=0.2)
        held_s = time.monotonic() - joined
        # the least requested one is not prewarmed
        assert set(held) == set(hottest), (held, await decision_lines(p, wid))
        assert set(held.values()) <= {common_pb2.TIER_WARM, common_pb2.TIER_HOT}, held
        prewarmed = {n: downloaded(p, joiner, n) for n in hottest}
        assert all(b > 0 for b in prewarmed.values()), prewarmed  # fetched by the prewarm
        loads = [d for d in await decisions(p, wid)
                 if d.action == cache_pb2.DECISION_ACTION_LOAD_WARM]
        assert {d.adapter.adapter_name for d in loads} == set(hottest), loads
        assert all("worker joined" in d.reason for d in loads), loads

        # its first requests for them find them on the host: no byte read on the request path
        first_requests = {n: await on_worker(p, joiner, n, f"joined-{n}-{uuid.uuid4().hex[:6]}")
                          for n in hottest}
        for n, r in first_requests.items():
            assert r.adapter.adapter_name == n and r.worker_id == wid, r
            assert r.tier_at_arrival in (common_pb2.TIER_WARM, common_pb2.TIER_HOT), r
        assert {n: downloaded(p, joiner, n) for n in hottest} == prewarmed
    assert {n: downloaded(p, p.first, n) for n in REQUESTS} == fetched_first
    print(
        f"[measure] join prewarm: {sum(REQUESTS.values())} requests on one worker, none "
        f"refused, no demotion; joined -> {', '.join(hottest)} held after {held_s:.1f}s "
        f"({', '.join(common_pb2.Tier.Name(held[n]) for n in hottest)}); first requests "
        f"there arrived {[common_pb2.Tier.Name(r.tier_at_arrival) for r in first_requests.values()]}, "
        f"0 bytes read after the prewarm's {int(sum(prewarmed.values()))}"
    )
