"""The adaptive ranking for the cache-manager: the simulator's experts, fed by live heat.

The simulator measures :class:`~loraplane.policy.adaptive.AdaptiveHeatOnline` request by
request; the cache-manager plans on snapshots. :class:`AdaptiveRanking` is the bridge, so
that the service runs the code the simulator measures (one implementation): it holds one
``AdaptiveHeatOnline`` over the cluster the cache-manager sees, feeds it every completed
request (``observe``: :meth:`~AdaptiveHeatOnline.on_request` then
:meth:`~AdaptiveHeatOnline.note_served`), tells it of WARM evictions (the reuse expert's
inflation value rises as at a simulated victim) and hands the heat plan the order its
leading experts would take victims in (:class:`Ranks`, carried by the
:class:`~loraplane.policy.snapshot.Snapshot`). The simulated tiers of that object stay
empty: the real placement is the snapshot's.

Mapping to the simulator's integers: versions, workers and base models are numbered in
sorted id order (so ties break on the id, as the simulator's break on the integer); slot
group = worker × base models + base model; the group size is the largest slot count of
any (worker, base model), the WARM size the largest host bytes of any worker.

**State across rounds and leaders.** The experts' state (decayed counts, shadows, leaders)
lives in memory only. A change of the universe (a version or worker appears or leaves, a
capacity changes) rebuilds the object and replays the last ``history`` requests kept here
(the WARM inflation value restarts at 0 then). A new leader starts empty and learns from the
heat events it consumes; until it has seen ``adaptive.hot_tau_per_slot`` × slots requests
(one HOT time constant) :meth:`ranks` is None and the heat plan ranks by the plain heat score
of the stored statistics, so a takeover does not reshuffle the cluster on no evidence.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from heapq import heapify, heappop, heappush
from types import MappingProxyType
from typing import overload

from .adaptive import AdaptiveHeatOnline
from .config import PolicyConfig
from .cost import Bandwidths
from .model import Priority, RequestClass
from .online import CLASS_CODE, PRIORITY_CODE, OnlineContext
from .snapshot import Ranks

DEFAULT_HISTORY = 50_000
"""Requests kept for a replay when the universe changes (a rebuild replays them: ~0.5 s of CPU
for 50,000 on this machine, once per admitted version or worker change)."""
_NEVER = math.inf
"""A stream end that never comes (:meth:`AdaptiveHeatOnline.stream_end`)."""


class _Latest(Sequence[int]):
    """A request column of one value at a time: the service feeds one request at a time,
    and the online policy reads only the current request's entry."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    @overload
    def __getitem__(self, i: int) -> int: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[int]: ...

    def __getitem__(self, i: int | slice) -> int | Sequence[int]:
        if isinstance(i, slice):
            raise TypeError("a request column of the live service has no slices")
        return self.value

    def __len__(self) -> int:
        return 0


@dataclass(frozen=True, slots=True)
class RankedVersion:
    """What the ranking must know of a version."""

    version_id: str
    size_bytes: int
    adapter_id: str
    """Versions of one adapter share it (a stable version supersedes the previous one)."""
    tenant_id: str
    base_model: str


@dataclass(frozen=True, slots=True)
class RankedWorker:
    """What the ranking must know of a worker: capacities and what it holds now."""

    worker_id: str
    hot_slots: Mapping[str, int]
    warm_bytes: int
    resident: frozenset[str] = frozenset()
    """Versions with files here (HOT ∪ WARM): one that leaves counts as a WARM eviction."""


_Request = tuple[str, str, int, int, int, float]
"""One kept request (of up to ``history``): version id, worker id, class code, priority code,
canary (0/1), event time. A plain tuple of strings and numbers, which the garbage collector
stops tracking (an exact tuple only: not a NamedTuple or dataclass), where 50,000 tracked
objects would be walked by every full collection (issue 18)."""


class _Kept:
    """The order :meth:`AdaptiveRanking.ranks` gave last, kept for the next call.

    Per slot group, its versions from the top of the group's order down (the position is the
    index): ``entries`` holds each one's (-rank, -version) (ascending = the definition's
    descending order), ``names`` the version ids beside them; ``lows`` the first position of
    each group that moved since the last call (-1: none). ``hot`` is every version's keep key
    as of the last call (positions moved are written again)."""

    __slots__ = ("base", "deadlines", "entries", "entry", "group", "hot", "leads", "lows",
                 "names", "warm", "warm_leads")

    def __init__(self, n_groups: int, n_versions: int, base: float) -> None:
        self.base = base
        """The experts' rebase point these ranks were read at (another: rank everything)."""
        self.entries: list[list[tuple[float, float, int]]] = [[] for _ in range(n_groups)]
        self.names: list[list[str]] = [[] for _ in range(n_groups)]
        self.lows = [-1] * n_groups
        self.entry: list[tuple[float, float, int]] = [(0.0, 0.0, 0)] * n_versions
        """Each version's entry in its group's order."""
        self.group = [0] * n_versions
        """The group each version ranks in."""
        self.hot: dict[str, float] = {}
        self.leads: list[str] = []
        """Each group's leading HOT expert when last ranked."""
        self.warm_leads: dict[str, str] = {}
        """Each worker's leading WARM expert when last ranked."""
        self.deadlines: list[tuple[float, int]] = []
        """(stream end, version) ahead of the request clock, a heap (stale entries allowed:
        ranking a version again is always exact)."""
        self.warm: dict[tuple[str, str], float] = {}
        """The WARM keys given last."""


class AdaptiveRanking:
    """The adaptive heat experts over the live cluster (see the module docstring)."""

    def __init__(self, config: PolicyConfig, bandwidths: Bandwidths | None = None,
                 history: int = DEFAULT_HISTORY) -> None:
        if history < 0:
            raise ValueError(f"history must be >= 0, got {history}")
        self.config = config
        self.bandwidths = bandwidths or Bandwidths()
        self._log: deque[_Request] = deque(maxlen=history)
        self._versions: tuple[RankedVersion, ...] = ()
        self._vmap: dict[str, RankedVersion] = {}
        self._given: tuple[RankedVersion, ...] | None = None
        """The versions tuple of the last :meth:`update` (its contents are :attr:`_vmap`)."""
        self._workers: tuple[tuple[str, tuple[tuple[str, int], ...], int], ...] = ()
        self._vindex: dict[str, int] = {}
        self._windex: dict[str, int] = {}
        self._bindex: dict[str, int] = {}
        self._first_groups: list[int] = []
        self._vids: list[str] = []
        self._position_keys: list[float] = []
        self._online: AdaptiveHeatOnline | None = None
        self._cols = (_Latest(), _Latest(), _Latest(), _Latest())
        self._clock = 0
        self._slots = 0
        self._resident: dict[str, frozenset[str]] = {}
        self._current: _Request | None = None
        self._kept: _Kept | None = None
        self._touched: set[int] = set()
        """Versions whose rank may have changed since the last :meth:`ranks` (a request of
        theirs or of another version of their adapter, a serve)."""
        self._touched_tenants: set[int] = set()
        """Tenants with a request since (the WARM keys' tenant refresh)."""
        self._siblings: list[tuple[int, ...]] = []
        """Per version, the other versions of its adapter (a release may supersede them)."""
        self._tenant_of: list[int] = []
        self._tenant_vids: list[list[str]] = []
        """Per tenant code, its version ids."""
        self.seen = 0
        """Requests fed to the current experts (a rebuild counts its replay)."""

    # -- inputs -------------------------------------------------------------------------------

    def observe(self, version_id: str, worker_id: str, request_class: RequestClass,
                priority: Priority, canary: bool, at: float) -> None:
        """One completed request of ``version_id`` served on ``worker_id`` ("" when unknown),
        in event-time order per producer; ``canary``: the version is an active canary.
        :meth:`arrived` then :meth:`served` (a completion reports both at once)."""
        self.arrived(version_id, worker_id, request_class, priority, canary, at)
        self.served()

    def arrived(self, version_id: str, worker_id: str, request_class: RequestClass,
                priority: Priority, canary: bool, at: float) -> None:
        """The request's arrival (:meth:`AdaptiveHeatOnline.on_request`); :meth:`served`
        must follow before the next one. Apart for a caller that sees evictions in between,
        as the simulator does."""
        req: _Request = (version_id, worker_id, CLASS_CODE[request_class],
                         PRIORITY_CODE[priority], 1 if canary else 0, at)
        self._log.append(req)
        self._arrive(req)

    def served(self) -> None:
        """The arrived request was served on its worker (:meth:`AdaptiveHeatOnline.note_served`)."""
        req, self._current = self._current, None
        if req is not None:
            self._serve(req)

    def update(self, versions: Iterable[RankedVersion], workers: Iterable[RankedWorker]) -> None:
        """The universe now: rebuild (and replay the kept requests) when it changed; WARM
        evictions since the last update raise the reuse expert's inflation value. Pass the
        same :class:`RankedVersion` object while a version is unchanged (cheap check)."""
        # the usual round changes nothing: compare by identity first (a caller that keeps its
        # RankedVersion objects while a version is unchanged makes this O(versions), no sort;
        # one that passes the very tuple of the last call, nothing at all)
        known = self._vmap
        if isinstance(versions, tuple) and versions is self._given:
            fresh, same = known, True
        else:
            fresh = {}
            same = True
            for r in versions:
                fresh[r.version_id] = r
                if same:
                    old = known.get(r.version_id)
                    same = old is r or old == r
            same = same and len(fresh) == len(known)
            self._given = versions if isinstance(versions, tuple) else None
        ws = tuple(sorted(workers, key=lambda r: r.worker_id))
        shape = tuple((w.worker_id, tuple(sorted(w.hot_slots.items())), w.warm_bytes) for w in ws)
        if not same or shape != self._workers:
            self._vmap = fresh
            self._versions = tuple(fresh[vid] for vid in sorted(fresh))
            self._workers = shape
            self._rebuild()
        online = self._online
        for w in ws:
            before = self._resident.get(w.worker_id, frozenset())
            if online is not None:
                wi = self._windex.get(w.worker_id)
                for vid in sorted(before - w.resident):
                    vi = self._vindex.get(vid)
                    if wi is not None and vi is not None:
                        online.note_evicted(wi, vi)
            self._resident[w.worker_id] = w.resident

    # -- output -------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Whether the experts have seen one HOT time constant of requests."""
        return self._online is not None and self.seen >= self._warmup()

    def ranks(self, resident: Iterable[tuple[str, str]]) -> Ranks | None:
        """The experts' order for a plan (None until :attr:`ready`); ``resident``: the
        (worker id, version id) pairs whose WARM key the plan needs.

        Incremental: the order of the last call is kept (:class:`_Kept`) and only the
        versions whose rank may have changed since are ranked again — a request of the version
        (or of another version of its adapter: a release supersedes), its first serve (its
        home group), its stream's end reached by the request clock, a switch of its group's
        leading HOT expert; a WARM key also with a request of its tenant (the tenant refresh)
        or a switch of its worker's WARM expert, and a pair not asked last time (a residency
        change). A rebase of the decayed counts (every heat rescaled: distinct keys may tie)
        or a new universe ranks everything again. The same :class:`Ranks` as
        :meth:`ranks_from_scratch`, the definition (``tests/unit/policy/test_ranking.py``
        compares them round by round)."""
        online = self._online
        if online is None or not self.ready:
            return None
        kept = self._kept
        touched, tenants = self._touched, self._touched_tenants
        self._touched, self._touched_tenants = set(), set()
        if kept is None or kept.base != online.time_base():
            kept = self._kept = self._rank_all(online)
            stale_wids: set[str] = set(self._windex)
            stale: set[str] = set()
        else:
            dirty = touched
            # a group whose leading HOT expert switched: all its members
            for g, lead in enumerate(kept.leads):
                now_lead = online.hot_expert(g)
                if now_lead != lead:
                    kept.leads[g] = now_lead
                    dirty.update(-e[2] for e in kept.entries[g])
            # streams whose end the request clock reached: ended now
            clock = online.request_clock()
            deadlines = kept.deadlines
            while deadlines and deadlines[0][0] <= clock:
                dirty.add(heappop(deadlines)[1])
            for vi in dirty:
                self._rank_one(online, kept, vi, clock)
            if len(deadlines) > 2 * len(self._vids) + 64:
                self._refile_deadlines(online, kept, clock)
            names, lows, keys = kept.names, kept.lows, self._position_keys
            hot = kept.hot
            for g, lo in enumerate(lows):
                if lo >= 0:
                    run = names[g]
                    hot.update(zip(run[lo:], keys[lo:len(run)], strict=True))
                    lows[g] = -1
            vids = self._vids
            stale = {vids[vi] for vi in dirty}
            by_tenant = self._tenant_vids
            for t in tenants:
                stale.update(by_tenant[t])
            stale_wids = set()
            for wid, wi in self._windex.items():
                lead = online.warm_expert(wi)
                if kept.warm_leads.get(wid) != lead:
                    kept.warm_leads[wid] = lead
                    stale_wids.add(wid)
        # WARM keys: the last call's where nothing they read changed
        before = kept.warm
        warm: dict[tuple[str, str], float] = {}
        windex, vindex, warm_rank = self._windex, self._vindex, online.warm_rank
        for pair in resident:
            k = before.get(pair)
            wid, vid = pair
            if k is None or vid in stale or wid in stale_wids:
                w_at = windex.get(wid)
                v_at = vindex.get(vid)
                if w_at is None or v_at is None:
                    continue
                k = warm_rank(w_at, v_at)
            warm[pair] = k
        kept.warm = warm
        return Ranks(MappingProxyType(dict(kept.hot)), MappingProxyType(warm),
                     MappingProxyType(self._hot_experts(online)),
                     MappingProxyType({wid: online.warm_expert(wi)
                                       for wid, wi in self._windex.items()}))

    def ranks_from_scratch(self, resident: Iterable[tuple[str, str]]) -> Ranks | None:
        """:meth:`ranks` by its definition, every version ranked again (what the incremental
        order must equal; it reads the experts only, and keeps nothing)."""
        online = self._online
        if online is None or not self.ready:
            return None
        # a version not served yet ranks in the first worker's group of its base model
        home, hot_rank = online.home_group, online.hot_rank
        homes = [g if (g := home(vi)) >= 0 else first
                 for vi, first in enumerate(self._first_groups)]
        # by group, then from the top of the group's order (highest rank, then version) down:
        # each group's run gets its positions' keys 0, -1/slots, -2/slots, ...
        ordered = sorted(((g, hot_rank(g, vi), vi) for vi, g in enumerate(homes)), reverse=True)
        sizes = Counter(homes)
        keys: list[float] = []
        for g in sorted(sizes, reverse=True):
            keys.extend(self._position_keys[: sizes[g]])
        vids = self._vids
        hot = dict(zip([vids[vi] for _, _, vi in ordered], keys, strict=True))
        warm: dict[tuple[str, str], float] = {}
        for wid, vid in resident:
            w_at = self._windex.get(wid)
            v_at = self._vindex.get(vid)
            if w_at is not None and v_at is not None:
                warm[(wid, vid)] = online.warm_rank(w_at, v_at)
        warm_experts = {wid: online.warm_expert(wi) for wid, wi in self._windex.items()}
        return Ranks(MappingProxyType(hot), MappingProxyType(warm),
                     MappingProxyType(self._hot_experts(online)), MappingProxyType(warm_experts))

    def _hot_experts(self, online: AdaptiveHeatOnline) -> dict[str, str]:
        n_bm = max(1, len(self._bindex))
        return {
            f"{wid}/{bm}": online.hot_expert(wi * n_bm + bi)
            for wid, wi in self._windex.items() for bm, bi in self._bindex.items()
        }

    def _rank_all(self, online: AdaptiveHeatOnline) -> _Kept:
        """Every version ranked (the first call on these experts, or after a rebase)."""
        n_groups = max(1, len(self._windex)) * max(1, len(self._bindex))
        kept = _Kept(n_groups, len(self._vids), online.time_base())
        home, hot_rank = online.home_group, online.hot_rank
        clock = online.request_clock()
        entries, names, vids, groups = kept.entries, kept.names, self._vids, kept.group
        for vi, first in enumerate(self._first_groups):
            g = home(vi)
            if g < 0:
                g = first
            r0, r1 = hot_rank(g, vi)
            entry = (-r0, -r1, -vi)
            kept.entry[vi] = entry
            groups[vi] = g
            entries[g].append(entry)
        for g, run in enumerate(entries):
            run.sort()
            names[g] = [vids[-e[2]] for e in run]
            kept.hot.update(zip(names[g], self._position_keys, strict=False))
        kept.leads = [online.hot_expert(g) for g in range(n_groups)]
        kept.warm_leads = {wid: online.warm_expert(wi) for wid, wi in self._windex.items()}
        self._refile_deadlines(online, kept, clock)
        return kept

    def _rank_one(self, online: AdaptiveHeatOnline, kept: _Kept, vi: int, clock: float) -> None:
        """Rank ``vi`` again; move it in (or between) the groups' orders if it changed."""
        g = online.home_group(vi)
        if g < 0:
            g = self._first_groups[vi]
        r0, r1 = online.hot_rank(g, vi)
        entry = (-r0, -r1, -vi)
        end = online.stream_end(vi)
        if clock < end < _NEVER:
            heappush(kept.deadlines, (end, vi))
        old, was = kept.entry[vi], kept.group[vi]
        if was == g and old == entry:
            return
        lows = kept.lows
        run = kept.entries[was]
        j = bisect_left(run, old)
        del run[j]
        del kept.names[was][j]
        if lows[was] < 0 or j < lows[was]:
            lows[was] = j
        run = kept.entries[g]
        j = bisect_left(run, entry)
        run.insert(j, entry)
        kept.names[g].insert(j, self._vids[vi])
        if lows[g] < 0 or j < lows[g]:
            lows[g] = j
        kept.entry[vi] = entry
        kept.group[vi] = g

    @staticmethod
    def _refile_deadlines(online: AdaptiveHeatOnline, kept: _Kept, clock: float) -> None:
        """The stream ends still ahead of the request clock, one entry per version."""
        ends = [(end, vi) for vi in range(len(kept.entry))
                if clock < (end := online.stream_end(vi)) < _NEVER]
        heapify(ends)
        kept.deadlines = ends

    # -- internals ----------------------------------------------------------------------------

    def _warmup(self) -> int:
        return int(self.config.adaptive.hot_tau_per_slot * max(1, self._slots)
                   * max(1, len(self._windex)) * max(1, len(self._bindex)))

    def _rebuild(self) -> None:
        vs = self._versions
        self._vindex = {r.version_id: i for i, r in enumerate(vs)}
        self._windex = {w[0]: i for i, w in enumerate(self._workers)}
        bms = sorted({bm for w in self._workers for bm, _ in w[1]} | {r.base_model for r in vs})
        self._bindex = {bm: i for i, bm in enumerate(bms)}
        self._slots = max((s for w in self._workers for _, s in w[1]), default=0)
        first_worker = 0
        self._first_groups = [first_worker * max(1, len(bms)) + self._bindex.get(r.base_model, 0)
                              for r in vs]
        """Per version, the slot group it ranks in until its first request is served there."""
        self._vids = [r.version_id for r in vs]
        self._position_keys = [-pos / max(1, self._slots) for pos in range(len(vs))]
        """HOT keep key of the version at each position of a group's order."""
        self._resident = {}
        self.seen = 0
        self._clock = 0
        self._kept = None
        if not vs or not self._workers or self._slots <= 0:
            self._online = None
            return
        adapters = _intern(r.adapter_id for r in vs)
        tenants = _intern(r.tenant_id for r in vs)
        per_adapter: dict[int, list[int]] = {}
        for vi, a in enumerate(adapters):
            per_adapter.setdefault(a, []).append(vi)
        self._siblings = [tuple(u for u in per_adapter[a] if u != vi) for vi, a in
                          enumerate(adapters)]
        self._tenant_of = tenants
        self._tenant_vids = [[] for _ in range(max(tenants, default=-1) + 1)]
        for r, t in zip(vs, tenants, strict=True):
            self._tenant_vids[t].append(r.version_id)
        versions, classes, priorities, canary = self._cols
        ctx = OnlineContext(
            n_versions=len(vs), n_workers=len(self._workers), n_base_models=len(bms),
            hot_slots=self._slots, warm_bytes=max(w[2] for w in self._workers),
            sizes=[r.size_bytes for r in vs], adapters=adapters, versions=versions,
            classes=classes, priorities=priorities, canary=canary,
            bandwidths=self.bandwidths, tenants=tenants,
        )
        self._online = AdaptiveHeatOnline(ctx, self.config)
        for req in self._log:
            self._arrive(req)
            self.served()
        self._touched, self._touched_tenants = set(), set()

    def _arrive(self, req: _Request) -> None:
        self._current = None
        online = self._online
        if online is None:
            return
        version_id, _, request_class, priority, is_canary, at = req
        vi = self._vindex.get(version_id)
        if vi is None:
            return
        versions, classes, priorities, canary = self._cols
        versions.value = vi
        classes.value = request_class
        priorities.value = priority
        canary.value = is_canary
        online.on_request(self._clock, vi, at)
        self._clock += 1
        self.seen += 1
        self._current = req
        self._touched.add(vi)
        siblings = self._siblings[vi]
        if siblings:
            self._touched.update(siblings)
        self._touched_tenants.add(self._tenant_of[vi])

    def _serve(self, req: _Request) -> None:
        online = self._online
        wi = self._windex.get(req[1])
        vi = self._vindex.get(req[0])
        if online is not None and wi is not None and vi is not None:
            bi = self._bindex[self._versions[vi].base_model]
            online.note_served(wi * max(1, len(self._bindex)) + bi, wi, vi)
            self._touched.add(vi)  # its home group, its reuse key


def _intern(names: Iterator[str] | Iterable[str]) -> list[int]:
    """Small integers for names, in order of first appearance."""
    codes: dict[str, int] = {}
    return [codes.setdefault(n, len(codes)) for n in names]
