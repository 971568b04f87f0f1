"""The worker's adapter placements: WARM (host tier) and HOT (registered in the engine).

:class:`AdapterManager` executes what the cache manager decides (load / evict / pin /
unpin) and what requests need (a WARM or COLD version promoted to HOT), with

* one lock per version (commands and requests on the same version run one at a time;
  a second load of the same version waits and then finds it done: single flight);
* an in-flight count per version: an eviction marks the version *draining* (no new
  request may start on it) and waits for the count to reach zero before removing it;
* versions keyed by the registry's ``engine_id``, so a new version of the same adapter
  name loads beside the old one.

Safety rules of the engine are enforced below it by
:class:`~loraplane.worker.guard.SafeEngine`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

from loraplane.policy.config import PolicyConfig
from loraplane.policy.cost import Bandwidths
from loraplane.policy.model import Priority, RequestClass
from loraplane.policy.snapshot import VersionMeta
from loraplane.policy.stats import VersionStats
from loraplane.policy.victims import HotMember, VictimChoice, hot_victim
from loraplane.shared import vocab
from loraplane.v1 import common_pb2
from loraplane.worker.engine import EngineAdapter
from loraplane.worker.errors import (
    AdapterCold,
    BaseModelNotServed,
    DigestMismatch,
    Draining,
    InUse,
    NoCapacity,
    NoSlot,
    NotPresent,
    SlotQueueFull,
    failure_reason,
)
from loraplane.worker.guard import SafeEngine
from loraplane.worker.host_tier import ArtifactSpec, FetchTiming, HostEntry, HostTier, RescanResult
from loraplane.worker.metrics import WorkerMetrics
from loraplane.worker.slot_queue import QueueFull, SlotQueue, Ticket

log = logging.getLogger(__name__)

Tier = common_pb2.Tier
"""A ``loraplane.v1.Tier`` value."""
# wire tier values and their names: the one vocabulary (loraplane.shared.vocab)
TIER_HOT, TIER_WARM, TIER_COLD = vocab.TIER_HOT, vocab.TIER_WARM, vocab.TIER_COLD
TIER_NAMES: dict[int, str] = vocab.TIER_NAMES

POLICY_CLASSES: dict[int, RequestClass] = {
    common_pb2.REQUEST_CLASS_UNSPECIFIED: RequestClass.INTERACTIVE,
    common_pb2.REQUEST_CLASS_INTERACTIVE: RequestClass.INTERACTIVE,
    common_pb2.REQUEST_CLASS_BACKGROUND: RequestClass.BACKGROUND,
    common_pb2.REQUEST_CLASS_CANARY: RequestClass.CANARY,
}
"""Request class enum value → the policy's class (its statistics count by class)."""
ON_DEMAND_REASON = "on_demand_"
"""Prefix of the reason of a demotion the request path made (``on_demand_capacity``,
``on_demand_idle``, ``on_demand_protection_overflow``...: the policy's reason after it)."""

Clock = Callable[[], datetime]


def _now() -> datetime:
    return datetime.now(UTC)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a background load's outcome as seen (it is counted in the metrics already)."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("background load failed: %s", task.exception())


@dataclass
class Placement:
    """One adapter version held by this worker."""

    spec: ArtifactSpec
    host: HostEntry
    loaded_at: datetime
    hot: bool = False
    pinned: bool = False
    never_evict: bool = False
    """Protected by policy (active canary, platinum...): the worker's own request-path
    demotion picks it only when every other HOT version is pinned, busy or protected too
    (the policy's HOT guarantee is the pin; its WARM guarantee is the cache manager's)."""
    hot_keep: float | None = None
    """The cache manager's HOT keep key (``LoadAdapter.hot_keep``, ``HotOrder``): the
    request-path victim takes the lowest first (None: not ranked; after the ranked, by heat).
    Cleared when the version leaves HOT."""
    in_flight: int = 0
    draining: bool = False
    drained: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while no eviction drains the version (cleared for the drain): what a request
    that meets a draining version waits for before it loads the version again."""
    last_used_at: datetime | None = None
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    stats: VersionStats = field(default_factory=VersionStats)
    """Requests this worker served for the version (the heat of the victim ranking)."""

    def __post_init__(self) -> None:
        self.idle.set()
        self.drained.set()

    @property
    def tier(self) -> Tier:
        """``TIER_HOT`` or ``TIER_WARM``."""
        return TIER_HOT if self.hot else TIER_WARM

    def engine_adapter(self) -> EngineAdapter:
        """How the engine sees this version."""
        return EngineAdapter(
            engine_id=self.spec.engine_id, name=self.spec.name, path=self.host.files_dir,
            rank=self.host.rank,
        )


@dataclass(frozen=True)
class LoadOutcome:
    """Result of a load: where the version came from and where it is now."""

    spec: ArtifactSpec
    source_tier: Tier
    tier: Tier
    pinned: bool
    duration_s: float
    bytes_read: int
    fetch: FetchTiming | None = None
    register_s: float = 0.0
    verify_s: float = 0.0
    """Re-verification time before registering a WARM version."""
    slot_wait_s: float = 0.0
    """Time spent waiting for a HOT slot (not part of ``duration_s``: the load estimates
    that follow ``AdapterLoaded`` reports stay what a load costs)."""
    lock_s: float = 0.0
    """Waiting for the version's lock (another load or command of the same version)."""
    ready_s: float = 0.0
    """From the files being verified (the fetch or the re-verification returned) to the
    search for a HOT slot: the placement's bookkeeping."""
    finish_s: float = 0.0
    """From the registration's end to the load's outcome (the pin, when asked)."""
    account_s: float = 0.0
    """After the outcome: the version lock released, gauges, waiters woken, metrics."""

    @property
    def changed(self) -> bool:
        """Whether the version moved to another tier."""
        return self.source_tier != self.tier


@dataclass(frozen=True)
class EvictOutcome:
    """Result of an eviction."""

    spec: ArtifactSpec | None
    engine_id: int
    from_tier: Tier
    to_tier: Tier
    reason: str


@dataclass(frozen=True)
class Lease:
    """A request's hold on an adapter version (see :meth:`AdapterManager.use`)."""

    adapter: EngineAdapter
    tier_at_arrival: Tier
    spec: ArtifactSpec | None
    """``None`` when serving the base model (through the all-zero adapter)."""


@dataclass(frozen=True)
class SlotWait:
    """How a request-path load may wait for a HOT slot."""

    request_class: int
    """``loraplane.v1.RequestClass`` of the request (its place in the queue)."""
    deadline: float | None
    """Monotonic instant the wait ends (what is left of the request's budget); None: no
    bound but the caller's own deadline and cancellation."""
    priority: int = common_pb2.PRIORITY_UNSPECIFIED
    """Tier of the calling tenant (with the class, its place in the queue)."""


EventSink = Callable[[LoadOutcome | EvictOutcome], Awaitable[None]]
"""Receives loads / evictions the worker did on its own (request path)."""


class AdapterManager:
    """Placements of adapter versions on this worker and the operations that move them."""

    def __init__(
        self,
        engine: SafeEngine,
        host: HostTier,
        *,
        base_model: str,
        zero_adapter: EngineAdapter,
        metrics: WorkerMetrics,
        clock: Clock = _now,
        drain_timeout_s: float = 120.0,
        on_event: EventSink | None = None,
        policy: PolicyConfig | None = None,
        bandwidths: Bandwidths | None = None,
        slot_queue_depth: int = 64,
        slot_retry_after_s: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
        hot_level: Literal["slots", "registered"] = "slots",
    ) -> None:
        """``zero_adapter``: the all-zero adapter that serves base-model requests.

        ``policy`` / ``bandwidths``: the cache policy's configuration, whose heat score and
        predicates rank request-path victims (:mod:`loraplane.policy.victims`).
        ``slot_queue_depth``: requests that may wait for a HOT slot at once.
        ``hot_level``: the HOT level planned to (:attr:`hot_capacity`; the setting
        ``worker_hot_level``).
        """
        self.engine = engine
        self.host = host
        self.base_model = base_model
        self.zero_adapter = zero_adapter
        self.metrics = metrics
        self.clock = clock
        self.drain_timeout_s = drain_timeout_s
        self.on_event = on_event
        self.policy = policy or PolicyConfig()
        self.bandwidths = bandwidths or Bandwidths()
        self.slot_retry_after_s = slot_retry_after_s
        self.monotonic = monotonic
        self.hot_level = hot_level
        self.placements: dict[int, Placement] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        self._room = asyncio.Lock()
        """Held while a HOT registration is decided and made (capacity check, victim
        demotion, register): two loads never both take the last slot."""
        self.slot_queue: SlotQueue[asyncio.Future[None] | None] = SlotQueue(slot_queue_depth)
        self._claims: Counter[int] = Counter()
        """Requests holding or waiting for each version (from :meth:`use`'s start to its
        end): a claimed version is never a victim."""
        self._slot_waiting: dict[int, Ticket[asyncio.Future[None] | None]] = {}
        """Versions whose load is parked in :attr:`slot_queue` now, with its ticket."""

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> RescanResult:
        """Register the zero adapter, re-verify the host tier, hold what passed as WARM."""
        await self.engine.register(self.zero_adapter)
        result = await self.host.rescan()
        for entry in result.kept:
            self.placements[entry.spec.engine_id] = Placement(
                spec=entry.spec, host=entry, loaded_at=entry.verified_at,
                stats=self._new_stats(),
            )
        if result.dropped:
            self.metrics.host_dropped.inc(len(result.dropped))
        self.refresh_gauges()
        return result

    # ------------------------------------------------------------------ helpers

    def _new_stats(self) -> VersionStats:
        sc = self.policy.score
        return VersionStats(sc.rate_window_s, sc.warm_rate_window_s)

    def _lock(self, engine_id: int) -> asyncio.Lock:
        lock = self._locks.get(engine_id)
        if lock is None:
            lock = self._locks[engine_id] = asyncio.Lock()
        return lock

    @property
    def hot_capacity(self) -> int:
        """Adapter versions that may be HOT (registered) at once; the cache manager plans with
        this number. At ``hot_level`` ``slots``: the engine's ``max_loras`` GPU slots,
        bounded by the registrations left beside the zero adapter (``max_cpu_loras - 1``);
        at ``registered``: ``max_cpu_loras - 1``, beyond the slots (vLLM moves a registered
        version into a slot per batch). Pins stay below ``max_loras`` either way
        (:class:`~loraplane.worker.guard.SafeEngine`)."""
        limits = self.engine.limits
        if self.hot_level == "registered":
            return limits.max_cpu_loras - 1
        return min(limits.max_loras, limits.max_cpu_loras - 1)

    def hot_count(self) -> int:
        """Versions HOT now."""
        return sum(1 for p in self.placements.values() if p.hot)

    def pinned_count(self) -> int:
        """Versions pinned now."""
        return sum(1 for p in self.placements.values() if p.pinned)

    def labels(self, spec: ArtifactSpec | None) -> dict[str, str]:
        """Metric labels of a version (base model only when ``spec`` is None)."""
        if spec is None:
            return {"base_model": self.base_model, "tenant": "", "adapter": "", "version": ""}
        return {"base_model": spec.base_model, "tenant": spec.tenant_id,
                "adapter": spec.adapter_name, "version": spec.version}

    def refresh_gauges(self) -> None:
        """Update the slot and host-byte gauges."""
        m = self.metrics
        limits = self.engine.limits
        m.engine_slots.labels(self.base_model, "capacity").set(limits.max_loras)
        m.engine_slots.labels(self.base_model, "registered_capacity").set(limits.max_cpu_loras)
        m.engine_slots.labels(self.base_model, "used").set(len(self.engine.registered))
        m.engine_slots.labels(self.base_model, "pinned").set(len(self.engine.pinned))
        # moves with every request, not only with loads: read when scraped
        m.engine_slots.labels(self.base_model, "resident").set_function(
            lambda: len(self.engine.slots.resident))
        m.host_bytes.labels("capacity").set(self.host.capacity_bytes)
        m.host_bytes.labels("used").set(self.host.used_bytes)
        m.host_bytes.labels("reserved").set(self.host.reserved_bytes)
        m.engine_up.labels(self.base_model).set(0 if self.engine.dead else 1)

    def _check_base_model(self, spec: ArtifactSpec) -> None:
        if spec.base_model != self.base_model:
            raise BaseModelNotServed(
                f"{spec.name} is for base model {spec.base_model!r}; this worker serves "
                f"{self.base_model!r}"
            )

    def record_failure(self, spec: ArtifactSpec | None, exc: BaseException) -> None:
        """Count a failed load/command."""
        self.metrics.load_failures.labels(**self.labels(spec), reason=failure_reason(exc)).inc()

    # ------------------------------------------------------------------ load

    async def load(
        self,
        spec: ArtifactSpec,
        target_tier: Tier,
        *,
        pin: bool = False,
        make_room: bool = False,
        never_evict: bool | None = None,
        wait: SlotWait | None = None,
    ) -> LoadOutcome:
        """Bring ``spec`` to ``target_tier`` (WARM or HOT), pinning it when asked.

        ``make_room`` (request path only): when every HOT slot is taken, demote the victim
        :func:`~loraplane.policy.victims.hot_victim` picks (idle, unpinned, unprotected
        first; never a busy one) instead of failing with :class:`NoCapacity`. ``wait``
        (request path only): with no victim, queue for a slot until ``wait.deadline``
        (then :class:`NoSlot`; a full queue: :class:`SlotQueueFull`). ``never_evict`` sets
        the version's protection (``None`` keeps what it has): a cache command sets it
        afresh, the request path only ever raises it. Idempotent: loading what is already
        there reports it.
        """
        if target_tier not in (TIER_WARM, TIER_HOT):
            raise ValueError(f"target tier {target_tier} is neither WARM nor HOT")
        self._check_base_model(spec)
        t_enter = time.perf_counter()
        try:
            async with self._lock(spec.engine_id):
                t_locked = time.perf_counter()
                outcome = await self._load_locked(spec, target_tier, pin, make_room,
                                                  never_evict, wait)
                t_out = time.perf_counter()
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                self.record_failure(spec, exc)
            raise
        finally:
            self.refresh_gauges()
            self._room_changed()  # a protection may have been lifted, a lock released
        if outcome.changed:
            labels = self.labels(spec)
            src, dst = TIER_NAMES[outcome.source_tier], TIER_NAMES[outcome.tier]
            self.metrics.loads.labels(**labels, source_tier=src, target_tier=dst).inc()
            self.metrics.load_seconds.labels(**labels, source_tier=src, target_tier=dst).observe(
                outcome.duration_s
            )
            if outcome.bytes_read:
                self.metrics.load_bytes.labels(**labels).inc(outcome.bytes_read)
        return replace(outcome, lock_s=t_locked - t_enter,
                       account_s=time.perf_counter() - t_out)

    async def _load_locked(
        self, spec: ArtifactSpec, target_tier: Tier, pin: bool, make_room: bool,
        never_evict: bool | None, wait: SlotWait | None,
    ) -> LoadOutcome:
        started = time.perf_counter()
        p = self.placements.get(spec.engine_id)
        if p is not None and p.draining:
            raise Draining(f"{spec.name} is being evicted")
        if p is not None and p.spec.sha256 != spec.sha256:
            raise DigestMismatch(
                f"{spec.name}: held with sha256 {p.spec.sha256}, asked for {spec.sha256}"
            )
        source = p.tier if p is not None else TIER_COLD
        fetch: FetchTiming | None = None
        t_ready = time.perf_counter()
        if p is None:
            entry, fetch = await self.host.fetch(spec)
            t_ready = time.perf_counter()
            p = Placement(spec=spec, host=entry, loaded_at=self.clock(), stats=self._new_stats())
            self.placements[spec.engine_id] = p
        if never_evict is not None:
            p.never_evict = never_evict
        register_s = verify_s = slot_wait_s = ready_s = 0.0
        t_done = None
        if target_tier == TIER_HOT and not p.hot:
            if source == TIER_WARM:  # files may have changed since they were verified
                t0 = time.perf_counter()
                try:
                    p.host = await self.host.reverify(spec.engine_id)
                except DigestMismatch:
                    self.placements.pop(spec.engine_id, None)
                    self.metrics.host_dropped.inc()
                    raise
                t_ready = time.perf_counter()
                verify_s = t_ready - t0
            t_wait = time.perf_counter()
            ready_s = t_wait - t_ready
            register_s = await self._make_hot(p, make_room, wait)
            t_done = time.perf_counter()
            slot_wait_s = max(0.0, t_done - t_wait - register_s)
        if pin and p.hot and not p.pinned:
            await self.engine.pin(spec.engine_id)
            p.pinned = True
        elif pin and not p.hot:
            raise NotPresent(f"{spec.name} must be HOT to be pinned (load it with TIER_HOT)")
        ended = time.perf_counter()
        return LoadOutcome(
            spec=spec, source_tier=source, tier=p.tier, pinned=p.pinned,
            duration_s=ended - started - slot_wait_s,
            bytes_read=fetch.bytes_read if fetch else 0, fetch=fetch, register_s=register_s,
            verify_s=verify_s, slot_wait_s=slot_wait_s, ready_s=ready_s,
            finish_s=0.0 if t_done is None else ended - t_done,
        )

    # ------------------------------------------------------------------ HOT slots

    def _room_changed(self) -> None:
        """Wake every waiter for a HOT slot; they retry in queue order (the room lock is
        FIFO), the first that finds room takes it, the others wait again in place."""
        for ticket in self.slot_queue:
            fut = ticket.payload
            if fut is not None and not fut.done():
                fut.set_result(None)

    def _set_queue_gauges(self) -> None:
        counts = {"interactive": 0, "canary": 0, "background": 0}
        names = {0: "interactive", 1: "canary", 2: "background"}
        for ticket in self.slot_queue:
            counts[names[ticket.rank]] += 1
        for name, n in counts.items():
            self.metrics.slot_queue_depth.labels(self.base_model, name).set(n)

    def hot_members(self, exclude: int = 0) -> list[HotMember]:
        """The HOT versions as :func:`~loraplane.policy.victims.hot_victim` sees them."""
        members = []
        for eid, q in self.placements.items():
            if not q.hot or eid == exclude:
                continue
            busy = (q.in_flight > 0 or self._claims.get(eid, 0) > 0 or q.draining
                    or self._lock(eid).locked())
            meta = VersionMeta(
                version_id=str(eid), tenant_id=q.spec.tenant_id, base_model=q.spec.base_model,
                # the worker does not know priorities: one value for all keeps the order
                # the rate gives; protection arrives as the never-evict flag
                priority=Priority.BRONZE, size_bytes=q.spec.size_bytes or q.host.size_bytes,
                rank=q.host.rank or 16,
            )
            members.append(HotMember(
                meta, q.stats.view(), (q.last_used_at or q.loaded_at).timestamp(),
                pinned=q.pinned, busy=busy, protected=q.never_evict, keep=q.hot_keep,
            ))
        return members

    def set_hot_order(self, keeps: dict[int, float], *, replace: bool) -> None:
        """Take the cache manager's HOT keep keys (engine id -> keep) for the request-path
        victim: ``replace`` (a ``HotOrder``) also clears the keep of every HOT version not
        listed; otherwise (a load's ``hot_keep``) only the listed ones change."""
        for eid, q in self.placements.items():
            if eid in keeps:
                q.hot_keep = keeps[eid] if q.hot else None
            elif replace:
                q.hot_keep = None

    def choose_victim(self, exclude: int = 0) -> VictimChoice:
        """The version the request path would demote now (see :mod:`loraplane.policy.victims`)."""
        return hot_victim(self.hot_members(exclude), self.clock().timestamp(), self.policy,
                          self.bandwidths)

    async def _make_hot(self, p: Placement, make_room: bool, wait: SlotWait | None) -> float:
        """Register ``p`` (its version lock held) once a HOT slot is free or made free.

        Returns the registration time. Without ``make_room`` / ``wait`` a full worker
        raises :class:`NoCapacity` at once. A command's load (``wait`` without
        ``make_room``: the cache manager chose what leaves) waits for a freed slot, and
        makes room like the request path once a request claims the version.
        """
        spec = p.spec
        ticket: Ticket[asyncio.Future[None] | None] | None = None
        waited_from = self.monotonic()
        klass = wait.request_class if wait is not None else 0
        prio = wait.priority if wait is not None else common_pb2.PRIORITY_UNSPECIFIED
        klass_name = POLICY_CLASSES.get(klass, RequestClass.BACKGROUND).value
        done = False
        try:
            while True:
                why = ""
                evicted: EvictOutcome | None = None
                register_s: float | None = None
                if not (ticket is None and wait is not None
                        and self.slot_queue.ahead_of(klass, self.monotonic(), prio) > 0):
                    async with self._room:
                        full = self.hot_count() >= self.hot_capacity
                        # a command's load makes room too once a request waits for the
                        # version (it inherited the command's place in the queue)
                        if full and (make_room or self._claims.get(spec.engine_id, 0) > 0):
                            choice = self.choose_victim(exclude=spec.engine_id)
                            why = choice.why_none
                            if choice.victim is not None:
                                evicted = await self._demote_victim(int(choice.victim), choice)
                                full = False
                        if not full:
                            t1 = time.perf_counter()
                            await self.engine.register(p.engine_adapter())
                            register_s = time.perf_counter() - t1
                            p.hot = True
                            p.loaded_at = self.clock()
                            p.stats.record_load()
                if evicted is not None:
                    self._count_eviction(evicted)
                    if self.on_event is not None:
                        await self.on_event(evicted)
                if register_s is not None:
                    done = True
                    if ticket is not None:
                        self.metrics.slot_waits.labels(self.base_model, klass_name,
                                                       "served").inc()
                        self.metrics.slot_wait_seconds.labels(self.base_model, klass_name).observe(
                            self.monotonic() - waited_from)
                    return register_s
                cause = (f"{self.hot_count()} versions HOT = capacity {self.hot_capacity}"
                         + (f" ({why})" if why else ""))
                if wait is None:
                    raise NoCapacity(f"{cause}; evict one before loading {spec.name}")
                now = self.monotonic()
                if wait.deadline is not None and now >= wait.deadline:
                    raise self._no_slot(spec, cause, waited_from, klass_name)
                if ticket is None:
                    try:
                        ticket = self.slot_queue.push(klass, now, wait.deadline or math.inf, None,
                                                      prio)
                    except QueueFull as exc:
                        self.metrics.slot_waits.labels(self.base_model, klass_name,
                                                       "queue_full").inc()
                        raise SlotQueueFull(f"no HOT slot for {spec.name}: {exc}; {cause}",
                                            retry_after_s=self.slot_retry_after_s) from None
                    self._set_queue_gauges()
                fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                ticket.payload = fut
                timeout = None if wait.deadline is None else max(0.0, wait.deadline - now)
                # only while parked here: this task holds the version lock, so any other
                # task of the version is parked on that lock (both safe to cancel)
                self._slot_waiting[spec.engine_id] = ticket
                try:
                    await asyncio.wait_for(fut, timeout)
                except TimeoutError:
                    raise self._no_slot(spec, cause, waited_from, klass_name) from None
                finally:
                    self._slot_waiting.pop(spec.engine_id, None)
        finally:
            if ticket is not None:
                self.slot_queue.remove(ticket)
                self._set_queue_gauges()
            if done or ticket is not None:
                self._room_changed()  # more room may be left; a woken waiter may have left

    def _no_slot(self, spec: ArtifactSpec, cause: str, waited_from: float,
                 klass_name: str) -> NoSlot:
        self.metrics.slot_waits.labels(self.base_model, klass_name, "budget").inc()
        waited = self.monotonic() - waited_from
        return NoSlot(
            f"no HOT slot for {spec.name} within its budget (waited {waited:.2f}s, "
            f"{len(self.slot_queue)} waiting): {cause}",
            retry_after_s=self.slot_retry_after_s,
        )

    async def _demote_victim(self, engine_id: int, choice: VictimChoice) -> EvictOutcome:
        """Unregister the chosen victim (room lock held; its version lock is free: it was
        checked by :meth:`hot_members` with no await since, so taking it does not wait)."""
        victim = self.placements[engine_id]
        async with self._lock(engine_id):
            # not HOT from now on: a request arriving while the engine unregisters it must
            # load it again (behind this lock), never start on an adapter about to go
            victim.hot = False
            victim.hot_keep = None
            try:
                await self.engine.unregister(engine_id)
            except BaseException:
                victim.hot = engine_id in self.engine.registered
                raise
        reason = choice.reason.value if choice.reason is not None else "capacity"
        return EvictOutcome(victim.spec, engine_id, TIER_HOT, TIER_WARM,
                            f"{ON_DEMAND_REASON}{reason}")

    # ------------------------------------------------------------------ evict

    def _count_eviction(self, outcome: EvictOutcome) -> None:
        self.metrics.evictions.labels(
            **self.labels(outcome.spec), from_tier=TIER_NAMES[outcome.from_tier],
            to_tier=TIER_NAMES[outcome.to_tier],
        ).inc()

    async def evict(
        self, engine_id: int, to_tier: Tier, reason: str, *, timeout_s: float | None = None
    ) -> EvictOutcome:
        """Demote (``to_tier`` WARM: unregister, keep files) or delete (COLD) a version.

        New requests are refused while in-flight ones drain (at most ``timeout_s``,
        default ``drain_timeout_s``; then :class:`InUse`). Idempotent: evicting what is
        not there reports that it is already at ``to_tier``.
        """
        if to_tier not in (TIER_WARM, TIER_COLD):
            raise ValueError(f"eviction target {to_tier} is neither WARM nor COLD")
        try:
            async with self._lock(engine_id):
                outcome = await self._evict_locked(engine_id, to_tier, reason, timeout_s)
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                p = self.placements.get(engine_id)
                self.record_failure(p.spec if p else None, exc)
            raise
        finally:
            self.refresh_gauges()
            self._room_changed()
        if outcome.from_tier != outcome.to_tier:
            self._count_eviction(outcome)
        return outcome

    async def _evict_locked(
        self, engine_id: int, to_tier: Tier, reason: str, timeout_s: float | None
    ) -> EvictOutcome:
        p = self.placements.get(engine_id)
        if p is None:
            return EvictOutcome(None, engine_id, TIER_COLD, TIER_COLD, reason)
        from_tier = p.tier
        if to_tier == TIER_WARM and not p.hot:
            return EvictOutcome(p.spec, engine_id, TIER_WARM, TIER_WARM, reason)
        p.draining = True
        p.drained.clear()
        try:
            wait_s = self.drain_timeout_s if timeout_s is None else timeout_s
            try:
                await asyncio.wait_for(p.idle.wait(), max(wait_s, 0.0))
            except TimeoutError:
                raise InUse(
                    f"{p.spec.name} still has {p.in_flight} requests in flight after "
                    f"{wait_s:.1f}s"
                ) from None
            if p.hot:
                await self.engine.unregister(engine_id)
                p.hot = False
                p.pinned = False
                p.hot_keep = None
            if to_tier == TIER_COLD:
                await self.host.remove(engine_id)
                del self.placements[engine_id]
        finally:
            p.draining = False
            p.drained.set()
        return EvictOutcome(p.spec, engine_id, from_tier, to_tier, reason)

    # ------------------------------------------------------------------ pin

    async def pin(self, engine_id: int) -> Placement:
        """Pin a HOT version (see :class:`~loraplane.worker.guard.SafeEngine` for the limit)."""
        async with self._lock(engine_id):
            p = self.placements.get(engine_id)
            if p is None or not p.hot:
                raise NotPresent(f"adapter {engine_id} is not HOT on this worker")
            if not p.pinned:
                await self.engine.pin(engine_id)
                p.pinned = True
        self.refresh_gauges()
        return p

    async def unpin(self, engine_id: int) -> Placement:
        """Release the pin of a HOT version (idempotent)."""
        async with self._lock(engine_id):
            p = self.placements.get(engine_id)
            if p is None or not p.hot:
                raise NotPresent(f"adapter {engine_id} is not HOT on this worker")
            if p.pinned:
                await self.engine.unpin(p.engine_adapter())
                p.pinned = False
        self.refresh_gauges()
        self._room_changed()
        return p

    # ------------------------------------------------------------------ requests

    async def _load_and_report(self, spec: ArtifactSpec, never_evict: bool,
                               wait: SlotWait) -> LoadOutcome:
        outcome = await self.load(spec, TIER_HOT, make_room=True,
                                  never_evict=True if never_evict else None, wait=wait)
        if outcome.changed and self.on_event is not None:
            await self.on_event(outcome)
        return outcome

    @contextlib.asynccontextmanager
    async def use(
        self,
        spec: ArtifactSpec | None,
        *,
        allow_cold: bool,
        cold_timeout_s: float | None = None,
        never_evict: bool = False,
        request_class: int = common_pb2.REQUEST_CLASS_UNSPECIFIED,
        wait_s: float | None = None,
        priority: int = common_pb2.PRIORITY_UNSPECIFIED,
    ) -> AsyncIterator[Lease]:
        """Hold a version for one request: promote it to HOT if needed, count it in flight.

        ``spec`` None serves the base model through the zero adapter. A COLD version is
        loaded only when ``allow_cold`` (within ``cold_timeout_s``; the fetch itself goes
        on after a timeout, so the next request finds it WARM); otherwise
        :class:`AdapterCold`. A full worker makes room (:meth:`choose_victim`) or queues
        the request for a slot (``request_class`` then ``priority``, the tenant's tier,
        order the queue, with ageing: :mod:`loraplane.shared.ordering`) for at most
        ``cold_timeout_s`` (else ``wait_s``, else until the caller gives up), then
        :class:`NoSlot`. From its start to its end the request *claims* the version: a
        claimed version is never a victim, so a version loaded for a waiting request
        stays until that request has run. ``never_evict`` (the gateway says the version
        is an active canary) protects a version this request loads. A version an eviction
        is draining is waited for within the same bound (:meth:`_await_drain`), then loaded
        again, as one the worker's own victim choice is unregistering is.
        """
        if spec is None:
            yield Lease(self.zero_adapter, TIER_HOT, None)
            return
        self._check_base_model(spec)
        eid = spec.engine_id
        p = self.placements.get(eid)
        arrival = p.tier if p is not None else TIER_COLD
        budget_s = cold_timeout_s if cold_timeout_s is not None else wait_s
        wait = SlotWait(request_class,
                        None if budget_s is None else self.monotonic() + max(0.0, budget_s),
                        priority)
        self._claims[eid] += 1
        leased = False
        try:
            for attempt in range(4):
                p = self.placements.get(eid)
                if p is not None and p.draining:
                    if attempt == 3:
                        raise Draining(f"{spec.name} is being evicted from this worker")
                    await self._await_drain(spec, p, wait)
                    continue
                if p is not None and p.hot:
                    break
                if attempt == 3:
                    raise Draining(f"{spec.name} was evicted while loading")
                if p is None and not allow_cold:
                    raise AdapterCold(f"{spec.name} is not on this worker")
                task = asyncio.ensure_future(self._load_and_report(spec, never_evict, wait))
                task.add_done_callback(_retrieve)  # a timed-out waiter must not lose its error
                await self._await_load(spec, task, p is None, wait)
            assert p is not None
            if p.spec.sha256 != spec.sha256:
                raise DigestMismatch(f"{spec.name}: held with another sha256")
            p.in_flight += 1
            leased = True
            p.idle.clear()
            now = self.clock()
            p.last_used_at = now
            p.stats.record_request(now.timestamp(), POLICY_CLASSES.get(
                request_class, RequestClass.INTERACTIVE))
            p.stats.start_request()
            failed = True
            try:
                yield Lease(p.engine_adapter(), arrival, p.spec)
                failed = False
            except (asyncio.CancelledError, GeneratorExit):
                failed = False
                raise
            finally:
                p.stats.finish_request(error=failed)
        finally:
            self._claims[eid] -= 1
            if self._claims[eid] <= 0:
                del self._claims[eid]
            if leased and p is not None:
                p.in_flight -= 1
                if p.in_flight <= 0:
                    p.in_flight = 0
                    p.idle.set()
            self._room_changed()

    async def _await_drain(self, spec: ArtifactSpec, p: Placement, wait: SlotWait) -> None:
        """Wait, at most until ``wait.deadline``, for the eviction draining ``p`` to end (the
        caller then loads the version again: from WARM after a demotion, from COLD when the
        request may). At the deadline :class:`Draining` (the gateway plans again). So a
        request that meets a cache command's demotion is served once the version is back, as
        a request for a version not HOT is, where it failed UNAVAILABLE: a gateway re-plans
        such a refusal once, and on a worker alone it met the same drain again."""
        timeout = None if wait.deadline is None else max(0.0, wait.deadline - self.monotonic())
        try:
            await asyncio.wait_for(p.drained.wait(), timeout)
        except TimeoutError:
            raise Draining(f"{spec.name} is being evicted from this worker") from None

    async def _await_load(self, spec: ArtifactSpec, task: asyncio.Future[LoadOutcome],
                          cold: bool, wait: SlotWait) -> None:
        """Wait for a request's load, at most until ``wait.deadline``.

        A load already parked in the slot queue for this version (another request's) takes
        this request's place when that is earlier (:meth:`SlotQueue.inherit`). At the
        deadline: parked for a slot → :class:`NoSlot` (this request's task, parked on the
        version lock or in the queue, is cancelled); still fetching a COLD version →
        :class:`AdapterCold` (the fetch goes on for the next request); otherwise (a
        command holds the version) it keeps waiting. A cancelled request takes its load
        out of the queue."""
        waited_from = self.monotonic()
        parked = self._slot_waiting.get(spec.engine_id)
        if parked is not None:
            if self.slot_queue.inherit(parked, wait.request_class, self.monotonic(),
                                       wait.priority):
                self._set_queue_gauges()
            self._room_changed()  # the parked load (a command's) may now make room
        try:
            timeout = None if wait.deadline is None else max(0.0, wait.deadline - waited_from)
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout)
                return
            except TimeoutError:
                pass
            if spec.engine_id in self._slot_waiting:
                task.cancel()
                await asyncio.wait({task})  # out of the queue before the answer
                klass = POLICY_CLASSES.get(wait.request_class, RequestClass.BACKGROUND).value
                raise self._no_slot(
                    spec, f"its load waits for a slot; {self.hot_count()} versions HOT = "
                    f"capacity {self.hot_capacity} ({self.choose_victim().why_none})",
                    waited_from, klass) from None
            if cold and spec.engine_id not in self.placements:
                raise AdapterCold(
                    f"{spec.name} is loading; not HOT within "
                    f"{self.monotonic() - waited_from:.3f}s", retry_after_s=1.0,
                ) from None
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done() and spec.engine_id in self._slot_waiting:
                task.cancel()
            raise
