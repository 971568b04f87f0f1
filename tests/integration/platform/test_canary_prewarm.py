"""A canary released with a prewarm schedule is WARM on its target workers before its share
is set, and its first request needs no download (issue 19), on the real platform.

Real services on the test stack: registry (own database) and admission in process, two
workers on real vLLM engines, the gateway, and the cache manager as a process whose rules
give every canary a prewarm schedule (``canary.prewarm.start_percent``). The canary is
staged at 0 % with the ``loraplane`` CLI; the cache manager prefetches it to both workers
(every worker serving the base model is a target) and its analysis sets the first share
through the registry (audited) once both workers have reported it.

What is asserted: each worker's host tier had verified and placed the canary's bytes
before the share step was taken (its ``verified_at`` against the audited step's time; a
poll of the workers' ``GetState`` while the share was 0 % could miss a short interval
between a worker's report and the step at load, as the fresh-clone run of 2026-12-04
22:50 UTC did: one of two workers unseen), and each holds it (WARM or HOT) in its own
``GetState``; the share step is the
analysis' ``prewarmed`` advance naming both workers; after the share, requests the gateway
routes to the canary arrive HOT or WARM, and no worker reads another byte of it from the
object store. Prints, as ``[measure]``, stage → WARM on each worker → share set.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import pytest

from loraplane.cache_manager.canary_runner import ACTOR, REASON_PREFIX
from loraplane.devkit.builder import DemoManifest, build_demo
from loraplane.gateway.app import GatewayApp
from loraplane.shared.tls import OPERATOR, WORKER
from loraplane.stack.stack import Stack
from loraplane.v1 import (
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

START_PERCENT = 50
RULES = {
    "canary": {
        "warm_replicas": 1,
        "prewarm": {"start_percent": START_PERCENT},
        # the analysis must not move past the first share while the test looks at it
        "analysis": {"stages": [START_PERCENT, 100], "dwell_s": 600.0, "window_s": 900.0},
    },
}
NAME, V1, V2 = "support", "2026-11-01.1", "2026-11-15.1"
SHARE_BOUND_S = 120.0


@dataclass
class Platform:
    stack: Stack
    demo: DemoManifest
    dsn: str
    cli_env: dict[str, str]
    gateway: GatewayApp
    workers: list[WorkerApp]
    manager: Manager
    tenant: str
    key: str
    work: Path


@pytest.fixture(scope="module")
async def platform(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Platform]:
    unique = uuid.uuid4().hex[:8]
    work = tmp_path_factory.mktemp("canary-prewarm")
    demo = build_demo()
    tenant = f"pre-{unique[:6]}"
    async with contextlib.AsyncExitStack() as es:
        cp = await es.enter_async_context(
            control_plane(stack, work, demo, name="prewarm", unique=unique, actor="ci/prewarm")
        )
        workers = []
        for n in range(2):
            wid = f"w{n}-pre-{unique}"
            workers.append(
                await es.enter_async_context(
                    serving_worker(
                        stack,
                        demo,
                        work,
                        wid,
                        worker_max_loras=2,
                        worker_max_cpu_loras=4,
                        worker_host_dir=work / f"host-{wid}",
                    )
                )
            )
        m = await es.enter_async_context(
            managed_gateway(stack, cp, demo, work, unique=unique, tenant=tenant, rules=RULES,
                            LORAPLANE_CACHE_MANAGER_CANARY_INTERVAL_S="0.5")
        )
        yield Platform(stack, demo, cp.dsn, cp.cli_env, m.gateway, workers, m.manager, tenant, m.key,
                       work)


async def worker_states(p: Platform) -> dict[str, events_pb2.WorkerState]:
    """Each worker's own answer to ``GetState``."""
    out = {}
    for w in p.workers:
        async with internal_channel(p.stack, w.grpc_address, caller=OPERATOR,
                                    server=WORKER) as ch:
            out[w.settings.worker_id] = await worker_pb2_grpc.WorkerInternalStub(ch).GetState(
                worker_pb2.GetStateRequest(), timeout=5
            )
    return out


def held(state: events_pb2.WorkerState, version: str) -> events_pb2.AdapterPlacement | None:
    for pl in state.placements:
        if pl.adapter.adapter_name == NAME and pl.adapter.version == version:
            return pl
    return None


def verified_at(w: WorkerApp, version: str) -> datetime | None:
    """When worker ``w``'s host tier verified and placed ``version``'s bytes (its WARM
    time; a later HOT load keeps it), from the in-process worker; None if it holds none."""
    for pl in w.manager.placements.values():
        if pl.spec.adapter_name == NAME and pl.spec.version == version:
            return pl.host.verified_at
    return None


async def share(p: Platform) -> int:
    conn = await asyncpg.connect(p.dsn)
    try:
        return int(
            await conn.fetchval(
                "SELECT canary_percent FROM release_pointers WHERE adapter_id = $1",
                f"{p.tenant}/{NAME}",
            )
            or 0
        )
    finally:
        await conn.close()


async def generate(
    p: Platform, stub: inference_pb2_grpc.InferenceStub, key: str
) -> inference_pb2.ResolvedAdapter | None:
    req = inference_pb2.GenerateRequest(
        adapter=NAME,
        prompt="Hello",
        max_tokens=1,
        request_key=key,
        request_class=common_pb2.REQUEST_CLASS_BACKGROUND,
    )
    try:
        msgs = [
            m
            async for m in stub.Generate(
                req, metadata=(("authorization", f"Bearer {p.key}"),), timeout=90
            )
        ]
    except grpc.aio.AioRpcError:
        return None
    return msgs[0].resolved


def downloaded(p: Platform, w: WorkerApp, version: str) -> float:
    """Bytes of ``version`` the worker read from the object store."""
    return (
        w.metrics_registry.get_sample_value(
            "loraplane_worker_adapter_load_bytes_total",
            {
                "base_model": p.demo.base_model.name,
                "tenant": p.tenant,
                "adapter": NAME,
                "version": version,
            },
        )
        or 0.0
    )


async def test_canary_is_warm_on_every_target_worker_before_its_share_is_set(
    platform: Platform,
) -> None:
    p = platform
    for version in (V1, V2):
        await release(
            p.cli_env,
            p.demo,
            adapter_copy(p.demo, p.work, NAME, version),
            tenant=p.tenant,
            name=NAME,
            version=version,
        )
    await run_cli(p.cli_env, "promote", f"{p.tenant}/{NAME}", V1, "--reason", "prewarm test")
    await catalog_shows(p.gateway, p.tenant, NAME, lambda e: e.release.stable == V1)
    async with tenant_channel(p.stack, f"127.0.0.1:{p.gateway.grpc_port}") as ch:
        stub = inference_pb2_grpc.InferenceStub(ch)

        async def stable_serves() -> bool:
            r = await generate(p, stub, "warm-up")
            return r is not None and r.adapter.version == V1 and not r.degraded_to_base

        await eventually(stable_serves, timeout_s=90, every_s=0.5)

        # stage the canary at 0 %: from here only the cache manager moves it
        t0 = time.monotonic()
        await run_cli(
            p.cli_env, "canary", f"{p.tenant}/{NAME}", V2, "0", "--reason", "prewarm test"
        )
        share_at = 0.0
        while time.monotonic() - t0 < SHARE_BOUND_S:
            percent = await share(p)
            if percent != 0:
                share_at = time.monotonic() - t0
                assert percent == START_PERCENT
                break
            await asyncio.sleep(0.1)
        assert share_at > 0, f"no share within {SHARE_BOUND_S}s"
        wids = sorted(w.settings.worker_id for w in p.workers)
        # each worker holds it now, in its own GetState (WARM, or HOT once asked for)
        states = await worker_states(p)
        tiers = {wid: held(st, V2).tier if held(st, V2) is not None else None
                 for wid, st in states.items()}
        assert sorted(tiers) == wids, tiers
        assert set(tiers.values()) <= {common_pb2.TIER_WARM, common_pb2.TIER_HOT}, tiers

        # the share step is the analysis' own, taken on both workers' reports
        conn = await asyncpg.connect(p.dsn)
        try:
            rows = await conn.fetch(
                # the share steps (not the clearance for tenant traffic, release.canary_clear)
                "SELECT action, after, at FROM audit_log WHERE actor = $1 AND subject = $2 "
                "AND action <> 'release.canary_clear' ORDER BY id",
                ACTOR,
                f"{p.tenant}/{NAME}",
            )
        finally:
            await conn.close()
        steps = []
        for r in rows:
            after = json.loads(r["after"]) if isinstance(r["after"], str) else r["after"]
            steps.append(json.loads(after["reason"][len(REASON_PREFIX) :]))
        assert [
            (s["action"], s.get("reason"), s.get("from_percent"), s.get("to_percent"))
            for s in steps
        ] == [("advance", "prewarmed", 0, START_PERCENT)], steps
        assert sorted(steps[0]["checks"]["prewarm"]["ready"]) == wids
        # ... and each worker had verified the bytes before that step was taken: the time
        # its host tier placed them (kept through a later HOT load), against the audited
        # step's (the registry's transaction, after the analysis decided)
        share_step_at = rows[0]["at"]
        warm_at = {w.settings.worker_id: verified_at(w, V2) for w in p.workers}
        assert all(t is not None and t <= share_step_at for t in warm_at.values()), (
            share_step_at, warm_at)
        before_s = {wid: (share_step_at - t).total_seconds() for wid, t in warm_at.items()
                    if t is not None}

        # the first requests routed to the canary find it on the worker: no download
        before = {w.settings.worker_id: downloaded(p, w, V2) for w in p.workers}
        assert all(b > 0 for b in before.values()), before  # each fetched it once, prewarm
        await catalog_shows(
            p.gateway, p.tenant, NAME, lambda e: e.release.canary_percent == START_PERCENT
        )
        canary_hits: list[Any] = []
        for i in range(60):
            r = await generate(p, stub, f"user-{i}")
            if r is not None and r.canary:
                canary_hits.append(r)
                if len(canary_hits) >= 3:
                    break
        assert canary_hits, "no request was routed to the canary"
        assert {r.adapter.version for r in canary_hits} == {V2}
        assert all(
            r.tier_at_arrival in (common_pb2.TIER_HOT, common_pb2.TIER_WARM)
            and not r.degraded_to_base
            for r in canary_hits
        ), canary_hits
        after_bytes = {w.settings.worker_id: downloaded(p, w, V2) for w in p.workers}
        assert after_bytes == before, (before, after_bytes)
    warm = ", ".join(f"{w} {s:.2f}s" for w, s in sorted(before_s.items()))
    print(
        f"[measure] canary prewarm: staged → share {START_PERCENT} % at {share_at:.1f}s, "
        f"verified on each worker before the share step by {warm}; "
        f"{len(canary_hits)} canary requests, tiers "
        f"{[common_pb2.Tier.Name(r.tier_at_arrival) for r in canary_hits]}, 0 bytes "
        "downloaded after the share"
    )
