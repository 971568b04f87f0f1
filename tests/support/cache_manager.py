"""Test support for the cache manager over real infrastructure (integration tests, demos).

* :func:`reset_topics` deletes and recreates the topics the cache manager reads and writes
  (isolation: a manager under test reads its input topics from the beginning);
* :class:`Registry` inserts the registry rows a test needs with SQL under a unique tenant;
* :class:`Launcher` starts cache managers as real processes (``python -m
  loraplane.cache_manager``) with short timings, sharing one lock key and group id;
* :class:`Bus` publishes real events and collects the commands the manager sends;
* :class:`Heartbeat` publishes a worker's periodic ``WorkerState`` (not a worker: it
  executes nothing; tests answer commands themselves or run real workers).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import grpc
import yaml  # type: ignore[import-untyped, unused-ignore]
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from google.protobuf.message import Message

from loraplane.cache_manager.model import Ref
from loraplane.shared import topics
from loraplane.shared.codec import decode_record, encode, kafka_headers
from loraplane.shared.kafka_admin import ensure_topics
from loraplane.shared.kafka_client import KafkaConnection
from loraplane.shared.tls import CACHE_MANAGER, GATEWAY, OPERATOR
from loraplane.stack.stack import Stack
from loraplane.v1 import cache_pb2, cache_pb2_grpc, events_pb2
from tests.support.tls import internal_channel, tls_env

REPO = Path(__file__).resolve().parents[2]
RESET_TOPICS = (topics.CACHE_STATE, topics.CACHE_COMMANDS, topics.ADAPTER_HEAT,
                topics.ADAPTER_ADMISSIONS, topics.ADAPTER_LIFECYCLE, topics.ADAPTER_PREWARM)

FAST = {
    "LORAPLANE_CACHE_MANAGER_TICK_S": "0.5",
    "LORAPLANE_CACHE_MANAGER_WORKER_TIMEOUT_S": "4",
    "LORAPLANE_CACHE_MANAGER_BOOTSTRAP_GRACE_S": "2.5",
    "LORAPLANE_CACHE_MANAGER_LEADER_POLL_S": "0.3",
    "LORAPLANE_CACHE_MANAGER_STATS_FLUSH_S": "0.5",
    "LORAPLANE_CACHE_MANAGER_COMMIT_INTERVAL_S": "0.5",
    "LORAPLANE_CACHE_MANAGER_GET_STATE_TIMEOUT_S": "1",
    "LORAPLANE_CACHE_MANAGER_GRACE_S": "0.5",
}
"""Timings of the managers under test (the bounds asserted below derive from them)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def reset_topics(bootstrap: str) -> None:
    """Delete and recreate the topics the cache manager reads and writes."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        doomed = [t for t in RESET_TOPICS if t in existing]
        if doomed:
            await admin.delete_topics(doomed)
        for name in RESET_TOPICS:
            for _ in range(50):
                try:
                    await admin.create_topics([NewTopic(name, topics.TOPICS[name].partitions, 1)])
                    break
                except Exception:  # noqa: BLE001 - deletion still settling
                    await asyncio.sleep(0.1)
    finally:
        await admin.close()


# --------------------------------------------------------------------------- registry rows


@dataclass
class Registry:
    """Registry rows of one test (unique tenant)."""

    dsn: str
    tenant: str
    next_engine_id: int = field(default_factory=lambda: random.randint(10**6, 10**9))

    async def _conn(self) -> asyncpg.Connection:
        return await asyncpg.connect(self.dsn)

    async def tenant_row(self, priority: str = "silver") -> None:
        conn = await self._conn()
        try:
            await conn.execute(
                "INSERT INTO tenants (tenant_id, default_priority) VALUES ($1, $2) "
                "ON CONFLICT DO NOTHING", self.tenant, priority)
        finally:
            await conn.close()

    async def version(
        self, name: str, version: str = "v1", *, status: str = "active",
        priority: str | None = None,
        size: int = 1_000_000, rank: int = 8, base_model: str = "loraplane/tiny-llama",
        artifact_uri: str = "", sha256: str = "ab" * 32, engine_id: int | None = None,
    ) -> Ref:
        """Insert (adapter and) version; returns its reference."""
        adapter_id = f"{self.tenant}/{name}"
        eid = engine_id or self.next_engine_id
        self.next_engine_id += 1
        conn = await self._conn()
        try:
            await conn.execute(
                "INSERT INTO adapters (adapter_id, tenant_id, name, base_model) "
                "VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                adapter_id, self.tenant, name, base_model)
            await conn.execute(
                "INSERT INTO adapter_versions (adapter_id, version, engine_id, base_model, rank, "
                "target_modules, artifact_uri, sha256, size_bytes, status, priority_override) "
                "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::version_status, "
                "$11::priority)",
                adapter_id, version, eid, base_model, rank, ["q_proj", "v_proj"],
                artifact_uri or f"s3://loraplane-artifacts/adapters/{adapter_id}/{version}/",
                sha256, size, status, priority)
            if status == "active":
                await conn.execute(
                    "INSERT INTO release_pointers (adapter_id, stable_version) VALUES ($1, $2) "
                    "ON CONFLICT (adapter_id) DO UPDATE SET stable_version = $2",
                    adapter_id, version)
            if status == "canary":
                await conn.execute(
                    "INSERT INTO release_pointers (adapter_id, canary_version, canary_percent) "
                    "VALUES ($1, $2, 10) ON CONFLICT (adapter_id) DO UPDATE SET "
                    "canary_version = $2, canary_percent = 10", adapter_id, version)
        finally:
            await conn.close()
        return Ref(self.tenant, name, version, base_model)


# --------------------------------------------------------------------------- bus


class Bus:
    """Publishes events; collects ``cache.commands`` as they are sent."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.commands: list[events_pb2.CacheCommand] = []
        self.arrivals: list[float] = []
        """``time.perf_counter()`` at which each command was read (same order)."""
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Create the topics if needed, connect, read ``cache.commands`` from the start."""
        await ensure_topics(KafkaConnection(self.bootstrap))
        self._producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        await self._producer.start()
        self._consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap,
                                          auto_offset_reset="earliest", enable_auto_commit=False,
                                          fetch_max_wait_ms=20)
        await self._consumer.start()
        parts = self._consumer.partitions_for_topic(topics.CACHE_COMMANDS)
        if not parts:
            raise RuntimeError(f"{topics.CACHE_COMMANDS} has no partitions")
        tps = [TopicPartition(topics.CACHE_COMMANDS, p) for p in parts]
        self._consumer.assign(tps)
        await self._consumer.seek_to_beginning(*tps)
        self._task = asyncio.create_task(self._collect())

    async def _collect(self) -> None:
        assert self._consumer is not None
        while True:
            batches = await self._consumer.getmany(timeout_ms=200)
            for recs in batches.values():
                for r in recs:
                    msg = decode_record(r)
                    assert isinstance(msg, events_pb2.CacheCommand)
                    self.commands.append(msg)
                    self.arrivals.append(time.perf_counter())

    async def publish(self, *msgs: Message) -> None:
        assert self._producer is not None
        for msg in msgs:
            topic = topics.topic_for(msg).name
            body, headers = encode(msg)
            await self._producer.send(topic, body, key=topics.key_for(topic, msg),
                                      headers=kafka_headers(headers))
        await self._producer.flush()

    async def wait_for(
        self, pred: Callable[[events_pb2.CacheCommand], bool], timeout: float = 15.0,
        count: int = 1,
    ) -> list[events_pb2.CacheCommand]:
        """Wait until ``count`` collected commands satisfy ``pred``; returns them."""
        deadline = time.monotonic() + timeout
        while True:
            found = [c for c in self.commands if pred(c)]
            if len(found) >= count:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"only {len(found)}/{count} matching commands after {timeout}s; got "
                    f"{[describe(c) for c in self.commands]}")
            await asyncio.sleep(0.1)

    def matching(self, pred: Callable[[events_pb2.CacheCommand], bool]
                 ) -> list[events_pb2.CacheCommand]:
        return [c for c in self.commands if pred(c)]

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._consumer is not None:
            await self._consumer.stop()
        if self._producer is not None:
            await self._producer.stop()


def describe(c: events_pb2.CacheCommand) -> str:
    """``load_hot acme/a@v1 -> w1`` for assertion messages."""
    arm = c.WhichOneof("command")
    if arm == "load":
        arm = "load_hot" if c.load.target_tier == 1 else "load_warm"
    elif arm == "evict":
        arm = "demote" if c.evict.to_tier == 2 else "evict"
    a = c.meta.adapter
    return f"{arm} {a.tenant_id}/{a.adapter_name}@{a.version} -> {c.worker_id} ({c.reason})"


def is_cmd(kind: str, ref: Ref | None = None, worker: str | None = None
           ) -> Callable[[events_pb2.CacheCommand], bool]:
    """Predicate on :func:`describe`'s kind, version and worker."""
    def pred(c: events_pb2.CacheCommand) -> bool:
        d = describe(c)
        if not d.startswith(kind + " "):
            return False
        a = c.meta.adapter
        if ref is not None and (a.tenant_id, a.adapter_name, a.version) != (
                ref.tenant_id, ref.adapter_name, ref.version):
            return False
        return worker is None or c.worker_id == worker
    return pred


# --------------------------------------------------------------------------- managers


@dataclass
class Manager:
    """One cache-manager process."""

    proc: subprocess.Popen[bytes]
    grpc_port: int
    metrics_port: int
    log: Path
    stack: Stack
    """The stack whose dev CA the process serves mutual TLS with (its ``cache-manager``
    certificate)."""

    def metric(self, name: str) -> float | None:
        """Value of an unlabelled metric (None when unreachable or absent)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                        timeout=1) as r:
                text = r.read().decode()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    def metric_lines(self, prefix: str) -> list[str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=1) as r:
            return [ln for ln in r.read().decode().splitlines() if ln.startswith(prefix)]

    def stub(self, caller: str = OPERATOR
             ) -> tuple[grpc.aio.Channel, cache_pb2_grpc.CacheManagerStub]:
        """A channel to the read API as ``caller`` (the operator's ``loraplane cache
        status``; the gateway's placement bootstrap) and its stub."""
        ch = internal_channel(self.stack, f"127.0.0.1:{self.grpc_port}", caller=caller,
                              server=CACHE_MANAGER)
        return ch, cache_pb2_grpc.CacheManagerStub(ch)

    async def wait_up(self, timeout: float = 20.0) -> None:
        """Wait until ``/metrics`` answers (the process is serving, leader or standby)."""
        start = time.monotonic()
        while self.metric("loraplane_cache_leader") is None:
            assert self.proc.poll() is None, self.log.read_text()
            if time.monotonic() - start > timeout:
                raise AssertionError(f"not serving after {timeout}s:\n{self.log.read_text()}")
            await asyncio.sleep(0.05)

    async def wait_leader(self, timeout: float = 20.0) -> float:
        """Wait until this instance leads; returns the seconds waited."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.metric("loraplane_cache_leader") == 1.0:
                return time.monotonic() - start
            assert self.proc.poll() is None, self.log.read_text()
            await asyncio.sleep(0.05)
        raise AssertionError(f"not leader after {timeout}s:\n{self.log.read_text()[-3000:]}")

    async def wait_planning(self, timeout: float = 20.0) -> None:
        """Wait until the takeover finished (state rebuilt, rounds run)."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if "planning starts" in self.log.read_text():
                return
            assert self.proc.poll() is None, self.log.read_text()
            await asyncio.sleep(0.05)
        raise AssertionError(f"never planned:\n{self.log.read_text()[-3000:]}")

    async def placement(self, ref: Ref) -> list[tuple[str, int]]:
        ch, stub = self.stub(GATEWAY)
        async with ch:
            resp = await stub.GetPlacement(cache_pb2.GetPlacementRequest(adapter=ref.proto()),
                                           timeout=5)
        return [(p.worker_id, p.placement.tier) for p in resp.placements]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()




class Launcher:
    """Starts cache-manager processes sharing one lock key and group id (one deployment),
    each serving (and dialling workers and the registry) with mutual TLS as the
    ``cache-manager`` of ``stack``'s dev CA, as ``make run`` starts them."""

    def __init__(self, client_env: dict[str, str], workdir: Path, tag: str,
                 tenants: str = "", *, stack: Stack) -> None:
        self.stack = stack
        self.client_env = client_env
        self.tenants = tenants
        self.workdir = workdir
        self.lock_key = random.randint(1, 2**40)
        self.group = f"cm-test-{tag}"
        self.started: list[Manager] = []

    def start(self, rules: dict[str, object] | None = None,
              policy: dict[str, object] | None = None, **env_over: str) -> Manager:
        """One more instance (standby if another leads); ``policy`` overrides policy.yaml."""
        n = len(self.started)
        rules = dict(rules or {})
        if policy is not None:
            base = yaml.safe_load((REPO / "config" / "policy.yaml").read_text()) or {}
            for section, values in policy.items():
                if isinstance(values, dict):
                    base.setdefault(section, {}).update(values)
                else:
                    base[section] = values
            policy_file = self.workdir / f"policy-{n}.yaml"
            policy_file.write_text(yaml.safe_dump(base))
            rules["policy_config"] = str(policy_file)
        rules_file = self.workdir / f"rules-{n}.yaml"
        rules_file.write_text(yaml.safe_dump(rules))
        grpc_port, metrics_port = free_port(), free_port()
        env = dict(os.environ)
        env.update(self.client_env)
        env.update(tls_env(self.stack, CACHE_MANAGER))
        env.update(FAST)
        env.update({
            "LORAPLANE_CACHE_MANAGER_GRPC_PORT": str(grpc_port),
            "LORAPLANE_CACHE_MANAGER_METRICS_PORT": str(metrics_port),
            # Off unless asked (env_over): a shell that sourced demo.env carries make run's
            # page port, which a second instance (or make run itself) already holds.
            "LORAPLANE_CACHE_MANAGER_PAGE_PORT": "0",
            "LORAPLANE_CACHE_MANAGER_LOCK_KEY": str(self.lock_key),
            "LORAPLANE_CACHE_MANAGER_CONSUMER_GROUP": self.group,
            "LORAPLANE_CACHE_MANAGER_RULES_FILE": str(rules_file),
            "LORAPLANE_CACHE_MANAGER_TENANTS": self.tenants,
            "LORAPLANE_INSTANCE_ID": f"cm-{n}-{uuid.uuid4().hex[:4]}",
        })
        env.update(env_over)
        log = self.workdir / f"cm-{n}.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "loraplane.cache_manager"], env=env, cwd=REPO,
            stdout=log.open("wb"), stderr=subprocess.STDOUT,
        )
        m = Manager(proc, grpc_port, metrics_port, log, self.stack)
        self.started.append(m)
        return m

    def stop_all(self) -> None:
        """SIGTERM every instance still running."""
        for m in self.started:
            m.stop()


# --------------------------------------------------------------------------- worker reports


class Heartbeat:
    """Publishes a worker's periodic ``WorkerState`` (what a worker does every few seconds).

    The test edits ``spec.held`` as it answers commands; this is not a worker (it executes
    nothing): the real-worker tests live in ``test_real_workers.py``.
    """

    def __init__(self, bus: Bus, spec: object, interval_s: float = 1.0) -> None:
        from tests.support import eventgen

        self._ev = eventgen
        self.bus = bus
        self.spec = spec
        self.interval_s = interval_s
        self.seq = 0
        self._task: asyncio.Task[None] | None = None

    async def beat(self) -> None:
        self.seq += 1
        await self.bus.publish(self._ev.snapshot(self.spec, self.seq, time.time()))  # type: ignore[arg-type]

    async def _run(self) -> None:
        while True:
            await self.beat()
            await asyncio.sleep(self.interval_s)

    async def start(self) -> Heartbeat:
        await self.beat()
        self._task = asyncio.create_task(self._run())
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None


class Responder:
    """Answers the commands addressed to some workers the way a worker reports them.

    It edits the workers' :class:`~tests.support.eventgen.WorkerSpec` (so their
    :class:`Heartbeat` snapshots agree) and publishes ``AdapterLoaded`` / ``AdapterEvicted``.
    It loads nothing: real workers are exercised in ``test_real_workers.py``.
    """

    def __init__(self, bus: Bus, *workers: object) -> None:
        from tests.support import eventgen

        self._ev = eventgen
        self.bus = bus
        self.workers = {w.worker_id: w for w in workers}  # type: ignore[attr-defined]
        self._seen = 0
        self._task: asyncio.Task[None] | None = None

    def _apply(self, cmd: events_pb2.CacheCommand) -> None:
        ev = self._ev
        spec = self.workers[cmd.worker_id]
        ref = Ref.of(cmd.meta.adapter)
        held = {h.ref: h for h in spec.held}
        arm = cmd.WhichOneof("command")
        if arm == "load":
            h = held.get(ref) or ev.Held(ref, tier=cmd.load.target_tier,
                                         engine_id=cmd.load.engine_id)
            if cmd.load.target_tier == ev.common_pb2.TIER_HOT:
                h.tier = ev.common_pb2.TIER_HOT
                h.pinned = h.pinned or cmd.load.pin
            held[ref] = h
        elif arm == "evict":
            if cmd.evict.to_tier == ev.common_pb2.TIER_COLD:
                held.pop(ref, None)
            elif ref in held:
                held[ref].tier = ev.common_pb2.TIER_WARM
                held[ref].pinned = False
        elif ref in held:
            held[ref].pinned = arm == "pin"
        spec.held = list(held.values())

    async def _run(self) -> None:
        while True:
            fresh = self.bus.commands[self._seen:]
            self._seen += len(fresh)
            for cmd in fresh:
                # a HOT order changes no placement and no report answers it (a real worker's)
                if cmd.worker_id in self.workers and cmd.WhichOneof("command") != "hot_order":
                    self._apply(cmd)
                    await self.bus.publish(self._ev.answer(cmd, time.time()))
            await asyncio.sleep(0.05)

    def start(self) -> Responder:
        self._task = asyncio.create_task(self._run())
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
