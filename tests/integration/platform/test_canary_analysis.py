"""Canaries that judge themselves (issue 16), end to end on the real platform.

Real services on the test stack: registry (own database) and admission in process, one
worker on the real vLLM engine, the gateway, and the cache manager as a process (its
leader runs the canary analysis and takes every step through the registry's admin API).
Adapters are the signed demo adapters, released with the ``loraplane`` CLI.

(b) a canary whose artifact disappears after admission (its objects removed from the
    object store) is aborted within 60 s of its share being set, with an audit entry
    naming the load failure, and stable answers every request meanwhile;
(a) a healthy canary is promoted through every stage (10 → 50 → 100 %, short dwell) to
    stable without a person, one audit entry per step, although the cache-manager leader
    is killed after the first step (the standby continues: no step lost, none repeated);
(c) a canary that loads and serves but answers as another model would (the wrong weights
    shipped under the adapter's name): its answers to the adapter's golden set, recorded
    from the stable version, diverge once it is HOT, and the analysis aborts it
    (``golden_set_failed``, audited with the diverging answer); stable answers every
    request, the canary's golden failures stop at the golden set's size on its one
    worker, it is demoted, and nothing is routed to it after the abort plus the drain bound.

Each prints, as ``[measure]``: time from the share being set to the decision, requests
the canary served, failures it caused.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import shutil
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import asyncpg
import grpc
import pytest
from minio import Minio
from prometheus_client import CollectorRegistry

from loraplane.cache_manager.canary_runner import ACTOR, REASON_PREFIX
from loraplane.cache_manager.model import Ref
from loraplane.devkit.builder import DemoManifest, build_demo
from loraplane.gateway.app import GatewayApp
from loraplane.shared.errors import LoraplaneError
from loraplane.stack.stack import Stack
from loraplane.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from loraplane.worker.app import WorkerApp
from loraplane.worker.vllm_engine import VllmEngine
from tests.integration.platform.support import (
    control_plane,
    eventually,
    free_port,
    gateway_settings,
    run_cli,
    worker_settings,
)
from tests.support.cache_manager import Launcher, Manager
from tests.support.registry import TOKEN

pytestmark = pytest.mark.engine

STAGES = [10, 50, 100]
ANALYSIS = {
    "stages": STAGES, "dwell_s": 4.0, "window_s": 30.0, "min_requests": 3,
    # the CPU engine shares 2 cores with the test: a tail comparison here would measure
    # the machine, not the canary (the TTFT rule has its unit tests)
    "ttft_slack_ms": 5000.0,
}
RULES = {"canary": {"warm_replicas": 1, "golden_set": ["Hello"], "analysis": ANALYSIS}}
ABORT_BOUND_S = 60.0
CONCURRENCY = 4


@dataclass
class Canaries:
    stack: Stack
    demo: DemoManifest
    dsn: str
    gateway: GatewayApp
    manager: Manager
    launcher: Launcher
    manager_env: dict[str, str]
    cli_env: dict[str, str]
    tenant: str
    key: str
    workdir: Path

    def adapter_dir(self, name: str, version: str) -> Path:
        src = next(a for a in self.demo.adapters if (a.name, a.version) == (name, version))
        dst = self.workdir / "adapters" / f"{name}-{version}-{uuid.uuid4().hex[:6]}"
        shutil.copytree(src.dir, dst)
        return dst

    async def cli(self, *args: str) -> str:
        return str((await run_cli(self.cli_env, *args)).stdout)

    async def release(self, name: str, version: str, src: tuple[str, str]) -> None:
        await self.cli("release", str(self.adapter_dir(*src)), "--tenant", self.tenant,
                       "--name", name, "--version", version, "--base-model",
                       self.demo.base_model.name, "--signing-key",
                       str(self.demo.keys.private_key), "--wait", "90")

    async def pointers(self, name: str) -> Any:
        conn = await asyncpg.connect(self.dsn)
        try:
            return await conn.fetchrow(
                "SELECT stable_version, canary_version, canary_percent FROM release_pointers "
                "WHERE adapter_id = $1", f"{self.tenant}/{name}")
        finally:
            await conn.close()

    async def automated_steps(self, name: str) -> list[tuple[str, dict[str, Any]]]:
        """(action, figures) of every audit entry the canary analysis wrote, oldest first."""
        conn = await asyncpg.connect(self.dsn)
        try:
            rows = await conn.fetch(
                "SELECT action, after FROM audit_log WHERE actor = $1 AND subject = $2 "
                "ORDER BY id", ACTOR, f"{self.tenant}/{name}")
        finally:
            await conn.close()
        out = []
        for r in rows:
            after = json.loads(r["after"]) if isinstance(r["after"], str) else r["after"]
            reason = after["reason"]
            assert reason.startswith(REASON_PREFIX), reason
            out.append((r["action"], json.loads(reason[len(REASON_PREFIX):])))
        return out


@pytest.fixture(scope="module")
async def canaries(stack: Stack, tmp_path_factory: pytest.TempPathFactory
                   ) -> AsyncIterator[Canaries]:
    unique = uuid.uuid4().hex[:8]
    work = tmp_path_factory.mktemp("canary-analysis")
    demo = build_demo()
    tenant = f"can-{unique[:6]}"
    async with control_plane(stack, work, demo, name="canary", unique=unique,
                             actor="ci/canary") as cp:
        wsettings = worker_settings(stack, demo, work, f"w-can-{unique}", worker_max_loras=4,
                                    worker_max_cpu_loras=6, worker_drain_timeout_s=10.0)
        engine = await VllmEngine.start(demo.base_model.dir, wsettings.engine_options())
        worker = WorkerApp(wsettings, engine, registry=CollectorRegistry())
        await worker.start()
        cm_port = free_port()
        budgets = work / "budgets.yaml"
        budgets.write_text("interactive: {budget_ms: 300, on_cold: degrade}\n"
                           "background: {budget_ms: 60000, on_cold: wait}\n")
        gateway = GatewayApp(
            gateway_settings(stack, cp, demo, instance_id=f"gw-{unique}",
                             cache_manager_addr=f"127.0.0.1:{cm_port}", budgets_file=budgets),
            registry=CollectorRegistry(), serve_metrics=False)
        await gateway.start()
        await gateway.wait_ready(60)
        launcher = Launcher({**stack.settings.client_env(), "LORAPLANE_POSTGRES_DSN": cp.dsn},
                            work, unique, tenants=tenant)
        try:
            await run_cli(cp.cli_env, "tenants", "create", tenant, "--priority", "gold")
            key = json.loads((await run_cli(cp.cli_env, "keys", "create", tenant, "--json")
                              ).stdout)["secret"]
            env = {"LORAPLANE_REGISTRY_ADDR": cp.registry.address,
                   "LORAPLANE_REGISTRY_OPERATOR_TOKEN": TOKEN,
                   "LORAPLANE_CACHE_MANAGER_CANARY_INTERVAL_S": "0.5"}
            manager = launcher.start(RULES, **env, LORAPLANE_CACHE_MANAGER_GRPC_PORT=str(cm_port))
            await manager.wait_planning(30)
            yield Canaries(stack, demo, cp.dsn, gateway, manager, launcher, env, cp.cli_env,
                           tenant, key, work)
        finally:
            launcher.stop_all()
            await gateway.stop(1)
            await worker.stop()
            await engine.close()
            del engine
            gc.collect()


@dataclass
class Traffic:
    """Requests with ever new sticky keys, ``CONCURRENCY`` at a time, until stopped."""

    stub: inference_pb2_grpc.InferenceStub
    key: str
    adapter: str
    lanes: int = CONCURRENCY
    timeout_s: float = 60.0
    served: Counter[str] = field(default_factory=Counter)
    """Version that answered → requests."""
    answers: list[tuple[float, str]] = field(default_factory=list)
    """(monotonic time the request was sent, version that answered), in completion order."""
    failures: list[str] = field(default_factory=list)
    failed_at: list[float] = field(default_factory=list)
    """Monotonic time each failed request was sent (``failures``' order)."""
    degraded: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def _one(self, i: int) -> None:
        req = inference_pb2.GenerateRequest(adapter=self.adapter, prompt="Hello, how are you?",
                                            max_tokens=1, request_key=f"user-{i}")
        sent = time.monotonic()
        try:
            msgs = [m async for m in self.stub.Generate(
                req, metadata=(("authorization", f"Bearer {self.key}"),),
                timeout=self.timeout_s)]
        except grpc.aio.AioRpcError as err:
            self.failures.append(f"{err.code().name}: {err.details()}")
            self.failed_at.append(sent)
            return
        r = msgs[0].resolved
        if r.degraded_to_base:
            self.degraded += 1
        self.served[r.adapter.version] += 1
        self.answers.append((sent, r.adapter.version))

    async def run(self) -> None:
        i = 0

        async def lane(lane_id: int) -> None:
            nonlocal i
            while not self._stop.is_set():
                i += 1
                await self._one(i * self.lanes + lane_id)

        await asyncio.gather(*(lane(n) for n in range(self.lanes)))

    def stop(self) -> None:
        self._stop.set()


@contextlib.asynccontextmanager
async def traffic(c: Canaries, adapter: str, **kw: Any) -> AsyncIterator[Traffic]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{c.gateway.grpc_port}") as ch:
        t = Traffic(inference_pb2_grpc.InferenceStub(ch), c.key, adapter, **kw)
        task = asyncio.create_task(t.run())
        try:
            yield t
        finally:
            t.stop()
            await task


async def stable_hot(c: Canaries, name: str, version: str) -> None:
    """Wait until ``name``'s stable version answers HOT through the gateway."""
    g = c.gateway.gateway

    async def known() -> bool:
        try:
            return g.catalog.lookup(c.tenant, name).release.stable == version
        except LoraplaneError:
            return False

    await eventually(known)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{c.gateway.grpc_port}") as ch:
        stub = inference_pb2_grpc.InferenceStub(ch)

        async def hot() -> bool:
            req = inference_pb2.GenerateRequest(adapter=name, prompt="Hi", max_tokens=1)
            try:
                msgs = [m async for m in stub.Generate(
                    req, metadata=(("authorization", f"Bearer {c.key}"),), timeout=60)]
            except grpc.aio.AioRpcError:
                return False  # no worker routable yet, or a cold refusal: asked again
            r = msgs[0].resolved
            return r.adapter.version == version and not r.degraded_to_base

        await eventually(hot, timeout_s=90, every_s=0.5)


async def test_b_canary_whose_artifact_disappeared_is_aborted_and_stable_serves(
    canaries: Canaries,
) -> None:
    c = canaries
    name, v1, v2 = "support", "2026-11-01.1", "2026-11-15.1"
    await c.release(name, v1, ("support", v1))
    await c.release(name, v2, ("support", v2))
    await c.cli("promote", f"{c.tenant}/{name}", v1, "--reason", "canary test")
    await stable_hot(c, name, v1)

    # the repository loses v2's objects after admission
    conn = await asyncpg.connect(c.dsn)
    try:
        uri = await conn.fetchval(
            "SELECT artifact_uri FROM adapter_versions WHERE adapter_id = $1 AND version = $2",
            f"{c.tenant}/{name}", v2)
    finally:
        await conn.close()
    u = urlparse(uri)
    st = c.stack.settings
    s3 = Minio(st.s3_endpoint, access_key=st.s3_access_key, secret_key=st.s3_secret_key,
               secure=False, region="us-east-1")
    objects = [o.object_name for o in s3.list_objects(u.netloc, prefix=u.path.lstrip("/"),
                                                      recursive=True)]
    assert objects, uri
    for obj in objects:
        s3.remove_object(u.netloc, obj)

    async with traffic(c, name) as t:
        await asyncio.sleep(1.0)
        t0 = time.monotonic()
        await c.cli("canary", f"{c.tenant}/{name}", v2, "20", "--reason", "canary test")

        async def aborted() -> Any:
            row = await c.pointers(name)
            return row if row["canary_version"] is None else None

        row = await eventually(aborted, timeout_s=ABORT_BOUND_S + 30, every_s=0.25)
        decided_s = time.monotonic() - t0
        await asyncio.sleep(2.0)  # and stable keeps answering after the abort
    assert decided_s <= ABORT_BOUND_S, decided_s
    assert row["stable_version"] == v1 and row["canary_percent"] == 0
    steps = await c.automated_steps(name)
    assert [(a, f["action"], f["reason"]) for a, f in steps] == [
        ("release.canary", "abort", "load_failed")]
    fig = steps[0][1]
    assert fig["from_percent"] == 20 and fig["canary"]["version"] == v2
    assert fig["canary"]["load_failures"] >= 2
    assert "DOWNLOAD_FAILED" in fig["canary"]["last_load_error"], fig
    print(f"[measure] (b) artifact gone: share set → abort {decided_s:.1f}s; canary served "
          f"{t.served[v2]} requests, caused {len(t.failures)} failures; stable served "
          f"{t.served[v1]} ({t.degraded} degraded)")
    assert t.failures == [] and t.degraded == 0
    assert set(t.served) == {v1} and t.served[v1] > 0


async def test_a_healthy_canary_is_promoted_through_every_stage_across_a_leader_kill(
    canaries: Canaries,
) -> None:
    """... and the leader is killed (SIGKILL) after the first step: the standby takes over
    mid-analysis, and every step is taken exactly once."""
    c = canaries
    standby = c.launcher.start(RULES, **c.manager_env)
    await standby.wait_up(30)
    name, v1, v2 = "code", "2026-11-01.1", "2026-11-02.1"
    await c.release(name, v1, ("code", "2026-11-01.1"))
    await c.release(name, v2, ("chat", "2026-11-01.1"))
    await c.cli("promote", f"{c.tenant}/{name}", v1, "--reason", "canary test")
    await stable_hot(c, name, v1)

    async with traffic(c, name) as t:
        t0 = time.monotonic()
        await c.cli("canary", f"{c.tenant}/{name}", v2, str(STAGES[0]), "--reason",
                    "canary test")

        async def first_step() -> bool:
            return any(f["action"] == "advance" for _, f in await c.automated_steps(name))

        await eventually(first_step, timeout_s=120, every_s=0.25)
        c.manager.kill()  # mid-analysis: the 50 % stage has just started
        killed_at = time.monotonic()
        await standby.wait_leader(60)
        print(f"[measure] (a) leader killed after the first step; standby leads after "
              f"{time.monotonic() - killed_at:.1f}s")

        async def promoted() -> Any:
            row = await c.pointers(name)
            return row if row["stable_version"] == v2 else None

        row = await eventually(promoted, timeout_s=240, every_s=0.5)
        decided_s = time.monotonic() - t0
    assert row["canary_version"] is None
    steps = await c.automated_steps(name)
    # cleared for tenant traffic once its golden set passed, then the stages
    assert [(a, f["action"], f["from_percent"], f["to_percent"]) for a, f in steps] == [
        ("release.canary_clear", "clear", 10, 10),
        ("release.canary", "advance", 10, 50), ("release.canary", "advance", 50, 100),
        ("release.promote", "promote", 100, 100)]
    assert steps[0][1]["reason"] == "golden_set_passed", steps[0]
    for _, fig in steps[1:]:
        assert fig["canary"]["requests"] >= ANALYSIS["min_requests"]
        assert fig["canary"]["errors"] == 0 and fig["stage_age_s"] >= ANALYSIS["dwell_s"]
    print(f"[measure] (a) healthy: share set → promoted {decided_s:.1f}s through "
          f"{STAGES}; canary served {t.served[v2]} requests, caused {len(t.failures)} "
          f"failures; stable served {t.served[v1]}")
    assert t.failures == []
    assert t.served[v2] > 0


async def test_cli_status_and_bad_input(canaries: Canaries) -> None:
    """``loraplane canary status`` shows (b)'s automated abort with its figures; bad input
    is refused with a message naming the problem."""
    c = canaries
    adapter = f"{c.tenant}/support"
    status = json.loads(await c.cli("canary", "status", adapter, "--json"))
    assert status["release"]["stable_version"] == "2026-11-01.1"
    assert not status["release"].get("canary_version")
    steps = [s["figures"] for s in status["analysis_steps"]]
    assert [(f["action"], f["reason"]) for f in steps] == [("abort", "load_failed")]
    text = await c.cli("canary", "status", adapter)
    assert "analysis: no canary" in text and "stable=2026-11-01.1" in text

    async def refused(*args: str) -> str:
        r = await run_cli(c.cli_env, "canary", *args, ok=False)
        assert r.exit_code != 0, (args, r.stdout)
        # rich may wrap the message inside a box: compare the words
        return " ".join((str(r.stdout) + str(r.stderr)).replace("│", " ").split())

    assert "one of status, pause" in await refused("frobnicate", adapter)
    assert "outside 0..100" in await refused(adapter, "2026-11-15.1", "150")
    assert "TENANT/NAME is required" in await refused("pause")
    assert "has no canary to pause" in await refused("pause", adapter)
    assert "has no canary to promote" in await refused("promote", adapter)
    # a canary on another tenant's adapter: that tenant has no such adapter
    other = f"other-{uuid.uuid4().hex[:6]}"
    await c.cli("tenants", "create", other)
    assert "does not exist" in await refused(f"{other}/support", "2026-11-15.1", "10")


GOLDEN_PROMPTS = ["Hello", "What is 2+2?"]
GOLDEN_TOKENS = 6
DRAIN_BOUND_S = 5.0
"""After the abort is in the registry: the lifecycle event reaches the gateway (outbox
relay + consumer, ~1 s) and requests sent before it finish (max_tokens 1)."""


async def test_c_canary_answering_against_its_golden_set_is_aborted_after_load(
    canaries: Canaries,
) -> None:
    """The failure is real and after load: the canary version loads, passes every check
    of admission and the worker, serves requests, but its weights are another adapter's;
    the golden set the adapter's owner recorded from the stable version catches it."""
    c = canaries
    name, v1, v2 = "review", "2026-11-01.1", "2026-11-20.1"
    await c.release(name, v1, ("support", "2026-11-01.1"))
    await c.release(name, v2, ("chat", "2026-11-01.1"))  # the wrong checkpoint shipped
    await c.cli("promote", f"{c.tenant}/{name}", v1, "--reason", "canary test")
    await stable_hot(c, name, v1)

    # the owner records the golden answers from the stable version (greedy, as the
    # shadow requests ask)
    golden: list[dict[str, str]] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{c.gateway.grpc_port}") as ch:
        stub = inference_pb2_grpc.InferenceStub(ch)
        for prompt in GOLDEN_PROMPTS:
            req = inference_pb2.GenerateRequest(adapter=name, prompt=prompt,
                                                max_tokens=GOLDEN_TOKENS, temperature=0.0)
            msgs = [m async for m in stub.Generate(
                req, metadata=(("authorization", f"Bearer {c.key}"),), timeout=60)]
            r = msgs[0].resolved
            assert r.adapter.version == v1 and not r.degraded_to_base, r
            golden.append({"prompt": prompt, "expect": "".join(m.text for m in msgs)})
    # a deployment whose rules carry it: the running managers hand over to a new one
    rules = {"canary": {**RULES["canary"], "golden_max_tokens": GOLDEN_TOKENS,
                        "golden_sets": {f"{c.tenant}/{name}": golden}}}
    c.launcher.stop_all()
    port = c.gateway.settings.cache_manager_addr.rpartition(":")[2]  # the gateway reads it
    manager = c.launcher.start(rules, **c.manager_env, LORAPLANE_CACHE_MANAGER_GRPC_PORT=port)
    manager.grpc_port = int(port)
    await manager.wait_leader(60)
    await manager.wait_planning(60)

    async with traffic(c, name) as t:
        await asyncio.sleep(1.0)
        t0 = time.monotonic()
        await c.cli("canary", f"{c.tenant}/{name}", v2, "50", "--reason", "canary test")

        async def aborted() -> Any:
            row = await c.pointers(name)
            return row if row["canary_version"] is None else None

        row = await eventually(aborted, timeout_s=ABORT_BOUND_S + 30, every_s=0.25)
        aborted_at = time.monotonic()
        decided_s = aborted_at - t0
        await asyncio.sleep(DRAIN_BOUND_S + 3.0)  # stable keeps answering after the abort
    assert decided_s <= ABORT_BOUND_S, decided_s
    assert row["stable_version"] == v1 and row["canary_percent"] == 0
    steps = await c.automated_steps(name)
    assert [(a, f["action"], f["reason"]) for a, f in steps] == [
        ("release.canary", "abort", "golden_set_failed")], steps
    fig = steps[0][1]
    assert fig["from_percent"] == 50 and fig["canary"]["version"] == v2
    assert fig["canary"]["load_failures"] == 0, fig  # it loaded: the failure is after load
    assert "diverges from the golden expectation" in fig["canary"]["last_golden_error"], fig
    golden_failed = fig["canary"]["golden_failed"]
    # one worker, one golden run: the failures stop at the golden set's size
    assert 1 <= golden_failed <= len(GOLDEN_PROMPTS), fig
    late = [(round(ts - aborted_at, 2), v) for ts, v in t.answers
            if v == v2 and ts > aborted_at + DRAIN_BOUND_S]
    first = min((ts for ts, v in t.answers if v == v2), default=None)
    last = max((ts for ts, v in t.answers if v == v2), default=None)
    if first is not None and last is not None:
        print(f"[measure] (c) canary answered from {first - t0:.1f}s to {last - t0:.1f}s "
              f"after the share (requests sent then)")
    print(f"[measure] (c) golden set diverges after load: share set → abort {decided_s:.1f}s; "
          f"canary served {t.served[v2]} requests, {golden_failed} golden-set failures "
          f"({fig['canary']['golden_ok']} passed), {len(t.failures)} request failures; "
          f"stable served {t.served[v1]} ({t.degraded} degraded)")
    assert late == [], late
    # never cleared for tenant traffic (its golden set failed): no user got a wrong answer
    assert t.served[v2] == 0, t.served
    assert t.failures == [] and t.degraded == 0
    assert t.served[v1] > 0 and any(ts > aborted_at and v == v1 for ts, v in t.answers)

    async def demoted() -> bool:
        hot = await manager.placement(Ref(c.tenant, name, v2, c.demo.base_model.name))
        return all(tier != common_pb2.TIER_HOT for _, tier in hot)

    await eventually(demoted, timeout_s=30, every_s=0.5)

