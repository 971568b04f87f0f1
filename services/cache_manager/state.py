"""Event-sourced state of the cache manager (pure: no I/O, clock passed in).

:class:`State` is built from the events the cache manager consumes and from the
registry's records:

* ``adapter.heat`` (:class:`HeatBatch`) → per-version request statistics
  (:class:`~loraplane.policy.stats.VersionStats`) and hit counts per tier;
* ``cache.state`` (:class:`WorkerReport`) → every worker's placement
  (HOT / WARM per version), capacities, liveness; command outcomes;
* ``adapter.admissions`` / ``adapter.lifecycle`` → version records and the
  release pointers (stable / canary / rollback target / retired);
* ``adapter.prewarm`` → short-lived warm-up requests.

:meth:`State.apply` is idempotent on ``meta.event_id`` (a bounded memory of
recent ids) and returns an :class:`Applied` telling the caller what changed:
a *trigger* for an early planning round, command outcomes for the tracker,
and version ids to resolve against the registry.

Worker snapshots are ordered by ``(started_at, seq)``: an older snapshot is
ignored, a newer ``started_at`` is a restart (the worker's placement is
replaced). A worker is *synced* once a full snapshot arrived since it was
(re)discovered: only synced workers receive commands.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from loraplane.cache_manager.model import (
    Pointers,
    Ref,
    Status,
    Tier,
    VersionRecord,
    priority_from_proto,
    request_class_from_proto,
    version_id,
)
from loraplane.policy.plan import Reason
from loraplane.policy.ranking import AdaptiveRanking
from loraplane.policy.stats import DEFAULT_TAU_S, DEFAULT_WARM_TAU_S, VersionStats
from loraplane.shared.vocab import tier_from_proto
from loraplane.v1 import common_pb2, events_pb2

DEFAULT_DEDUPE_CAPACITY = 200_000
"""Event ids remembered for idempotency (older ones are forgotten first)."""


def ts_seconds(ts: Timestamp, default: float) -> float:
    """Epoch seconds of a protobuf timestamp (``default`` when unset)."""
    if ts.seconds == 0 and ts.nanos == 0:
        return default
    return float(ts.seconds + ts.nanos / 1e9)


# --------------------------------------------------------------------------- workers


@dataclass(slots=True)
class Placement:
    """One version on one worker."""

    ref: Ref
    tier: Tier
    pinned: bool = False
    in_flight: int = 0
    size_bytes: int = 0
    engine_id: int = 0
    loaded_at: float = 0.0
    last_used_at: float | None = None
    sha256: str = ""
    rank: int = 0
    slot_resident: bool = False
    """HOT's second level: in one of the engine's GPU slots at the worker's last snapshot."""


@dataclass(frozen=True, slots=True)
class Capacity:
    """HOT capacity of one base model's engine on a worker."""

    slots: int
    max_lora_rank: int = 0
    tokenizer_revision: str = ""
    gpu_slots: int = 0
    """The engine's GPU slots (``max_loras``; ``slots`` counts the registrations planned)."""
    gpu_slots_used: int = 0


@dataclass(slots=True)
class WorkerView:
    """The cache manager's picture of one worker."""

    worker_id: str
    grpc_address: str = ""
    capacities: dict[str, Capacity] = field(default_factory=dict)
    """HOT slots per base model."""
    warm_bytes_capacity: int = 0
    placements: dict[str, Placement] = field(default_factory=dict)
    """By version id."""
    started_at: float = 0.0
    seq: int = -1
    ready: bool = False
    last_seen: float = 0.0
    """Event time of the last report (any kind)."""
    snapshot_at: float = 0.0
    """Event time of the last full snapshot (older incremental reports no longer apply)."""
    alive: bool = True
    synced: bool = False
    """A full snapshot arrived since the worker was (re)discovered."""

    def hot(self) -> Iterator[str]:
        """Version ids HOT here."""
        return (v for v, p in self.placements.items() if p.tier is Tier.HOT)

    def tier_of(self, vid: str) -> Tier:
        """Tier of ``vid`` on this worker."""
        p = self.placements.get(vid)
        return Tier.COLD if p is None else p.tier

    def serves(self, base_model: str) -> bool:
        """Whether an engine for ``base_model`` runs here."""
        return base_model in self.capacities

    def commandable(self) -> bool:
        """Alive, synced and ready: may receive commands."""
        return self.alive and self.synced and self.ready


# --------------------------------------------------------------------------- outcomes


@dataclass(frozen=True, slots=True)
class Outcome:
    """A worker's answer to one command."""

    command_id: str
    worker_id: str
    version_id: str
    ok: bool
    retriable: bool = False
    code: str = ""
    """``LoadErrorCode`` name for failures (e.g. ``LOAD_ERROR_CODE_NO_CAPACITY``)."""
    message: str = ""


@dataclass(slots=True)
class Applied:
    """What one event changed (for the caller's bookkeeping)."""

    duplicate: bool = False
    triggers: list[str] = field(default_factory=list)
    """Why an early planning round is useful ("burst", "canary", "worker_joined", ...)."""
    outcomes: list[Outcome] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    """Version ids the registry must be asked about."""
    restarted_workers: list[str] = field(default_factory=list)
    """Workers that started a new incarnation (their pending commands are void)."""


@dataclass(frozen=True, slots=True)
class Boost:
    """A temporary requirement of HOT replicas (prewarm, rollback)."""

    replicas: int
    until: float
    reason: str
    target_worker: str = ""


# --------------------------------------------------------------------------- state


class State:
    """Everything the cache manager knows; mutated only through its methods."""

    def __init__(
        self,
        *,
        tau_s: float = DEFAULT_TAU_S,
        tau_warm_s: float = DEFAULT_WARM_TAU_S,
        dedupe_capacity: int = DEFAULT_DEDUPE_CAPACITY,
        prewarm_ttl_s: float = 300.0,
        rollback_boost_ttl_s: float = 600.0,
        tenants: frozenset[str] | None = None,
        base_models: frozenset[str] | None = None,
    ) -> None:
        self.tau_s = tau_s
        self.tau_warm_s = tau_warm_s
        self.tenants = tenants
        """Tenants this deployment manages (None: all); others' events are ignored."""
        self.base_models = base_models
        """Base models this shard plans (None: all; :mod:`~loraplane.cache_manager.sharding`).
        Versions of other base models are FOREIGN here (their room counts as taken); every
        worker is still followed (its reports answer any shard's commands)."""
        self.prewarm_ttl_s = prewarm_ttl_s
        self.rollback_boost_ttl_s = rollback_boost_ttl_s
        self.versions: dict[str, VersionRecord] = {}
        self.pointers: dict[str, Pointers] = {}
        """By adapter id."""
        self.stats: dict[str, VersionStats] = {}
        self.workers: dict[str, WorkerView] = {}
        self.boosts: dict[str, Boost] = {}
        """Temporary HOT requirements by version id (prewarm, rollback)."""
        self.canary_since: dict[str, float] = {}
        """When each current canary became canary (for warm-up tracking)."""
        self.hits: dict[tuple[str, Tier], int] = {}
        """Completed requests by (version id, tier at arrival)."""
        self.errors: dict[str, int] = {}
        """Failed requests by version id."""
        self.ranking: AdaptiveRanking | None = None
        """The adaptive heat experts (the heat policy's order), fed every completed request."""
        self.events_applied = 0
        self.duplicates = 0
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._requests: OrderedDict[str, None] = OrderedDict()
        """Request ids already counted: the gateway and the worker may both report one."""
        self._dedupe_capacity = dedupe_capacity

    # ------------------------------------------------------------------ idempotency

    def _first_time(self, event_id: str) -> bool:
        if not event_id:
            return True
        if event_id in self._seen:
            self.duplicates += 1
            return False
        self._seen[event_id] = None
        if len(self._seen) > self._dedupe_capacity:
            self._seen.popitem(last=False)
        return True

    # ------------------------------------------------------------------ dispatch

    def manages(self, tenant_id: str) -> bool:
        """Whether this deployment manages ``tenant_id``."""
        return self.tenants is None or tenant_id in self.tenants

    def manages_base(self, base_model: str) -> bool:
        """Whether this shard plans versions of ``base_model`` (an empty name is not known to
        be foreign: the registry's record decides)."""
        return self.base_models is None or not base_model or base_model in self.base_models

    def _owns(self, ref: common_pb2.AdapterRef) -> bool:
        return self.manages(ref.tenant_id) and self.manages_base(ref.base_model)

    def _foreign(self, msg: Message) -> bool:
        """An adapter event about a tenant this deployment does not manage, or a base model
        of another shard (heat batches are filtered per completion in :meth:`_heat`)."""
        if self.tenants is None and self.base_models is None:
            return False
        if isinstance(msg, events_pb2.HeatBatch):
            return not self.manages(msg.meta.adapter.tenant_id)
        if isinstance(msg, events_pb2.PrewarmRequested):
            return not self._owns(msg.meta.adapter)
        if isinstance(msg, events_pb2.AdmissionEvent):
            arm = msg.WhichOneof("verdict")
            return arm is not None and not self._owns(getattr(msg, arm).meta.adapter)
        if isinstance(msg, events_pb2.LifecycleEvent):
            arm = msg.WhichOneof("event")
            return arm is not None and not self._owns(getattr(msg, arm).meta.adapter)
        return False

    def apply(self, msg: Message, now: float) -> Applied:
        """Apply one consumed event: its type's handler (:data:`_ROUTES`), once per event id
        (idempotent on ``meta.event_id``); an event of another type is ignored."""
        out = Applied()
        route = _ROUTES.get(type(msg))
        if route is None or self._foreign(msg):
            return out
        event_id = route.event_id(msg)
        if event_id is None:
            return out
        if not self._first_time(event_id):
            out.duplicate = True
            return out
        route.handle(self, msg, now, out)
        self.events_applied += 1
        return out

    # ------------------------------------------------------------------ versions

    def record_of(self, ref: Ref, engine_id: int, out: Applied) -> VersionRecord:
        """The record of ``ref``, creating a provisional (UNKNOWN) one to resolve."""
        vid = ref.version_id
        rec = self.versions.get(vid)
        if rec is None:
            if not self.manages(ref.tenant_id) or not self.manages_base(ref.base_model):
                rec = VersionRecord(ref=ref, status=Status.FOREIGN, engine_id=engine_id)
                self.versions[vid] = rec
                return rec
            rec = VersionRecord(ref=ref, status=Status.UNKNOWN, engine_id=engine_id)
            self.versions[vid] = rec
            out.unresolved.append(vid)
        elif rec.engine_id == 0 and engine_id:
            rec = replace(rec, engine_id=engine_id)
            self.versions[vid] = rec
        return rec

    def upsert_version(self, record: VersionRecord) -> None:
        """Registry facts about one version (the registry is the source of truth); a version
        of another shard's base model is kept FOREIGN."""
        if not self.manages_base(record.ref.base_model):
            record = record.with_status(Status.FOREIGN)
        self.versions[record.version_id] = record
        if record.status is Status.CANARY:
            self.canary_since.setdefault(record.version_id, 0.0)

    def set_pointers(self, adapter_id: str, pointers: Pointers) -> None:
        """Registry release pointers of one adapter."""
        self.pointers[adapter_id] = pointers

    def resolve(self, vid: str, record: VersionRecord | None) -> None:
        """Answer for a version seen before the registry spoke of it (None: unknown there)."""
        if record is not None:
            self.upsert_version(record)
            return
        rec = self.versions.get(vid)
        if rec is not None and rec.status is Status.UNKNOWN:
            self.versions[vid] = rec.with_status(Status.GONE)

    def load_registry(
        self, records: Iterable[VersionRecord], pointers: dict[str, Pointers]
    ) -> None:
        """Bulk-load the registry view (bootstrap and periodic refresh)."""
        for rec in records:
            self.upsert_version(rec)
        for adapter_id, ptr in pointers.items():
            self.set_pointers(adapter_id, ptr)

    def unresolved(self) -> list[str]:
        """Version ids still UNKNOWN (to ask the registry about)."""
        return sorted(v for v, r in self.versions.items() if r.status is Status.UNKNOWN)

    def is_canary(self, rec: VersionRecord) -> bool:
        """Active canary: the adapter's canary pointer with a share > 0."""
        ptr = self.pointers.get(rec.ref.adapter_id)
        return ptr is not None and ptr.canary == rec.ref.version and ptr.canary_percent > 0

    def is_staged_canary(self, rec: VersionRecord) -> bool:
        """Canary pointer set (any share, including 0: staged before traffic)."""
        ptr = self.pointers.get(rec.ref.adapter_id)
        return ptr is not None and ptr.canary == rec.ref.version and rec.status.loadable

    def is_rollback_target(self, rec: VersionRecord) -> bool:
        """The version a rollback of its adapter would return to."""
        ptr = self.pointers.get(rec.ref.adapter_id)
        return (
            ptr is not None
            and bool(ptr.rollback_target)
            and ptr.rollback_target == rec.ref.version
            and ptr.stable != rec.ref.version
        )

    def canaries(self) -> tuple[set[str], set[str]]:
        """Version ids of (staged canaries: pointer set, any share; active: share > 0)."""
        staged: set[str] = set()
        active: set[str] = set()
        for adapter_id, ptr in self.pointers.items():
            if not ptr.canary:
                continue
            tenant, _, name = adapter_id.partition("/")
            vid = version_id(tenant, name, ptr.canary)
            staged.add(vid)
            if ptr.canary_percent > 0:
                active.add(vid)
        return staged, active

    def stable_of(self, adapter_id: str) -> str:
        """Stable version id of an adapter ("" if none)."""
        ptr = self.pointers.get(adapter_id)
        if ptr is None or not ptr.stable:
            return ""
        tenant, _, name = adapter_id.partition("/")
        return version_id(tenant, name, ptr.stable)

    # ------------------------------------------------------------------ heat

    def stats_of(self, vid: str) -> VersionStats:
        """Mutable statistics of a version (created on first use)."""
        st = self.stats.get(vid)
        if st is None:
            st = VersionStats(self.tau_s, self.tau_warm_s)
            self.stats[vid] = st
        return st

    def _heat(self, batch: events_pb2.HeatBatch, now: float, out: Applied) -> None:
        burst = False
        for c in batch.completions:
            a = c.meta.adapter
            if not a.adapter_name:
                continue  # base-model request: no adapter to place
            if self.base_models is not None and not self.manages_base(a.base_model):
                continue  # another shard's base model
            if c.request_id:
                if c.request_id in self._requests:
                    continue  # the same request reported by another producer
                self._requests[c.request_id] = None
                if len(self._requests) > self._dedupe_capacity:
                    self._requests.popitem(last=False)
            ref = Ref.of(a)
            vid = ref.version_id
            if vid not in self.versions:
                self.record_of(ref, c.engine_id, out)
            t = min(ts_seconds(c.meta.occurred_at, now), now)
            st = self.stats_of(vid)
            cls = request_class_from_proto(c.request_class)
            st.record_request(t, cls)
            if self.ranking is not None:
                rec = self.versions[vid]
                ptr = self.pointers.get(ref.adapter_id)
                canary = ptr is not None and ptr.canary == ref.version and ptr.canary_percent > 0
                self.ranking.observe(vid, c.worker_id, cls, rec.priority, canary, t)
            failed = c.status_code != 0
            st.finish_request(error=failed)
            if failed:
                self.errors[vid] = self.errors.get(vid, 0) + 1
            tier = tier_from_proto(c.tier_at_arrival)
            key = (vid, tier)
            self.hits[key] = self.hits.get(key, 0) + 1
            if not burst and not self.hot_anywhere(vid):
                burst = True
        if burst:
            out.triggers.append("burst")

    def hot_anywhere(self, vid: str) -> bool:
        """Whether ``vid`` is HOT on at least one alive worker."""
        for w in self.workers.values():
            if w.alive:
                p = w.placements.get(vid)
                if p is not None and p.tier is Tier.HOT:
                    return True
        return False

    # ------------------------------------------------------------------ worker reports

    def _report(self, rep: events_pb2.WorkerReport, now: float, out: Applied) -> None:
        wid = rep.worker_id
        if not wid:
            return
        t = min(ts_seconds(rep.meta.occurred_at, now), now)
        arm = rep.WhichOneof("report")
        w = self.workers.get(wid)
        if arm == "state":
            self._snapshot(rep.state, t, out)
            return
        if w is None:
            # Reports from a worker we have no snapshot of: remember it exists, wait for the
            # snapshot before commanding it.
            w = WorkerView(worker_id=wid, last_seen=t)
            self.workers[wid] = w
        self._touch(w, t, out)
        ref = Ref.of(rep.meta.adapter)
        # A report older than the snapshot we hold is already reflected in it (e.g. replayed
        # after a takeover that fetched the state directly): answer its command, change nothing.
        full_vid = ref.version_id if ref.adapter_name else ""
        vid = full_vid if t >= w.snapshot_at else ""
        if arm == "loaded":
            ld = rep.loaded
            if vid:
                rec = self.record_of(ref, ld.engine_id, out)
                tier = tier_from_proto(ld.tier)
                p = w.placements.get(vid)
                if p is None:
                    p = Placement(ref=ref, tier=Tier.COLD, size_bytes=rec.size_bytes,
                                  engine_id=ld.engine_id or rec.engine_id, rank=rec.rank,
                                  sha256=rec.sha256)
                    w.placements[vid] = p
                if tier is Tier.HOT and p.tier is not Tier.HOT:
                    self.stats_of(vid).record_load()
                if p.tier is not tier:
                    p.loaded_at = t
                p.tier = tier
                p.pinned = ld.pinned and tier is Tier.HOT
            if rep.command_id:
                out.outcomes.append(Outcome(rep.command_id, wid, full_vid, ok=True))
        elif arm == "evicted":
            ev = rep.evicted
            if vid:
                to = tier_from_proto(ev.to_tier)
                if to is Tier.COLD:
                    w.placements.pop(vid, None)
                else:
                    p = w.placements.get(vid)
                    if p is not None:
                        p.tier = Tier.WARM
                        p.pinned = False
                        p.loaded_at = t
            if rep.command_id:
                out.outcomes.append(Outcome(rep.command_id, wid, full_vid, ok=True))
        elif arm == "failed":
            f = rep.failed
            code = events_pb2.LoadErrorCode.Name(f.code)
            if rep.command_id:
                out.outcomes.append(
                    Outcome(rep.command_id, wid, full_vid, ok=False, retriable=f.retriable,
                            code=code, message=f.message)
                )

    def _touch(self, w: WorkerView, t: float, out: Applied) -> None:
        w.last_seen = max(w.last_seen, t)
        if not w.alive:
            w.alive = True
            out.triggers.append("worker_back")

    def _snapshot(self, s: events_pb2.WorkerState, t: float, out: Applied) -> None:
        wid = s.worker_id
        w = self.workers.get(wid)
        started = ts_seconds(s.started_at, 0.0)
        if w is not None and (started, s.seq) <= (w.started_at, w.seq):
            w.last_seen = max(w.last_seen, t)
            return  # stale or repeated snapshot
        if w is None:
            w = WorkerView(worker_id=wid)
            self.workers[wid] = w
            out.triggers.append("worker_joined")
        elif started > w.started_at and w.started_at > 0.0:
            out.triggers.append("worker_restarted")
            out.restarted_workers.append(wid)
        elif not w.synced:
            out.triggers.append("worker_synced")
        was_alive = w.alive
        w.started_at, w.seq = started, s.seq
        w.grpc_address = s.grpc_address
        w.ready = s.ready
        w.warm_bytes_capacity = s.warm_bytes_capacity
        w.capacities = {
            c.base_model: Capacity(c.hot_slots_capacity, c.max_lora_rank, c.tokenizer_revision,
                                   c.gpu_slots, c.gpu_slots_used)
            for c in s.capacities
        }
        for bm in s.base_models:
            w.capacities.setdefault(bm, Capacity(0))
        placements: dict[str, Placement] = {}
        for ap in s.placements:
            ref = Ref.of(ap.adapter)
            if not ref.adapter_name:
                continue
            vid = ref.version_id
            rec = self.record_of(ref, ap.engine_id, out)
            last_used = ts_seconds(ap.last_used_at, 0.0) or None
            placements[vid] = Placement(
                ref=ref,
                tier=tier_from_proto(ap.tier),
                pinned=ap.pinned,
                in_flight=ap.in_flight,
                size_bytes=ap.size_bytes or rec.size_bytes,
                engine_id=ap.engine_id or rec.engine_id,
                loaded_at=ts_seconds(ap.loaded_at, t),
                last_used_at=last_used,
                sha256=ap.sha256,
                rank=ap.rank,
                slot_resident=ap.slot_resident,
            )
            if last_used is not None:
                # After a restart of the cache manager, the worker remembers what was used.
                st = self.stats_of(vid)
                if st.last_access is None or st.last_access < last_used:
                    st.last_access = last_used
        w.placements = placements
        w.snapshot_at = max(w.snapshot_at, t)
        w.synced = True
        w.last_seen = max(w.last_seen, t)
        if not was_alive:
            w.alive = True
            out.triggers.append("worker_back")

    def expire_workers(self, now: float, timeout_s: float) -> list[str]:
        """Mark workers silent for longer than ``timeout_s`` as gone; returns the newly gone."""
        gone: list[str] = []
        for w in self.workers.values():
            if w.alive and now - w.last_seen > timeout_s:
                w.alive = False
                w.synced = False
                gone.append(w.worker_id)
        return sorted(gone)

    # ------------------------------------------------------------------ registry events

    def _admission(self, ev: events_pb2.AdmissionEvent, out: Applied) -> None:
        arm = ev.WhichOneof("verdict")
        if arm == "admitted":
            a = ev.admitted
            ref = Ref.of(a.meta.adapter)
            old = self.versions.get(ref.version_id)
            keep = old is not None and old.status in (Status.ACTIVE, Status.CANARY,
                                                      Status.RETIRED)
            status = old.status if (old is not None and keep) else Status.ADMITTED
            self.versions[ref.version_id] = VersionRecord(
                ref=ref,
                status=status,
                engine_id=a.engine_id,
                artifact_uri=a.artifact_uri,
                sha256=a.sha256,
                size_bytes=a.size_bytes,
                rank=a.rank,
                priority=priority_from_proto(a.priority),
            )
            ptr = self.pointers.get(ref.adapter_id)
            if ptr is not None and ptr.canary == ref.version:
                out.triggers.append("canary")
        elif arm == "rejected":
            r = ev.rejected
            ref = Ref.of(r.meta.adapter)
            rec = self.record_of(ref, r.engine_id, out)
            self.versions[ref.version_id] = rec.with_status(Status.REJECTED)
            if ref.version_id in out.unresolved:
                out.unresolved.remove(ref.version_id)

    def _set_status(self, ref: Ref, engine_id: int, status: Status, out: Applied) -> None:
        rec = self.record_of(ref, engine_id, out)
        if rec.status is Status.UNKNOWN:
            # Keep it UNKNOWN until the registry gives the artifact (cannot load without it),
            # but remember the status the event told us.
            self.versions[ref.version_id] = rec.with_status(status)
            if ref.version_id not in out.unresolved:
                out.unresolved.append(ref.version_id)
            return
        if rec.status is Status.RETIRED and status is not Status.RETIRED:
            return
        self.versions[ref.version_id] = rec.with_status(status)

    def _demote_status(self, adapter_id: str, version: str, out: Applied) -> None:
        """A version leaves the stable/canary pointer: it stays loadable (ADMITTED)."""
        if not version:
            return
        tenant, _, name = adapter_id.partition("/")
        rec = self.versions.get(version_id(tenant, name, version))
        if rec is not None and rec.status in (Status.ACTIVE, Status.CANARY):
            self.versions[rec.version_id] = rec.with_status(Status.ADMITTED)

    def _lifecycle(self, ev: events_pb2.LifecycleEvent, now: float, out: Applied) -> None:
        arm = ev.WhichOneof("event")
        if arm == "promoted":
            p = ev.promoted
            ref = Ref.of(p.meta.adapter)
            ptr = self.pointers.get(ref.adapter_id, Pointers())
            previous = p.previous_stable_version or ptr.stable
            if previous and previous != ref.version:
                self._demote_status(ref.adapter_id, previous, out)
            canary = "" if ptr.canary == ref.version else ptr.canary
            self.pointers[ref.adapter_id] = replace(
                ptr, stable=ref.version, previous_stable=previous if previous != ref.version
                else ptr.previous_stable, canary=canary,
                canary_percent=ptr.canary_percent if canary else 0,
            )
            self.canary_since.pop(ref.version_id, None)
            self._set_status(ref, p.engine_id, Status.ACTIVE, out)
            out.triggers.append("promoted")
        elif arm == "canary_changed":
            c = ev.canary_changed
            ref = Ref.of(c.meta.adapter)
            ptr = self.pointers.get(ref.adapter_id, Pointers())
            if ptr.canary and ptr.canary != c.canary_version:
                self._demote_status(ref.adapter_id, ptr.canary, out)
                tenant, _, name = ref.adapter_id.partition("/")
                self.canary_since.pop(version_id(tenant, name, ptr.canary), None)
            self.pointers[ref.adapter_id] = replace(
                ptr, canary=c.canary_version, canary_percent=int(c.percent)
            )
            if c.canary_version:
                cref = replace(ref, version=c.canary_version)
                self.canary_since.setdefault(cref.version_id, now)
                self._set_status(cref, c.engine_id, Status.CANARY, out)
            out.triggers.append("canary")
        elif arm == "rolled_back":
            rb = ev.rolled_back
            ref = Ref.of(rb.meta.adapter)
            to_ref = replace(ref, version=rb.to_version or ref.version)
            ptr = self.pointers.get(ref.adapter_id, Pointers())
            from_vid = replace(ref, version=rb.from_version).version_id
            replicas = sum(
                1 for w in self.workers.values()
                if w.alive and w.tier_of(from_vid) is Tier.HOT
            )
            self._demote_status(ref.adapter_id, rb.from_version, out)
            self.pointers[ref.adapter_id] = replace(
                ptr, stable=to_ref.version, previous_stable=rb.from_version, rollback_to=""
            )
            self._set_status(to_ref, rb.engine_id, Status.ACTIVE, out)
            self.boosts[to_ref.version_id] = Boost(
                replicas=max(1, replicas), until=now + self.rollback_boost_ttl_s,
                reason=Reason.ROLLBACK,
            )
            out.triggers.append("rollback")
        elif arm == "retired":
            r = ev.retired
            ref = Ref.of(r.meta.adapter)
            self._set_status(ref, r.engine_id, Status.RETIRED, out)
            current = self.pointers.get(ref.adapter_id)
            if current is not None and current.canary == ref.version:
                self.pointers[ref.adapter_id] = replace(current, canary="", canary_percent=0)
            self.boosts.pop(ref.version_id, None)
            self.canary_since.pop(ref.version_id, None)
            out.triggers.append("retire")

    def _prewarm(self, ev: events_pb2.PrewarmRequested, now: float, out: Applied) -> None:
        ref = Ref.of(ev.meta.adapter)
        if not ref.adapter_name:
            return
        self.record_of(ref, ev.engine_id, out)
        old = self.boosts.get(ref.version_id)
        replicas = 1 if old is None else max(1, old.replicas)
        self.boosts[ref.version_id] = Boost(
            replicas=replicas, until=now + self.prewarm_ttl_s, reason=ev.reason or Reason.PREWARM,
            target_worker=ev.target_worker_id,
        )
        if not self.hot_anywhere(ref.version_id):
            out.triggers.append("prewarm")

    def expire_boosts(self, now: float) -> None:
        """Forget prewarm / rollback requirements past their deadline."""
        for vid in [v for v, b in self.boosts.items() if b.until <= now]:
            del self.boosts[vid]


@dataclass(frozen=True)
class _Route:
    """How :meth:`State.apply` applies one event type."""

    event_id: Callable[[Any], str | None]
    """The id the event is applied once on (None: nothing in it to apply)."""
    handle: Callable[[State, Any, float, Applied], None]
    """The state change: ``(state, event, now, out)``."""


def _meta_id(ev: Any) -> str | None:
    return str(ev.meta.event_id)


def _admission_id(ev: events_pb2.AdmissionEvent) -> str | None:
    inner = ev.admitted if ev.WhichOneof("verdict") == "admitted" else ev.rejected
    return inner.meta.event_id


def _lifecycle_id(ev: events_pb2.LifecycleEvent) -> str | None:
    arm = ev.WhichOneof("event")
    return None if arm is None else str(getattr(ev, arm).meta.event_id)


_ROUTES: dict[type[Message], _Route] = {
    events_pb2.HeatBatch: _Route(_meta_id, State._heat),
    events_pb2.WorkerReport: _Route(_meta_id, State._report),
    events_pb2.AdmissionEvent: _Route(
        _admission_id, lambda state, ev, _now, out: state._admission(ev, out)),
    events_pb2.LifecycleEvent: _Route(_lifecycle_id, State._lifecycle),
    events_pb2.PrewarmRequested: _Route(_meta_id, State._prewarm),
}
"""Every event type the cache manager's state follows, with its handler."""
