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
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from loraplane.v1 import common_pb2
from loraplane.worker.engine import EngineAdapter
from loraplane.worker.errors import (
    AdapterCold,
    BaseModelNotServed,
    DigestMismatch,
    Draining,
    InUse,
    NoCapacity,
    NotPresent,
    failure_reason,
)
from loraplane.worker.guard import SafeEngine
from loraplane.worker.host_tier import ArtifactSpec, FetchTiming, HostEntry, HostTier, RescanResult
from loraplane.worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)

Tier = common_pb2.Tier
"""A ``loraplane.v1.Tier`` value."""
TIER_HOT = common_pb2.TIER_HOT
TIER_WARM = common_pb2.TIER_WARM
TIER_COLD = common_pb2.TIER_COLD
TIER_NAMES: dict[Tier, str] = {TIER_HOT: "hot", TIER_WARM: "warm", TIER_COLD: "cold"}

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
    in_flight: int = 0
    draining: bool = False
    last_used_at: datetime | None = None
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()

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
    ) -> None:
        """``zero_adapter``: the all-zero adapter that serves base-model requests."""
        self.engine = engine
        self.host = host
        self.base_model = base_model
        self.zero_adapter = zero_adapter
        self.metrics = metrics
        self.clock = clock
        self.drain_timeout_s = drain_timeout_s
        self.on_event = on_event
        self.placements: dict[int, Placement] = {}
        self._locks: dict[int, asyncio.Lock] = {}

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> RescanResult:
        """Register the zero adapter, re-verify the host tier, hold what passed as WARM."""
        await self.engine.register(self.zero_adapter)
        result = await self.host.rescan()
        for entry in result.kept:
            self.placements[entry.spec.engine_id] = Placement(
                spec=entry.spec, host=entry, loaded_at=entry.verified_at
            )
        if result.dropped:
            self.metrics.host_dropped.inc(len(result.dropped))
        self.refresh_gauges()
        return result

    # ------------------------------------------------------------------ helpers

    def _lock(self, engine_id: int) -> asyncio.Lock:
        lock = self._locks.get(engine_id)
        if lock is None:
            lock = self._locks[engine_id] = asyncio.Lock()
        return lock

    @property
    def hot_capacity(self) -> int:
        """Adapter versions that may be HOT at once: the engine's ``max_loras`` slots (the
        cache manager plans with this number and pins at most one less), bounded by the
        registrations left beside the zero adapter (``max_cpu_loras - 1``)."""
        limits = self.engine.limits
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
    ) -> LoadOutcome:
        """Bring ``spec`` to ``target_tier`` (WARM or HOT), pinning it when asked.

        ``make_room`` (request path only): when every HOT registration is taken, demote
        the least recently used idle unpinned version (never-evict ones only when nothing
        else can go) instead of failing with :class:`NoCapacity`. ``never_evict`` sets the version's
        protection (``None`` keeps what it has): a cache command sets it afresh, the
        request path only ever raises it. Idempotent: loading what is already there
        reports it.
        """
        if target_tier not in (TIER_WARM, TIER_HOT):
            raise ValueError(f"target tier {target_tier} is neither WARM nor HOT")
        self._check_base_model(spec)
        try:
            async with self._lock(spec.engine_id):
                outcome = await self._load_locked(spec, target_tier, pin, make_room,
                                                  never_evict)
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                self.record_failure(spec, exc)
            raise
        finally:
            self.refresh_gauges()
        if outcome.changed:
            labels = self.labels(spec)
            src, dst = TIER_NAMES[outcome.source_tier], TIER_NAMES[outcome.tier]
            self.metrics.loads.labels(**labels, source_tier=src, target_tier=dst).inc()
            self.metrics.load_seconds.labels(**labels, source_tier=src, target_tier=dst).observe(
                outcome.duration_s
            )
            if outcome.bytes_read:
                self.metrics.load_bytes.labels(**labels).inc(outcome.bytes_read)
        return outcome

    async def _load_locked(
        self, spec: ArtifactSpec, target_tier: Tier, pin: bool, make_room: bool,
        never_evict: bool | None,
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
        if p is None:
            entry, fetch = await self.host.fetch(spec)
            p = Placement(spec=spec, host=entry, loaded_at=self.clock())
            self.placements[spec.engine_id] = p
        if never_evict is not None:
            p.never_evict = never_evict
        register_s = verify_s = 0.0
        if target_tier == TIER_HOT and not p.hot:
            if source == TIER_WARM:  # files may have changed since they were verified
                t0 = time.perf_counter()
                try:
                    p.host = await self.host.reverify(spec.engine_id)
                except DigestMismatch:
                    self.placements.pop(spec.engine_id, None)
                    self.metrics.host_dropped.inc()
                    raise
                verify_s = time.perf_counter() - t0
            full = self.hot_count() >= self.hot_capacity
            if full and not (make_room and await self._demote_lru(exclude=spec.engine_id)):
                raise NoCapacity(
                    f"{self.hot_count()} versions HOT = capacity {self.hot_capacity}; "
                    f"evict one before loading {spec.name}"
                )
            t1 = time.perf_counter()
            await self.engine.register(p.engine_adapter())
            register_s = time.perf_counter() - t1
            p.hot = True
            p.loaded_at = self.clock()
        if pin and p.hot and not p.pinned:
            await self.engine.pin(spec.engine_id)
            p.pinned = True
        elif pin and not p.hot:
            raise NotPresent(f"{spec.name} must be HOT to be pinned (load it with TIER_HOT)")
        return LoadOutcome(
            spec=spec, source_tier=source, tier=p.tier, pinned=p.pinned,
            duration_s=time.perf_counter() - started,
            bytes_read=fetch.bytes_read if fetch else 0, fetch=fetch, register_s=register_s,
            verify_s=verify_s,
        )

    async def _demote_lru(self, exclude: int) -> bool:
        """Demote the least recently used idle, unpinned HOT version, never-evict ones last
        (a worker full of them must still serve: the version stays WARM, which is what the
        policy guarantees beyond its pinned share); False if none."""
        epoch = datetime.min.replace(tzinfo=UTC)
        candidates = sorted(
            (
                p for eid, p in self.placements.items()
                if eid != exclude and p.hot and not p.pinned
                and p.in_flight == 0 and not p.draining and not self._lock(eid).locked()
            ),
            key=lambda p: (p.never_evict, p.last_used_at or p.loaded_at or epoch),
        )
        protected_at_sort = {id(p): p.never_evict for p in candidates}
        for victim in candidates:
            async with self._lock(victim.spec.engine_id):
                if not victim.hot or victim.pinned or victim.in_flight or victim.draining:
                    continue
                if victim.never_evict and not protected_at_sort[id(victim)]:
                    continue  # protected meanwhile: it now belongs at the end of the order
                await self.engine.unregister(victim.spec.engine_id)
                victim.hot = False
            outcome = EvictOutcome(victim.spec, victim.spec.engine_id, TIER_HOT, TIER_WARM,
                                   "worker_lru_protected" if victim.never_evict else "worker_lru")
            self._count_eviction(outcome)
            if self.on_event is not None:
                await self.on_event(outcome)
            return True
        return False

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
            if to_tier == TIER_COLD:
                await self.host.remove(engine_id)
                del self.placements[engine_id]
        finally:
            p.draining = False
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
        return p

    # ------------------------------------------------------------------ requests

    async def _load_and_report(self, spec: ArtifactSpec, never_evict: bool) -> LoadOutcome:
        outcome = await self.load(spec, TIER_HOT, make_room=True,
                                  never_evict=True if never_evict else None)
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
    ) -> AsyncIterator[Lease]:
        """Hold a version for one request: promote it to HOT if needed, count it in flight.

        ``spec`` None serves the base model through the zero adapter. A COLD version is
        loaded only when ``allow_cold`` (within ``cold_timeout_s``; the load itself goes
        on after a timeout, so the next request finds it); otherwise :class:`AdapterCold`.
        ``never_evict`` (the gateway says the version is an active canary) makes a version
        this request loads the worker's own demotion's last choice.
        """
        if spec is None:
            yield Lease(self.zero_adapter, TIER_HOT, None)
            return
        self._check_base_model(spec)
        p = self.placements.get(spec.engine_id)
        arrival = p.tier if p is not None else TIER_COLD
        for attempt in range(4):
            p = self.placements.get(spec.engine_id)
            if p is not None and p.draining:
                raise Draining(f"{spec.name} is being evicted from this worker")
            if p is not None and p.hot:
                break
            if attempt == 3:
                raise Draining(f"{spec.name} was evicted while loading")
            if p is None and not allow_cold:
                raise AdapterCold(f"{spec.name} is not on this worker")
            task = asyncio.ensure_future(self._load_and_report(spec, never_evict))
            task.add_done_callback(_retrieve)  # a timed-out waiter must not lose its error
            if cold_timeout_s is None or p is not None:
                await asyncio.shield(task)
            else:
                try:
                    await asyncio.wait_for(asyncio.shield(task), cold_timeout_s)
                except TimeoutError:
                    raise AdapterCold(
                        f"{spec.name} is loading; not HOT within {cold_timeout_s:.3f}s",
                        retry_after_s=1.0,
                    ) from None
        assert p is not None
        if p.spec.sha256 != spec.sha256:
            raise DigestMismatch(f"{spec.name}: held with another sha256")
        p.in_flight += 1
        p.idle.clear()
        p.last_used_at = self.clock()
        try:
            yield Lease(p.engine_adapter(), arrival, p.spec)
        finally:
            p.in_flight -= 1
            if p.in_flight <= 0:
                p.in_flight = 0
                p.idle.set()
