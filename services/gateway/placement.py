"""The placement view: which worker holds which adapter version, in which tier.

Fed by ``cache.state`` (:class:`~loraplane.v1.events_pb2.WorkerReport`: full
snapshots and ``AdapterLoaded`` / ``AdapterEvicted`` deltas), bootstrapped from the
cache manager's ``ListWorkers`` at start, and by the gateway's own probes of every
worker's ``GetState`` over gRPC (:mod:`~loraplane.gateway.liveness`). Snapshots are
ordered by ``(started_at, seq)``; a delta older than the worker's last snapshot is
ignored, so a replay of old reports never overwrites newer state.

Liveness comes from the request path, not from the broker: a worker that answers its
probes stays routable however long ``cache.state`` is silent (a broker outage), and a
worker that fails ``down_after_failures`` probes in a row is taken out of routing
within seconds, whatever its last report said (:meth:`PlacementView.liveness`).

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
    answered_at: float = 0.0
    """When its last answered probe was sent (gateway clock; 0 = never answered)."""
    probe_failures: int = 0
    """Probes failed in a row since the last answer."""
    state: str = ""
    """Liveness state at the last :meth:`PlacementView.refresh_liveness` (see LIVENESS)."""
    state_since: float = 0.0
    """Since when it has been in ``state``."""


ANSWERING = "answering"
"""Answered a probe within the staleness window (routable whatever the broker does)."""
REPORTING = "reporting"
"""Not probed or not yet answered, but its ``cache.state`` reports are fresh."""
SILENT = "silent"
"""Neither an answer nor a report within the staleness window: not routed to."""
DOWN = "down"
"""Failed ``down_after_failures`` probes in a row: not routed to until it answers."""
LIVENESS: tuple[str, ...] = (ANSWERING, REPORTING, SILENT, DOWN)
"""Every liveness state a worker can be in."""


class PlacementView:
    """Workers and the tiers of adapter versions on them."""

    def __init__(
        self,
        *,
        clock: Clock = time.time,
        stale_after_s: float = 60.0,
        down_after_failures: int = 2,
        warm_load_ms: float = 50.0,
        cold_load_ms: float = 2000.0,
        ewma_alpha: float = 0.2,
    ) -> None:
        """``stale_after_s``: a worker neither answering probes nor reporting for longer is
        not routed to (0 = never); ``down_after_failures``: probes failed in a row that
        take a worker out of routing."""
        if down_after_failures < 1:
            raise ValueError("down_after_failures must be at least 1")
        self._clock = clock
        self._stale_after_s = stale_after_s
        self._down_after = down_after_failures
        self._workers: dict[str, WorkerView] = {}
        self._warm_ms = warm_load_ms
        self._cold_ms = cold_load_ms
        self._estimates = LoadEstimates(warm_load_ms, cold_load_ms)
        """The last estimates handed out (one object while they stay the same)."""
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

    def apply_state(
        self, state: events_pb2.WorkerState, at: float, *, alive: bool = True,
        reported: bool = True,
    ) -> bool:
        """Apply a full snapshot taken at ``at``; returns whether it was newer than what is
        known. ``reported``: it came through ``cache.state`` (counts as a report)."""
        w = self._worker(state.worker_id)
        started = _ts(state.started_at)
        if (started, state.seq) < (w.started_at, w.seq) or (
            (started, state.seq) == (w.started_at, w.seq) and at <= w.as_of
        ):
            return False
        w.started_at, w.seq, w.as_of = started, state.seq, at
        if reported:
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

    def probe_answered(self, state: events_pb2.WorkerState, sent_at: float) -> None:
        """The worker answered a ``GetState`` probe sent at ``sent_at`` with ``state``: it is
        alive, and its snapshot is applied (sent_at orders it before any later delta)."""
        w = self._worker(state.worker_id)
        revived = w.probe_failures >= self._down_after
        w.answered_at = max(w.answered_at, sent_at)
        w.probe_failures = 0
        applied = self.apply_state(state, sent_at, reported=False)
        if revived and not applied:
            self._changed()

    def probe_failed(self, worker_id: str) -> None:
        """A probe of the worker failed (no answer in time, connection refused)."""
        w = self._workers.get(worker_id)
        if w is None:
            return
        w.probe_failures += 1
        if w.probe_failures == self._down_after:
            self._changed()

    def liveness(self, w: WorkerView, now: float | None = None) -> str:
        """One of :data:`LIVENESS` for ``w`` at ``now`` (default: the clock)."""
        if w.probe_failures >= self._down_after:
            return DOWN
        now = self._clock() if now is None else now
        stale = self._stale_after_s
        if w.answered_at and (stale <= 0 or now - w.answered_at <= stale):
            return ANSWERING
        if stale <= 0 or now - w.last_seen <= stale:
            return REPORTING
        return SILENT

    def refresh_liveness(self) -> list[tuple[str, str, str]]:
        """Record each worker's liveness state and since when; returns the transitions
        ``(worker_id, old, new)`` since the last call (``old`` "" the first time)."""
        now = self._clock()
        changes = []
        for w in self.workers():
            state = self.liveness(w, now)
            if state != w.state:
                changes.append((w.worker_id, w.state, state))
                w.state, w.state_since = state, now
        return changes

    def mark_down(self, worker_id: str) -> None:
        """Stop routing to a worker until its next snapshot says it is ready."""
        w = self._workers.get(worker_id)
        if w is not None and w.ready:
            w.ready = False
            self._changed()

    # ------------------------------------------------------------------ reads

    def estimates(self) -> LoadEstimates:
        """Current WARM → HOT and COLD → HOT load estimates."""
        est = self._estimates
        if est.warm_ms != self._warm_ms or est.cold_ms != self._cold_ms:
            est = self._estimates = LoadEstimates(self._warm_ms, self._cold_ms)
        return est

    def worker(self, worker_id: str) -> WorkerView | None:
        """One worker."""
        return self._workers.get(worker_id)

    def workers(self) -> list[WorkerView]:
        """Every known worker, by id."""
        return [self._workers[k] for k in sorted(self._workers)]

    def routable(self, base_model: str) -> list[WorkerView]:
        """Ready, live workers (answering probes or reporting) with an address that serve
        ``base_model``."""
        now = self._clock()
        return [
            w
            for w in self._workers.values()
            if w.ready
            and w.address
            and base_model in w.base_models
            and self.liveness(w, now) in (ANSWERING, REPORTING)
        ]

    def base_models(self) -> set[str]:
        """Base models served by at least one routable worker."""
        out: set[str] = set()
        for w in self._workers.values():
            out |= w.base_models
        return {b for b in out if self.routable(b)}

    def names_base_model(self, name: str) -> bool:
        """Whether some known worker (live or not) has ``name`` among its base models: a
        cheap test before :func:`~loraplane.gateway.models.served_base_models`."""
        return any(name in w.base_models for w in self._workers.values())

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


