"""From state to commands: policy plan + business rules + safety guards (pure).

One planning round (:meth:`Planner.plan`):

1. **Projection.** Start from the placement of every *commandable* worker
   (alive, synced, ready) and apply the expected effect of every pending
   command, so a load already on its way is never decided twice.
2. **Policy.** Freeze that projection into a :class:`~loraplane.policy.snapshot.Snapshot`
   (versions that may be loaded, statistics, capacities; versions that must go —
   retired, rejected, unknown to the registry — are left out and their room is
   subtracted) and ask the policy for a plan. Actions on one (worker, version)
   are merged into one command (promote + pin → ``LOAD_HOT(pin)``, demote +
   evict → ``EVICT``).
3. **Business rules** (:mod:`~loraplane.cache_manager.rules`): drain and evict
   versions that must go; keep canaries, rollback targets, prewarm requests and
   scheduled windows HOT on enough workers (taking a free slot, else displacing
   the coolest unprotected idle version); keep rollback targets WARM; load on
   demand where a slot is free. A rule wins over the policy on the same key:
   the policy may not demote what a rule requires HOT. A staged canary under a prewarm
   schedule is prefetched WARM to each of its target workers (:mod:`.prewarm`).
4. **Guards.** Drop what is unsafe or not allowed now: a command for a key with
   one in flight or backing off (:class:`~loraplane.cache_manager.tracker.CommandTracker`),
   a load beyond a worker's slots, a pin that would leave no unpinned slot
   (engine killer: every slot pinned; counted in GPU slots, :func:`pin_slots`), a rank above the engine's ``max_lora_rank``,
   a base model the worker does not serve, a version without artifact, and a demotion
   or eviction of a protected version's last confirmed HOT replica (make before break:
   a move of an active canary or platinum version loads the new replica first; the
   old one goes in a later round, once the new one is reported HOT); then cap
   removals and loads per round.

The result is an ordered list of :class:`~loraplane.cache_manager.model.CommandSpec`
(what frees room first) plus notes for the log.
"""

from __future__ import annotations

import logging
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from loraplane.cache_manager import prewarm
from loraplane.cache_manager.model import (
    CommandKind,
    CommandSpec,
    Pointers,
    Status,
    Tier,
    VersionRecord,
)
from loraplane.cache_manager.rules import RulesConfig
from loraplane.cache_manager.state import Boost, Capacity, State, WorkerView
from loraplane.cache_manager.tracker import CommandTracker
from loraplane.policy.config import PolicyConfig
from loraplane.policy.cost import Bandwidths
from loraplane.policy.online import CachePolicy
from loraplane.policy.placement import HostOption, rank_hosts
from loraplane.policy.plan import ActionKind, Plan, Reason
from loraplane.policy.planner import by_base_model, total_bytes
from loraplane.policy.predicates import max_pins, protection_of
from loraplane.policy.ranking import RankedVersion, RankedWorker
from loraplane.policy.score import hot_terms, warm_value
from loraplane.policy.snapshot import Snapshot, VersionMeta, WorkerState
from loraplane.policy.stats import StatsView
from loraplane.policy.victims import HotMember, hot_victim

log = logging.getLogger(__name__)

EMPTY_STATS = StatsView()


# --------------------------------------------------------------------------- projection


@dataclass(slots=True)
class Slot:
    """Projected placement of one version on one worker."""

    tier: Tier
    pinned: bool = False
    in_flight: int = 0
    loaded_at: float = 0.0


@dataclass(slots=True)
class Projection:
    """Projected placement of one commandable worker."""

    view: WorkerView
    slots: dict[str, Slot] = field(default_factory=dict)
    _hot: dict[str, int] | None = None
    """HOT versions per base model, counted once and kept until :meth:`apply` changes
    ``slots`` (a round asks for it per candidate host and requirement)."""

    def hot_count(self, base_model: str, versions: dict[str, VersionRecord]) -> int:
        """HOT versions of ``base_model`` here (the policy's slot grouping, ``by_base_model``)."""
        hot = self._hot
        if hot is None:
            hot = {bm: len(group) for bm, group in by_base_model(
                (v for v, s in self.slots.items() if s.tier is Tier.HOT),
                lambda v: _bm(versions, v, self.view)).items()}
            self._hot = hot
        return hot.get(base_model, 0)

    def pinned_count(self, base_model: str, versions: dict[str, VersionRecord]) -> int:
        """Pinned versions of ``base_model`` here."""
        pinned = by_base_model(
            (v for v, s in self.slots.items() if s.tier is Tier.HOT and s.pinned),
            lambda v: _bm(versions, v, self.view))
        return len(pinned.get(base_model, ()))

    def used_bytes(self, versions: dict[str, VersionRecord]) -> int:
        """Host bytes of every resident version (the policy's ``total_bytes``)."""
        return total_bytes(self.slots, lambda v: _size(versions, v, self.view))

    def apply(self, kind: CommandKind, vid: str, pin: bool = False) -> None:
        """Apply the expected effect of a command."""
        self._hot = None
        s = self.slots.get(vid)
        if kind is CommandKind.LOAD_HOT:
            if s is None:
                s = Slot(Tier.HOT)
                self.slots[vid] = s
            s.tier = Tier.HOT
            s.pinned = s.pinned or pin
        elif kind is CommandKind.LOAD_WARM:
            if s is None:
                self.slots[vid] = Slot(Tier.WARM)
        elif kind is CommandKind.DEMOTE:
            if s is not None:
                s.tier = Tier.WARM
                s.pinned = False
        elif kind is CommandKind.EVICT:
            self.slots.pop(vid, None)
        elif kind is CommandKind.PIN:
            if s is not None and s.tier is Tier.HOT:
                s.pinned = True
        elif kind is CommandKind.UNPIN and s is not None:
            s.pinned = False


_LOADS = frozenset({CommandKind.LOAD_HOT, CommandKind.LOAD_WARM})


def pin_slots(cap: Capacity) -> int:
    """The slots pins are counted against: the engine's GPU slots (``max_loras``: vLLM pins
    into a slot, and with every slot pinned the next adapter kills it) when the worker
    reports them, which are fewer than its HOT (registered) slots at ``worker_hot_level``
    ``registered``; else the HOT slots."""
    return min(cap.slots, cap.gpu_slots) if cap.gpu_slots > 0 else cap.slots


def _bm(versions: dict[str, VersionRecord], vid: str, view: WorkerView) -> str:
    """Base model of a version on a worker: the registry's record, else the worker's report
    (the projection's source; the snapshot's ``VersionMeta`` carries the record's)."""
    rec = versions.get(vid)
    if rec is not None:
        return rec.ref.base_model
    p = view.placements.get(vid)
    return "" if p is None else p.ref.base_model


def _size(versions: dict[str, VersionRecord], vid: str, view: WorkerView) -> int:
    """Size of a version on a worker: what the worker reported, else the registry's record
    (the projection's source of sizes; the policy reads the snapshot's ``VersionMeta``)."""
    p = view.placements.get(vid)
    if p is not None and p.size_bytes:
        return p.size_bytes
    rec = versions.get(vid)
    return 0 if rec is None else rec.size_bytes


def project(state: State, tracker: CommandTracker) -> dict[str, Projection]:
    """Projected placement of every commandable worker (pending commands applied); a shard
    (``state.base_models``) projects only the workers serving one of its base models."""
    out: dict[str, Projection] = {}
    shard = state.base_models
    for wid in sorted(state.workers):
        w = state.workers[wid]
        if not w.commandable():
            continue
        if shard is not None and not any(w.serves(bm) for bm in shard):
            continue
        out[wid] = Projection(w, {
            v: Slot(p.tier, p.pinned, p.in_flight, p.loaded_at) for v, p in w.placements.items()
        })
    for pending in tracker.pending():
        target = out.get(pending.spec.worker_id)
        if target is not None:
            target.apply(pending.spec.kind, pending.spec.version_id, pending.spec.pin)
    return out


# --------------------------------------------------------------------------- round


@dataclass(slots=True)
class Requirement:
    """A version a business rule wants HOT on ``replicas`` workers."""

    version_id: str
    replicas: int
    reason: str
    target_worker: str = ""


HotOrder = tuple[tuple[int, float], ...]
"""A worker's HOT order: (engine id, keep key) of every version HOT there, by engine id."""


def order_shape(order: HotOrder) -> tuple[tuple[int, int], ...]:
    """What a worker's victim reads of a HOT order (it compares the keys of its own HOT
    versions, ``victims.hot_victim``): each engine id with its key's rank among the order's
    distinct keys (equal keys: equal ranks), not the key values."""
    rank = {k: i for i, k in enumerate(sorted({k for _, k in order}))}
    return tuple((eid, rank[k]) for eid, k in order)


@dataclass(slots=True)
class Round:
    """Result of one planning round."""

    commands: list[CommandSpec]
    notes: list[str]
    heat: dict[str, float]
    """Heat score of every version named by a command."""
    snapshot: Snapshot
    plan: Plan
    dropped: int = 0
    """Commands the guards removed this round."""
    hot_orders: dict[str, HotOrder] = field(default_factory=dict)
    """Per worker whose HOT order changed since it was last sent (:meth:`Planner.hot_orders`):
    what its request-path victim follows (``HotOrder``)."""


_REMOVES_HOT = frozenset({CommandKind.DEMOTE, CommandKind.EVICT})
"""Commands that take a version out of HOT on a worker."""
_NO_ORDER: tuple[HotOrder, tuple[tuple[int, int], ...]] = ((), ())
"""What a worker never sent a HOT order was sent (:attr:`Planner._hot_orders`)."""


class Planner:
    """Turns the state into commands (see the module docstring)."""

    def __init__(
        self,
        policy: CachePolicy,
        policy_config: PolicyConfig,
        rules: RulesConfig,
        bandwidths: Bandwidths | None = None,
    ) -> None:
        self.policy = policy
        self.policy_config = policy_config
        self.rules = rules
        self.bandwidths = bandwidths or Bandwidths()
        self._no_load: frozenset[tuple[str, str]] = frozenset()
        self._metas: dict[str, tuple[VersionRecord, bool, float, VersionMeta]] = {}
        """Policy metadata per version, rebuilt only when its inputs change."""
        self._ranked: dict[str, tuple[VersionMeta, RankedVersion]] = {}
        """What the adaptive ranking knows of each version, per cached meta."""
        self._meta_inputs: tuple[dict[str, VersionRecord], dict[str, Pointers],
                                 dict[str, Boost]] | None = None
        """Copies of what the last snapshot's metadata came from (versions, pointers, boosts):
        while they are equal and no schedule is configured, the same metadata serve again."""
        self._meta_dict: dict[str, VersionMeta] = {}
        self._meta_view: Mapping[str, VersionMeta] = MappingProxyType(self._meta_dict)
        self._ranked_versions: tuple[RankedVersion, ...] = ()
        self._hot_orders: dict[str, tuple[HotOrder, tuple[tuple[int, int], ...]]] = {}
        """The HOT order each worker was last sent (:meth:`hot_order_sent`), with its shape."""

    # ------------------------------------------------------------------ snapshot

    def warmup_reason(
        self, state: State, rec: VersionRecord, now: float, staged: set[str] | None = None
    ) -> str | None:
        """Why the business wants ``rec`` warmed now (None: it does not) — the one warm-up
        decision: it is the policy's ``VersionMeta.warmup`` signal (:meth:`build_snapshot`) and
        the business reason a policy load made for that signal carries (:meth:`_explain`).
        A staged canary (pointer set, any share), a boost (rollback, prewarm: its own reason),
        an open schedule window. ``staged``: :meth:`State.canaries`' first set, when at hand."""
        vid = rec.version_id
        if (vid in staged) if staged is not None else state.is_staged_canary(rec):
            return Reason.CANARY_WARMUP
        boost = state.boosts.get(vid)
        if boost is not None:
            return boost.reason
        if self.rules.schedules and self.scheduled_replicas(rec, state, now) > 0:
            return Reason.SCHEDULED_WARMUP
        return None

    def scheduled_replicas(self, rec: VersionRecord, state: State, now: float) -> int:
        """HOT replicas an open schedule window asks for (0 when none)."""
        best = 0
        for sch in self.rules.schedules:
            if not sch.matches(rec.ref.tenant_id, rec.ref.adapter_name):
                continue
            if sch.version is not None:
                if sch.version != rec.ref.version:
                    continue
            elif rec.status not in (Status.ACTIVE, Status.CANARY):
                continue
            if sch.is_open(now):
                best = max(best, sch.hot_replicas)
        return best

    def build_snapshot(
        self, state: State, proj: dict[str, Projection], now: float
    ) -> Snapshot:
        """Freeze the projection for the policy (versions that must go are left out)."""
        metas = self._version_metas(state, now)
        workers: list[WorkerState] = []
        for wid, pr in proj.items():
            view = pr.view
            slots = {bm: cap.slots for bm, cap in view.capacities.items()
                     if state.manages_base(bm)}  # a shard plans its own base models' slots
            warm_bytes = view.warm_bytes_capacity
            hot: set[str] = set()
            warm: set[str] = set()
            pinned: set[str] = set()
            in_flight: dict[str, int] = {}
            loaded_at: dict[str, float] = {}
            for vid, s in pr.slots.items():
                if vid not in metas:
                    # Not the policy's to place: count its room as taken.
                    if s.tier is Tier.HOT:
                        bm = _bm(state.versions, vid, view)
                        if bm in slots:
                            slots[bm] = max(0, slots[bm] - 1)
                    warm_bytes = max(0, warm_bytes - _size(state.versions, vid, view))
                    continue
                if s.tier is Tier.HOT and metas[vid].base_model in slots:
                    hot.add(vid)
                    if s.pinned:
                        pinned.add(vid)
                    loaded_at[vid] = s.loaded_at
                else:
                    warm.add(vid)
                if s.in_flight:
                    in_flight[vid] = s.in_flight
            workers.append(WorkerState(
                worker_id=wid,
                hot_slots=MappingProxyType(slots),
                warm_bytes=warm_bytes,
                hot=frozenset(hot),
                warm=frozenset(warm),
                pinned=frozenset(pinned),
                in_flight=MappingProxyType(in_flight),
                loaded_at=MappingProxyType(loaded_at),
            ))
        stats = {vid: st.view() for vid, st in state.stats.items() if vid in metas}
        ranks = None
        ranking = state.ranking
        if ranking is not None:
            ranking.update(
                # the adaptive experts over what the policy places (the simulator's code); the
                # same tuple while the metadata are the same ones (no comparison at all)
                self._ranked_versions,
                # full capacities (the snapshot's net of other versions' room would change
                # the experts' universe, and rebuild them, whenever such a version moves)
                (RankedWorker(wid, {bm: cap.slots for bm, cap in pr.view.capacities.items()},
                              pr.view.warm_bytes_capacity, frozenset(pr.slots))
                 for wid, pr in proj.items()),
            )
            ranks = ranking.ranks((w.worker_id, v) for w in workers for v in w.resident())
        # Snapshot.build's freeze, with the metadata's read-only view kept with them (the
        # same object while they serve again: the policy finds them equal at once)
        return Snapshot(versions=self._meta_view, stats=MappingProxyType(stats),
                        workers=tuple(sorted(workers, key=lambda w: w.worker_id)),
                        bandwidths=self.bandwidths, ranks=ranks)

    def _version_metas(self, state: State, now: float) -> dict[str, VersionMeta]:
        """The policy's metadata of every loadable version (a version's is rebuilt only when
        its record, canary flag or warm-up signal changes; all of them serve again as they
        are while versions, pointers and boosts are equal and no schedule is configured: the
        warm-up signal of a schedule depends on the clock)."""
        inputs = self._meta_inputs
        if (not self.rules.schedules and inputs is not None and inputs[0] == state.versions
                and inputs[1] == state.pointers and inputs[2] == state.boosts):
            return self._meta_dict
        metas: dict[str, VersionMeta] = {}
        staged, active = state.canaries()
        cache = self._metas
        fresh: dict[str, tuple[VersionRecord, bool, float, VersionMeta]] = {}
        for vid, rec in state.versions.items():
            if not rec.status.loadable:
                continue
            canary = vid in active
            warmup = 1.0 if self.warmup_reason(state, rec, now, staged) is not None else 0.0
            hit = cache.get(vid)
            if hit is not None and hit[0] is rec and hit[1] == canary and hit[2] == warmup:
                meta = hit[3]
            else:
                meta = VersionMeta(
                    version_id=vid,
                    tenant_id=rec.ref.tenant_id,
                    base_model=rec.ref.base_model,
                    priority=rec.priority,
                    size_bytes=rec.size_bytes,
                    rank=rec.rank or 16,
                    canary=canary,
                    warmup=warmup,
                )
            fresh[vid] = (rec, canary, warmup, meta)
            metas[vid] = meta
        self._metas = fresh
        ranked = self._ranked
        self._ranked = {}
        for vid, m in metas.items():
            hit_r = ranked.get(vid)
            if hit_r is None or hit_r[0] is not m:
                hit_r = (m, RankedVersion(vid, m.size_bytes, state.versions[vid].ref.adapter_id,
                                          m.tenant_id, m.base_model))
            self._ranked[vid] = hit_r
        self._ranked_versions = tuple(r for _, r in self._ranked.values())
        self._meta_inputs = (dict(state.versions), dict(state.pointers), dict(state.boosts))
        self._meta_dict = metas
        self._meta_view = MappingProxyType(metas)
        return metas

    def heat_of(self, snapshot: Snapshot, vid: str, now: float) -> float:
        """HOT-ranking heat of a version in the snapshot (0 when not in it)."""
        meta = snapshot.versions.get(vid)
        if meta is None:
            return 0.0
        return float(hot_terms(meta, snapshot.stats_of(vid), now, self.policy_config.score,
                               snapshot.bandwidths).heat)

    def warm_value_of(self, snapshot: Snapshot, vid: str, now: float) -> float:
        """WARM-ranking value of a version in the snapshot (0 when not in it): its request
        rate over the WARM window per size, without the HOT heat's liveness factor."""
        meta = snapshot.versions.get(vid)
        if meta is None:
            return 0.0
        return float(warm_value(meta, snapshot.stats_of(vid), now, self.policy_config.score,
                                snapshot.bandwidths))

    # ------------------------------------------------------------------ plan

    def plan(
        self,
        state: State,
        tracker: CommandTracker,
        now: float,
        *,
        extra: Iterable[CommandSpec] = (),
        no_load: frozenset[tuple[str, str]] = frozenset(),
    ) -> Round:
        """One planning round (see the module docstring).

        ``extra``: commands asked from outside the policy (e.g. demote a canary that failed
        its golden set), handled like business rules; ``no_load``: (worker, version) keys
        that must not be loaded now.
        """
        self._no_load = no_load
        proj = project(state, tracker)
        snapshot = self.build_snapshot(state, proj, now)
        notes: list[str] = []
        try:
            plan = self.policy.plan(snapshot, now)
        except NotImplementedError:
            plan = Plan()
            notes.append(f"policy {self.policy.name} cannot plan; business rules only")
        except Exception:  # a policy bug must not stop the rules (retire, canary) from working
            log.exception("policy %s failed", self.policy.name)
            plan = Plan()
            notes.append(f"policy {self.policy.name} failed; business rules only")
        specs = [self._explain(state, s, now) for s in self._merge(plan)]
        rule_specs, protected_keys, resident_keys = self._rules(
            state, proj, specs, snapshot, tracker, now, notes)
        rule_specs = [*extra, *rule_specs]
        # A rule wins over the policy on the same key: what it requires HOT is not demoted,
        # what it only keeps resident (a rollback target) is not evicted, but may go WARM.
        rule_keys = {(s.worker_id, s.version_id) for s in rule_specs}
        specs = [
            s for s in specs
            if (s.worker_id, s.version_id) not in rule_keys
            and not (s.kind.frees and (s.worker_id, s.version_id) in protected_keys)
            and not (s.kind is CommandKind.EVICT and (s.worker_id, s.version_id) in resident_keys)
        ]
        candidates = sorted([*specs, *rule_specs], key=CommandSpec.sort_key)
        # a version blocked from loading failed its golden set or was aborted / withdrawn
        # by the canary analysis: it loses the protection of an active canary, so its last
        # HOT replica can go at a share above 0 % too
        failing = {vid for _, vid in no_load}
        self._keep_serving = frozenset(
            s.version_id for s in candidates
            if s.kind in _REMOVES_HOT and s.version_id not in failing
            and self._protected(snapshot, s.version_id))
        accepted, dropped = self._guard(state, tracker, candidates, now, notes)
        heat = {s.version_id: self.heat_of(snapshot, s.version_id, now) for s in accepted}
        ranks = snapshot.ranks
        accepted = [
            CommandSpec(s.kind, s.worker_id, s.version_id, s.reason, s.detail, s.pin,
                        heat.get(s.version_id, 0.0), s.source,
                        never_evict=s.kind in _LOADS and self._protected(snapshot, s.version_id),
                        hot_keep=ranks.hot_key(s.version_id)
                        if ranks is not None and s.kind is CommandKind.LOAD_HOT else None)
            for s in accepted
        ]
        loading = {s.worker_id for s in accepted if s.kind is CommandKind.LOAD_HOT}
        return Round(accepted, notes, heat, snapshot, plan, dropped,
                     self.hot_orders(state, snapshot, loading))

    def hot_orders(self, state: State, snapshot: Snapshot,
                   loading: Container[str] = frozenset()) -> dict[str, HotOrder]:
        """Per worker whose order changed since it was last sent: the round's HOT keep key
        (``Ranks.hot_key``) of every version HOT there, by engine id — what the worker's
        request-path victim follows (``HotOrder``), so that it takes the victim the heat plan
        would. Empty without a ranking. The victim only compares the keys of one worker's
        HOT versions, so an order whose keys moved without changing how they compare
        (:func:`order_shape`) is not sent again: under live traffic the values move every
        round. ``loading``: workers sent a HOT load this round; the load carries this
        round's key (``hot_keep``), so they get this round's keys of the others too, to
        compare with. A restarted worker's HOT set (and so its order) changes as it loads
        again."""
        ranks = snapshot.ranks
        if ranks is None:
            return {}
        out: dict[str, HotOrder] = {}
        for wid, w in state.workers.items():
            if not w.alive:
                continue
            order = tuple(sorted(
                (rec.engine_id, ranks.hot_key(vid)) for vid in w.hot()
                if (rec := state.versions.get(vid)) is not None and rec.engine_id
            ))
            sent, shape = self._hot_orders.get(wid, _NO_ORDER)  # an empty HOT set needs none
            if order == sent:
                continue  # the very order sent: nothing to send again
            if (order and wid in loading) or shape != order_shape(order):
                out[wid] = order
        return out

    def hot_order_sent(self, worker_id: str, order: HotOrder) -> None:
        """``order`` reached the broker for ``worker_id`` (sent again only once it changes)."""
        self._hot_orders[worker_id] = (order, order_shape(order))

    def _protected(self, snapshot: Snapshot, vid: str) -> bool:
        """Whether the policy protects ``vid`` (active canary, protected priority)."""
        meta = snapshot.versions.get(vid)
        return meta is not None and protection_of(meta, self.policy_config) is not None

    def _explain(self, state: State, spec: CommandSpec, now: float) -> CommandSpec:
        """Name the business reason behind a policy load driven by the warm-up signal
        (:meth:`warmup_reason`: the same decision that set the signal)."""
        if spec.kind.frees or spec.reason != Reason.SCHEDULED_WARMUP:
            return spec
        rec = state.versions.get(spec.version_id)
        if rec is None:
            return spec
        reason = self.warmup_reason(state, rec, now)
        if reason is None or reason == Reason.SCHEDULED_WARMUP:
            return spec
        detail = f"{spec.detail} (policy reason: scheduled_warmup)".strip()
        return CommandSpec(spec.kind, spec.worker_id, spec.version_id, reason, detail, spec.pin,
                           spec.heat, spec.source)

    def _merge(self, plan: Plan) -> list[CommandSpec]:
        """One command per (worker, version) from the plan's actions."""
        groups: dict[tuple[str, str], list[tuple[ActionKind, str, str]]] = {}
        for a in plan:
            groups.setdefault((a.worker_id, a.version_id), []).append(
                (a.kind, a.reason.value, a.detail)
            )
        out: list[CommandSpec] = []
        name = self.policy.name
        for (wid, vid), acts in groups.items():
            kinds = {k for k, _, _ in acts}
            frees = kinds & {ActionKind.UNPIN, ActionKind.DEMOTE, ActionKind.EVICT}
            takes = kinds & {ActionKind.PREFETCH, ActionKind.PROMOTE, ActionKind.PIN}
            if frees and takes and kinds != {ActionKind.UNPIN, ActionKind.PROMOTE}:
                log.warning("policy %s: contradictory actions on %s/%s: %s", name, wid, vid,
                            sorted(k.value for k in kinds))
                continue

            def pick(kind: ActionKind, acts: list[tuple[ActionKind, str, str]] = acts) -> tuple[
                    str, str]:
                for k, r, d in acts:
                    if k is kind:
                        return r, d
                return acts[0][1], acts[0][2]

            if ActionKind.EVICT in kinds:
                r, d = pick(ActionKind.EVICT)
                out.append(CommandSpec(CommandKind.EVICT, wid, vid, r, d, source=name))
            elif ActionKind.DEMOTE in kinds:
                r, d = pick(ActionKind.DEMOTE)
                out.append(CommandSpec(CommandKind.DEMOTE, wid, vid, r, d, source=name))
            elif ActionKind.PROMOTE in kinds:
                r, d = pick(ActionKind.PROMOTE)
                out.append(CommandSpec(CommandKind.LOAD_HOT, wid, vid, r, d,
                                       pin=ActionKind.PIN in kinds, source=name))
            elif ActionKind.PREFETCH in kinds:
                r, d = pick(ActionKind.PREFETCH)
                out.append(CommandSpec(CommandKind.LOAD_WARM, wid, vid, r, d, source=name))
            elif ActionKind.PIN in kinds:
                r, d = pick(ActionKind.PIN)
                out.append(CommandSpec(CommandKind.PIN, wid, vid, r, d, source=name))
            elif ActionKind.UNPIN in kinds:
                r, d = pick(ActionKind.UNPIN)
                out.append(CommandSpec(CommandKind.UNPIN, wid, vid, r, d, source=name))
        return out

    # ------------------------------------------------------------------ rules

    def requirements(self, state: State, now: float) -> list[Requirement]:
        """Versions the business rules want HOT, with replica counts (most important first)."""
        reqs: dict[str, Requirement] = {}

        def want(vid: str, replicas: int, reason: str, target: str = "") -> None:
            rec = state.versions.get(vid)
            if rec is None or not rec.status.loadable or replicas <= 0:
                return
            old = reqs.get(vid)
            if old is None or replicas > old.replicas:
                reqs[vid] = Requirement(vid, replicas, reason, target or
                                        (old.target_worker if old else ""))

        for vid in state.canaries()[0]:  # want() keeps the loadable ones: is_staged_canary
            want(vid, self.rules.canary.warm_replicas, Reason.CANARY_WARMUP)
        for vid, boost in state.boosts.items():
            if boost.until > now:
                want(vid, boost.replicas, boost.reason, boost.target_worker)
        if self.rules.schedules:
            for vid, rec in state.versions.items():
                n = self.scheduled_replicas(rec, state, now)
                if n:
                    want(vid, n, Reason.SCHEDULED_WARMUP)
        if self.rules.demand.enabled:
            horizon = now - self.rules.demand.window_s
            for vid, st in state.stats.items():
                recent = st.last_access is not None and st.last_access >= horizon
                if recent and vid not in reqs:
                    want(vid, 1, Reason.DEMAND)
        order: dict[str, int] = {Reason.ROLLBACK: 0, Reason.CANARY_WARMUP: 1,
                                 Reason.SCHEDULED_WARMUP: 2}
        return sorted(reqs.values(), key=lambda r: (order.get(r.reason, 3), r.version_id))

    def _rules(
        self,
        state: State,
        proj: dict[str, Projection],
        policy_specs: list[CommandSpec],
        snapshot: Snapshot,
        tracker: CommandTracker,
        now: float,
        notes: list[str],
    ) -> tuple[list[CommandSpec], set[tuple[str, str]], set[tuple[str, str]]]:
        """The business rules' commands, the (worker, version) keys they keep from every
        removal (required HOT, a prewarmed canary's WARM copy) and the keys they keep from
        eviction only (a rollback target: resident, HOT or WARM)."""
        versions = state.versions
        resident: set[tuple[str, str]] = set()
        out: list[CommandSpec] = []
        # Projection after the policy's plan (rules build on what the policy does).
        for s in policy_specs:
            pr = proj.get(s.worker_id)
            if pr is not None:
                pr.apply(s.kind, s.version_id, s.pin)

        # 1. Versions that must go: drain (wait for in-flight) then evict everywhere.
        for wid, pr in proj.items():
            for vid in sorted(pr.view.placements):
                rec = versions.get(vid)
                if rec is None or not rec.status.to_drop:
                    continue
                p = pr.view.placements[vid]
                if p.in_flight > 0:
                    notes.append(f"draining {vid} on {wid}: {p.in_flight} in flight")
                    continue
                reason = {Status.RETIRED: Reason.RETIRED, Status.REJECTED: Reason.REJECTED}.get(
                    rec.status, Reason.UNKNOWN_VERSION)
                out.append(CommandSpec(CommandKind.EVICT, wid, vid, reason,
                                       f"{vid} is {rec.status.value}", source="rule:drop"))
                pr.apply(CommandKind.EVICT, vid)

        # 2. Requirements: HOT on enough workers.
        reqs = self.requirements(state, now)
        required = {r.version_id for r in reqs}
        protected: set[tuple[str, str]] = set()
        # where each required version is HOT, in worker order: what the loop below changes
        # never alters it (it loads the version it serves, and displaces no required one)
        hot_holders: dict[str, list[str]] = {vid: [] for vid in required}
        for wid, pr in proj.items():
            slots = pr.slots
            for vid in required.intersection(slots):
                if slots[vid].tier is Tier.HOT:
                    hot_holders[vid].append(wid)
        for req in reqs:
            rec = versions[req.version_id]
            vid = req.version_id
            holders = hot_holders[vid]
            for wid in holders[: req.replicas]:
                protected.add((wid, vid))
            missing = req.replicas - len(holders)
            if missing <= 0:
                continue
            displace = req.reason != Reason.DEMAND
            bm = rec.ref.base_model
            if not displace and not any(
                    pr.view.serves(bm) and pr.view.capacities[bm].slots
                    > pr.hot_count(bm, versions) for pr in proj.values()):
                candidates = []  # demand takes free slots only, and none is free anywhere
            else:
                candidates = self._hosts(rec, versions, proj, holders, req.target_worker,
                                         tracker, now)
            for wid in candidates:
                if missing <= 0:
                    break
                pr = proj[wid]
                bm = rec.ref.base_model
                free = pr.view.capacities[bm].slots - pr.hot_count(bm, versions)
                if free <= 0:
                    if not displace:
                        continue
                    victim = self._victim(pr, bm, required, snapshot, tracker, now)
                    if victim is None:
                        continue
                    out.append(CommandSpec(
                        CommandKind.DEMOTE, wid, victim, Reason.DISPLACED,
                        f"room for {vid} ({req.reason})", source=f"rule:{req.reason}",
                    ))
                    pr.apply(CommandKind.DEMOTE, victim)
                out.append(CommandSpec(
                    CommandKind.LOAD_HOT, wid, vid, req.reason,
                    f"{req.reason}: {req.replicas} HOT replica(s) required",
                    source=f"rule:{req.reason}",
                ))
                pr.apply(CommandKind.LOAD_HOT, vid)
                protected.add((wid, vid))
                missing -= 1
            if missing > 0:
                notes.append(f"{vid}: {missing} of {req.replicas} HOT replica(s) short "
                             f"({req.reason}): no worker with room")

        # 2b. Canary prewarm schedules: verified bytes on every target worker (free bytes).
        out += self._canary_prewarm(state, proj, tracker, now, notes, protected)
        out += self._join_prewarm(state, proj, snapshot, tracker, now)

        # 3. Rollback targets stay WARM where the stable version is HOT (free bytes only).
        rb = self.rules.rollback
        if rb.keep_target_warm and rb.warm_replicas > 0:
            for adapter_id in sorted(state.pointers):
                ptr = state.pointers[adapter_id]
                target = ptr.rollback_target
                if not target or target == ptr.stable:
                    continue
                tenant, _, name = adapter_id.partition("/")
                tvid = f"{tenant}/{name}@{target}"
                rec = versions.get(tvid)
                if rec is None or not rec.status.loadable or not rec.artifact_uri:
                    continue
                stable_vid = state.stable_of(adapter_id)
                holders = [w for w, pr in proj.items() if tvid in pr.slots]
                for wid in holders[: rb.warm_replicas]:
                    # kept on the host, not HOT: the policy may still demote a HOT copy to
                    # WARM (vetoing that while its load into the freed slot goes ahead left
                    # the load without a slot, round after round)
                    resident.add((wid, tvid))
                need = rb.warm_replicas - len(holders)
                for wid, pr in proj.items():
                    if need <= 0:
                        break
                    if tvid in pr.slots or stable_vid not in pr.slots:
                        continue
                    if not pr.view.serves(rec.ref.base_model):
                        continue
                    room = pr.view.warm_bytes_capacity - pr.used_bytes(versions)
                    if room < rec.size_bytes or not tracker.can_issue(wid, tvid, now):
                        continue
                    out.append(CommandSpec(CommandKind.LOAD_WARM, wid, tvid, Reason.ROLLBACK_TARGET,
                                           f"rollback target of {adapter_id}",
                                           source="rule:rollback_target"))
                    pr.apply(CommandKind.LOAD_WARM, tvid)
                    resident.add((wid, tvid))
                    need -= 1
        return out, protected, resident

    def _canary_prewarm(
        self,
        state: State,
        proj: dict[str, Projection],
        tracker: CommandTracker,
        now: float,
        notes: list[str],
        protected: set[tuple[str, str]],
    ) -> list[CommandSpec]:
        """``LOAD_WARM`` of every staged canary under a prewarm schedule on each of its
        target workers (:func:`loraplane.cache_manager.prewarm.targets`) that does not hold
        it; a WARM copy there is protected from the policy's removals."""
        out: list[CommandSpec] = []
        versions = state.versions
        for vid in sorted(state.canaries()[0]):
            rec = versions.get(vid)
            if rec is None or not rec.status.loadable or not rec.artifact_uri:
                continue
            schedule = self.rules.canary.prewarm_for(rec.ref.tenant_id, rec.ref.adapter_name)
            for wid in prewarm.targets(state, rec, schedule):
                pr = proj.get(wid)
                if pr is None:
                    continue
                held = pr.slots.get(vid)
                if held is not None:
                    if held.tier is Tier.WARM:
                        protected.add((wid, vid))
                    continue
                room = pr.view.warm_bytes_capacity - pr.used_bytes(versions)
                if room < rec.size_bytes:
                    notes.append(f"{vid}: canary prewarm on {wid} short of host bytes "
                                 f"({room} free, {rec.size_bytes} needed)")
                    continue
                if not tracker.can_issue(wid, vid, now):
                    continue
                out.append(CommandSpec(
                    CommandKind.LOAD_WARM, wid, vid, Reason.CANARY_PREWARM,
                    f"prewarm schedule: WARM before its {schedule.start_percent} % share",
                    source="rule:canary_prewarm"))
                pr.apply(CommandKind.LOAD_WARM, vid)
                protected.add((wid, vid))
        return out

    def _join_prewarm(
        self,
        state: State,
        proj: dict[str, Projection],
        snapshot: Snapshot,
        tracker: CommandTracker,
        now: float,
    ) -> list[CommandSpec]:
        """``LOAD_WARM`` of the ``join_prewarm.top`` hottest requested versions of each base
        model on a worker started within ``join_prewarm.window_s``, each one it does not hold
        (free bytes only): its first requests for them need no download. Ranked again every
        round of the window, on the heat the manager has consumed so far: a version that enters
        the top later in the window (its heat came in later, it got hotter) is loaded too.

        Hottest by the WARM ranking's value (:meth:`warm_value_of`), as the loads are WARM:
        by a new worker's first rounds (its engine takes seconds to start) the HOT heat's
        liveness factor has written off every stream idle for many of its own gaps, and
        ranked a version of one request (no gap known) first, the rest by name."""
        rule = self.rules.join_prewarm
        out: list[CommandSpec] = []
        if rule.top <= 0:
            return out
        versions = state.versions
        for wid, pr in proj.items():
            if not 0 < now - pr.view.started_at <= rule.window_s:
                continue
            for bm in sorted(pr.view.capacities):
                ranked = sorted(
                    ((self.warm_value_of(snapshot, vid, now), vid) for vid, m in
                     snapshot.versions.items()
                     if m.base_model == bm and snapshot.stats_of(vid).requests > 0),
                    key=lambda hv: (-hv[0], hv[1]))[: rule.top]
                for heat, vid in ranked:
                    rec = versions[vid]
                    if vid in pr.slots or not rec.artifact_uri:
                        continue
                    if pr.view.warm_bytes_capacity - pr.used_bytes(versions) < rec.size_bytes:
                        continue
                    if not tracker.can_issue(wid, vid, now):
                        continue
                    out.append(CommandSpec(
                        CommandKind.LOAD_WARM, wid, vid, Reason.HEAT,
                        f"worker joined: among the {rule.top} hottest of {bm} "
                        f"(WARM value {heat:.3g})", source="rule:join_prewarm"))
                    pr.apply(CommandKind.LOAD_WARM, vid)
        return out

    def _hosts(
        self,
        rec: VersionRecord,
        versions: dict[str, VersionRecord],
        proj: dict[str, Projection],
        holders: list[str],
        target: str,
        tracker: CommandTracker,
        now: float,
    ) -> list[str]:
        """Workers that could take ``rec`` HOT, best first: the eligible ones (serve the base
        model, rank, no backoff or golden-set block) ranked by the policy's one host ranking
        (:func:`loraplane.policy.placement.rank_hosts`)."""
        bm = rec.ref.base_model
        options: list[HostOption] = []
        for wid, pr in proj.items():
            if wid in holders or not pr.view.serves(bm) or (wid, rec.version_id) in self._no_load:
                continue
            cap = pr.view.capacities[bm]
            if cap.slots <= 0 or (cap.max_lora_rank and rec.rank > cap.max_lora_rank):
                continue
            if not tracker.can_issue(wid, rec.version_id, now):
                continue
            options.append(HostOption(
                worker_id=wid, preferred=wid == target,
                free_slots=cap.slots - pr.hot_count(bm, versions),
                resident=rec.version_id in pr.slots,
            ))
        return [o.worker_id for o in rank_hosts(rec.version_id, options)]

    def _victim(
        self,
        pr: Projection,
        bm: str,
        required: set[str],
        snapshot: Snapshot,
        tracker: CommandTracker,
        now: float,
    ) -> str | None:
        """The HOT version of ``bm`` here a business rule displaces, chosen by the policy's one
        victim function (:func:`loraplane.policy.victims.hot_victim`, the worker's request path
        uses it too). The rule's requirements travel as typed member flags: a pinned version,
        one with requests in flight or a command under way is ``busy``, one another rule
        requires or the policy protects is ``protected``; a rule never displaces a protected
        version (a protection overflow choice is refused)."""
        members: list[HotMember] = []
        for vid, s in pr.slots.items():
            if s.tier is not Tier.HOT:
                continue
            meta = snapshot.versions.get(vid)
            if meta is None or meta.base_model != bm:
                continue
            stats = snapshot.stats_of(vid)
            members.append(HotMember(
                meta=meta, stats=stats,
                last_used=stats.last_access if stats.last_access is not None else s.loaded_at,
                pinned=s.pinned,
                busy=s.in_flight > 0 or not tracker.can_issue(pr.view.worker_id, vid, now),
                protected=vid in required,
            ))
        choice = hot_victim(members, now, self.policy_config, snapshot.bandwidths)
        if choice.victim is None or choice.reason is Reason.PROTECTION_OVERFLOW:
            return None
        return choice.victim

    # ------------------------------------------------------------------ guards

    def _guard(
        self,
        state: State,
        tracker: CommandTracker,
        specs: Iterable[CommandSpec],
        now: float,
        notes: list[str],
    ) -> tuple[list[CommandSpec], int]:
        """Drop unsafe or disallowed commands; cap per round (see the module docstring)."""
        versions = state.versions
        proj = project(state, tracker)
        limits = self.rules.limits
        loads_in_flight: dict[str, int] = {}
        for p in tracker.pending():
            if p.spec.kind in (CommandKind.LOAD_HOT, CommandKind.LOAD_WARM):
                loads_in_flight[p.spec.worker_id] = loads_in_flight.get(p.spec.worker_id, 0) + 1
        accepted: list[CommandSpec] = []
        seen: set[tuple[str, str]] = set()
        removals = 0
        dropped = 0
        removed_hot: dict[str, int] = {}
        keep_serving: frozenset[str] = getattr(self, "_keep_serving", frozenset())

        def drop(spec: CommandSpec, why: str) -> None:
            nonlocal dropped
            dropped += 1
            notes.append(f"dropped {spec.kind.value} {spec.version_id} on {spec.worker_id}: {why}")

        for spec in specs:
            key = (spec.worker_id, spec.version_id)
            pr = proj.get(spec.worker_id)
            if pr is None:
                drop(spec, "worker not commandable")
                continue
            if key in seen:
                drop(spec, "second command for the same key this round")
                continue
            if not tracker.can_issue(spec.worker_id, spec.version_id, now):
                dropped += 1  # in flight or backing off: expected, not worth a note
                continue
            rec = versions.get(spec.version_id)
            slot = pr.slots.get(spec.version_id)
            if (spec.kind is CommandKind.LOAD_HOT and spec.pin and slot is not None
                    and slot.tier is Tier.HOT and not slot.pinned):
                spec = CommandSpec(CommandKind.PIN, spec.worker_id, spec.version_id, spec.reason,
                                   spec.detail, False, spec.heat, spec.source)
            if spec.kind.frees:
                if slot is None:
                    drop(spec, "not on the worker")
                    continue
                if spec.kind is not CommandKind.UNPIN and slot.in_flight > 0:
                    drop(spec, f"{slot.in_flight} request(s) in flight")
                    continue
                if spec.kind is CommandKind.UNPIN and not slot.pinned:
                    drop(spec, "not pinned")
                    continue
                if spec.kind is CommandKind.DEMOTE and slot.tier is not Tier.HOT:
                    drop(spec, "not HOT")
                    continue
                if (spec.kind in _REMOVES_HOT and slot.tier is Tier.HOT
                        and spec.version_id in keep_serving):
                    # Make before break: a protected version (active canary, protected
                    # priority) keeps a confirmed HOT replica until its new one is HOT.
                    confirmed = sum(
                        1 for w in state.workers.values()
                        if w.commandable() and w.tier_of(spec.version_id) is Tier.HOT
                    ) - removed_hot.get(spec.version_id, 0)
                    if confirmed <= 1:
                        drop(spec, "last confirmed HOT replica of a protected version")
                        continue
                if spec.kind is not CommandKind.UNPIN:
                    if removals >= limits.max_removals_per_round:
                        drop(spec, "removal cap of the round reached")
                        continue
                    removals += 1
            else:
                if rec is None or not rec.status.loadable:
                    drop(spec, "version may not be loaded")
                    continue
                if key in self._no_load:
                    drop(spec, "loading it here is blocked (failed golden set)")
                    continue
                bm = rec.ref.base_model
                cap = pr.view.capacities.get(bm)
                if cap is None:
                    drop(spec, f"worker does not serve {bm}")
                    continue
                if spec.kind in (CommandKind.LOAD_HOT, CommandKind.LOAD_WARM):
                    if not rec.artifact_uri or not rec.engine_id:
                        drop(spec, "artifact or engine id unknown")
                        continue
                    if cap.max_lora_rank and rec.rank > cap.max_lora_rank:
                        drop(spec, f"rank {rec.rank} > max_lora_rank {cap.max_lora_rank}")
                        continue
                    if loads_in_flight.get(spec.worker_id, 0) >= limits.max_loads_per_worker:
                        drop(spec, "loads in flight cap of the worker reached")
                        continue
                takes_slot = spec.kind is CommandKind.LOAD_HOT and (
                    slot is None or slot.tier is not Tier.HOT)
                if takes_slot and pr.hot_count(bm, versions) >= cap.slots:
                    drop(spec, f"no free {bm} slot")
                    continue
                wants_pin = spec.kind is CommandKind.PIN or (
                    spec.kind is CommandKind.LOAD_HOT and spec.pin)
                new_pin = wants_pin and not (slot is not None and slot.pinned)
                if new_pin and pr.pinned_count(bm, versions) >= max_pins(pin_slots(cap)):
                    if spec.kind is CommandKind.PIN:
                        drop(spec, "would leave no unpinned slot")
                        continue
                    spec = CommandSpec(spec.kind, spec.worker_id, spec.version_id,
                                       spec.reason, spec.detail, False, spec.heat, spec.source)
                if spec.kind is CommandKind.PIN and (slot is None or slot.tier is not Tier.HOT):
                    drop(spec, "not HOT")
                    continue
                if spec.kind is CommandKind.LOAD_WARM and slot is not None:
                    drop(spec, "already resident")
                    continue
                if spec.kind is CommandKind.LOAD_HOT and slot is not None and \
                        slot.tier is Tier.HOT and (slot.pinned or not spec.pin):
                    drop(spec, "already HOT")
                    continue
                if spec.kind in (CommandKind.LOAD_HOT, CommandKind.LOAD_WARM):
                    loads_in_flight[spec.worker_id] = loads_in_flight.get(spec.worker_id, 0) + 1
            if len(accepted) >= limits.max_commands_per_round:
                drop(spec, "command cap of the round reached")
                continue
            seen.add(key)
            if spec.kind in _REMOVES_HOT and slot is not None and slot.tier is Tier.HOT:
                removed_hot[spec.version_id] = removed_hot.get(spec.version_id, 0) + 1
            pr.apply(spec.kind, spec.version_id, spec.pin)
            accepted.append(spec)
        return accepted, dropped
