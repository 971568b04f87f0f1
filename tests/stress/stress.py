"""``make stress``: the platform under load and faults, on the local stack with real vLLM workers.

The seed's launch checklist item 9 and more. One run starts a private ``make run``-style
platform (supervisor with its restart policy, two vLLM workers, every service a real
process; own port block and data directory, loopback only), seeds tenants and adapters
through the real release path, then plays every scenario, each bounded in time and
load, and checks its invariants itself:

* ``answers_match_reference``: every answer equals the greedy reference of the version
  the platform reported (the base model's when degraded), computed engine-direct before
  the platform starts;
* ``zero_cross_tenant``: every answer resolved to the caller's own adapter;
* ``releases_exactly_once``: every release of the scenario ends admitted or rejected,
  with exactly one verdict in the audit log (as expected: bad signatures rejected);
* ``no_platinum_or_canary_cold_start``: no request of a platinum tenant or for an active
  canary arrived COLD once that version had been warmed;
* ``refusals_documented``: every refusal is a documented status (RESOURCE_EXHAUSTED or
  UNAVAILABLE with a ``retry-after-ms`` hint, and a message naming the cause); the only
  other failure allowed is the client's own UNAVAILABLE while the gateway process is down
  (``gateway_restart``);
* ``recovered``: after a fault, the component is back (the supervisor restarted it) and
  the platform serves again within the bound.

The load speaks to the gateway as a tenant would after sourcing demo.env: over TLS
trusting ``LORAPLANE_GATEWAY_CA_FILE`` (the stack's edge TLS, on by default), plaintext
only with ``LORAPLANE_STACK_EDGE_TLS=false``.

Prints a table and writes ``.loraplane/bench/stress.json``; exits 1 when an invariant is
false. ``--only a,b`` runs some scenarios (after the setup).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import statistics
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from loraplane.devkit.builder import DemoManifest, build_demo
from loraplane.devkit.engine import generate_greedy, lora_request
from loraplane.devkit.keys import write_dev_keys
from loraplane.registry.client import RegistryClient, release_adapter, s3_client, wait_for_verdict
from loraplane.registry.settings import RegistryClientSettings
from loraplane.shared.catalogue import load_catalogue
from loraplane.shared.tls import tls_fields
from loraplane.stack.components import Component, port_in_use
from loraplane.stack.seed import seed_models, seed_platform
from loraplane.stack.services import SERVICES, existing_services
from loraplane.stack.settings import PORT_OFFSETS, StackSettings, repo_root
from loraplane.stack.supervisor import Supervisor
from loraplane.v1 import common_pb2, inference_pb2, inference_pb2_grpc, registry_pb2
from loraplane.worker.lora_files import LlamaDims, write_lora

PROMPT = "Hello, how are you?"
MAX_TOKENS = 8
INTERACTIVE = common_pb2.REQUEST_CLASS_INTERACTIVE
BACKGROUND = common_pb2.REQUEST_CLASS_BACKGROUND
CLASS_NAMES = {INTERACTIVE: "interactive", BACKGROUND: "background",
               common_pb2.REQUEST_CLASS_CANARY: "canary"}
TENANT = "stress"
VIP = "stress-vip"
N_TAIL = 12
"""Adapters of the long tail (more than the 2 × 4 HOT slots of both workers)."""
RECOVERY_BOUND_S = 240.0
"""A fault's component must be back and the platform serving within this (how long the
scenario waits)."""
WORKER_RECOVERY_BOUND_S = 60.0
"""A killed worker must be back serving HOT (an answer from it, HOT at arrival) within
this, without a person (issue 14)."""
Key = tuple[str, str, str]
"""(tenant, adapter, version)."""


def log(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------- outcomes


@dataclass
class Outcome:
    tenant: str
    adapter: str
    klass: int
    code: str
    details: str = ""
    retry_hint: bool = False
    resolved: Key = ("", "", "")
    degraded: bool = False
    tier: int = 0
    tokens: tuple[int, ...] = ()
    ttft_ms: float = 0.0
    started: float = 0.0
    ended: float = 0.0
    worker: str = ""
    """Worker that answered."""


@dataclass
class Platform:
    sup: Supervisor
    settings: StackSettings
    demo: DemoManifest
    env: dict[str, str]
    keys: dict[str, str]
    refs: dict[Key, tuple[int, ...]]
    base_ref: tuple[int, ...]
    adapter_files: dict[str, Path]
    workdir: Path
    platinum: set[str] = field(default_factory=set)
    canaries: set[Key] = field(default_factory=set)
    """Active canary versions (share > 0)."""
    warmed: set[Key] = field(default_factory=set)

    @property
    def gateway_addr(self) -> str:
        return self.env["LORAPLANE_GATEWAY_GRPC"]

    def component(self, name: str) -> Component:
        for comp in [*self.sup.stack.components, *self.sup.procs]:
            if comp.name == name:
                return comp
        raise KeyError(name)

    def registry(self) -> RegistryClient:
        return RegistryClient.from_settings(RegistryClientSettings(
            registry_addr=self.env["LORAPLANE_REGISTRY_ADDR"],
            registry_operator_token=self.env["LORAPLANE_REGISTRY_OPERATOR_TOKEN"],  # type: ignore[arg-type]
            registry_actor="stress", s3_endpoint=self.env["LORAPLANE_S3_ENDPOINT"],
            s3_access_key=self.env["LORAPLANE_S3_ACCESS_KEY"],
            s3_secret_key=self.env["LORAPLANE_S3_SECRET_KEY"], **tls_fields(self.env),
        ))

    def metrics_port(self, service: str, replica: int = 0) -> int:
        spec = next(s for s in SERVICES if s.name == service)
        return spec.ports(self.settings, replica)["METRICS_PORT"]


def scrape(port: int, family: str, **labels: str) -> float:
    """Sum of a metric's samples on a service's /metrics (0 when unreachable)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(family):
            continue
        m = re.match(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})? (\S+)", line)
        if m is None or m.group(1) != family:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


# --------------------------------------------------------------------------- load


async def call(stub: inference_pb2_grpc.InferenceStub, key: str, tenant: str, adapter: str,
               klass: int, *, max_tokens: int = MAX_TOKENS, request_key: str = "") -> Outcome:
    req = inference_pb2.GenerateRequest(adapter=adapter, prompt=PROMPT, max_tokens=max_tokens,
                                        request_class=klass,  # type: ignore[arg-type]
                                        request_key=request_key)
    t0 = time.monotonic()
    out = Outcome(tenant, adapter, klass, "OK", started=t0)
    msgs = []
    try:
        async for m in stub.Generate(req, metadata=(("authorization", f"Bearer {key}"),),
                                     timeout=90):
            if not msgs:
                out.ttft_ms = (time.monotonic() - t0) * 1000
            msgs.append(m)
    except grpc.aio.AioRpcError as err:
        trailing = dict(err.trailing_metadata() or ())
        out.code, out.details = err.code().name, err.details() or ""
        out.retry_hint = "retry-after-ms" in trailing
        out.ended = time.monotonic()
        return out
    r = msgs[0].resolved
    out.resolved = (r.adapter.tenant_id, r.adapter.adapter_name, r.adapter.version)
    out.degraded, out.tier, out.worker = r.degraded_to_base, r.tier_at_arrival, r.worker_id
    out.tokens = tuple(t for m in msgs for t in m.token_ids)
    out.ended = time.monotonic()
    return out


CLIENT_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
)
"""The load's gRPC client reconnects within a second of the gateway listening again (the
library's default backoff grows to 120 s, so calls kept failing with "failed to connect"
long after a restarted gateway served). ``grpc.min_reconnect_backoff_ms`` stays gRPC's
own: it is the shortest time one connection attempt may take, and 200 ms cut TLS
handshakes short under load (``shared.tls.RECONNECT_OPTIONS``)."""


def gateway_channel(p: Platform) -> grpc.aio.Channel:
    """The load's channel to the public gRPC port: TLS trusting the CA demo.env names
    (``LORAPLANE_GATEWAY_CA_FILE``: the stack's edge TLS, on by default in the ``run``
    profile), plaintext only when it names none (``LORAPLANE_STACK_EDGE_TLS=false``)."""
    ca_file = p.env.get("LORAPLANE_GATEWAY_CA_FILE", "")
    if not ca_file:
        return grpc.aio.insecure_channel(p.gateway_addr, options=CLIENT_CHANNEL_OPTIONS)
    return grpc.aio.secure_channel(
        p.gateway_addr, grpc.ssl_channel_credentials(Path(ca_file).read_bytes()),
        options=CLIENT_CHANNEL_OPTIONS)


Pick = Callable[[random.Random], tuple[str, str, int]]
"""Chooses (tenant, adapter, class) of the next request."""


async def run_load(p: Platform, pick: Pick, duration_s: float, concurrency: int,
                   *, seed: int, max_tokens: int = MAX_TOKENS,
                   during: Callable[[], Awaitable[Any]] | None = None,
                   outcomes: list[Outcome] | None = None) -> tuple[list[Outcome], Any]:
    """``concurrency`` clients for ``duration_s`` (and until ``during`` returned); each
    outcome is appended to ``outcomes`` as it ends (``during`` may watch it)."""
    outcomes = [] if outcomes is None else outcomes
    stop = asyncio.Event()
    rng = random.Random(seed)
    async with gateway_channel(p) as ch:
        stub = inference_pb2_grpc.InferenceStub(ch)

        async def client(i: int) -> None:
            n = 0
            while not stop.is_set():
                tenant, adapter, klass = pick(rng)
                o = await call(stub, p.keys[tenant], tenant, adapter, klass,
                               max_tokens=max_tokens, request_key=f"c{i}-{n}")
                n += 1
                outcomes.append(o)
                if o.code != "OK":
                    await asyncio.sleep(0.2)

        tasks = [asyncio.create_task(client(i)) for i in range(concurrency)]
        t0 = time.monotonic()
        result = await during() if during is not None else None
        await asyncio.sleep(max(0.0, duration_s - (time.monotonic() - t0)))
        stop.set()
        await asyncio.gather(*tasks)
    return outcomes, result


async def wait_serving(p: Platform, timeout_s: float, tenant: str = "acme",
                       adapter: str = "support") -> float:
    """Seconds until one background request is answered (raises after ``timeout_s``)."""
    t0 = time.monotonic()
    async with gateway_channel(p) as ch:
        stub = inference_pb2_grpc.InferenceStub(ch)
        while time.monotonic() - t0 < timeout_s:
            o = await call(stub, p.keys[tenant], tenant, adapter, BACKGROUND)
            if o.code == "OK":
                return time.monotonic() - t0
            await asyncio.sleep(0.5)
    raise RuntimeError(f"not serving {tenant}/{adapter} within {timeout_s:.0f}s")


async def wait_healthy(comp: Component, since_pid: int | None, timeout_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        pid = comp.pid()
        if pid is not None and pid != since_pid and comp.health().healthy:
            return time.monotonic() - t0
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{comp.name} not back within {timeout_s:.0f}s")


def kill(comp: Component) -> int | None:
    pid = comp.pid()
    if pid is not None:
        os.killpg(pid, signal.SIGKILL)
    return pid


# --------------------------------------------------------------------------- releases


@dataclass
class Release:
    tenant: str
    name: str
    version: str
    expect: str
    """'admitted' or 'rejected'."""
    status: str = ""
    verdicts: int = 0


def do_release(p: Platform, r: Release, files: Path, signing_key: Path) -> None:
    catalogue = load_catalogue(repo_root() / "config" / "base_models.yaml")
    work = p.workdir / "release" / f"{r.name}-{r.version}-{uuid.uuid4().hex[:6]}"
    shutil.copytree(files, work)
    (work / "model.sig").unlink(missing_ok=True)
    with p.registry() as reg:
        release_adapter(reg, s3_client(reg_settings(p)), directory=work, tenant=r.tenant,
                        name=r.name, version=r.version, base_model=p.demo.base_model.name,
                        signing_key=signing_key,
                        tokenizer_revision=catalogue.get(p.demo.base_model.name)
                        .tokenizer_revision)
        rec = wait_for_verdict(reg, r.tenant, r.name, r.version, timeout_s=180)
        r.status = "timeout" if rec is None else (
            "rejected" if rec.status == common_pb2.VERSION_STATUS_REJECTED else "admitted")


def reg_settings(p: Platform) -> RegistryClientSettings:
    return RegistryClientSettings(
        registry_addr=p.env["LORAPLANE_REGISTRY_ADDR"],
        registry_operator_token=p.env["LORAPLANE_REGISTRY_OPERATOR_TOKEN"],  # type: ignore[arg-type]
        registry_actor="stress", s3_endpoint=p.env["LORAPLANE_S3_ENDPOINT"],
        s3_access_key=p.env["LORAPLANE_S3_ACCESS_KEY"],
        s3_secret_key=p.env["LORAPLANE_S3_SECRET_KEY"], **tls_fields(p.env))


def count_verdicts(p: Platform, releases: list[Release]) -> None:
    with p.registry() as reg:
        for r in releases:
            subject = f"{r.tenant}/{r.name}@{r.version}"
            n = 0
            for action in ("version.admit", "version.reject"):
                resp = reg.call("ListAudit", registry_pb2.ListAuditRequest(
                    subject_prefix=subject, action=action, page_size=100))
                n += sum(1 for e in resp.entries if e.subject == subject)
            r.verdicts = n


def promote(p: Platform, tenant: str, name: str, version: str) -> None:
    with p.registry() as reg:
        reg.call("Promote", registry_pb2.PromoteRequest(
            tenant_id=tenant, adapter_name=name, version=version, reason="stress"))


def rollback(p: Platform, tenant: str, name: str, to: str) -> None:
    with p.registry() as reg:
        reg.call("Rollback", registry_pb2.RollbackRequest(
            tenant_id=tenant, adapter_name=name, to_version=to, reason="stress"))


# --------------------------------------------------------------------------- invariants


@dataclass
class Scenario:
    name: str
    outcomes: list[Outcome] = field(default_factory=list)
    releases: list[Release] = field(default_factory=list)
    recovery_s: float | None = None
    recovered: bool | None = None
    evictions: float = 0.0
    client_outage: tuple[float, float] | None = None
    """Window (monotonic) in which the gateway process itself was down."""
    notes: list[str] = field(default_factory=list)


def check(p: Platform, sc: Scenario) -> dict[str, bool]:
    wrong, cross, cold_protected, undocumented = [], [], [], []
    for o in sc.outcomes:
        if o.code == "OK":
            if o.resolved[0] != o.tenant:
                cross.append(o)
            ref = p.base_ref if o.degraded else p.refs.get(o.resolved)
            if ref is None or o.tokens != ref:
                wrong.append(o)
            protected = o.tenant in p.platinum or o.resolved in p.canaries
            if protected and o.tier == common_pb2.TIER_COLD and o.resolved in p.warmed:
                cold_protected.append(o)
            if not o.degraded:
                p.warmed.add(o.resolved)
            continue
        documented = (o.code in ("RESOURCE_EXHAUSTED", "UNAVAILABLE") and o.retry_hint
                      and len(o.details) > 5)
        # the gateway process itself gone: streams cut and connections refused until it
        # is back (the client library's UNAVAILABLE; nothing the platform could answer)
        in_outage = (sc.client_outage is not None and o.code == "UNAVAILABLE"
                     and sc.client_outage[0] - 1 <= o.ended <= sc.client_outage[1] + 1)
        if not (documented or in_outage):
            undocumented.append(o)
    for label, bad in (("wrong answer", wrong), ("cross-tenant", cross),
                       ("protected cold start", cold_protected),
                       ("undocumented refusal", undocumented)):
        for o in bad[:3]:
            sc.notes.append(f"{label}: {o.tenant}/{o.adapter} class {CLASS_NAMES[o.klass]} "
                            f"{o.code} {o.details[:100]} resolved {o.resolved} "
                            f"degraded {o.degraded}")
    inv = {
        "answers_match_reference": not wrong,
        "zero_cross_tenant": not cross,
        "no_platinum_or_canary_cold_start": not cold_protected,
        "refusals_documented": not undocumented,
        "answered_some": any(o.code == "OK" for o in sc.outcomes),
    }
    if sc.releases:
        inv["releases_exactly_once"] = all(
            r.status == r.expect and r.verdicts == 1 for r in sc.releases)
        for r in sc.releases:
            if r.status != r.expect or r.verdicts != 1:
                sc.notes.append(f"release {r.tenant}/{r.name}@{r.version}: {r.status} "
                                f"(expected {r.expect}), {r.verdicts} verdicts")
    if sc.recovered is not None:
        inv["recovered"] = sc.recovered
    return inv


def summarize(p: Platform, sc: Scenario) -> dict[str, Any]:
    outcomes: Counter[str] = Counter()
    ttft: dict[str, list[float]] = {}
    cold = 0
    for o in sc.outcomes:
        outcomes["degraded" if o.code == "OK" and o.degraded else o.code] += 1
        if o.code == "OK":
            ttft.setdefault(CLASS_NAMES[o.klass], []).append(o.ttft_ms)
            cold += o.tier == common_pb2.TIER_COLD
    inv = check(p, sc)
    return {
        "name": sc.name,
        "requests": len(sc.outcomes),
        "outcomes": dict(outcomes),
        "ttft_ms": {k: {"p50": round(statistics.median(v), 1),
                        "p99": round(float(np.percentile(v, 99)), 1)}
                    for k, v in sorted(ttft.items())},
        "cold_starts": cold,
        "evictions": int(sc.evictions),
        "recovery_s": None if sc.recovery_s is None else round(sc.recovery_s, 1),
        "invariants": inv,
        "notes": sc.notes,
    }


# --------------------------------------------------------------------------- scenarios


def evictions(p: Platform) -> list[float]:
    """Evictions counted by each worker (a restarted worker starts again from 0)."""
    return [scrape(p.metrics_port("worker", i), "loraplane_worker_adapter_evictions_total")
            for i in range(p.settings.workers)]


def evicted_since(p: Platform, before: list[float]) -> float:
    """Evictions since ``before``; a counter that went down restarted (its value counts)."""
    return sum(now - b if now >= b else now for now, b in zip(evictions(p), before,
                                                             strict=True))


def hot_pick(rng: random.Random) -> tuple[str, str, int]:
    tenant, adapter = rng.choices([("acme", "support"), ("acme", "code"), ("globex", "legal"),
                                   (VIP, "assist")], weights=[5, 2, 2, 1])[0]
    return tenant, adapter, INTERACTIVE if rng.random() < 0.6 else BACKGROUND


def tail_pick(rng: random.Random) -> tuple[str, str, int]:
    return TENANT, f"tail-{rng.randrange(N_TAIL)}", BACKGROUND if rng.random() < 0.67 \
        else INTERACTIVE


async def sc_hot(p: Platform) -> Scenario:
    sc = Scenario("hot")
    sc.outcomes, _ = await run_load(p, hot_pick, 20, 8, seed=1)
    return sc


async def sc_cold(p: Platform) -> Scenario:
    sc = Scenario("cold")
    sc.outcomes, _ = await run_load(p, tail_pick, 40, 12, seed=2)
    return sc


async def sc_burst(p: Platform) -> Scenario:
    sc = Scenario("burst")

    async def crowd() -> None:
        async with gateway_channel(p) as ch:
            stub = inference_pb2_grpc.InferenceStub(ch)
            got = await asyncio.gather(*(
                call(stub, p.keys[TENANT], TENANT, "burst", BACKGROUND if i % 2 else INTERACTIVE,
                     request_key=f"b{i}") for i in range(32)))
            sc.outcomes.extend(got)

    load, _ = await run_load(p, hot_pick, 15, 4, seed=3, during=crowd)
    sc.outcomes.extend(load)
    return sc


async def sc_batch_eviction(p: Platform) -> Scenario:
    sc = Scenario("batch_eviction")
    sc.releases = [Release(TENANT, f"batch-{i}", "v1", "admitted") for i in range(6)]

    async def releases() -> None:
        with ThreadPoolExecutor(6) as pool:
            await asyncio.gather(*(asyncio.get_running_loop().run_in_executor(
                pool, do_release, p, r, p.adapter_files[r.name], p.demo.keys.private_key)
                for r in sc.releases))
        for r in sc.releases:
            if r.status == "admitted":
                await asyncio.to_thread(promote, p, r.tenant, r.name, r.version)
        await asyncio.sleep(3)  # the gateway sees the pointers

    def pick(rng: random.Random) -> tuple[str, str, int]:
        if rng.random() < 0.5:
            return hot_pick(rng)
        return TENANT, f"batch-{rng.randrange(6)}", BACKGROUND

    before = evictions(p)
    sc.outcomes, _ = await run_load(p, lambda r: hot_pick(r), 1, 4, seed=4, during=releases)
    more, _ = await run_load(p, pick, 25, 10, seed=5)
    sc.outcomes += more
    sc.evictions = evicted_since(p, before)
    await asyncio.to_thread(count_verdicts, p, sc.releases)
    return sc


async def fault(p: Platform, name: str, component: str, *, seed: int,
                release: Release | None = None, max_tokens: int = MAX_TOKENS,
                pick: Pick = hot_pick) -> Scenario:
    """Steady load; kill ``component`` mid-load; the supervisor restarts it; measure."""
    sc = Scenario(name)
    comp = p.component(component)
    live: list[Outcome] = []

    async def inject() -> None:
        await asyncio.sleep(4)
        pid = kill(comp)
        t_kill = time.monotonic()
        if component == "svc-gateway":
            sc.client_outage = (t_kill, t_kill)
        try:
            back = await wait_healthy(comp, pid, RECOVERY_BOUND_S)
            if component == "svc-gateway":
                # down until its gRPC port takes connections again (/metrics may answer
                # first)
                grpc_port = int(p.gateway_addr.rsplit(":", 1)[1])
                while not port_in_use(grpc_port):
                    if time.monotonic() - t_kill > RECOVERY_BOUND_S:
                        raise RuntimeError("gateway gRPC port not listening again")
                    await asyncio.sleep(0.1)
                sc.client_outage = (t_kill, time.monotonic())
            await wait_serving(p, RECOVERY_BOUND_S)
            bound = RECOVERY_BOUND_S
            if component.startswith("svc-worker"):
                # back serving HOT: an answer of the load from the restarted worker, HOT
                # when it arrived there
                bound = WORKER_RECOVERY_BOUND_S
                wid = "worker-1" if component.endswith("-1") else "worker-0"
                while not any(o.code == "OK" and o.worker == wid and not o.degraded
                              and o.tier == common_pb2.TIER_HOT and o.started > t_kill
                              for o in live):
                    if time.monotonic() - t_kill > RECOVERY_BOUND_S:
                        raise RuntimeError(f"{wid} not serving HOT again")
                    await asyncio.sleep(0.2)
                sc.notes.append(f"{wid}: process healthy {back:.1f}s after the kill")
            sc.recovery_s = time.monotonic() - t_kill
            sc.recovered = sc.recovery_s <= bound
        except RuntimeError as exc:
            sc.recovered = False
            sc.notes.append(str(exc))
        if release is not None:
            sc.releases = [release]
            await asyncio.to_thread(do_release, p, release, p.adapter_files["tail-0"],
                                    p.demo.keys.private_key)
            await asyncio.to_thread(count_verdicts, p, sc.releases)

    before = evictions(p)
    sc.outcomes, _ = await run_load(p, pick, 8, 6, seed=seed, during=inject,
                                    max_tokens=max_tokens, outcomes=live)
    sc.evictions = evicted_since(p, before)
    return sc


async def sc_bad_signatures(p: Platform) -> Scenario:
    sc = Scenario("bad_signatures")
    rogue = write_dev_keys(p.workdir / "rogue-keys", seed=666, label="rogue")
    sc.releases = [Release(TENANT, f"rogue-{i}", "v1", "rejected") for i in range(5)]

    async def stream() -> None:
        for r in sc.releases:
            await asyncio.to_thread(do_release, p, r, p.adapter_files["tail-1"],
                                    rogue.private_key)

    sc.outcomes, _ = await run_load(p, hot_pick, 10, 6, seed=6, during=stream)
    await asyncio.to_thread(count_verdicts, p, sc.releases)
    return sc


SWITCH_WAIT_S = 90.0
"""After the promote (the rollback), the switch waits for the load to be answered by the new
(the old) version, at most this long. A fixed schedule (roll back 6 s after the promote)
assumed a request rate: at load 17-20 on 2 cores the 6 clients made 11 requests in 16 s and
none answered by v2 had started inside those 6 s."""


async def sc_version_switch(p: Platform) -> Scenario:
    sc = Scenario("version_switch_rollback")
    t0 = time.monotonic()
    live: list[Outcome] = []
    marks: list[str] = []
    seen: dict[str, bool] = {}

    async def served_by(version: str, since: float) -> None:
        """Until a request that started after ``since`` is answered by ``version``."""
        while time.monotonic() - since < SWITCH_WAIT_S:
            if any(o.code == "OK" and not o.degraded and o.resolved[2] == version
                   and o.started >= since for o in live):
                seen[version] = True
                marks.append(f"{version} answered by {time.monotonic() - t0:.1f}s")
                return
            await asyncio.sleep(0.2)
        marks.append(f"no answer from {version} within {SWITCH_WAIT_S:.0f}s")

    async def switch() -> None:
        await asyncio.sleep(4)
        await asyncio.to_thread(promote, p, TENANT, "switch", "v2")
        t_promote = time.monotonic()
        marks.append(f"promoted v2 at {t_promote - t0:.1f}s")
        await served_by("v2", t_promote)
        await asyncio.sleep(2)  # a little more load on v2
        await asyncio.to_thread(rollback, p, TENANT, "switch", "v1")
        t_back = time.monotonic()
        marks.append(f"rolled back at {t_back - t0:.1f}s")
        await served_by("v1", t_back)

    def pick(rng: random.Random) -> tuple[str, str, int]:
        return TENANT, "switch", INTERACTIVE if rng.random() < 0.5 else BACKGROUND

    sc.outcomes, _ = await run_load(p, pick, 16, 6, seed=7, during=switch, outcomes=live)
    served = Counter(o.resolved[2] for o in sc.outcomes if o.code == "OK" and not o.degraded)
    sc.notes.append(f"served by version: {dict(served)}")
    sc.notes.append("; ".join(marks))
    tiers = {common_pb2.TIER_HOT: "hot", common_pb2.TIER_WARM: "warm",
             common_pb2.TIER_COLD: "cold"}
    sc.notes.append("timeline (start-end s, class, version, tier): " + ", ".join(
        f"{o.started - t0:.1f}-{o.ended - t0:.1f} {CLASS_NAMES[o.klass][:3]} "
        f"{o.resolved[2] or o.code}{' degraded' if o.degraded else ''} "
        f"{tiers.get(o.tier, o.tier)}" for o in sorted(sc.outcomes, key=lambda o: o.started)))
    if not (seen.get("v2") and seen.get("v1")):
        sc.notes.append("v2 must answer after the promote and v1 again after the rollback")
        sc.outcomes.append(Outcome(TENANT, "switch", BACKGROUND, "NOT_SWITCHED"))
    return sc


SCENARIOS: dict[str, Callable[[Platform], Awaitable[Scenario]]] = {
    "hot": sc_hot,
    "cold": sc_cold,
    "burst": sc_burst,
    "batch_eviction": sc_batch_eviction,
    "object_store_down": lambda p: fault(p, "object_store_down", "seaweedfs", seed=8),
    "bad_signatures": sc_bad_signatures,
    "broker_restart": lambda p: fault(p, "broker_restart", "tansu", seed=9,
                                      release=Release(TENANT, "after-broker", "v1", "admitted")),
    "postgres_restart": lambda p: fault(p, "postgres_restart", "postgres", seed=10,
                                        release=Release(TENANT, "after-pg", "v1", "admitted")),
    "worker_kill": lambda p: fault(p, "worker_kill", "svc-worker-1", seed=11),
    "leader_kill": lambda p: fault(p, "leader_kill", "svc-cache-manager", seed=12),
    "version_switch_rollback": sc_version_switch,
    "gateway_restart": lambda p: fault(p, "gateway_restart", "svc-gateway", seed=13),
}


# --------------------------------------------------------------------------- setup


async def references(demo: DemoManifest, files: dict[str, Path]
                     ) -> tuple[tuple[int, ...], dict[str, tuple[int, ...]]]:
    """Greedy token ids of PROMPT: base model and every adapter directory, engine-direct."""
    from loraplane.worker.settings import WorkerSettings
    from loraplane.worker.vllm_engine import VllmEngine

    ws = WorkerSettings(base_model=demo.base_model.name, base_model_dir=demo.base_model.dir,
                        worker_max_loras=4, worker_max_cpu_loras=5)
    engine = await VllmEngine.start(demo.base_model.dir, ws.engine_options())
    try:
        llm = engine._llm
        base = (await generate_greedy(llm, PROMPT, max_tokens=MAX_TOKENS,
                                      ignore_eos=False)).token_ids
        refs = {}
        for i, (name, path) in enumerate(sorted(files.items())):
            out = await generate_greedy(llm, PROMPT, max_tokens=MAX_TOKENS, ignore_eos=False,
                                        lora=lora_request(800_000 + i, f"ref/{name}", path))
            refs[name] = out.token_ids
            await llm.remove_lora(800_000 + i)
    finally:
        await engine.close()
    return base, refs


def build_adapters(demo: DemoManifest, root: Path) -> dict[str, Path]:
    """Demo adapters by ``tenant/name@version`` plus the stress adapters by name."""
    dims = LlamaDims.from_model_dir(demo.base_model.dir)
    files: dict[str, Path] = {f"{a.tenant}/{a.name}@{a.version}": a.dir for a in demo.adapters}
    names = ([f"tail-{i}" for i in range(N_TAIL)] + [f"batch-{i}" for i in range(6)]
             + ["burst", "assist", "switch-v1", "switch-v2"])
    for i, name in enumerate(names):
        rng = np.random.default_rng(5000 + i)
        files[name] = write_lora(
            root / name, dims, base_model=demo.base_model.name, rank=8,
            modules=("q_proj", "v_proj"),
            fill=lambda shape, _, rng=rng: (rng.standard_normal(shape) * 0.3).astype(np.float32),
        )
    return files


async def setup(settings: StackSettings, work: Path) -> Platform:
    demo = build_demo()
    files = build_adapters(demo, work / "adapters")
    t0 = time.monotonic()
    base_ref, by_file = await references(demo, files)
    if len(set(by_file.values()) | {base_ref}) != len(by_file) + 1:
        raise RuntimeError("two adapters give the same reference answer: the check could "
                           "not tell them apart")
    log(f"references: {len(by_file)} adapters + base, engine-direct, {time.monotonic()-t0:.0f}s")

    sup = Supervisor(settings, echo=lambda m: log(f"  [supervisor] {m}"))
    manifest: dict[str, Any] = {}

    def prepare(s: Supervisor) -> None:
        manifest["demo"], manifest["values"] = seed_models(s.echo)

    await asyncio.to_thread(sup.start, prepare)  # (blocking; it runs its own event loops)
    values = dict(manifest["values"])
    values.update(await asyncio.to_thread(seed_platform, manifest["demo"], sup.env, sup.echo))
    env = sup.demo_env(values)
    log(f"gateway edge {env['LORAPLANE_GATEWAY_GRPC']}: "
        + (f"TLS, trusting {env['LORAPLANE_GATEWAY_CA_FILE']}"
           if env.get("LORAPLANE_GATEWAY_CA_FILE") else "plaintext"))
    threading.Thread(target=sup.watch, daemon=True, name="supervisor-watch").start()

    refs: dict[Key, tuple[int, ...]] = {}
    for a in demo.adapters:
        refs[(a.tenant, a.name, a.version)] = by_file[f"{a.tenant}/{a.name}@{a.version}"]
    p = Platform(sup, settings, demo, env, {}, refs, base_ref, files, work, platinum={VIP})
    p.keys = {"acme": env["LORAPLANE_DEMO_API_KEY"],
              "globex": env["LORAPLANE_OTHER_TENANT_API_KEY"]}
    with p.registry() as reg:
        reg.ensure_tenant(TENANT, display_name="stress", priority=common_pb2.PRIORITY_GOLD)
        reg.ensure_tenant(VIP, display_name="stress platinum",
                          priority=common_pb2.PRIORITY_PLATINUM)
        p.keys[TENANT] = reg.create_api_key(TENANT, "stress")[1]
        p.keys[VIP] = reg.create_api_key(VIP, "stress")[1]
    seeded = ([Release(TENANT, f"tail-{i}", "v1", "admitted") for i in range(N_TAIL)]
              + [Release(TENANT, "burst", "v1", "admitted"), Release(VIP, "assist", "v1",
                                                                      "admitted"),
                 Release(TENANT, "switch", "v1", "admitted"),
                 Release(TENANT, "switch", "v2", "admitted")])
    t0 = time.monotonic()
    def seed_one(r: Release) -> None:
        do_release(p, r, files[r.name if r.name != "switch" else f"switch-{r.version}"],
                   demo.keys.private_key)

    with ThreadPoolExecutor(4) as pool:
        await asyncio.gather(*(asyncio.get_running_loop().run_in_executor(pool, seed_one, r)
                               for r in seeded))
    for r in seeded:
        if r.status != "admitted":
            raise RuntimeError(f"seeding {r.tenant}/{r.name}@{r.version}: {r.status}")
        if r.version == "v1":
            await asyncio.to_thread(promote, p, r.tenant, r.name, r.version)
    for name in [f"tail-{i}" for i in range(N_TAIL)] + ["burst", "assist"] + [
            f"batch-{i}" for i in range(6)] + [f"rogue-{i}" for i in range(5)] + [
            "after-broker", "after-pg"]:
        src = name if name in files else ("tail-1" if name.startswith("rogue") else "tail-0")
        tenant = VIP if name == "assist" else TENANT
        refs[(tenant, name, "v1")] = by_file[src]
    refs[(TENANT, "switch", "v1")] = by_file["switch-v1"]
    refs[(TENANT, "switch", "v2")] = by_file["switch-v2"]
    with p.registry() as reg:
        for tenant, name in {(a.tenant, a.name) for a in demo.adapters}:
            rel = reg.call("GetRelease", registry_pb2.GetReleaseRequest(
                tenant_id=tenant, adapter_name=name)).release
            if rel.canary_version and rel.canary_percent > 0:
                p.canaries.add((tenant, name, rel.canary_version))
    log(f"seeded {len(seeded)} stress versions in {time.monotonic() - t0:.0f}s; active "
        f"canaries {sorted(p.canaries)}")
    await asyncio.sleep(3)  # the gateway's views see the pointers
    await wait_serving(p, 300)
    await wait_serving(p, 120, VIP, "assist")  # platinum: warmed once, then never cold
    p.warmed.add((VIP, "assist", "v1"))
    return p


def teardown(p: Platform | None, sup: Supervisor, settings: StackSettings) -> bool:
    sup.request_stop()
    sup.stop()
    ports = [getattr(settings, n) for n in PORT_OFFSETS]
    for svc in existing_services():
        ports.extend(svc.all_ports(settings))
    time.sleep(0.5)
    still = [port for port in ports if port_in_use(port)]
    pids = list((settings.root / "run").glob("*.pid"))
    if still or pids:
        log(f"left behind: ports {still}, pid files {pids}")
    return not still and not pids


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'scenario':<24}{'reqs':>6}  {'outcomes':<44}{'int p99':>9}{'bg p99':>9}" \
           f"{'cold':>6}{'evict':>6}{'recov':>7}  invariants"
    lines = [head, "-" * len(head)]
    for r in rows:
        oc = ", ".join(f"{k} {v}" for k, v in sorted(r["outcomes"].items()))
        t = r["ttft_ms"]
        rec = "" if r["recovery_s"] is None else f"{r['recovery_s']:.0f}s"
        bad = [k for k, v in r["invariants"].items() if not v]
        lines.append(
            f"{r['name']:<24}{r['requests']:>6}  {oc[:43]:<44}"
            f"{t.get('interactive', {}).get('p99', 0):>9.0f}"
            f"{t.get('background', {}).get('p99', 0):>9.0f}{r['cold_starts']:>6}"
            f"{r['evictions']:>6}{rec:>7}  {'all true' if not bad else 'FALSE: ' + ', '.join(bad)}")
    return "\n".join(lines)


async def main_async(only: list[str], repeat: int = 1) -> int:
    # a private port block and data directory: LORAPLANE_STRESS_PORT_BASE, else
    # LORAPLANE_STACK_PORT_BASE, else 25000; LORAPLANE_STACK_DATA_DIR, else
    # .loraplane/stress-stack
    base = int(os.environ.get("LORAPLANE_STRESS_PORT_BASE")
               or os.environ.get("LORAPLANE_STACK_PORT_BASE") or "25000")
    root = repo_root() / ".loraplane"
    data = Path(os.environ.get("LORAPLANE_STACK_DATA_DIR") or root / "stress-stack")
    work = data.parent / f"{data.name}-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    settings = StackSettings(profile="run", port_base=base, data_dir=data,
                             demo_env_file=work / "demo.env", workers=2)
    Supervisor(settings).stack.wipe()
    rows: list[dict[str, Any]] = []
    p: Platform | None = None
    sup: Supervisor | None = None
    t_all = time.monotonic()
    try:
        p = await setup(settings, work)
        sup = p.sup
        for name, fn in [(n, f) for n, f in SCENARIOS.items() for _ in range(repeat)]:
            if only and name not in only:
                continue
            t0 = time.monotonic()
            log(f"scenario {name} ...")
            sc = await fn(p)
            row = summarize(p, sc)
            rows.append(row)
            log(f"  {name}: {row['requests']} requests {row['outcomes']} in "
                f"{time.monotonic() - t0:.0f}s; invariants {row['invariants']}")
            for note in row["notes"]:
                log(f"    {note}")
    finally:
        clean = teardown(p, sup or (p.sup if p else Supervisor(settings)), settings)
    out = {"scenarios": rows, "teardown": {"nothing_left_running": clean},
           "wall_s": round(time.monotonic() - t_all, 1)}
    path = root / "bench" / "stress.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    log("\n" + table(rows))
    log(f"nothing left running: {clean}; wrote {path}")
    missing = [n for n in SCENARIOS if n not in {r['name'] for r in rows}]
    ok = clean and all(all(r["invariants"].values()) for r in rows)
    if missing and not only:
        ok = False
    return 0 if ok else 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated scenarios to run")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each scenario this many times in a row (recovery medians)")
    args = ap.parse_args()
    only = [s for s in args.only.split(",") if s]
    unknown = [s for s in only if s not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    sys.exit(asyncio.run(main_async(only, max(1, args.repeat))))


if __name__ == "__main__":
    main()
