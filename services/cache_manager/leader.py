"""One cache-manager leader (the deployment's or one shard's): election, consumption, rounds.

Life of an instance (:meth:`CacheManagerService.run`):

1. **Standby**: try the leader lock every ``leader_poll_s``; the read API answers
   UNAVAILABLE; ``/metrics`` answers (``loraplane_cache_leader 0``).
2. **Takeover** (lock acquired): build a fresh :class:`~loraplane.cache_manager.core.CacheCore`;
   load the registry (versions, pointers), the saved heat statistics and the
   directory of recently seen workers from Postgres; start the consumer (resumes
   at the committed offsets) and the producer; ask every known worker for its
   state (``WorkerInternal.GetState``). No command is sent until every known
   worker is synced or ``bootstrap_grace_s`` passed, so a restart neither
   reloads what is loaded nor evicts what it has not seen yet.
3. **Leading**: three tasks —
   *consume* (apply events; triggers wake the planner early),
   *decide* (a round per trigger or per ``tick_s``; the lock is checked before
   every batch of commands; commands published keyed by worker),
   *housekeeping* (offset commits, lock checks, statistics and worker directory
   to Postgres, registry refresh, resolution of versions seen before the
   registry spoke of them).
4. Losing the lock (or Postgres) ends leadership: tasks stop, state is dropped,
   the instance goes back to standby.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol

import asyncpg
from prometheus_client import REGISTRY, CollectorRegistry

from loraplane.cache_manager import canary_runner, prewarm, store
from loraplane.cache_manager.canary_window import CanaryWindow
from loraplane.cache_manager.core import CacheCore
from loraplane.cache_manager.election import LeaderLock
from loraplane.cache_manager.kafka_io import (
    INPUT_TOPICS,
    CommandSink,
    Received,
    assign_every_partition,
    decode_batch,
    new_consumer,
)
from loraplane.cache_manager.messages import build_command, build_hot_order
from loraplane.cache_manager.metrics import CacheMetrics, StateCollector
from loraplane.cache_manager.model import WITHDRAWN, CommandKind, Tier, version_id
from loraplane.cache_manager.planner import HotOrder
from loraplane.cache_manager.rules import RulesConfig
from loraplane.cache_manager.settings import CacheManagerSettings
from loraplane.cache_manager.shadow import GrpcShadowRunner, ShadowRunner
from loraplane.cache_manager.sharding import EVERY, shard_group, shard_lock_key
from loraplane.cache_manager.state import State
from loraplane.cache_manager.tracker import Resolution
from loraplane.policy.config import PolicyConfig
from loraplane.policy.factory import make_policy
from loraplane.shared import topics
from loraplane.shared.consumer import ConsumerLoop, Restart
from loraplane.shared.db import create_pool
from loraplane.shared.tls import WORKER, TlsFiles, secure_or_insecure_aio_channel
from loraplane.shared.topics import new_meta
from loraplane.v1 import events_pb2, worker_pb2, worker_pb2_grpc

log = logging.getLogger(__name__)

IMMEDIATE_TRIGGERS = frozenset({
    "burst", "canary", "rollback", "retire", "promoted", "prewarm", "worker_joined",
    "worker_restarted", "worker_back", "worker_synced",
})
"""Triggers that start a round now rather than at the next tick."""


SOURCES: dict[str, tuple[str, ...]] = {
    "control": tuple(t for t in INPUT_TOPICS if t != topics.ADAPTER_HEAT),
    "heat": (topics.ADAPTER_HEAT,),
}
"""The two consumers of the leader and their topics."""


def freeze_state() -> None:
    """Take every object the process holds now out of the garbage collector's reach
    (``gc.freeze``): called after a leader's first round on its rebuilt state. That state
    (version records and metadata, the policy's and the adaptive ranking's per-version
    structures, what the planner keeps between rounds) lives as long as the leadership, and a
    full collection walking it took ~90-100 ms at 64 workers x 10,000 versions, inside a round
    every 20-40 rounds; frozen, a full collection walks only what came after (1-4 ms there;
    13-25 ms when frozen before the first round, which builds what the planner keeps).
    Decisions do not depend on it. A round or a ranking rebuild leaves no cyclic garbage
    (``gc.collect()`` finds none), so nothing frozen is held past its use; what a leadership
    leaves behind is freed by :func:`thaw_state`."""
    gc.freeze()


def thaw_state(still_leading: bool) -> None:
    """A leadership ended and its state was dropped: give the frozen objects back to the
    collector and collect (any cycle among them is freed), then freeze again what the
    process's other shards still hold (``still_leading``)."""
    gc.unfreeze()
    gc.collect()
    if still_leading:
        gc.freeze()


class LostLeadership(Exception):
    """The lock session ended: stop commanding at once."""


class StateFetcher(Protocol):
    """Asks a worker for its current state (takeover)."""

    async def get_state(self, address: str, timeout_s: float) -> events_pb2.WorkerState:
        """``WorkerInternal.GetState`` of the worker at ``address``."""


class GrpcStateFetcher:
    """:class:`StateFetcher` over gRPC (mutual TLS when ``tls`` is set)."""

    def __init__(self, tls: TlsFiles | None = None) -> None:
        self.tls = tls

    async def get_state(self, address: str, timeout_s: float) -> events_pb2.WorkerState:
        async with secure_or_insecure_aio_channel(address, self.tls, server=WORKER) as channel:
            stub = worker_pb2_grpc.WorkerInternalStub(channel)
            state: events_pb2.WorkerState = await stub.GetState(
                worker_pb2.GetStateRequest(), timeout=timeout_s)
            return state


class _CoreHolder:
    """What the scrape-time collector reads (one per metrics registry)."""

    def __init__(self) -> None:
        self.core: Callable[[], CacheCore | None] = lambda: None
        self.canary: Callable[[], canary_runner.CanaryRunner | None] = lambda: None
        self.leading: set[str] = set()
        """Shards this process leads now (``*``: unsharded): ``loraplane_cache_leader``."""


_HOLDERS: dict[int, _CoreHolder] = {}


def _holder(registry: CollectorRegistry) -> _CoreHolder:
    h = _HOLDERS.get(id(registry))
    if h is None:
        h = _CoreHolder()
        _HOLDERS[id(registry)] = h
        registry.register(StateCollector(lambda: h.core()))
        registry.register(canary_runner.CanaryCollector(lambda: h.canary(), time.time))
    return h


class CacheManagerService:
    """One cache-manager instance (leader or standby)."""

    def __init__(
        self,
        settings: CacheManagerSettings,
        rules: RulesConfig,
        policy_config: PolicyConfig,
        *,
        registry: CollectorRegistry = REGISTRY,
        clock: Callable[[], float] = time.time,
        fetcher: StateFetcher | None = None,
        shadow: ShadowRunner | None = None,
        shard: str | None = None,
    ) -> None:
        self.settings = settings
        self.shard = shard
        """The base model this instance leads (:mod:`.sharding`); None: every base model."""
        self._registry = registry
        self.rules = rules
        self.policy_config = policy_config
        self.clock = clock
        self.metrics = CacheMetrics.for_registry(registry)
        _holder(registry).core = lambda: self.core
        _holder(registry).canary = lambda: self.canary
        tls = settings.tls_files()
        self.fetcher = fetcher or GrpcStateFetcher(tls)
        self.shadow = shadow or GrpcShadowRunner(tls)
        make_policy(rules.policy, policy_config)  # fail at start on an unknown policy name
        self.core: CacheCore | None = None
        self.ready = False
        self._trigger = asyncio.Event()
        self._trigger_at: float | None = None
        self._trigger_cause = ""
        self._unresolved: set[str] = set()
        self._loops: dict[str, ConsumerLoop] = {}
        """``control`` (worker reports, registry events, prewarm) and ``heat``: two consumers,
        so command answers and snapshots never wait behind a backlog of heat."""
        self._last_record: dict[str, float] = {}
        self._flushed: asyncio.Event | None = None
        """Set (at the end of a leadership) once the stats are flushed: the consumers then
        commit their positions and close."""
        self._shadow_tasks: set[asyncio.Task[None]] = set()
        self._exercised: set[tuple[str, str]] = set()
        self._golden_running: dict[str, int] = {}
        """Canary version id → golden-set runs in flight."""
        """(worker, canary version) pairs whose golden set was sent since it became HOT."""
        self.canary: canary_runner.CanaryRunner | None = None
        """The canary analysis of the current leadership (None when standby)."""

    # ------------------------------------------------------------------ lifecycle

    @property
    def _base_models(self) -> frozenset[str] | None:
        return None if self.shard is None else frozenset({self.shard})

    @property
    def group(self) -> str:
        """Kafka group id of this instance's input offsets (the deployment's, or its shard's)."""
        group = self.settings.cache_manager_consumer_group
        return group if self.shard is None else shard_group(group, self.shard)

    def _leading(self, on: bool) -> None:
        name = EVERY if self.shard is None else self.shard
        self.metrics.shard_leader.labels(name).set(1 if on else 0)
        leading = _holder(self._registry).leading
        if on:
            leading.add(name)
        else:
            leading.discard(name)
        self.metrics.leader.set(1 if leading else 0)

    async def run(self, stop: asyncio.Event) -> None:
        """Stand by, lead when elected, until ``stop`` is set."""
        s = self.settings
        if self.shard is None:
            lock = LeaderLock(s.postgres_dsn, s.cache_manager_lock_key)
        else:
            lock = LeaderLock(s.postgres_dsn, shard_lock_key(s.cache_manager_lock_key, self.shard),
                              shared_key=s.cache_manager_lock_key)
        self._leading(False)  # the shard's series exists (0) while standing by
        while not stop.is_set():
            if not await lock.acquire(stop, s.cache_manager_leader_poll_s):
                break
            log.info("cache manager %s: leader%s", s.instance,
                     "" if self.shard is None else f" of shard {self.shard}")
            self.metrics.takeovers.inc()
            try:
                await self._lead(lock, stop)
            except LostLeadership:
                log.warning("cache manager %s: lost leadership", s.instance)
            except Exception:
                log.exception("cache manager %s: leadership ended by an error", s.instance)
                await _sleep_or(stop, s.cache_manager_leader_poll_s)
            finally:
                self.core = None
                self.ready = False
                self._leading(False)
                thaw_state(bool(_holder(self._registry).leading))
                await lock.release()
        await lock.release()

    async def _lead(self, lock: LeaderLock, stop: asyncio.Event) -> None:
        s = self.settings
        started = time.perf_counter()
        core = CacheCore(
            policy=make_policy(self.rules.policy, self.policy_config),
            policy_config=self.policy_config, rules=self.rules,
            worker_timeout_s=s.cache_manager_worker_timeout_s, tenants=s.tenant_set,
            base_models=self._base_models,
        )
        deployment = s.cache_manager_consumer_group
        pool = await create_pool(s.postgres_dsn, min_size=1, max_size=4)
        sink = CommandSink(s.kafka())
        tasks: list[asyncio.Task[None]] = []
        try:
            async with pool.acquire() as conn:
                records, pointers = await store.read_registry(conn, s.tenant_set,
                                                              self._base_models)
                core.state.load_registry(records, pointers)
                saved = await store.load_stats(conn, deployment, core.state.tau_s,
                                               core.state.tau_warm_s)
                if self.shard is not None:  # the deployment's rows: this shard's versions
                    saved = {v: st for v, st in saved.items() if v in core.state.versions}
                core.state.stats.update(saved)
                known = await store.load_workers(
                    conn, deployment, max_age_s=s.cache_manager_worker_timeout_s)
                # what the analysis took out stays out: the blocks of the leaders before,
                # from the registry (audit entries, withdrawals), before the first round
                blocked = core.restore_blocks(
                    await store.taken_out(conn, self.rules.commands.backoff_max_s),
                    await store.withdrawn(conn), self.clock())
            self._flushed = None
            self._loops = {name: self._new_loop(core, name) for name in SOURCES}
            await sink.start()
            self.core = core
            self.ready = False
            self._leading(True)
            await self._fetch_states(core, known)
            ready_by = time.monotonic() + s.cache_manager_bootstrap_grace_s
            log.info("takeover: %d versions, %d stats, %d known workers (%d synced), "
                     "%d versions kept from loading (%s) in %.3fs",
                     len(records), len(core.state.stats), len(known),
                     sum(1 for w in known if (v := core.state.workers.get(w)) and v.synced),
                     len(blocked), ", ".join(blocked[:10]), time.perf_counter() - started)
            tasks = [
                *self._canary_tasks(core, pool),
                *(asyncio.create_task(loop.run(), name=f"cm-consume-{name}")
                  for name, loop in self._loops.items()),
                asyncio.create_task(self._decide(core, lock, sink, known, ready_by, started),
                                    name="cm-decide"),
                asyncio.create_task(self._housekeeping(core, lock, pool), name="cm-house"),
            ]
            stopper = asyncio.create_task(stop.wait(), name="cm-stop")
            done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            for t in done:
                if t is not stopper and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
        finally:
            consuming = [t for t in tasks if t.get_name().startswith("cm-consume-")]
            flushed = self._flushed = asyncio.Event()
            for loop in self._loops.values():
                loop.stop()  # after its current batch; commits once ``flushed`` is set
            others = [t for t in tasks if t not in consuming]
            for t in [*others, *self._shadow_tasks]:
                t.cancel()
            for t in others:
                with contextlib.suppress(BaseException):
                    await t
            if self.core is core:
                with contextlib.suppress(Exception):
                    await self._flush(core, pool)
            flushed.set()
            if consuming:
                _, late = await asyncio.wait(consuming, timeout=10)
                for t in late:
                    t.cancel()
                for t in consuming:
                    with contextlib.suppress(BaseException):
                        await t
            self._loops = {}
            await sink.stop()
            await pool.close()

    async def _fetch_states(self, core: CacheCore, known: Mapping[str, str]) -> None:
        """Ask every known worker for its state (concurrently, bounded by the timeout)."""
        timeout = self.settings.cache_manager_get_state_timeout_s

        async def one(wid: str, address: str) -> None:
            if not address:
                return
            try:
                ws = await self.fetcher.get_state(address, timeout)
            except Exception as exc:  # noqa: BLE001 - an unreachable worker waits for its snapshot
                log.info("GetState %s at %s failed: %s", wid, address, exc)
                return
            report = events_pb2.WorkerReport(
                meta=new_meta(self.settings.producer), worker_id=ws.worker_id or wid, state=ws)
            core.apply(report, self.clock())

        await asyncio.gather(*(one(w, a) for w, a in known.items()))

    # ------------------------------------------------------------------ consume

    def _new_loop(self, core: CacheCore, name: str) -> ConsumerLoop:
        """The consumer of one of :data:`SOURCES` (restarted by the loop; an error or a
        stall of one restarts both: after a broker loss both may be deaf)."""
        s = self.settings
        wanted = SOURCES[name]

        async def assign(consumer: Any) -> None:
            assign_every_partition(consumer, wanted)

        async def closing(consumer: Any) -> None:
            flushed = self._flushed
            if flushed is not None:  # the leadership ends: commit what the flush covered
                await flushed.wait()
                await consumer.commit()

        def failed(_exc: BaseException) -> None:
            self.metrics.consumer_restarts.inc()
            for other, loop in self._loops.items():
                if other != name:
                    loop.request_restart()

        async def on_batch(batch: Any) -> None:
            await self._apply_batch(core, name, decode_batch(batch, wanted))

        self._last_record[name] = time.monotonic()
        return ConsumerLoop(
            f"cache-manager {name}",
            factory=lambda: new_consumer(s.kafka(), self.group),
            on_batch=on_batch, on_open=assign, on_close=closing, on_error=failed,
            backoff=lambda _attempt: 1.0, poll_timeout_ms=500, max_records=5000,
        )

    async def _apply_batch(self, core: CacheCore, name: str, batch: list[Received]) -> None:
        s = self.settings
        now = self.clock()
        if batch:
            self._last_record[name] = time.monotonic()
        elif name == "control" and time.monotonic() - self._last_record[name] > \
                s.cache_manager_consumer_stall_s and any(
                    w.alive for w in core.state.workers.values()):
            # Workers report every few seconds: silence means a consumer gone deaf.
            self._last_record[name] = time.monotonic()
            raise Restart(f"no record for {s.cache_manager_consumer_stall_s:.0f}s while "
                          "workers are alive")
        for rec in batch:
            if rec.message is None:
                self.metrics.events.labels(rec.topic, "undecodable").inc()
                continue
            result = core.apply(rec.message, now)
            if self.canary is not None:
                canary_runner.observe(self.canary.window, rec.message, result, now)
            applied = result.applied
            self.metrics.events.labels(
                rec.topic, "duplicate" if applied.duplicate else "applied").inc()
            if applied.unresolved:
                self._unresolved.update(applied.unresolved)
            if result.resolutions:
                self._resolutions(core, result.resolutions)
            if applied.triggers and any(t in IMMEDIATE_TRIGGERS for t in applied.triggers):
                if self._trigger_at is None:
                    self._trigger_at = time.perf_counter()
                    self._trigger_cause = applied.triggers[0]
                self._trigger.set()
        if batch:
            await asyncio.sleep(0)  # let the other consumer and the planner run

    def _resolutions(self, core: CacheCore, resolutions: list[Resolution]) -> None:
        for res in resolutions:
            kind = res.pending.spec.kind
            self.metrics.commands.labels(kind.value, res.result).inc()
            if res.result in ("ok", "failed"):
                self.metrics.command_seconds.labels(kind.value).observe(res.latency_s)
            if res.result != "ok":
                log.info("command %s %s %s on %s: %s %s", res.pending.command_id, kind.value,
                         res.pending.spec.version_id, res.pending.spec.worker_id, res.result,
                         res.code)
            elif kind is CommandKind.LOAD_HOT and self.rules.canary.any_golden_set:
                self._maybe_shadow(core, res)

    def _maybe_shadow(self, core: CacheCore, res: Resolution) -> None:
        """A load made a version HOT: exercise it there (again) if it is a canary."""
        vid, wid = res.pending.spec.version_id, res.pending.spec.worker_id
        self._exercised.discard((wid, vid))
        self._exercise(core, wid, vid)

    def _shadow_sweep(self, core: CacheCore) -> None:
        """Every canary HOT on a worker where it was not exercised yet gets its golden set
        there: a version already HOT when its canary pointer is set (loaded on a request
        path, or by the policy) had no load answer to trigger it."""
        if not self.rules.canary.any_golden_set:
            return
        canaries = set()
        for adapter_id, ptr in core.state.pointers.items():
            if not ptr.canary:
                continue
            tenant, _, name = adapter_id.partition("/")
            vid = version_id(tenant, name, ptr.canary)
            canaries.add(vid)
            for w in core.state.workers.values():
                if w.tier_of(vid) is Tier.HOT and (w.worker_id, vid) not in self._exercised:
                    self._exercise(core, w.worker_id, vid)
        self._exercised = {k for k in self._exercised if k[1] in canaries}

    def _exercise(self, core: CacheCore, wid: str, vid: str) -> None:
        if (wid, vid) in self._exercised:
            return
        rec = core.state.versions.get(vid)
        w = core.state.workers.get(wid)
        if rec is None or w is None or not w.grpc_address or not core.state.is_staged_canary(rec):
            return
        canary = self.rules.canary
        golden = canary.golden_for(rec.ref.tenant_id, rec.ref.adapter_name)
        if not golden:
            return
        self._exercised.add((wid, vid))

        self._golden_running[vid] = self._golden_running.get(vid, 0) + 1

        async def exercise() -> None:
            try:
                result = await self.shadow.run(
                    w.grpc_address, rec, golden,
                    max_tokens=canary.golden_max_tokens, timeout_s=canary.golden_timeout_s)
            except Exception as exc:  # noqa: BLE001 - a shadow run must never die unseen
                log.warning("canary %s golden set on %s could not run: %s", vid, wid, exc)
                self._exercised.discard((wid, vid))  # the next round's sweep retries it
                return
            finally:
                left = self._golden_running.get(vid, 1) - 1
                if left > 0:
                    self._golden_running[vid] = left
                else:
                    self._golden_running.pop(vid, None)
            self.metrics.shadow.labels("ok").inc(result.ok)
            self.metrics.shadow.labels("failed").inc(result.failed)
            if self.canary is not None:
                self.canary.window.golden(vid, self.clock(), ok=result.ok, failed=result.failed,
                                          error="; ".join(result.errors)[:300])
            log.info("canary %s golden set on %s: %d ok, %d failed", vid, wid, result.ok,
                     result.failed)
            if result.failed > canary.golden_max_failures and self.core is core:
                log.warning("canary %s failed its golden set on %s: %s", vid, wid, result.errors)
                core.shadow_failed(wid, vid, self.clock(),
                                   f"{result.failed} of {result.ok + result.failed} failed")
                self._trigger.set()

        task = asyncio.create_task(exercise(), name=f"cm-shadow-{vid}-{wid}")
        self._shadow_tasks.add(task)
        task.add_done_callback(self._shadow_tasks.discard)

    def _canary_tasks(self, core: CacheCore, pool: asyncpg.Pool) -> list[asyncio.Task[None]]:
        """The canary analysis of this leadership (:mod:`.canary_runner`): steps through
        the registry with the operator token; without a token it is off (logged)."""
        s = self.settings
        token = s.registry_operator_token.get_secret_value()
        if not token:
            log.warning("canary analysis off: LORAPLANE_REGISTRY_OPERATOR_TOKEN is not set")
            self.canary = None
            return []
        canary = self.rules.canary
        runner = self.canary = canary_runner.CanaryRunner(
            canary.analysis_for,
            canary_runner.GrpcRegistryActions(s.registry_addr, token, tls=s.tls_files()),
            # runs under the shard's own key: a shard forgets the runs it has no canary for
            canary_runner.PgRunStore(pool, self.group), CanaryWindow())

        def aborted(vid: str, now: float) -> None:
            core.canary_aborted(vid, now)
            self._trigger.set()

        def withdrawn(vid: str, now: float, detail: str) -> None:
            core.canary_aborted(vid, now, reason=WITHDRAWN, detail=detail)
            self._trigger.set()

        def golden_pending(vid: str) -> bool:
            rec = core.state.versions.get(vid)
            if rec is None or not canary.golden_for(rec.ref.tenant_id, rec.ref.adapter_name):
                return False
            return vid in self._golden_running or not runner.window.golden_seen(vid)

        def prewarm_status(state: State, vid: str) -> prewarm.PrewarmStatus | None:
            rec = state.versions.get(vid)
            if rec is None:
                return None
            return prewarm.status(state, rec,
                                  canary.prewarm_for(rec.ref.tenant_id, rec.ref.adapter_name))

        runner.on_abort = aborted
        runner.golden_pending = golden_pending
        runner.prewarm = prewarm_status
        runner.on_withdraw = withdrawn
        runner.on_step = lambda d: self.metrics.canary_steps.labels(
            d.action.value, d.reason.value).inc()
        runner.on_stable_step = lambda d: self.metrics.canary_steps.labels(
            d.action.value, d.reason.value).inc()
        return [asyncio.create_task(
            canary_runner.run_loop(runner, core.state, interval_s=s.cache_manager_canary_interval_s,
                                   clock=self.clock), name="cm-canary")]

    # ------------------------------------------------------------------ decide

    async def _decide(
        self, core: CacheCore, lock: LeaderLock, sink: CommandSink, known: Mapping[str, str],
        ready_by: float, started: float,
    ) -> None:
        s = self.settings
        last_round = 0.0
        first_round = False
        while True:
            with contextlib.suppress(TimeoutError):
                # while taking over, look at the readiness below often (a fresh report of a
                # worker already synced by a replayed one sets no trigger)
                await asyncio.wait_for(self._trigger.wait(), timeout=s.cache_manager_tick_s
                                       if self.ready else min(s.cache_manager_tick_s, 0.05))
            cause = "trigger" if self._trigger.is_set() else "tick"
            if not self.ready:
                # Plan once every known worker is synced by a report the first round will not
                # find stale: a replayed old snapshot (a new shard's group starts at the
                # earliest offset) must not mark a worker gone and have its versions placed
                # elsewhere.
                fresh_after = self.clock() - s.cache_manager_worker_timeout_s
                synced = bool(known) and all(
                    (w := core.state.workers.get(wid)) is not None and w.synced
                    and w.last_seen >= fresh_after for wid in known)
                if not synced and time.monotonic() < ready_by:
                    self._trigger.clear()
                    continue
                self.ready = True
                first_round = True
                self.metrics.takeover_seconds.observe(time.perf_counter() - started)
                log.info("state rebuilt in %.2fs (%s): %splanning starts",
                         time.perf_counter() - started, "all workers synced" if synced
                         else "grace elapsed",
                         "" if self.shard is None else f"shard {self.shard}: ")
            wait = s.cache_manager_min_round_interval_s - (time.monotonic() - last_round)
            if wait > 0:
                await asyncio.sleep(wait)
            self._trigger.clear()
            trigger_at, self._trigger_at = self._trigger_at, None
            last_round = time.monotonic()
            await self.round_once(core, lock, sink, cause, trigger_at)
            if first_round:  # the rebuilt state and what the first plan keeps of it
                freeze_state()
                first_round = False

    async def round_once(
        self, core: CacheCore, lock: LeaderLock, sink: CommandSink, cause: str,
        trigger_at: float | None = None,
    ) -> int:
        """One planning round; returns the number of commands published."""
        t0 = time.perf_counter()
        result = core.round(self.clock())
        self.metrics.decision_seconds.observe(time.perf_counter() - t0)
        self.metrics.rounds.labels(cause).inc()
        self._resolutions(core, result.resolutions)
        self._shadow_sweep(core)
        for wid in result.gone_workers:
            log.warning("worker %s stopped reporting: gone", wid)
        for note in result.round.notes:
            log.debug("round: %s", note)
        orders = result.round.hot_orders
        if not result.issued and not orders:
            return 0
        if not await lock.still_held():
            raise LostLeadership()
        if orders:
            await self._send_hot_orders(core, sink, orders)
        if not result.issued:
            return 0
        messages = [build_command(i, self.settings.producer) for i in result.issued]
        errors = await sink.publish(messages)
        published = 0
        now = self.clock()
        for issued, err in zip(result.issued, errors, strict=True):
            spec = issued.pending.spec
            if err is not None:
                log.warning("publish of %s failed: %s", issued.pending.command_id, err)
                core.publish_failed(issued.pending.command_id, now)
                self.metrics.commands.labels(spec.kind.value, "publish_failed").inc()
                continue
            published += 1
            self.metrics.commands.labels(spec.kind.value, "issued").inc()
            if spec.kind in (CommandKind.DEMOTE, CommandKind.EVICT):
                self.metrics.removals.labels(spec.kind.value, spec.reason).inc()
            elif spec.kind in (CommandKind.LOAD_HOT, CommandKind.LOAD_WARM):
                tier = "hot" if spec.kind is CommandKind.LOAD_HOT else "warm"
                self.metrics.loads.labels(tier, spec.reason).inc()
            log.info("decision %d: %s %s on %s (%s%s) heat=%.3f by %s",
                     issued.decision.id, spec.kind.value, spec.version_id, spec.worker_id,
                     spec.reason, f": {spec.detail}" if spec.detail else "", spec.heat,
                     spec.source)
        if trigger_at is not None:
            self.metrics.trigger_seconds.observe(time.perf_counter() - trigger_at)
        return published

    async def _send_hot_orders(self, core: CacheCore, sink: CommandSink,
                               orders: dict[str, HotOrder]) -> None:
        """Send the workers' HOT orders (their request-path victims follow them); one whose
        publish failed is sent again next round."""
        now = self.clock()
        wids = list(orders)
        errors = await sink.publish([
            build_hot_order(wid, orders[wid], self.settings.producer, str(uuid.uuid4()), now)
            for wid in wids
        ])
        for wid, err in zip(wids, errors, strict=True):
            if err is None:
                core.planner.hot_order_sent(wid, orders[wid])
            else:
                log.info("HOT order for %s not published: %s", wid, err)

    # ------------------------------------------------------------------ housekeeping

    async def _housekeeping(self, core: CacheCore, lock: LeaderLock, pool: asyncpg.Pool) -> None:
        s = self.settings
        due = {"commit": 0.0, "lock": 0.0, "flush": 0.0, "refresh": time.monotonic()
               + s.cache_manager_registry_refresh_s}
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            if now >= due["lock"]:
                due["lock"] = now + s.cache_manager_leader_poll_s
                if not await lock.still_held():
                    raise LostLeadership()
            if now >= due["commit"]:
                due["commit"] = now + s.cache_manager_commit_interval_s
                for loop in list(self._loops.values()):
                    try:
                        await loop.commit_position()
                    except Exception as exc:  # noqa: BLE001 - retried next period
                        log.info("offset commit failed: %s", exc)
            if self._unresolved:
                wanted, self._unresolved = self._unresolved, set()
                await self._guarded(self._resolve(core, pool, wanted))
            if now >= due["flush"]:
                due["flush"] = now + s.cache_manager_stats_flush_s
                await self._guarded(self._flush(core, pool))
            if now >= due["refresh"]:
                due["refresh"] = now + s.cache_manager_registry_refresh_s
                await self._guarded(self._refresh(core, pool))

    async def _guarded(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("database work failed (retried later): %s", exc)

    async def _resolve(self, core: CacheCore, pool: asyncpg.Pool, wanted: set[str]) -> None:
        async with pool.acquire() as conn:
            found = await store.lookup_versions(conn, sorted(wanted))
        for vid, rec in found.items():
            core.state.resolve(vid, rec)
        self._trigger.set()

    async def _refresh(self, core: CacheCore, pool: asyncpg.Pool) -> None:
        async with pool.acquire() as conn:
            records, pointers = await store.read_registry(conn, self.settings.tenant_set,
                                                          self._base_models)
        core.state.load_registry(records, pointers)

    async def _flush(self, core: CacheCore, pool: asyncpg.Pool) -> None:
        stats = dict(core.state.stats)
        if self.shard is not None:
            # the deployment's rows are shared by its shards: write this shard's versions only
            # (a worker's snapshot also seeds the last use of other base models' versions here)
            versions = core.state.versions
            stats = {v: st for v, st in stats.items()
                     if (rec := versions.get(v)) is not None and rec.ref.base_model == self.shard}
        workers = {w.worker_id: w.grpc_address for w in list(core.state.workers.values())
                   if w.alive and w.grpc_address}
        deployment = self.settings.cache_manager_consumer_group
        async with pool.acquire() as conn:
            await store.save_stats(conn, deployment, stats)
            await store.save_workers(conn, deployment, workers)


async def _sleep_or(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
