"""The placement view: which worker holds which adapter version, in which tier.

Fed by ``cache.state`` (:class:`~loraplane.v1.events_pb2.WorkerReport`: full
snapshots and ``AdapterLoaded`` / ``AdapterEvicted`` deltas), bootstrapped from the
cache manager's ``ListWorkers`` at start. Snapshots are ordered by
``(started_at, seq)``; a delta older than the worker's last snapshot is ignored, so a
replay of old reports never overwrites newer state.

:class:`LocalLoad` is what this gateway knows better than any report: its own
requests in flight per worker and the cold loads it started.
:func:`worker_options` combines both into the :class:`~loraplane.gateway.budget.WorkerOption`
list the budget decision works on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from loraplane.gateway.budget import TIER_COLD, TIER_HOT, TIER_WARM, LoadEstimates, WorkerOption
from loraplane.v1 import events_pb2

Clock = Callable[[], float]
"""Seconds since the epoch."""


def _ts(stamp: object) -> float:
    seconds = getattr(stamp, "seconds", 0)
    nanos = getattr(stamp, "nanos", 0)
    return float(seconds) + float(nanos) / 1e9


@dataclass(slots=True)
class WorkerView:
    """What the gateway knows about one worker."""

    worker_id: str
    """Worker id."""
    address: str = ""
    """host:port of its WorkerInternal server ("" until a snapshot says)."""
    base_models: frozenset[str] = frozenset()
    """Base models its engines serve."""
    ready: bool = False
    """Whether it accepts requests."""
    started_at: float = 0.0
    """Process start (epoch seconds) of the last snapshot."""
    seq: int = -1
    """Snapshot counter of the last snapshot."""
    as_of: float = 0.0
    """Event time of the last snapshot."""
    last_seen: float = 0.0
    """Event time of the last report of any kind."""
    tiers: dict[int, int] = field(default_factory=dict)
    """engine_id → TIER_HOT / TIER_WARM."""
    reported_in_flight: int = 0
    """Sum of in-flight requests in the last snapshot."""


class PlacementView:
    """Workers and the tiers of adapter versions on them."""

    def __init__(
        self,
        *,
        clock: Clock = time.time,
        stale_after_s: float = 60.0,
        warm_load_ms: float = 50.0,
        cold_load_ms: float = 2000.0,
        ewma_alpha: float = 0.2,
    ) -> None:
        """``stale_after_s``: a worker silent for longer is not routed to (0 = never)."""
        self._clock = clock
        self._stale_after_s = stale_after_s
        self._workers: dict[str, WorkerView] = {}
        self._warm_ms = warm_load_ms
        self._cold_ms = cold_load_ms
        self._alpha = ewma_alpha
        self.events_applied = 0
        """Reports applied (readiness, tests)."""
        self._listeners: list[Callable[[], None]] = []

    def on_change(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` after every change (wakes requests waiting for a load)."""
        self._listeners.append(callback)

    def _changed(self) -> None:
        for cb in self._listeners:
            cb()

    # ------------------------------------------------------------------ updates

    def _worker(self, worker_id: str) -> WorkerView:
        w = self._workers.get(worker_id)
        if w is None:
            w = WorkerView(worker_id)
            self._workers[worker_id] = w
        return w

    def apply_state(self, state: events_pb2.WorkerState, at: float, *, alive: bool = True) -> bool:
        """Apply a full snapshot taken at ``at``; returns whether it was newer than what is known."""
        w = self._worker(state.worker_id)
        started = _ts(state.started_at)
        if (started, state.seq) < (w.started_at, w.seq) or (
            (started, state.seq) == (w.started_at, w.seq) and at <= w.as_of
        ):
            return False
        w.started_at, w.seq, w.as_of = started, state.seq, at
        w.last_seen = max(w.last_seen, at)
        w.address = state.grpc_address or w.address
        w.base_models = frozenset(state.base_models)
        w.ready = state.ready and alive
        w.tiers = {
            p.engine_id: p.tier
            for p in state.placements
            if p.engine_id and p.tier in (TIER_HOT, TIER_WARM)
        }
        w.reported_in_flight = sum(max(0, p.in_flight) for p in state.placements)
        self._changed()
        return True

    def apply_report(self, report: events_pb2.WorkerReport) -> None:
        """Apply one ``cache.state`` report."""
        self.events_applied += 1
        at = _ts(report.meta.occurred_at)
        arm = report.WhichOneof("report")
        if arm == "state":
            state = report.state
            if not state.worker_id:
                state.worker_id = report.worker_id
            self.apply_state(state, at)
            return
        w = self._worker(report.worker_id)
        w.last_seen = max(w.last_seen, at)
        if at < w.as_of:
            return
        if arm == "loaded":
            loaded = report.loaded
            if loaded.engine_id and loaded.tier in (TIER_HOT, TIER_WARM):
                w.tiers[loaded.engine_id] = loaded.tier
            self._learn(loaded)
        elif arm == "evicted":
            ev = report.evicted
            if ev.to_tier == TIER_WARM:
                w.tiers[ev.engine_id] = TIER_WARM
            else:
                w.tiers.pop(ev.engine_id, None)
        self._changed()

    def _learn(self, loaded: events_pb2.AdapterLoaded) -> None:
        if loaded.tier != TIER_HOT or loaded.duration_ms <= 0:
            return
        a = self._alpha
        if loaded.source_tier == TIER_WARM:
            self._warm_ms = (1 - a) * self._warm_ms + a * loaded.duration_ms
        elif loaded.source_tier == TIER_COLD:
            self._cold_ms = (1 - a) * self._cold_ms + a * loaded.duration_ms

    def mark_down(self, worker_id: str) -> None:
        """Stop routing to a worker until its next snapshot says it is ready."""
        w = self._workers.get(worker_id)
        if w is not None and w.ready:
            w.ready = False
            self._changed()

    # ------------------------------------------------------------------ reads

    def estimates(self) -> LoadEstimates:
        """Current WARM → HOT and COLD → HOT load estimates."""
        return LoadEstimates(self._warm_ms, self._cold_ms)

    def worker(self, worker_id: str) -> WorkerView | None:
        """One worker."""
        return self._workers.get(worker_id)

    def workers(self) -> list[WorkerView]:
        """Every known worker, by id."""
        return [self._workers[k] for k in sorted(self._workers)]

    def routable(self, base_model: str) -> list[WorkerView]:
        """Ready, fresh workers with an address that serve ``base_model``."""
        now = self._clock()
        stale = self._stale_after_s
        return [
            w
            for w in self._workers.values()
            if w.ready
            and w.address
            and base_model in w.base_models
            and (stale <= 0 or now - w.last_seen <= stale)
        ]

    def base_models(self) -> set[str]:
        """Base models served by at least one routable worker."""
        out: set[str] = set()
        for w in self._workers.values():
            out |= w.base_models
        return {b for b in out if self.routable(b)}

    def is_warm(self, base_model: str, engine_id: int) -> bool:
        """Whether the version is HOT or WARM on some routable worker."""
        return any(engine_id in w.tiers for w in self.routable(base_model))

    def forget_version(self, worker_id: str, engine_id: int) -> None:
        """The worker said it does not serve ``engine_id`` now (evicting, evicted): treat it
        as COLD there until the worker's next report says otherwise."""
        w = self._workers.get(worker_id)
        if w is not None and w.tiers.pop(engine_id, None) is not None:
            self._changed()

    def tier(self, worker_id: str, engine_id: int) -> int:
        """Tier of a version on a worker (TIER_COLD when absent)."""
        w = self._workers.get(worker_id)
        return TIER_COLD if w is None else w.tiers.get(engine_id, TIER_COLD)


class LocalLoad:
    """This gateway's requests in flight per worker and the cold loads it started."""

    def __init__(self, max_cold_loads_per_worker: int = 2) -> None:
        """``max_cold_loads_per_worker``: concurrent cold loads started on one worker."""
        self.max_cold = max_cold_loads_per_worker
        self.in_flight: dict[str, int] = {}
        self._loads: dict[str, dict[int, int]] = {}
        self._listeners: list[Callable[[], None]] = []

    def on_slot_freed(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever a cold-load slot is released."""
        self._listeners.append(callback)

    def begin(self, worker_id: str) -> None:
        """A request was sent to ``worker_id``."""
        self.in_flight[worker_id] = self.in_flight.get(worker_id, 0) + 1

    def end(self, worker_id: str) -> None:
        """A request to ``worker_id`` finished."""
        self.in_flight[worker_id] = max(0, self.in_flight.get(worker_id, 0) - 1)

    def start_load(self, worker_id: str, engine_id: int) -> None:
        """A cold load of ``engine_id`` started on ``worker_id`` (takes a slot)."""
        loads = self._loads.setdefault(worker_id, {})
        loads[engine_id] = loads.get(engine_id, 0) + 1

    def finish_load(self, worker_id: str, engine_id: int) -> None:
        """The cold load ended (first token or failure): frees the slot."""
        loads = self._loads.get(worker_id, {})
        n = loads.get(engine_id, 0) - 1
        if n > 0:
            loads[engine_id] = n
        else:
            loads.pop(engine_id, None)
        for cb in self._listeners:
            cb()

    def loading(self, worker_id: str, engine_id: int) -> bool:
        """Whether a cold load of ``engine_id`` started here is under way on the worker."""
        return engine_id in self._loads.get(worker_id, {})

    def cold_slots_free(self, worker_id: str) -> int:
        """Cold loads this gateway may still start on the worker."""
        return max(0, self.max_cold - len(self._loads.get(worker_id, {})))


def worker_options(
    workers: Iterable[WorkerView],
    local: LocalLoad,
    engine_id: int,
    *,
    exclude: frozenset[str] = frozenset(),
) -> list[WorkerOption]:
    """One :class:`WorkerOption` per worker for the version ``engine_id`` (0 = base model,
    which is HOT wherever the base model is served)."""
    out = []
    for w in workers:
        if w.worker_id in exclude:
            continue
        tier = TIER_HOT if engine_id == 0 else w.tiers.get(engine_id, TIER_COLD)
        out.append(
            WorkerOption(
                w.worker_id,
                tier,
                max(local.in_flight.get(w.worker_id, 0), w.reported_in_flight),
                local.loading(w.worker_id, engine_id),
                local.cold_slots_free(w.worker_id),
            )
        )
    return out


