"""The heat policy: weighted heat score, never-evict protection, demotion, placement.

Two faces, one score (:mod:`loraplane.policy.score`) and one set of
predicates (:mod:`loraplane.policy.predicates`):

* :meth:`HeatPolicy.plan` — for the cache-manager: from a snapshot of several
  workers, compute the target placement (HOT per worker and base model, WARM
  per worker, pins) and return the actions that reach it, each with a reason.
* :meth:`HeatPolicy.online` — for the simulator: pick victims on demand. It
  scores only the members of the tier that is full (HOT groups hold tens of
  versions), so a request costs O(1) and a miss O(slots).
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field

from ._lazyheap import LazyHeap
from .adaptive import AdaptiveHeatOnline
from .config import PolicyConfig
from .cost import Bandwidths
from .model import PRIORITIES, REQUEST_CLASSES, Tier
from .online import OnlineContext
from .placement import HostOption, host_key, stable_hash
from .plan import Action, ActionKind, Plan, Reason
from .planner import by_base_model, size_of, total_bytes
from .predicates import (
    Protection,
    demotion_reason,
    eviction_reason,
    hot_share_limit,
    max_pins,
    protection,
    protection_of,
)
from .score import hot_terms_at, liveness, penalty_s, size_factor, terms, warm_value
from .snapshot import EMPTY_STATS, Snapshot, VersionMeta, WorkerState
from .stats import GAP_SMOOTHING, StatsView

try:  # mypyc reads it when it compiles this module (loraplane.native)
    from mypy_extensions import mypyc_attr
except ImportError:  # no mypy (a dev/test dependency), so no compiled build: a no-op
    def mypyc_attr(*_args: object, **_kwargs: object) -> Callable[[type], type]:  # type: ignore[misc]
        return lambda cls: cls

_NO_PROTECTION = 0
_CANARY = 1
_PRIORITY = 2
_KIND_CODE = {None: _NO_PROTECTION, Protection.CANARY: _CANARY, Protection.PRIORITY: _PRIORITY}
_IN_HEAP = 0
_IN_SCAN = 1
_IN_PROTECTED = 2


@mypyc_attr(allow_interpreted_subclasses=True)
class HeatOnline:
    """Online heat state for one simulated run (arrays indexed by version).

    The decayed counts are kept *rebased*: ``k[v] = Σ exp((t_i - base) / tau)``
    over v's requests, so that ``count(now) = k[v] * exp(-(now - base) / tau)``.
    The factor ``exp(-(now - base) / tau)`` is common to every version, so a
    victim scan costs a multiply-add per member and no ``exp``; an update is
    one ``exp``. ``base`` moves forward before the numbers could overflow.
    Per version the score's static part (penalty of its request mix, priority,
    size) is cached and refreshed on each of its requests.
    """

    _REBASE = 500.0
    """Rebase when (now - base) / tau exceeds this (exp(500) is far from overflow)."""

    def __init__(self, ctx: OnlineContext, cfg: PolicyConfig) -> None:
        sc = cfg.score
        bw = ctx.bandwidths
        n = ctx.n_versions
        self._ctx = ctx
        self._tau = sc.rate_window_s
        self._tau_w = sc.warm_rate_window_s
        self._base = 0.0
        # heat = rate * (a + b * penalty) + prio_weight * priority_value, where
        # penalty = Σ_class share * class_weight * max(0, reload - budget)   (see score.py)
        self._a = sc.weights.qps / sc.qps_ref
        self._b = sc.weights.ttft_penalty / (sc.qps_ref * sc.penalty_ref_s)
        weights = [sc.class_weights[c] for c in REQUEST_CLASSES]
        budgets = [sc.class_budgets_s[c] for c in REQUEST_CLASSES]
        self._pen_hot = [
            tuple(w * max(0.0, bw.warm_to_hot_s(s) - b) for w, b in zip(weights, budgets, strict=True))
            for s in ctx.sizes
        ]
        self._pen_warm = [
            tuple(
                w * max(0.0, bw.load_s(s, Tier.COLD) - b)
                for w, b in zip(weights, budgets, strict=True)
            )
            for s in ctx.sizes
        ]
        prio_w = sc.weights.tenant_priority
        self._prio_term = [prio_w * sc.priority_values[p] for p in PRIORITIES]
        self._prot_of = [
            [_KIND_CODE[protection(canary == 1, p, cfg)] for p in PRIORITIES] for canary in (0, 1)
        ]
        self._idle_s = cfg.demote.idle_minutes * 60.0
        slots = ctx.hot_slots
        self._limit = (
            0,
            hot_share_limit(Protection.CANARY, slots, cfg),
            hot_share_limit(Protection.PRIORITY, slots, cfg),
        )
        self._inv_size = [1.0 / size_factor(s, sc.warm_size_exponent) for s in ctx.sizes]
        # per-version state
        self._k_hot = [0.0] * n
        self._k_warm = [0.0] * n
        self._last = [-math.inf] * n
        self._gap = [0.0] * n
        """Smoothed inter-arrival gap per version (0: unknown), as ``StatsView.mean_gap_s``."""
        self._live_scale = sc.liveness_scale
        self._live_odds = sc.liveness_odds
        self._cls = [[0, 0, 0] for _ in range(n)]
        self._mult_hot = [0.0] * n
        """(a + b * penalty_hot) / tau: multiplies the rebased HOT count."""
        self._mult_warm = [0.0] * n
        """(a + b * penalty_warm) / (tau_w * size_factor): multiplies the rebased WARM count."""
        self._prio = [0.0] * n
        self._prio_warm = [0.0] * n
        self._prot = [0] * n
        self._adapter = ctx.adapters
        self._superseded = [False] * n
        self._stable: dict[int, int] = {}
        self._hot: list[set[int]] = [set() for _ in range(ctx.n_workers * ctx.n_base_models)]
        # WARM members per worker, split so that a victim search scans few of them:
        # unprotected members with no priority term have a time-invariant order (their value
        # is decay(now) * k_warm * mult_warm) and sit in a lazy min-heap; the others are scanned.
        self._warm_heap = [LazyHeap() for _ in range(ctx.n_workers)]
        self._warm_scan: list[set[int]] = [set() for _ in range(ctx.n_workers)]
        self._warm_prot: list[set[int]] = [set() for _ in range(ctx.n_workers)]
        self._warm_of: list[list[int]] = [[] for _ in range(n)]
        """Workers where each version is WARM."""
        self._where = [_IN_HEAP] * n
        """The WARM structure each version is filed in (the same on every worker)."""

    # -- statistics -------------------------------------------------------------------------

    def _rebase(self, now: float) -> None:
        shift = now - self._base
        fh = math.exp(-shift / self._tau)
        fw = math.exp(-shift / self._tau_w)
        self._k_hot = [k * fh for k in self._k_hot]
        self._k_warm = [k * fw for k in self._k_warm]
        self._base = now
        for w, heap in enumerate(self._warm_heap):
            members = [u for u in range(len(self._warm_of)) if w in self._warm_of[u]
                       and u in heap]
            for u in members:
                heap.push(u, self._heap_key(u))

    def on_request(self, i: int, v: int, now: float) -> None:
        """Add the request to v's decayed counts; refresh v's class mix, priority and flags."""
        ctx = self._ctx
        if (now - self._base) / self._tau > self._REBASE:
            self._rebase(now)
        rel = now - self._base
        self._k_hot[v] += math.exp(rel / self._tau)
        self._k_warm[v] += math.exp(rel / self._tau_w)
        cls = self._cls[v]
        last = self._last[v]
        if now >= last > -math.inf:  # same rule as VersionStats.record_request
            gap = now - last
            self._gap[v] = gap if self._gap[v] == 0.0 else (
                (1.0 - GAP_SMOOTHING) * self._gap[v] + GAP_SMOOTHING * gap
            )
        self._last[v] = max(last, now)
        cls[ctx.classes[i]] += 1
        ci, cb, cc = cls
        total = ci + cb + cc
        ph = self._pen_hot[v]
        pw = self._pen_warm[v]
        pen_hot = (ci * ph[0] + cb * ph[1] + cc * ph[2]) / total
        pen_warm = (ci * pw[0] + cb * pw[1] + cc * pw[2]) / total
        inv_size = self._inv_size[v]
        self._mult_hot[v] = (self._a + self._b * pen_hot) / self._tau
        self._mult_warm[v] = (self._a + self._b * pen_warm) / self._tau_w * inv_size
        p = ctx.priorities[i]
        canary = ctx.canary[i]
        self._prio[v] = self._prio_term[p]
        self._prio_warm[v] = self._prio_term[p] * inv_size
        self._prot[v] = self._prot_of[canary][p]
        self._superseded[v] = False
        if not canary:
            # non-canary traffic: v is the stable version; the previous stable is superseded
            adapter = self._adapter[v]
            previous = self._stable.get(adapter, v)
            if previous != v:
                self._superseded[previous] = True
                self._reclassify(previous)
            self._stable[adapter] = v
        if self._warm_of[v]:
            self._reclassify(v)

    def _heap_key(self, v: int) -> float:
        return -1.0 if self._superseded[v] else self._k_warm[v] * self._mult_warm[v]

    def _warm_class(self, v: int) -> int:
        """Which WARM structure ``v`` belongs in: heap, scan set or protected set."""
        if self._superseded[v]:
            return _IN_HEAP
        if self._prot[v]:
            return _IN_PROTECTED
        return _IN_HEAP if self._prio_warm[v] == 0.0 else _IN_SCAN

    def _warm_file(self, w: int, v: int, where: int) -> None:
        if where == _IN_HEAP:
            self._warm_heap[w].push(v, self._heap_key(v))
        elif where == _IN_SCAN:
            self._warm_scan[w].add(v)
        else:
            self._warm_prot[w].add(v)

    def _warm_unfile(self, w: int, v: int, where: int) -> None:
        if where == _IN_HEAP:
            self._warm_heap[w].discard(v)
        elif where == _IN_SCAN:
            self._warm_scan[w].discard(v)
        else:
            self._warm_prot[w].discard(v)

    def _reclassify(self, v: int) -> None:
        """Refile ``v`` on every worker where it is WARM after its figures changed."""
        old = self._where[v]
        new = self._warm_class(v)
        self._where[v] = new
        for w in self._warm_of[v]:
            if old != new:
                self._warm_unfile(w, v, old)
                self._warm_file(w, v, new)
            elif new == _IN_HEAP:
                self._warm_heap[w].push(v, self._heap_key(v))

    def superseded(self, v: int) -> bool:
        """True when another version of the same adapter took the stable traffic since v's
        last request (a canary of the same adapter does not supersede it)."""
        return self._superseded[v]

    def rate(self, v: int, now: float) -> float:
        """Decayed request rate (req/s) of ``v`` at ``now`` (HOT time constant)."""
        return self._k_hot[v] * math.exp(-(now - self._base) / self._tau) / self._tau

    def rate_warm(self, v: int, now: float) -> float:
        """Decayed request rate (req/s) of ``v`` at ``now`` (WARM time constant)."""
        return self._k_warm[v] * math.exp(-(now - self._base) / self._tau_w) / self._tau_w

    def heat_hot(self, v: int, now: float) -> float:
        """Heat for the HOT ranking (penalty: reload from WARM over budget); -1 if superseded."""
        return self._heat_hot(v, now, math.exp(-(now - self._base) / self._tau))

    def _heat_hot(self, v: int, now: float, decay: float) -> float:
        """:meth:`heat_hot` with the common decay factor already computed."""
        if self._superseded[v]:
            return -1.0
        rate = self._k_hot[v] * decay * self._mult_hot[v]
        gap = self._gap[v]
        if gap > 0.0 and self._live_scale > 0.0:
            # score.liveness, inlined: the stream most likely ended after many mean gaps idle
            x = self._live_scale * (now - self._last[v]) / gap
            if x > 0.0:
                odds = self._live_odds
                rate *= (1.0 + odds) / (1.0 + odds * math.exp(min(x, 50.0)))
        return rate + self._prio[v]

    def value_warm(self, v: int, now: float) -> float:
        """WARM ranking key: WARM heat (penalty: load from COLD) per GB^exponent; -1 if superseded."""
        if self.superseded(v):
            return -1.0
        decay = math.exp(-(now - self._base) / self._tau_w)
        return self._k_warm[v] * decay * self._mult_warm[v] + self._prio_warm[v]

    def protection(self, v: int, now: float) -> int:
        """Protection code of ``v`` now (idle versions lose their HOT protection)."""
        if now - self._last[v] > self._idle_s:
            return _NO_PROTECTION
        return self._prot[v]

    # -- membership -------------------------------------------------------------------------

    def on_served(self, g: int, w: int, v: int, now: float) -> None:
        """Heat needs no per-hit bookkeeping beyond :meth:`on_request`."""

    def on_insert_hot(self, g: int, v: int, now: float) -> None:
        """Track ``v`` in the group."""
        self._hot[g].add(v)

    def on_remove_hot(self, g: int, v: int) -> None:
        """Forget ``v`` in the group."""
        self._hot[g].discard(v)

    def on_insert_warm(self, w: int, v: int, now: float) -> None:
        """Track ``v`` on the worker."""
        where = self._warm_class(v)
        if self._warm_of[v] and where != self._where[v]:
            self._reclassify(v)
        self._where[v] = where
        self._warm_of[v].append(w)
        self._warm_file(w, v, where)

    def on_remove_warm(self, w: int, v: int) -> None:
        """Forget ``v`` on the worker."""
        self._warm_of[v].remove(w)
        self._warm_unfile(w, v, self._where[v])

    # -- victims ----------------------------------------------------------------------------

    def hot_victim(self, g: int, now: float, busy: Mapping[int, float]) -> int | None:
        """Coolest member that is neither busy nor protected within its kind's share.

        Protected members beyond their share compete on heat; when every free
        member is protected, the coolest protected one goes (protection overflow).
        """
        decay = math.exp(-(now - self._base) / self._tau)
        last, prot = self._last, self._prot
        heat = self._heat_hot
        idle_before = now - self._idle_s
        best = math.inf
        best_v = -1
        n_canary = n_priority = 0
        for u in self._hot[g]:
            kind = prot[u]
            if kind and last[u] >= idle_before:
                if kind == _CANARY:
                    n_canary += 1
                else:
                    n_priority += 1
                continue
            if busy.get(u, 0.0) > now:
                continue
            h = heat(u, now, decay)
            if h < best or (h == best and u < best_v):
                best, best_v = h, u
        within_share = n_canary <= self._limit[_CANARY] and n_priority <= self._limit[_PRIORITY]
        if within_share and best_v >= 0:
            return best_v
        # protected members beyond their share (or nothing else free): they compete too
        excess = {_CANARY: n_canary - self._limit[_CANARY],
                  _PRIORITY: n_priority - self._limit[_PRIORITY]}
        protected: dict[int, list[tuple[float, int]]] = {_CANARY: [], _PRIORITY: []}
        for u in self._hot[g]:
            kind = prot[u]
            if not kind or last[u] < idle_before or busy.get(u, 0.0) > now:
                continue
            protected[kind].append((heat(u, now, decay), u))
        candidates = [] if best_v < 0 else [(best, best_v)]
        for kind, members in protected.items():
            members.sort()
            candidates.extend(members[: max(excess[kind], 0)])
        if not candidates:
            candidates = protected[_CANARY] + protected[_PRIORITY]
        return min(candidates)[1] if candidates else None

    def warm_victim(self, w: int, now: float, hot: Container[int]) -> int | None:
        """Lowest WARM value among unprotected non-HOT members (coolest protected if none).

        Canary protection lapses after ``demote.idle_minutes`` without traffic (the
        canary ended); priority protection does not. Superseded versions go first.
        """
        decay = math.exp(-(now - self._base) / self._tau_w)
        k, mult, prio = self._k_warm, self._mult_warm, self._prio_warm
        sup, last = self._superseded, self._last
        best_v = -1
        best = math.inf
        heap = self._warm_heap[w]
        top = heap.pop_min(lambda u: u not in hot)
        if top is not None:
            key = heap.key(top)
            best, best_v = (-1.0 if key < 0 else key * decay), top
        for u in self._warm_scan[w]:
            if u in hot:
                continue
            value = -1.0 if sup[u] else k[u] * decay * mult[u] + prio[u]
            if value < best or (value == best and u < best_v):
                best, best_v = value, u
        idle_before = now - self._idle_s
        prot = self._prot
        best_p = -1
        best_protected = math.inf
        for u in self._warm_prot[w]:
            if u in hot:
                continue
            value = k[u] * decay * mult[u] + prio[u]
            if prot[u] == _CANARY and last[u] < idle_before:  # the canary ended
                if value < best or (value == best and u < best_v):
                    best, best_v = value, u
            elif value < best_protected or (value == best_protected and u < best_p):
                best_protected, best_p = value, u
        if best_v >= 0:
            return best_v
        return best_p if best_p >= 0 else None


@dataclass
class _Target:
    """Working state of :meth:`HeatPolicy.plan` for one worker."""

    worker: WorkerState
    slots_left: dict[str, int]
    hot: dict[str, Reason | None]
    """Target HOT versions; the reason is None for a version already HOT here."""
    pending: dict[str, int]
    """Per base model: versions HOT on the worker that are not (yet) in the target."""
    bytes_needed: int = 0
    load: float = 0.0
    pins: set[str] | None = None


@dataclass(frozen=True, slots=True)
class _Figures:
    """What :meth:`HeatPolicy.plan` computes per version from its meta, statistics and the
    clock (:meth:`HeatPolicy._figures`)."""

    rate: float
    heat: float
    value: float
    kind: Protection | None
    demote: Reason | None


@dataclass(frozen=True, slots=True)
class _Kept:
    """The parts of a requested version's figures that change only with its metadata, its
    request mix, the bandwidths and the config, not with the clock
    (:meth:`HeatPolicy._figures_kept`)."""

    meta: VersionMeta
    bandwidths: Bandwidths
    interactive: int
    background: int
    canary: int
    penalty_hot: float
    """``penalty_s`` of a reload from WARM for this request mix."""
    penalty_warm: float
    """``penalty_s`` of a load from COLD for this request mix."""
    priority_value: float
    size_factor: float
    kind: Protection | None


class _HostIndex:
    """The targets of one plan indexed for :meth:`HeatPolicy._pick_worker`, so that a replica
    looks at a few workers, not all of them: where the version is resident, and the least
    loaded of the others (per base model, by load, those with a slot free without displacing
    anyone apart from those whose free slots are all still an incumbent's).

    :func:`~loraplane.policy.placement.host_key` puts a worker where the version is HOT or
    WARM first, then one with a free slot before one without, then the least loaded, then the
    stable hash: so the best worker is among the eligible resident ones, else among the
    eligible non-resident ones of the least load, those with a free slot if there is one.
    A target's entry moves when an assignment changes its load or slots (:meth:`changed`: it is
    refiled before the next look by load; most replicas stop at a resident worker)."""

    def __init__(self, targets: list[_Target]) -> None:
        self.targets = targets
        self._index = {id(t): i for i, t in enumerate(targets)}
        self._resident: dict[str, list[int]] = {}
        for i, t in enumerate(targets):
            for v in t.worker.resident():
                self._resident.setdefault(v, []).append(i)
        self._by_load: dict[str, tuple[list[tuple[float, int]], list[tuple[float, int]]]] = {}
        """Per base model: (load, target index) of the targets with a free slot, and of those
        with slots left that are all an incumbent's, each sorted."""
        self._filed: dict[tuple[int, str], tuple[int, tuple[float, int]]] = {}
        self._stale: dict[int, _Target] = {}
        """Targets changed since they were filed (refiled before the next look by load)."""
        for t in targets:
            self.file(t)

    def changed(self, t: _Target) -> None:
        """An assignment changed ``t``'s load or slots: refile it before the next look."""
        self._stale[self._index[id(t)]] = t

    def file(self, t: _Target) -> None:
        """Enter ``t`` by its current load and slots."""
        i = self._index[id(t)]
        for bm in t.worker.hot_slots:
            left = t.slots_left.get(bm, 0)
            if left <= 0:
                continue
            which = 0 if left - t.pending.get(bm, 0) > 0 else 1
            entry = (t.load, i)
            insort(self._by_load.setdefault(bm, ([], []))[which], entry)
            self._filed[(i, bm)] = (which, entry)

    def unfile(self, t: _Target) -> None:
        """Take ``t`` out (before an assignment changes it)."""
        i = self._index[id(t)]
        for bm in t.worker.hot_slots:
            filed = self._filed.pop((i, bm), None)
            if filed is not None:
                entries = self._by_load[bm][filed[0]]
                del entries[bisect_left(entries, filed[1])]

    def candidates(self, vid: str, meta: VersionMeta) -> list[_Target]:
        """Eligible targets among which the best for one more replica of ``vid`` is, in
        target order."""
        bm = meta.base_model
        size = meta.size_bytes
        targets = self.targets

        def eligible(i: int) -> bool:
            t = targets[i]
            w = t.worker
            return (bm in w.hot_slots and vid not in t.hot and t.slots_left.get(bm, 0) > 0
                    and t.bytes_needed + size <= w.warm_bytes)

        resident = self._resident.get(vid, [])
        out = [i for i in resident if eligible(i)]
        for i in out:
            t = targets[i]
            if vid in t.worker.hot or t.slots_left[bm] - t.pending.get(bm, 0) > 0:
                # HOT there, or a free slot where it is WARM: no other worker ranks before
                return [targets[i] for i in out]
        for t in self._stale.values():
            self.unfile(t)
            self.file(t)
        self._stale.clear()
        for entries in self._by_load.get(bm, ([], [])):
            least: float | None = None
            for load, i in entries:
                if least is not None and load != least:
                    break
                if i in resident or not eligible(i):
                    continue
                out.append(i)
                least = load
            if least is not None:
                break
        return [targets[i] for i in sorted(out)]


@dataclass(slots=True)
class _Scores:
    """Every version's figures for one plan (:meth:`HeatPolicy._scores`)."""

    kind: Mapping[str, Protection | None]
    rate: dict[str, float]
    heat: dict[str, float]
    value: dict[str, float]
    demote: dict[str, Reason | None]
    requested: list[str]
    """Versions with statistics (sorted): the only ones with a rate above 0."""
    prewarm: list[tuple[str, Reason]]
    """:attr:`_VersionFacts.prewarm`."""
    undemoted: list[str] = field(default_factory=list)
    """Versions no demotion reason sends back to WARM (any order)."""


class _VersionFacts:
    """What a snapshot's versions alone decide in :meth:`HeatPolicy.plan`, computed once for
    as long as the versions stay equal (the cache-manager's steady rounds): each version's
    figures as if never requested (they do not depend on the clock), those of them that no
    demotion sends back to WARM, and the prefetch candidates."""

    def __init__(self, versions: Mapping[str, VersionMeta], bandwidths: Bandwidths,
                 figures: Callable[[VersionMeta, StatsView, float, Bandwidths], _Figures]
                 ) -> None:
        self.source = versions
        """The mapping they came from: a snapshot's are frozen, so the same one is equal."""
        self.versions = dict(versions)
        self.bandwidths = bandwidths
        self.rate: dict[str, float] = {}
        self.heat: dict[str, float] = {}
        self.value: dict[str, float] = {}
        self.kind: dict[str, Protection | None] = {}
        self.demote: dict[str, Reason | None] = {}
        self.undemoted: list[str] = []
        """Versions (sorted) no demotion reason sends back without statistics."""
        self.prewarm: list[tuple[str, Reason]] = []
        """Versions (sorted) to prefetch when no worker holds them: active canaries and
        scheduled warm-ups, with the reason."""
        for vid in sorted(versions):
            meta = versions[vid]
            f = figures(meta, EMPTY_STATS, 0.0, bandwidths)
            self.rate[vid] = f.rate
            self.heat[vid] = f.heat
            self.value[vid] = f.value
            self.kind[vid] = f.kind
            self.demote[vid] = f.demote
            if f.demote is None:
                self.undemoted.append(vid)
            if meta.superseded:
                continue
            if f.kind is Protection.CANARY:
                self.prewarm.append((vid, Reason.CANARY_PREWARM))
            elif meta.warmup > 0.0:
                self.prewarm.append((vid, Reason.SCHEDULED_WARMUP))


_stable_hash = stable_hash


@mypyc_attr(allow_interpreted_subclasses=True)
class HeatPolicy:
    """The weighted heat-score policy (see the module docstring and ``README.md``)."""

    name = "heat"

    def __init__(self, config: PolicyConfig | None = None) -> None:
        self.config = config or PolicyConfig()
        self._facts: _VersionFacts | None = None
        """What the last plan's versions alone decide (a cache, kept while they are equal)."""
        self._kept: dict[str, _Kept] = {}
        """Per requested version, what its figures keep between rounds (:meth:`_figures_kept`)."""
        self._kept_config = self.config

    def _scores(self, snapshot: Snapshot, now: float) -> _Scores:
        """Every version's figures at ``now``. A version never requested (no statistics)
        scores the same at every clock, so those come from the facts kept while the versions
        stay equal (:class:`_VersionFacts`); only the requested ones are computed again."""
        versions = snapshot.versions
        stats = snapshot.stats
        bw = snapshot.bandwidths
        facts = self._facts
        if facts is None or facts.bandwidths is not bw or (
                versions is not facts.source and versions != facts.versions):
            facts = self._facts = _VersionFacts(versions, bw, self._figures)
            self._kept = {v: k for v, k in self._kept.items() if v in versions}
        out = _Scores(kind=facts.kind, rate=dict(facts.rate), heat=dict(facts.heat),
                      value=dict(facts.value), demote=dict(facts.demote),
                      requested=sorted(vid for vid in stats if vid in versions),
                      prewarm=facts.prewarm)
        if self._kept_config is not self.config:
            self._kept, self._kept_config = {}, self.config
        for vid in out.requested:
            f = self._figures_kept(vid, versions[vid], stats[vid], now, bw)
            out.rate[vid] = f.rate
            out.heat[vid] = f.heat
            out.value[vid] = f.value
            out.demote[vid] = f.demote
        out.undemoted = [v for v in facts.undemoted if v not in stats]
        out.undemoted += (v for v in out.requested if out.demote[v] is None)
        return out

    def _figures(self, meta: VersionMeta, st: StatsView, now: float, bw: Bandwidths) -> _Figures:
        """One version's figures for :meth:`plan` (a pure function of its arguments)."""
        cfg = self.config
        sc = cfg.score
        # replicas, the hottest set and load use the same discounted rate as the heat
        rate = st.rate(now, sc.rate_window_s) * liveness(st.idle_s(now), st.mean_gap_s, sc)
        if meta.superseded:
            return _Figures(rate, -1.0, -1.0, None, Reason.SUPERSEDED)
        return _Figures(rate, hot_terms_at(meta, st, rate, sc, bw).heat,
                        warm_value(meta, st, now, sc, bw), protection_of(meta, cfg),
                        demotion_reason(meta, st, now, cfg))

    def _figures_kept(self, vid: str, meta: VersionMeta, st: StatsView, now: float,
                      bw: Bandwidths) -> _Figures:
        """:meth:`_figures` (the definition), with what does not depend on the clock kept from
        the last round while the version's metadata, request mix and the bandwidths stay equal
        (:class:`_Kept`): the same operations on the same operands, so the same floats."""
        cfg = self.config
        sc = cfg.score
        rate = st.rate(now, sc.rate_window_s) * liveness(st.idle_s(now), st.mean_gap_s, sc)
        if meta.superseded:
            return _Figures(rate, -1.0, -1.0, None, Reason.SUPERSEDED)
        k = self._kept.get(vid)
        if k is None or k.bandwidths is not bw or k.interactive != st.interactive or (
                k.background != st.background or k.canary != st.canary) or (
                k.meta is not meta and k.meta != meta):
            shares = st.class_shares()
            k = self._kept[vid] = _Kept(
                meta, bw, st.interactive, st.background, st.canary,
                penalty_s(bw.warm_to_hot_s(meta.size_bytes), shares, sc),
                penalty_s(bw.load_s(meta.size_bytes, Tier.COLD), shares, sc),
                sc.priority_values[meta.priority],
                size_factor(meta.size_bytes, sc.warm_size_exponent),
                protection_of(meta, cfg))
        heat = terms(rate, k.penalty_hot, k.priority_value, meta.warmup, sc).heat
        warm = terms(st.rate_warm(now, sc.warm_rate_window_s), k.penalty_warm, k.priority_value,
                     meta.warmup, sc).heat
        return _Figures(rate, heat, warm / k.size_factor, k.kind,
                        demotion_reason(meta, st, now, cfg))

    def online(self, ctx: OnlineContext) -> HeatOnline | AdaptiveHeatOnline:
        """Fresh online state for the simulator: the adaptive experts (``adaptive.py``) unless
        ``adaptive.enabled`` is false, then the plain heat score."""
        if self.config.adaptive.enabled:
            return AdaptiveHeatOnline(ctx, self.config)
        return HeatOnline(ctx, self.config)

    # -- planning -----------------------------------------------------------------------------

    def plan(self, snapshot: Snapshot, now: float) -> Plan:
        """Actions that move the snapshot towards the heat policy's target placement.

        Deterministic for a given snapshot and clock. Raises :class:`SnapshotError`
        when the snapshot is inconsistent (unknown versions, pins that are not HOT).
        """
        problems = snapshot.problems()
        if problems:
            raise SnapshotError(problems)
        cfg = self.config
        versions = snapshot.versions
        ranks = snapshot.ranks
        sc = self._scores(snapshot, now)
        self._idle_from_load(snapshot, now, sc)
        kind, rate, heat, value, demote = sc.kind, sc.rate, sc.heat, sc.value, sc.demote
        requested, undemoted = sc.requested, sc.undemoted
        # the HOT order: the adaptive experts' when the snapshot carries it (ranking.py: the
        # code the simulator measures), else the plain heat score (every version the plan
        # orders by it is an undemoted one)
        keep = heat if ranks is None else {v: ranks.hot_key(v) for v in undemoted}

        targets = [
            _Target(worker=w, slots_left=dict(w.hot_slots), hot={}, pending={
                bm: len(group) for bm, group in
                by_base_model(w.hot, lambda v: versions[v].base_model).items()})
            for w in snapshot.workers
        ]
        replicas: dict[str, int] = {}

        def assign(t: _Target, vid: str, reason: Reason | None) -> None:
            meta = versions[vid]
            if vid in t.worker.hot:
                t.pending[meta.base_model] -= 1
            t.hot[vid] = reason
            t.slots_left[meta.base_model] = t.slots_left.get(meta.base_model, 0) - 1
            t.bytes_needed += meta.size_bytes
            t.load += rate[vid]
            replicas[vid] = replicas.get(vid, 0) + 1

        # 1. in-flight versions stay HOT where they are (hard rule)
        for t in targets:
            for vid in sorted(t.worker.hot):
                if t.worker.busy(vid):
                    assign(t, vid, None)

        # 2. protected incumbents keep their slot, within their kind's share
        for t in targets:
            for bm, slots in sorted(t.worker.hot_slots.items()):
                taken = {Protection.CANARY: 0, Protection.PRIORITY: 0}
                pinned = 0
                incumbents = sorted(
                    (v for v in t.worker.hot
                     if versions[v].base_model == bm and kind[v] is not None
                     and demote[v] is None),
                    key=lambda v: (-keep[v], v),
                )
                for vid in incumbents:
                    k = kind[vid]
                    assert k is not None
                    if taken[k] >= hot_share_limit(k, slots, cfg) or pinned >= max_pins(slots):
                        continue
                    taken[k] += 1
                    pinned += 1
                    if vid not in t.hot:
                        assign(t, vid, None)

        # 3. everyone else by heat (incumbents get the hysteresis bonus), with replicas
        serving: dict[str, int] = {}
        for t in targets:
            for bm in t.worker.hot_slots:
                serving[bm] = serving.get(bm, 0) + 1
        incumbent = {v for t in targets for v in t.worker.hot}
        hottest: set[str] = set()
        by_bm: dict[str, list[str]] = {}
        for vid in requested:  # a version with a rate has statistics
            if demote[vid] is None and rate[vid] > 0:
                by_bm.setdefault(versions[vid].base_model, []).append(vid)
        for members in by_bm.values():
            members.sort(key=lambda v: (-rate[v], v))
            hottest.update(members[: cfg.placement.hottest_top_n])
        # incumbents get the hysteresis bonus on the plain score; the adaptive order has its
        # own stability (shadow scores decide the leader) and none, as in the simulator
        bonus = 1.0 + cfg.placement.hysteresis if ranks is None else 1.0
        order = sorted(
            (v for v in undemoted if versions[v].base_model in serving),
            key=lambda v: (-(keep[v] * bonus if v in incumbent else keep[v]), v),
        )
        hosts = _HostIndex(targets)
        for vid in order:
            meta = versions[vid]
            wanted, first_reason = self._wanted_replicas(
                meta, vid in incumbent, heat[vid], rate[vid], vid in hottest, kind[vid],
                serving[meta.base_model],
            )
            for _ in range(wanted - replicas.get(vid, 0)):
                chosen = self._pick_worker(self._host_candidates(hosts, vid, meta), vid, meta)
                if chosen is None:
                    break
                if vid in chosen.worker.hot:
                    reason: Reason | None = None
                elif replicas.get(vid, 0) == 0:
                    reason = first_reason
                elif replicas.get(vid, 0) < cfg.placement.min_hot_replicas and (
                    vid in hottest or kind[vid] is Protection.PRIORITY
                ):
                    reason = Reason.MIN_REPLICAS
                else:
                    reason = Reason.LOAD_SPREAD
                assign(chosen, vid, reason)
                hosts.changed(chosen)

        # 4. pins: protected target versions, within shares, never every slot
        for t in targets:
            t.pins = set()
            for bm, slots in sorted(t.worker.hot_slots.items()):
                taken = {Protection.CANARY: 0, Protection.PRIORITY: 0}
                protected = sorted(
                    (v for v in t.hot if versions[v].base_model == bm and kind[v] is not None
                     and demote[v] is None),
                    key=lambda v: (-keep[v], v),
                )
                for vid in protected:
                    k = kind[vid]
                    assert k is not None
                    if taken[k] >= hot_share_limit(k, slots, cfg):
                        continue
                    if sum(taken.values()) >= max_pins(slots):
                        break
                    taken[k] += 1
                    t.pins.add(vid)

        actions: list[Action] = []
        for t in targets:
            actions.extend(self._hot_actions(t, versions, heat, demote, replicas))
            actions.extend(self._warm_actions(t, snapshot, targets, value, kind, now))
        actions.extend(self._prewarm_actions(snapshot, targets, sc.prewarm))
        return Plan.of(actions)

    def _idle_from_load(self, snapshot: Snapshot, now: float, sc: _Scores) -> None:
        """A version HOT on a worker that loaded it less than ``demote.idle_minutes`` ago is
        not idle: its idle time counts from the later of its last request and that load
        (``WorkerState.loaded_at``), and from the load alone when it was never requested.

        A worker loads a version on the request path before that request's heat reaches the
        planner: demoted then as idle (never requested, or not for an hour), the version was
        promoted again a round later when the heat came (an incumbent above
        ``promote_min_heat``, ``min_hot_replicas``), and the requests that met the demotion
        were refused (a worker drains the version it demotes). A version without
        ``loaded_at`` counts as before."""
        idle_s = self.config.demote.idle_minutes * 60.0
        demote = sc.demote
        for w in snapshot.workers:
            for vid, at in w.loaded_at.items():
                if demote.get(vid) is Reason.IDLE and vid in w.hot and now - at <= idle_s:
                    demote[vid] = None
                    sc.undemoted.append(vid)

    def _wanted_replicas(
        self,
        meta: VersionMeta,
        is_incumbent: bool,
        heat: float,
        rate: float,
        is_hottest: bool,
        kind: Protection | None,
        n_serving: int,
    ) -> tuple[int, Reason]:
        """How many HOT replicas a version should have, and why its first one is promoted."""
        pl = self.config.placement
        reason = Reason.HEAT
        wanted = 0
        if is_incumbent or heat >= pl.promote_min_heat:
            wanted = 1
        warmup_part = self.config.score.weights.scheduled_warmup * meta.warmup
        if meta.warmup > 0.0 and (wanted == 0 or heat - warmup_part < pl.promote_min_heat):
            wanted, reason = max(wanted, 1), Reason.SCHEDULED_WARMUP
        if wanted and (is_hottest or kind is Protection.PRIORITY):
            wanted = max(wanted, pl.min_hot_replicas)
        if wanted:
            wanted = max(wanted, math.ceil(rate / pl.replica_qps))
        return min(wanted, pl.max_hot_replicas, n_serving), reason

    def _host_candidates(self, hosts: _HostIndex, vid: str, meta: VersionMeta) -> list[_Target]:
        """The targets :meth:`_pick_worker` needs to look at for ``vid`` (the index's
        :meth:`~_HostIndex.candidates`; a subclass may return every target, the definition).

        A method, not a static one: compiled (:mod:`loraplane.native`), a call of a static
        method is bound to this class's, and a subclass's would never run."""
        return hosts.candidates(vid, meta)

    @staticmethod
    def _pick_worker(targets: Iterable[_Target], vid: str, meta: VersionMeta) -> _Target | None:
        """Best worker among ``targets`` for one more HOT replica
        (:func:`loraplane.policy.placement.host_key`): where it is HOT, then where a slot is
        free without displacing anyone, then where it is WARM, then the least loaded; equal
        keys: the first target."""
        bm = meta.base_model
        eligible = [
            t for t in targets
            if bm in t.worker.hot_slots and vid not in t.hot and t.slots_left.get(bm, 0) > 0
            and t.bytes_needed + meta.size_bytes <= t.worker.warm_bytes
        ]
        if len(eligible) <= 1:
            return eligible[0] if eligible else None
        best: tuple[tuple[bool, bool, bool, bool, float, int], _Target] | None = None
        for t in eligible:
            w = t.worker
            hot_here = vid in w.hot
            # versions HOT here not in the target yet, but this one (it is not in t.hot)
            pending_incumbents = t.pending.get(bm, 0) - (1 if hot_here else 0)
            key = host_key(vid, HostOption(
                worker_id=w.worker_id, hot_here=hot_here,
                free_slots=t.slots_left[bm] - pending_incumbents,
                resident=vid in w.resident(), load=t.load,
            ))
            if best is None or key < best[0]:
                best = (key, t)
        return None if best is None else best[1]

    @staticmethod
    def _hot_actions(
        t: _Target,
        versions: Mapping[str, VersionMeta],
        heat: Mapping[str, float],
        demote: Mapping[str, Reason | None],
        replicas: Mapping[str, int],
    ) -> list[Action]:
        w = t.worker
        pins = t.pins or set()
        out: list[Action] = []
        for vid in sorted(w.hot):
            if vid in t.hot:
                if vid in w.pinned and vid not in pins:
                    out.append(Action(ActionKind.UNPIN, w.worker_id, vid, Reason.UNPROTECTED))
                continue
            reason = demote[vid]
            if reason is None and replicas.get(vid, 0) > 0:
                reason = Reason.REPLICA_SURPLUS
            if reason is None:
                bm = versions[vid].base_model
                group = by_base_model(w.hot, lambda v: versions[v].base_model).get(bm, [])
                over = len(group) > w.hot_slots.get(bm, 0)
                reason = Reason.CAPACITY if over else Reason.DISPLACED
            if vid in w.pinned:
                out.append(Action(ActionKind.UNPIN, w.worker_id, vid, reason))
            out.append(Action(ActionKind.DEMOTE, w.worker_id, vid, reason, f"heat {heat[vid]:.4g}"))
        for vid, why in sorted(t.hot.items()):
            if why is not None:
                out.append(
                    Action(ActionKind.PROMOTE, w.worker_id, vid, why, f"heat {heat[vid]:.4g}")
                )
        for vid in sorted(pins - w.pinned):
            out.append(Action(ActionKind.PIN, w.worker_id, vid, Reason.PROTECTED))
        return out

    def _warm_actions(
        self,
        t: _Target,
        snapshot: Snapshot,
        targets: list[_Target],
        value: Mapping[str, float],
        kind: Mapping[str, Protection | None],
        now: float,
    ) -> list[Action]:
        """Keep what the HOT target needs, then protected versions, then the best value per byte."""
        w = t.worker
        versions = snapshot.versions
        cap = w.warm_bytes
        keep: set[str] = set(t.hot) | {v for v in w.resident() if w.busy(v)}
        used = total_bytes(keep, lambda v: size_of(snapshot, v))
        out: list[Action] = []
        ranks = snapshot.ranks
        if ranks is None:
            rest = sorted(w.resident() - keep, key=lambda v: (-value[v], v))
        else:
            # the adaptive WARM expert's order, best first (its victim: the lowest key, then id)
            rest = sorted(w.resident() - keep,
                          key=lambda v: (ranks.warm_key(w.worker_id, v), v), reverse=True)
        protected = [v for v in rest if kind[v] is not None]
        others = [v for v in rest if kind[v] is None]
        for vid in protected:
            size = versions[vid].size_bytes
            if used + size <= cap:
                keep.add(vid)
                used += size
            else:
                out.append(
                    Action(ActionKind.EVICT, w.worker_id, vid, Reason.PROTECTION_OVERFLOW,
                           f"protected versions exceed {cap} host bytes")
                )
        for vid in others:
            meta = versions[vid]
            if meta.superseded:
                out.append(Action(ActionKind.EVICT, w.worker_id, vid, Reason.SUPERSEDED))
                continue
            idle = eviction_reason(meta, snapshot.stats_of(vid), now, self.config)
            if idle is not None:
                out.append(Action(ActionKind.EVICT, w.worker_id, vid, idle))
                continue
            if used + meta.size_bytes <= cap:
                keep.add(vid)
                used += meta.size_bytes
                continue
            reason = Reason.CAPACITY if self._resident_bytes(w, snapshot) > cap else Reason.DISPLACED
            out.append(
                Action(ActionKind.EVICT, w.worker_id, vid, reason, f"value {value[vid]:.4g}/GB")
            )
        t.bytes_needed = used
        return out

    @staticmethod
    def _resident_bytes(w: WorkerState, snapshot: Snapshot) -> int:
        return total_bytes(w.resident(), lambda v: size_of(snapshot, v))

    @staticmethod
    def _prewarm_actions(
        snapshot: Snapshot, targets: list[_Target], prewarm: list[tuple[str, Reason]]
    ) -> list[Action]:
        """Prefetch active canaries and scheduled warm-ups that no worker holds yet
        (``prewarm``: :attr:`_VersionFacts.prewarm`)."""
        out: list[Action] = []
        if not prewarm:
            return out
        placed = {v for t in targets for v in t.worker.resident()} | {
            v for t in targets for v in t.hot
        }
        for vid, reason in prewarm:
            meta = snapshot.versions[vid]
            if vid in placed:
                continue
            best: tuple[tuple[float, int], _Target] | None = None
            for t in targets:
                w = t.worker
                if meta.base_model not in w.hot_slots:
                    continue
                if t.bytes_needed + meta.size_bytes > w.warm_bytes:
                    continue
                key = (t.bytes_needed / max(w.warm_bytes, 1), _stable_hash(vid, w.worker_id))
                if best is None or key < best[0]:
                    best = (key, t)
            if best is None:
                continue
            t = best[1]
            t.bytes_needed += meta.size_bytes
            out.append(Action(ActionKind.PREFETCH, t.worker.worker_id, vid, reason))
        return out


class SnapshotError(ValueError):
    """The snapshot is inconsistent; ``problems`` lists every reason."""

    retriable = False

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("inconsistent snapshot: " + "; ".join(self.problems))
