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
    worker, it is demoted, and nothing is routed to it after the abort plus the drain bound;
(d) a canary whose tenant requests fail after load (it serves from a second vLLM worker
    whose engine process is then stopped: the requests time out there) is aborted
    (``error_rate``) with no more failures than the rule's budget plus one, nothing is
    routed to it after the abort plus the drain bound, and once the engine resumes it is
    out of HOT in that worker's own ``GetState``; (d) starts with a leader change: the
    leader that takes over keeps (c)'s aborted canary out of HOT (its placement and the
    worker's ``GetState``, polled through (d) until the block ends), as (c)'s leader did;
(e) a stable version with nothing to roll back to whose requests fail (reported on
    ``adapter.heat`` as the gateways report them) is withdrawn once across two SIGKILLed
    leaders (one killed before deciding, one right after the step): one
    ``version.withdraw`` entry, no step by the other two, out of HOT in the worker's
    ``GetState``, its requests refused ``version_withdrawn`` by the gateway.

Each prints, as ``[measure]``: time from the share being set to the decision, requests
the canary served, failures it caused.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import shutil
import signal
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
import psutil
import pytest
from prometheus_client import CollectorRegistry

from loraplane.cache_manager.canary_analysis import AnalysisRules, wilson_bounds
from loraplane.cache_manager.canary_runner import ACTOR, REASON_PREFIX
from loraplane.cache_manager.model import Ref
from loraplane.devkit.builder import DemoManifest, build_demo
from loraplane.gateway.app import GatewayApp
from loraplane.shared.errors import LoraplaneError
from loraplane.shared.tls import OPERATOR, WORKER
from loraplane.stack.stack import Stack
from loraplane.v1 import (
    common_pb2,
    inference_pb2,
    inference_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
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
from tests.support import eventgen as eg
from tests.support.cache_manager import Bus, Launcher, Manager
from tests.support.registry import TOKEN
from tests.support.tls import internal_channel, tenant_channel

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
    worker_address: str
    """The fixture's vLLM worker (``WorkerInternal``: its own ``GetState``)."""

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
                            work, unique, tenants=tenant, stack=stack)
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
                           tenant, key, work, worker.grpc_address)
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
    slowest_s: float = 0.0
    """Longest time an answered request took (send to last message)."""
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
        self.slowest_s = max(self.slowest_s, time.monotonic() - sent)
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
    async with tenant_channel(c.stack, f"127.0.0.1:{c.gateway.grpc_port}") as ch:
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
    async with tenant_channel(c.stack, f"127.0.0.1:{c.gateway.grpc_port}") as ch:
        stub = inference_pb2_grpc.InferenceStub(ch)

        outcomes: Counter[str] = Counter()  # what the requests got (a timeout's message)

        async def hot() -> bool:
            req = inference_pb2.GenerateRequest(adapter=name, prompt="Hi", max_tokens=1)
            try:
                msgs = [m async for m in stub.Generate(
                    req, metadata=(("authorization", f"Bearer {c.key}"),), timeout=60)]
            except grpc.aio.AioRpcError as err:
                # no worker routable yet, or a cold refusal: asked again
                outcomes[f"{err.code().name}: {err.details()}"[:160]] += 1
                return False
            r = msgs[0].resolved
            outcomes[f"{r.adapter.version} degraded={r.degraded_to_base} tier="
                     f"{common_pb2.Tier.Name(r.tier_at_arrival)}"] += 1
            return r.adapter.version == version and not r.degraded_to_base

        try:
            await eventually(hot, timeout_s=90, every_s=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{name}@{version} never answered HOT; requests got "
                                 f"{dict(outcomes)}\n{managers_said(c)}") from None


def managers_said(c: Canaries, lines: int = 60) -> str:
    """The log tail of every running cache manager (what explains a wait that timed out)."""
    return "\n".join(f"--- {m.log.name} (running)\n"
                     + "\n".join(m.log.read_text(errors="replace").splitlines()[-lines:])
                     for m in c.launcher.started if m.proc.poll() is None)


async def canary_ended(c: Canaries, name: str, timeout_s: float) -> Any:
    """``name``'s pointers once its canary pointer is gone (aborted or promoted); past
    ``timeout_s`` an AssertionError that carries what explains it: the analysis' view
    (``loraplane canary status``) and the log tail of every running cache manager."""

    async def ended() -> Any:
        row = await c.pointers(name)
        return row if row["canary_version"] is None else None

    try:
        return await eventually(ended, timeout_s=timeout_s, every_s=0.25)
    except AssertionError as exc:
        status = (await run_cli(c.cli_env, "canary", "status", f"{c.tenant}/{name}", "--json",
                                ok=False)).stdout
        raise AssertionError(f"{exc}\ncanary status: {status}\n{managers_said(c)}") from None


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
    s3 = c.stack.settings.s3_client()
    objects = [o.object_name for o in s3.list_objects(u.netloc, prefix=u.path.lstrip("/"),
                                                      recursive=True)]
    assert objects, uri
    for obj in objects:
        s3.remove_object(u.netloc, obj)

    async with traffic(c, name) as t:
        await asyncio.sleep(1.0)
        t0 = time.monotonic()
        await c.cli("canary", f"{c.tenant}/{name}", v2, "20", "--reason", "canary test")

        row = await canary_ended(c, name, ABORT_BOUND_S + 30)
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
    async with tenant_channel(c.stack, f"127.0.0.1:{c.gateway.grpc_port}") as ch:
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

        row = await canary_ended(c, name, ABORT_BOUND_S + 30)
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


ABORTED_IN_C = ("review", "2026-11-20.1")
BLOCK_S = 120.0
"""``commands.backoff_max_s`` (the tests' rules keep the default): an aborted canary is kept
from loading this long after its abort, by whichever leader leads."""


@dataclass
class BlockWatch:
    """Where a version the analysis aborted is HOT — the leader's view (``GetPlacement``)
    and the fixture's worker (its own ``GetState``) — polled from now until ``stop`` or
    until its block ends (``BLOCK_S`` after the abort's audit entry, less a margin)."""

    c: Canaries
    manager: Manager
    name: str
    version: str
    seen: list[str] = field(default_factory=list)
    """The first sightings (at most 4)."""
    hot_polls: int = 0
    polls: int = 0
    watched_from: float = 0.0
    """Seconds after the abort the watch began / ended."""
    watched_to: float = 0.0
    watched: bool = False
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def aborted_at(self) -> float | None:
        """The abort's time (epoch seconds) from its audit entry (None: (c) did not run or
        did not abort it)."""
        conn = await asyncpg.connect(self.c.dsn)
        try:
            rows = await conn.fetch(
                "SELECT EXTRACT(EPOCH FROM at)::float8 AS at, before, after FROM audit_log "
                "WHERE actor = $1 AND subject = $2 AND action = 'release.canary' ORDER BY id",
                ACTOR, f"{self.c.tenant}/{self.name}")
        finally:
            await conn.close()
        for r in reversed(rows):
            before, after = (json.loads(x) if isinstance(x, str) else x
                             for x in (r["before"], r["after"]))
            fig = json.loads(after["reason"][len(REASON_PREFIX):])
            if fig["action"] == "abort" and before["canary_version"] == self.version:
                return float(r["at"])
        return None

    async def run(self) -> None:
        at = await self.aborted_at()
        if at is None:
            return
        self.watched = True
        ref = Ref(self.c.tenant, self.name, self.version, self.c.demo.base_model.name)
        until = at + BLOCK_S - 10.0
        self.watched_from = self.watched_to = time.time() - at
        while not self.stop.is_set() and time.time() < until:
            hot: list[str] = []
            with contextlib.suppress(grpc.aio.AioRpcError):
                hot += [f"{wid} in the leader's placement"
                        for wid, tier in await self.manager.placement(ref)
                        if tier == common_pb2.TIER_HOT]
            with contextlib.suppress(grpc.aio.AioRpcError):
                if await hot_on_worker(self.c.stack, self.c.worker_address, self.name,
                                       self.version):
                    hot.append("the worker's GetState")
            if hot:
                self.hot_polls += 1
                if len(self.seen) < 4:
                    self.seen.append(f"{' and '.join(hot)} {time.time() - at:.1f}s after "
                                     "the abort")
            self.polls += 1
            self.watched_to = time.time() - at
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), 0.5)


DEADLINE_FACTOR = 10.0
"""(d)'s tenant requests are sent with a 60 s deadline until the canary serves; then with
``max(abort bound, DEADLINE_FACTOR x the slowest answer so far)``: the slowest answer is
measured on this machine at its present load, so a healthy request never reaches the
deadline, while one stuck on the wedged engine fails at it; the abort bound (the gateway's
heat flush + an analysis tick + ``DRAIN_BOUND_S``) keeps the next request to the canary
from failing before the abort counted the first and reached the gateway."""


def _rule_budget(served: int, stable_rate: float, rules: AnalysisRules) -> int:
    """Failures among ``served`` requests the error rule tolerates (the next one aborts):
    the real rule's Wilson bound, ``n`` floored at ``min_requests``."""
    limit = stable_rate + rules.max_error_rate_excess
    for k in range(1, served + 1):
        if wilson_bounds(k, max(served, rules.min_requests), rules.confidence)[0] > limit:
            return k - 1
    return served


def _engine_processes(before: set[int]) -> list[psutil.Process]:
    """This process' spawned children (vLLM's engine core processes, ``VLLM::EngineCore``;
    not the cache managers, which run as ``-m loraplane.cache_manager``) not in
    ``before``."""
    out = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmd = f"{p.name()} {' '.join(p.cmdline())}"
            engine = "spawn_main" in cmd or "EngineCore" in cmd  # vLLM retitles it
            if p.pid not in before and engine and "resource_tracker" not in cmd:
                out.append(p)
    return out


async def test_d_canary_whose_requests_fail_after_load_is_aborted_within_the_rule_budget(
    canaries: Canaries,
) -> None:
    """(c) as the issue words it: tenant requests fail after load. The canary loads on a
    second worker, passes its golden set, is cleared and serves tenants; then that worker's
    engine hangs (its engine process is stopped: a wedged accelerator or engine, a real
    failure, not a flag). The worker still answers its probes, so the gateway keeps routing
    the canary's share there, and those requests fail at their deadline
    (DEADLINE_EXCEEDED). Stable is HOT on the other worker only (the LRU policy loads a
    version only where a rule asks: stable by its first requests, before the second worker
    starts, the canary by a prewarm aimed at the second worker), so it is untouched. Shown: the abort comes with no
    more failures than the rule's budget, and nothing is routed to the canary after the
    abort plus the drain bound."""
    c = canaries
    name, v1, v2 = "triage", "2026-11-01.1", "2026-11-25.1"
    # a long dwell: the canary stays at its 50 % share beside stable until it fails
    analysis = {**ANALYSIS, "dwell_s": 600.0, "window_s": 600.0}
    rules = AnalysisRules.model_validate(analysis)
    unique = uuid.uuid4().hex[:6]
    # the LRU policy only makes room: a version is loaded where a rule asks (a prewarm, the
    # canary's warm replica), once, so stable and the canary stay where they are put
    c.launcher.stop_all()
    port = c.gateway.settings.cache_manager_addr.rpartition(":")[2]
    manager = c.launcher.start(
        {"canary": {**RULES["canary"], "analysis": analysis}, "policy": "lru"},
        **c.manager_env, LORAPLANE_CACHE_MANAGER_GRPC_PORT=port)
    manager.grpc_port = int(port)
    ref1 = Ref(c.tenant, name, v1, c.demo.base_model.name)
    ref2 = Ref(c.tenant, name, v2, c.demo.base_model.name)

    async def hot_on(ref: Ref) -> set[str]:
        return {w for w, tier in await manager.placement(ref) if tier == common_pb2.TIER_HOT}

    await manager.wait_leader(60)
    await manager.wait_planning(60)
    # a leader change: (c)'s aborted canary stays out of HOT under the new leader while its
    # block holds (watched through this test, asserted at its end)
    blocked = BlockWatch(c, manager, *ABORTED_IN_C)
    watch = asyncio.create_task(blocked.run())
    # stable first, while the fixture's worker is the only one: HOT there alone
    await c.release(name, v1, ("support", "2026-11-01.1"))
    await c.release(name, v2, ("code", "2026-11-01.1"))
    await c.cli("promote", f"{c.tenant}/{name}", v1, "--reason", "canary test")
    await stable_hot(c, name, v1)

    async def stable_placed() -> set[str]:
        return await hot_on(ref1)  # the manager's view follows the workers' reports

    hot1 = await eventually(stable_placed, timeout_s=30, every_s=0.25)
    assert len(hot1) == 1, hot1  # loaded once, on one worker
    # the second worker, empty: the canary goes there. Its own WARM tier, as on a host of
    # its own: started on the fixture worker's directory it took every version there as
    # its own WARM (six in a whole-file run, stable and (c)'s aborted canary among them),
    # so stable needed no download there - a request routed there while the fixture's
    # worker was not routable made it HOT on the request path - and it emptied the other's
    # unfinished downloads
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    wsettings = worker_settings(c.stack, c.demo, c.workdir, f"w-can-b-{unique}",
                                worker_max_loras=4, worker_max_cpu_loras=6,
                                worker_drain_timeout_s=10.0,
                                worker_host_dir=c.workdir / f"worker-host-b-{unique}")
    engine = await VllmEngine.start(c.demo.base_model.dir, wsettings.engine_options())
    core = _engine_processes(before)
    worker = WorkerApp(wsettings, engine, registry=CollectorRegistry())
    await worker.start()
    stopped: list[psutil.Process] = []
    bus = Bus(c.stack.settings.kafka_bootstrap)
    await bus.start()
    try:
        assert core, "the second engine's process was not found"
        b, b_address = wsettings.worker_id, worker.grpc_address
        assert b not in hot1, hot1

        async def both_routable() -> bool:
            routable = c.gateway.gateway.placement.routable(c.demo.base_model.name)
            return len(routable) >= 2

        await eventually(both_routable, timeout_s=60, every_s=0.5)
        # the canary is prewarmed onto the second worker (a prewarm aimed at it)
        await bus.publish(eg.prewarm(ref2, time.time(), target=b))

        async def canary_hot_there() -> bool:
            return await hot_on(ref2) == {b}

        await eventually(canary_hot_there, timeout_s=60, every_s=0.5)

        async with traffic(c, name, lanes=1) as t:
            t0 = time.monotonic()
            await c.cli("canary", f"{c.tenant}/{name}", v2, "50", "--reason", "canary test")

            async def serving() -> bool:
                return t.served[v2] >= 3

            await eventually(serving, timeout_s=120, every_s=0.25)
            # the deadline from this machine's answers; wedged once a request sent with it
            # was answered (one lane: the request in flight then was sent with it too)
            abort_bound_s = (c.gateway.settings.heat_flush_interval_s + DRAIN_BOUND_S
                             + float(c.manager_env["LORAPLANE_CACHE_MANAGER_CANARY_INTERVAL_S"]))
            deadline_s = t.timeout_s = max(abort_bound_s, DEADLINE_FACTOR * t.slowest_s)
            deadline_from = time.monotonic()

            async def on_new_deadline() -> bool:
                return any(ts >= deadline_from for ts, _ in t.answers)

            await eventually(on_new_deadline, timeout_s=60, every_s=0.1)
            placed = await hot_on(ref2), await hot_on(ref1)
            assert placed[0] == {b} and b not in placed[1], (placed, managers_said(c))
            served_before = t.served[v2]
            for p in core:
                p.send_signal(signal.SIGSTOP)
                stopped.append(p)
            wedged_at = time.monotonic()

            # the first failure is known at its deadline; the analysis' bound runs from then
            row = await canary_ended(c, name, deadline_s + ABORT_BOUND_S)
            aborted_at = time.monotonic()
            # requests go on past the drain bound; the last one sent to the canary before
            # the abort fails at its deadline
            await asyncio.sleep(DRAIN_BOUND_S + deadline_s + 2.0)
        assert row["stable_version"] == v1 and row["canary_percent"] == 0
        steps = await c.automated_steps(name)
        assert [(a, f["action"], f["reason"]) for a, f in steps] == [
            ("release.canary_clear", "clear", "golden_set_passed"),
            ("release.canary", "abort", "error_rate")], steps
        fig = steps[1][1]
        errors, served = fig["canary"]["errors"], fig["canary"]["requests"]
        budget = _rule_budget(served - fig["canary"]["degraded"],
                              fig["checks"]["error_rate"]["stable_rate"], rules)
        late = [(round(ts - aborted_at, 2), v) for ts, v in t.answers
                if v == v2 and ts > aborted_at + DRAIN_BOUND_S]
        late_failures = [round(ts - aborted_at, 2) for ts in t.failed_at
                         if ts > aborted_at + DRAIN_BOUND_S]
        print(f"[measure] (d) requests fail after load (engine wedged): share set → cleared "
              f"and serving after {wedged_at - t0:.1f}s ({served_before} canary requests "
              f"served; request deadline {deadline_s:.1f}s from the slowest answer "
              f"{t.slowest_s:.2f}s), wedge → abort {aborted_at - wedged_at:.1f}s, share set → "
              f"abort {aborted_at - t0:.1f}s; the decision counted "
              f"{errors} failed of {served} canary requests (rule budget {budget} "
              f"tolerated); tenants saw {len(t.failures)} failures "
              f"({sorted({f.split(':')[0] for f in t.failures})}); canary served "
              f"{t.served[v2]}, stable {t.served[v1]}")
        assert 1 <= errors <= budget + 1, (errors, budget, fig)  # decided at the first excess
        assert all(f.startswith("DEADLINE_EXCEEDED") for f in t.failures), t.failures
        # one lane: at most the request the decision counted plus the one in flight meanwhile
        assert errors <= len(t.failures) <= errors + 1, (t.failures, errors)
        assert late == [] and late_failures == [], (late, late_failures)
        assert any(ts > aborted_at and v == v1 for ts, v in t.answers)  # stable answers

        # the engine resumes: the aborted canary is drained and taken out of HOT on that
        # worker, as the worker itself reports it
        for p in stopped:
            p.send_signal(signal.SIGCONT)
        stopped.clear()
        resumed_at = time.monotonic()

        async def out_of_hot_on_b() -> bool:
            async with internal_channel(c.stack, b_address, caller=OPERATOR,
                                        server=WORKER) as ch:
                state = await worker_pb2_grpc.WorkerInternalStub(ch).GetState(
                    worker_pb2.GetStateRequest(), timeout=10)
            return not any((pl.adapter.adapter_name, pl.adapter.version) == (name, v2)
                           and pl.tier == common_pb2.TIER_HOT for pl in state.placements)

        # the requests stuck in the engine finish, then the demotion (asked every round)
        # drains within the worker's drain timeout
        await eventually(out_of_hot_on_b, timeout_s=wsettings.worker_drain_timeout_s + ABORT_BOUND_S,
                         every_s=0.5)
        print(f"[measure] (d) engine resumed → canary out of HOT on {b} (its GetState) "
              f"{time.monotonic() - resumed_at:.1f}s")
        blocked.stop.set()
        await watch
        if not blocked.watched:  # (d) alone: (c) aborted nothing to watch
            print(f"[measure] (d) no abort of {blocked.name}@{blocked.version} by (c): the "
                  "leader change was not watched")
            return
        print(f"[measure] (d) (c)'s aborted {blocked.name}@{blocked.version} watched from "
              f"{blocked.watched_from:.1f}s to {blocked.watched_to:.1f}s after its abort under "
              f"the new leader: HOT in {blocked.hot_polls} of {blocked.polls} polls "
              f"{blocked.seen}")
        assert blocked.hot_polls == 0, (blocked.hot_polls, blocked.polls, blocked.seen)
        assert blocked.watched_to - blocked.watched_from >= 30.0, blocked.__dict__
    finally:
        blocked.stop.set()
        watch.cancel()
        for p in stopped:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGCONT)
        await bus.stop()
        await worker.stop()
        await engine.close()
        del engine
        gc.collect()


async def hot_on_worker(stack: Stack, address: str, name: str, version: str) -> bool:
    """Whether the worker at ``address`` itself (its ``GetState``, asked as an operator)
    holds the version HOT."""
    async with internal_channel(stack, address, caller=OPERATOR, server=WORKER) as ch:
        state = await worker_pb2_grpc.WorkerInternalStub(ch).GetState(
            worker_pb2.GetStateRequest(), timeout=10)
    return any((pl.adapter.adapter_name, pl.adapter.version) == (name, version)
               and pl.tier == common_pb2.TIER_HOT for pl in state.placements)


def withdraw_steps(m: Manager) -> float:
    """Withdrawals this cache-manager process took (``loraplane_cache_canary_steps``)."""
    return sum(float(ln.split()[-1]) for ln in m.metric_lines("loraplane_cache_canary_steps")
               if 'action="withdraw"' in ln and not ln.split("{")[0].endswith("_created"))


async def test_e_failing_stable_is_withdrawn_once_across_leader_kills_and_leaves_the_worker(
    canaries: Canaries,
) -> None:
    """A stable version with nothing to roll back to fails after load (its failed requests
    arrive as the gateways report them, INTERNAL, on ``adapter.heat``; the base model's
    other stable version serves real requests meanwhile, the reference). The leader that
    consumed them is killed (SIGKILL) before its next analysis tick; its standby takes the
    withdrawal and is killed the moment the registry has it; the third leader neither
    forgets it nor takes it again. Shown from the real parts: one ``version.withdraw``
    audit entry, one withdraw step over the three processes, the version drained and out
    of HOT in the vLLM worker's own ``GetState``, its requests refused by the gateway with
    ``version_withdrawn``."""
    c = canaries
    name, ref_name, v1 = "bot", "faq", "2026-11-01.1"
    bm = c.demo.base_model.name
    interval_s = float(c.manager_env["LORAPLANE_CACHE_MANAGER_CANARY_INTERVAL_S"])
    c.launcher.stop_all()
    port = c.gateway.settings.cache_manager_addr.rpartition(":")[2]
    # the first leader's analysis ticks at its takeover and then not for 600 s: killed
    # after consuming the failures, before deciding
    first = c.launcher.start(RULES, **{**c.manager_env,
                                       "LORAPLANE_CACHE_MANAGER_CANARY_INTERVAL_S": "600"},
                             LORAPLANE_CACHE_MANAGER_GRPC_PORT=port)
    first.grpc_port = int(port)
    await first.wait_leader(60)
    await first.wait_planning(60)
    second = c.launcher.start(RULES, **c.manager_env)
    await second.wait_up(30)
    await c.release(name, v1, ("support", "2026-11-01.1"))
    await c.release(ref_name, v1, ("chat", "2026-11-01.1"))
    for n in (name, ref_name):  # first releases: no rollback target
        await c.cli("promote", f"{c.tenant}/{n}", v1, "--reason", "canary test")
        await stable_hot(c, n, v1)
    assert await hot_on_worker(c.stack, c.worker_address, name, v1)

    async def withdrawals() -> list[Any]:
        conn = await asyncpg.connect(c.dsn)
        try:
            return list(await conn.fetch(
                "SELECT actor, after FROM audit_log WHERE action = 'version.withdraw' "
                "AND subject = $1", f"{c.tenant}/{name}"))
        finally:
            await conn.close()

    ref = Ref(c.tenant, name, v1, bm)
    bus = Bus(c.stack.settings.kafka_bootstrap)
    await bus.start()
    published = 0

    async def failing() -> None:
        nonlocal published
        while True:
            await bus.publish(eg.heat(ref, 4, time.time(), tier=common_pb2.TIER_HOT,
                                      status=grpc.StatusCode.INTERNAL.value[0]))
            published += 4
            await asyncio.sleep(interval_s)

    task = asyncio.create_task(failing())
    try:
        async with traffic(c, ref_name, lanes=1) as t:
            t0 = time.monotonic()

            async def flowing() -> bool:
                # enough failures and reference requests for the rule, in the window
                return (published >= 4 * ANALYSIS["min_requests"]
                        and t.served[v1] >= ANALYSIS["min_requests"])

            await eventually(flowing, timeout_s=60, every_s=0.1)
            assert withdraw_steps(first) == 0 and await withdrawals() == []
            first.kill()
            killed_at = time.monotonic()
            await second.wait_leader(60)
            third = c.launcher.start(RULES, **c.manager_env)
            await third.wait_up(30)
            led2_at = time.monotonic()
            rows = await eventually(withdrawals, timeout_s=ABORT_BOUND_S, every_s=0.1)
            decided_at = time.monotonic()
            second.kill()  # the moment the registry has the step: its demotion may be unsent
            await third.wait_leader(60)
            await third.wait_planning(60)
            led_at = time.monotonic()

            async def out_of_hot() -> bool:
                return not await hot_on_worker(c.stack, c.worker_address, name, v1)

            # drained (the worker's drain timeout) and taken out of HOT
            await eventually(out_of_hot, timeout_s=ABORT_BOUND_S, every_s=0.25)
            out_at = time.monotonic()
            # failures keep arriving: the third leader's analysis sees them for 20 ticks
            # and takes no second step
            await asyncio.sleep(20 * interval_s)
            third_steps = withdraw_steps(third)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await bus.stop()
    assert len(await withdrawals()) == 1 and rows[0]["actor"] == ACTOR, rows
    after = json.loads(rows[0]["after"]) if isinstance(rows[0]["after"], str) else rows[0]["after"]
    fig = json.loads(after["withdrawn_reason"][len(REASON_PREFIX):]) \
        if after["withdrawn_reason"].startswith(REASON_PREFIX) else {}
    assert third_steps == 0, third_steps  # the third leader did not take it again
    assert t.failures == [] and t.served[v1] > 0  # the reference served throughout

    async def refused() -> str | None:
        async with tenant_channel(c.stack, f"127.0.0.1:{c.gateway.grpc_port}") as ch:
            req = inference_pb2.GenerateRequest(adapter=name, prompt="Hi", max_tokens=1)
            try:
                [m async for m in inference_pb2_grpc.InferenceStub(ch).Generate(
                    req, metadata=(("authorization", f"Bearer {c.key}"),), timeout=30)]
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    return err.details()
            return None

    detail = await eventually(refused, timeout_s=DRAIN_BOUND_S * 2, every_s=0.25)
    assert "withdrawn by the canary analysis" in detail, detail
    stable = fig.get("stable", {})
    print(f"[measure] (e) failing stable, nothing to roll back to: first leader killed "
          f"undecided {killed_at - t0:.1f}s after the failures began; its standby led "
          f"{led2_at - killed_at:.1f}s later and withdrew {decided_at - led2_at:.1f}s after "
          f"that ({stable.get('errors')} failed of {stable.get('requests')}, reference "
          f"{fig.get('reference', {}).get('requests')} requests), killed at once; the third "
          f"led {led_at - decided_at:.1f}s after the step; out of HOT in the worker's "
          f"GetState {out_at - decided_at:.1f}s after the step; 1 version.withdraw entry, "
          f"0 steps by the first and the third leader; the gateway refuses it: {detail[:90]}")
