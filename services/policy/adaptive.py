"""The heat policy's online victim choice, robust across workloads (issue 13).

Measured on real adapter-serving traffic (GenTD26) the plain heat score lost to
LRU in HOT and to GDSF in WARM, and lost more when the same trace ran 24×
faster: its time constants were absolute seconds tuned on synthetic traces,
where frequency wins; on GenTD26 recency wins. :class:`AdaptiveHeatOnline`
keeps the business rules of :class:`~loraplane.policy.heat.HeatOnline`
(in-flight, protected shares, WARM protection, superseded first) and changes
what ranks the rest:

* **A request clock instead of seconds.** Decayed counts, liveness and sessions
  run on the number of requests seen (the simulator's request index), with
  constants per HOT slot of the cluster (``adaptive.*_per_slot``): replaying a
  trace faster or slower changes nothing but the in-flight overlaps. Business
  rules that are wall-clock by definition (a canary ends after
  ``demote.idle_minutes`` without traffic) stay in seconds.
* **Experts over shadow caches, per tier.** Each HOT slot group runs two shadow
  caches of its size on the same requests, one ranked by recency (LRU) and one
  by heat (decayed rate + priority; a stream idle for more of its own mean gaps
  than the heat score's liveness allows goes first). Each worker's WARM tier runs
  two shadow byte caches: **reuse** per byte — GDSF-style aging (``L`` rises to
  each victim's key) of the version's *sessions* (returns after more than
  ``session_gap_per_slot`` × slots requests without it) plus
  ``reuse_count_weight`` × its request count, a reuse that would otherwise be a
  tail event counting ``1 + tail_weight`` times, and refreshed at
  ``tenant_weight`` of its value whenever its tenant sends a request — and
  **heat** per byte (decayed rate × cost of a COLD load over the class budgets /
  size: the heat score's WARM value). A shadow's decayed score (HOT: hits over
  ``expert_window_per_slot`` × slots requests; WARM: hits weighted by what a miss
  would cost, over ``warm_expert_window_per_slot`` × slots) says which ranking
  would have done best lately; the real tier picks its victim by the leader's
  ranking among its own eligible members (ARC / ACME-style adaptation). The HOT
  leader changes when the other is ahead by more than one hit, the WARM leader
  when the other's score exceeds ``warm_switch_margin`` × its own + 1.
* **Pins protect live streams.** A protected HOT version keeps its pinned slot
  only while idle for fewer than ``pin_idle_per_slot`` × slots requests (and less
  than ``demote.idle_minutes``).
* **Protected WARM share.** Protected versions hold at most
  ``never_evict.warm_share`` of a worker's host bytes protected; beyond it the
  lowest-ranked of them compete with the rest, and each such eviction is counted in
  :attr:`AdaptiveHeatOnline.protection_overflows` (reported by the simulator).

Cost: O(log n) per request, amortised. Every ranking is a lazy min-heap of
keys that do not change with time — rebased decayed counts, GDSF's inflation
value ``L``, the liveness cut-off as a second heap of deadlines; the tenant
refresh only raises keys, so a stale entry is a lower bound that is re-pushed
when it reaches the top. Recency is an ordered dict. The real tier keeps only
its leader's ranking (rebuilt when the leader changes), HOT members are not in
the WARM heap (they cannot be evicted there), protected members sit apart.
Deterministic: ties break on the version id.

Routing assumption (the simulator's): a version is served by one slot group and
one worker.
"""

# The hot loops write `if b > a: a = b` for max(a, b) (the same value, no call).
# ruff: noqa: PLR1730
from __future__ import annotations

import math
from array import array
from collections import OrderedDict
from collections.abc import Container, Mapping
from heapq import heapify, heappop, heappush, heapreplace

from .config import PolicyConfig
from .model import PRIORITIES, REQUEST_CLASSES, RequestClass, Tier
from .online import OnlineContext
from .predicates import Protection, hot_share_limit, protection
from .score import size_factor
from .stats import GAP_SMOOTHING

_NONE, _CANARY, _PRIORITY = 0, 1, 2
_KIND = {None: _NONE, Protection.CANARY: _CANARY, Protection.PRIORITY: _PRIORITY}
_BACKGROUND = REQUEST_CLASSES.index(RequestClass.BACKGROUND)
HOT_EXPERTS = ("lru", "heat")
"""HOT rankings the adaptive policy chooses from."""
WARM_EXPERTS = ("reuse", "heat")
"""WARM rankings the adaptive policy chooses from."""
_LRU, _HEAT = 0, 1
_REUSE = 0
_exp = math.exp
_SMOOTH = GAP_SMOOTHING
_NEVER = math.inf
_GONE = -math.inf
"""Death time / key of a superseded version: first to go."""
_OUT = math.nan
"""A :class:`_HeatRank` key of a version that is not a member (NaN compares unequal to every
heap entry, so all its entries are stale)."""


class _Record:
    """What one version's requests taught (one object: the hot loop updates it in place; a
    native struct once compiled)."""

    __slots__ = ("count", "gap", "kh", "kw", "last", "last_s", "latency", "ph", "prio", "pw",
                 "sessions")

    def __init__(self) -> None:
        self.kh = 0.0
        """Rebased decayed count, HOT time constant."""
        self.kw = 0.0
        """The same, WARM time constant."""
        self.count = 0
        """Requests."""
        self.sessions = 0
        """Sessions (returns after more than ``session_gap_per_slot`` × slots requests)."""
        self.last = _GONE
        """Request clock of the last request."""
        self.gap = 0.0
        """Smoothed inter-arrival gap (0: unknown)."""
        self.ph = 0.0
        """Σ HOT penalty of each request's class (its mean: ``/ count``)."""
        self.pw = 0.0
        """Σ WARM penalty."""
        self.latency = 0
        """Latency-sensitive (not background) requests."""
        self.last_s = -math.inf
        """Seconds of the last request (wall-clock business rules)."""
        self.prio = 0
        """Priority code of the last request (the protection left when a canary's ends)."""


class _HeatRank:
    """Members of one HOT cache ranked by heat: ended streams first (earliest end), then the
    lowest rebased heat.

    Two lazy heaps over the policy's current ``heat`` and ``ends`` arrays (shared by every
    rank). A member's authoritative entry in each heap is the one recorded in ``key`` /
    ``dies``; a request that *raises* its heat or pushes its end later changes only the shared
    arrays (the entry is then a lower bound, refreshed when it reaches the top), one that lowers
    them pushes a new entry. So a request usually costs no heap operation.

    ``key`` and ``dies`` hold one C double per version (``array('d')``): the garbage collector
    does not traverse them, where a list of 10,000 floats per rank, two ranks per slot group,
    made each full collection walk millions of references (issue 18).
    """

    __slots__ = ("alive", "death", "dies", "ends", "heat", "key", "lim", "n")

    def __init__(self, n: int, heat: list[float], ends: list[float]) -> None:
        self.alive: list[tuple[float, int]] = []
        self.death: list[tuple[float, int]] = []
        self.key: array[float] = array("d", [_OUT]) * n
        """Key of each member's current entry in ``alive`` (``_OUT``, NaN: not a member)."""
        self.dies: array[float] = array("d", [_NEVER]) * n
        """End of each member's current entry in ``death`` (``_NEVER``: none)."""
        self.heat = heat
        self.ends = ends
        self.n = 0
        """Members."""
        self.lim = 128
        """Entries (both heaps) beyond which :meth:`evict` drops stale ones."""

    def put(self, v: int, _push: object = heappush) -> None:
        """Add ``v`` or take its new heat and end into account."""
        h = self.heat[v]
        d = self.ends[v]
        k = self.key[v]
        if math.isnan(k):
            self.n += 1
            self.key[v] = h
            heappush(self.alive, (h, v))
            self.dies[v] = d
            if d != _NEVER:
                heappush(self.death, (d, v))
            return
        if h < k:
            self.key[v] = h
            heappush(self.alive, (h, v))
        if d < self.dies[v]:
            self.dies[v] = d
            heappush(self.death, (d, v))

    def drop(self, v: int) -> None:
        """Remove ``v`` (its entries become stale)."""
        if not math.isnan(self.key[v]):
            self.n -= 1
            self.key[v] = _OUT
            self.dies[v] = _NEVER

    def clear(self) -> None:
        """Remove every member."""
        key, dies = self.key, self.dies
        for _, v in self.alive:
            key[v] = _OUT
            dies[v] = _NEVER
        self.alive, self.death, self.n = [], [], 0

    def compact(self) -> None:
        """Drop stale entries once they outnumber the members."""
        limit = 4 * self.n + 64
        if len(self.alive) > limit or len(self.death) > limit:
            key, dies = self.key, self.dies
            self.alive = [(k, v) for k, v in self.alive if key[v] == k]
            heapify(self.alive)
            self.death = [(d, v) for d, v in self.death if not math.isnan(key[v]) and dies[v] == d]
            heapify(self.death)

    def rescale(self, factor: float) -> None:
        """Multiply every key by ``factor`` > 0 (a rebase of the decayed counts: order kept).
        The shared ``heat`` array is rescaled by the caller."""
        key = self.key
        alive = [(k * factor, v) for k, v in self.alive if key[v] == k]
        for k, v in alive:
            key[v] = k
        self.alive = alive
        heapify(alive)

    def victim(self, clock: float, skip: Container[int], busy: Mapping[int, float] | None,
               now: float) -> int | None:
        """Lowest-ranked member not in ``skip`` and not busy (``busy`` None: nothing is)."""
        key, dies, heat, ends = self.key, self.dies, self.heat, self.ends
        death = self.death
        kept: list[tuple[float, int]] = []
        found = None
        while death:
            d, u = death[0]
            if d > clock:
                break
            if math.isnan(key[u]) or dies[u] != d:
                heappop(death)
                continue
            e = ends[u]
            if e > d:  # the stream went on since: refresh the entry
                dies[u] = e
                heapreplace(death, (e, u))
                continue
            heappop(death)
            kept.append((d, u))
            if u in skip or (busy is not None and busy.get(u, 0.0) > now):
                continue
            found = u
            break
        for entry in kept:
            heappush(death, entry)
        if found is not None:
            self.compact()
            return found
        alive = self.alive
        kept = []
        while alive:
            k, u = alive[0]
            if key[u] != k:
                heappop(alive)
                continue
            h = heat[u]
            if h > k:  # hotter since: refresh the entry
                key[u] = h
                heapreplace(alive, (h, u))
                continue
            heappop(alive)
            kept.append((k, u))
            if u in skip or (busy is not None and busy.get(u, 0.0) > now):
                continue
            found = u
            break
        for entry in kept:
            heappush(alive, entry)
        self.compact()
        return found

    def evict(self, clock: float) -> None:
        """Remove the lowest-ranked member (a shadow cache: nothing is busy or protected)."""
        key = self.key
        dies = self.dies
        death = self.death
        while death:
            d, u = death[0]
            if d > clock:
                break
            if math.isnan(key[u]) or dies[u] != d:
                heappop(death)
                continue
            e = self.ends[u]
            if e > d:
                dies[u] = e
                heapreplace(death, (e, u))
                continue
            heappop(death)
            self.n -= 1
            key[u] = _OUT
            dies[u] = _NEVER
            return
        alive = self.alive
        heat = self.heat
        while alive:
            k, u = alive[0]
            if key[u] != k:
                heappop(alive)
                continue
            h = heat[u]
            if h > k:
                key[u] = h
                heapreplace(alive, (h, u))
                continue
            heappop(alive)
            self.n -= 1
            key[u] = _OUT
            dies[u] = _NEVER
            if len(alive) + len(death) > self.lim:
                self.compact()
                self.lim = 8 * self.n + 128
            return

    def rank(self, u: int, clock: float) -> tuple[float, float]:
        """Comparable rank of member ``u`` (lower goes first)."""
        d = self.ends[u]
        if d <= clock:
            return (0.0, d)
        return (1.0, self.heat[u])


class AdaptiveHeatOnline:
    """Online state of the adaptive heat policy for one simulated run (see module doc)."""

    _REBASE = 500.0
    _INLINE_SHADOWS = True
    """Per request, the shadow steps written out in :meth:`on_request` (the hot loop); False:
    through :meth:`_shadow_hot` / :meth:`_shadow_warm`, the one implementation the inline copy
    must equal (``tests/unit/policy/test_adaptive_paths.py`` runs both on the same traces and
    compares every victim)."""

    def __init__(self, ctx: OnlineContext, cfg: PolicyConfig) -> None:
        sc = cfg.score
        ad = cfg.adaptive
        bw = ctx.bandwidths
        n = ctx.n_versions
        self._ctx = ctx
        self._classes = ctx.classes
        self._priorities = ctx.priorities
        self._canary = ctx.canary
        n_groups = ctx.n_workers * ctx.n_base_models
        n_w = ctx.n_workers
        self._n_w = n_w
        total_slots = max(1, ctx.hot_slots * n_groups)
        self._tau = ad.hot_tau_per_slot * total_slots
        self._tau_w = ad.warm_tau_per_slot * total_slots
        self._rebase_at = self._REBASE * min(self._tau, self._tau_w)
        self._inv_tau = 1.0 / self._tau
        self._inv_tau_w = 1.0 / self._tau_w
        self._gap_session = ad.session_gap_per_slot * total_slots
        self._beta = ad.reuse_count_weight
        self._phi = ad.tenant_weight
        self._base = 0.0
        self._clock = 0.0
        """Requests seen so far (the request clock)."""
        weights = [sc.class_weights[c] for c in REQUEST_CLASSES]
        budgets = [sc.class_budgets_s[c] for c in REQUEST_CLASSES]
        # penalty factor: seconds over budget per request-equivalent, as in the heat score
        factor = sc.weights.ttft_penalty / max(sc.weights.qps * sc.penalty_ref_s, 1e-12)
        sizes = ctx.sizes
        self._sizes = sizes
        self._pen_hot = [
            tuple(factor * w * max(0.0, bw.warm_to_hot_s(s) - b)
                  for w, b in zip(weights, budgets, strict=True))
            for s in sizes
        ]
        self._pen_warm = [
            tuple(factor * w * max(0.0, bw.load_s(s, Tier.COLD) - b)
                  for w, b in zip(weights, budgets, strict=True))
            for s in sizes
        ]
        self._tail = [ad.tail_weight if bw.load_s(s, Tier.COLD) >= ad.tail_load_s else 0.0
                      for s in sizes]
        """Extra weight of a latency-sensitive reuse of each version (its COLD load would be a
        tail event)."""
        # priority as request-equivalents: weight ratio of the heat score's terms
        prio_per_req = sc.weights.tenant_priority / max(sc.weights.qps, 1e-12)
        self._prio_term = [prio_per_req * sc.priority_values[p] for p in PRIORITIES]
        self._prot_of = [
            [_KIND[protection(c == 1, p, cfg)] for p in PRIORITIES] for c in (0, 1)
        ]
        self._idle_s = cfg.demote.idle_minutes * 60.0
        slots = ctx.hot_slots
        self._slots = slots
        self._pin_idle = ad.pin_idle_per_slot * slots
        self._warm_share_bytes = cfg.never_evict.warm_share * ctx.warm_bytes
        self._warm_bytes = ctx.warm_bytes
        self.protection_overflows = 0
        """WARM evictions of protected versions beyond ``never_evict.warm_share`` (or with
        nothing else left)."""
        self._limit = (
            0,
            hot_share_limit(Protection.CANARY, slots, cfg),
            hot_share_limit(Protection.PRIORITY, slots, cfg),
        )
        self._inv_size = [1.0 / size_factor(s, sc.warm_size_exponent) for s in sizes]
        # liveness: a stream idle for more than `_dead_gaps` of its own mean gaps has ended
        # (the heat score's liveness factor is below 1/2 there); 0 = never
        scale, odds = sc.liveness_scale, sc.liveness_odds
        self._dead_gaps = math.log((1.0 + 2.0 * odds) / odds) / scale if scale > 0.0 else 0.0
        tenants = list(ctx.tenants) if len(ctx.tenants) == n else list(range(n))
        self._tenant = tenants
        n_t = max(tenants, default=-1) + 1
        # -- per version
        self._st = [_Record() for _ in range(n)]
        """Per version, what its requests taught."""
        self._hkey = [0.0] * n
        """HOT heat key (rebased) as of the last request."""
        self._hdies = [_NEVER] * n
        """Request clock at which the stream counts as ended (liveness)."""
        self._wheat = [0.0] * n
        """WARM heat per byte (rebased) as of the last request."""
        self._reuse = [0.0] * n
        """Reuse value per byte (without L) as of the last request."""
        self._prot = [0] * n
        self._adapter = ctx.adapters
        self._superseded = [False] * n
        per_adapter: dict[int, int] = {}
        for a in ctx.adapters:
            per_adapter[a] = per_adapter.get(a, 0) + 1
        self._releases = [per_adapter[a] > 1 for a in ctx.adapters]
        """Whether v's adapter has other versions (the release / superseded rules apply)."""
        self._stable: dict[int, int] = {}
        self._group_of = [-1] * n
        self._worker_of = [-1] * n
        # -- HOT: real members per group (recency always; heat while heat leads), shadows
        self._hot_lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(n_groups)]
        self._hot_heat = [_HeatRank(n, self._hkey, self._hdies) for _ in range(n_groups)]
        self._hot_prot: list[dict[int, None]] = [{} for _ in range(n_groups)]
        """Members with a protection kind (pins are decided among them)."""
        self._sh_lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(n_groups)]
        self._sh_heat = [_HeatRank(n, self._hkey, self._hdies) for _ in range(n_groups)]
        self._score_hot = [[0.0, 0.0] for _ in range(n_groups)]
        self._lead_hot = [_HEAT] * n_groups
        """Index in :data:`HOT_EXPERTS` of each group's current leader (heat first)."""
        self._keep = 1.0 - 1.0 / max(1.0, ad.expert_window_per_slot * slots)
        # -- WARM: real members per worker (the leader's heap), protected set, shadows
        self._warm_members: list[dict[int, None]] = [{} for _ in range(n_w)]
        self._in_hot = [False] * n
        self._warm_heap: list[list[tuple[float, int]]] = [[] for _ in range(n_w)]
        self._pending: list[list[int]] = [[] for _ in range(n_w)]
        """Per worker: fetched since the last victim search (not in the heap yet)."""
        self._wkey: list[float | None] = [None] * n
        """Key of each member in its worker's real WARM heap (None: not in it — HOT,
        protected or not WARM)."""
        self._rkey = [0.0] * n
        """Own reuse key (L at the last request + value) of each version on its worker."""
        self._tenant_l = [[-math.inf] * n_t for _ in range(n_w)]
        """Per worker: its L at each tenant's last request (the tenant refresh)."""
        self._tenant_l0 = self._tenant_l[0]
        self._warm_prot: list[dict[int, None]] = [{} for _ in range(n_w)]
        self._canary_prot: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(n_w)]
        """Protected canaries per worker in order of their last request (their protection
        lapses after ``demote.idle_minutes`` without canary traffic)."""
        self._prot_bytes = [0] * n_w
        self._lead_warm = [_HEAT] * n_w
        self._gdsf_l = [0.0] * n_w
        self._sh_warm: list[list[list[tuple[float, int]]]] = [[[], []] for _ in range(n_w)]
        self._sh_key: list[list[float | None]] = [[None] * n, [None] * n]
        self._sh_rkey = [0.0] * n
        """Own reuse key of each version in the reuse shadow."""
        self._sh_tenant_l = [[-math.inf] * n_t for _ in range(n_w)]
        self._sh_tenant_l0 = self._sh_tenant_l[0]
        self._sh_used = [[0, 0] for _ in range(n_w)]
        self._sh_n = [[0, 0] for _ in range(n_w)]
        self._sh_compact_at = [128] * n_w
        """Per worker: shadow heap entries (both heaps) beyond which stale ones are dropped."""
        self._sh_l = [0.0] * n_w
        self._score_warm = [[0.0, 0.0] for _ in range(n_w)]
        self._warm_keep = 1.0 - 1.0 / max(
            1.0, ad.warm_expert_window_per_slot * slots * n_groups / n_w
        )
        self._warm_margin = ad.warm_switch_margin

    # -- statistics -------------------------------------------------------------------------

    def _rebase(self, now: float) -> None:
        shift = now - self._base
        fh = math.exp(-shift / self._tau)
        fw = math.exp(-shift / self._tau_w)
        for st in self._st:
            st.kh *= fh
            st.kw *= fw
        hkey, wheat = self._hkey, self._wheat
        for u in range(len(hkey)):
            hkey[u] *= fh
            wheat[u] *= fw
        self._base = now
        for rank in (*self._hot_heat, *self._sh_heat):
            rank.rescale(fh)
        keys = self._sh_key[_HEAT]
        for u, k in enumerate(keys):
            if k is not None:
                keys[u] = k * fw
        for w in range(self._n_w):
            if self._lead_warm[w] == _HEAT:
                self._rebuild_warm(w)
            members = {u for _, u in self._sh_warm[w][_HEAT] if keys[u] is not None}
            heap: list[tuple[float, int]] = []
            for u in sorted(members):
                k = keys[u]
                assert k is not None
                heap.append((k, u))
            heapify(heap)
            self._sh_warm[w][_HEAT] = heap

    def count_request(self, i: int, v: int, now: float) -> float:
        """The per-request statistics step of :meth:`on_request`: v's record, heat, WARM heat
        and reuse values, protection and release flags, the tenant refresh — everything but the
        shadows. Returns the request's worth (request-equivalents of a miss from COLD: the
        WARM shadows' score weight)."""
        self._clock = float(i)
        rel = i - self._base
        if rel > self._rebase_at:
            self._rebase(i)
            rel = 0.0
        eh = _exp(rel * self._inv_tau)
        ew = _exp(rel * self._inv_tau_w)
        st = self._st[v]
        kh = st.kh + eh
        st.kh = kh
        kw = st.kw + ew
        st.kw = kw
        count = st.count + 1
        st.count = count
        last = st.last
        sessions = st.sessions
        if i - last > self._gap_session:
            sessions += 1
            st.sessions = sessions
        if last != _GONE:
            g0 = st.gap
            g0 = i - last if g0 == 0.0 else g0 + _SMOOTH * (i - last - g0)
            st.gap = g0
            if self._dead_gaps:
                self._hdies[v] = i + self._dead_gaps * g0
        st.last = float(i)
        if now > st.last_s:
            st.last_s = now
        c = self._classes[i]
        ph = st.ph + self._pen_hot[v][c]
        st.ph = ph
        pw = st.pw + self._pen_warm[v][c]
        st.pw = pw
        latency = st.latency
        if c != _BACKGROUND:
            latency += 1
            st.latency = latency
        worth = 1.0 + pw / count
        p = self._priorities[i]
        st.prio = p
        canary = self._canary[i]
        prio = self._prio_term[p]
        inv = self._inv_size[v]
        # priority as request-equivalents added at this request (it decays with them)
        hkey = kh * (1.0 + ph / count) + prio * eh
        self._hkey[v] = hkey
        wheat = (kw * worth + prio * ew) * inv
        self._wheat[v] = wheat
        tail = self._tail[v]
        if tail:
            reuse = (sessions + self._beta * count) * (1.0 + tail * latency / count) * inv
        else:  # the same value: x * (1.0 + 0.0) == x exactly
            reuse = (sessions + self._beta * count) * inv
        self._reuse[v] = reuse
        kind = self._prot_of[canary][p]
        if kind != self._prot[v]:
            self._reprotect(v, kind)
        if self._releases[v]:
            self._release(v, canary)
        # the tenant refresh: remember every worker's L now (lazy: raises its versions' keys)
        tenant = self._tenant[v]
        if self._n_w == 1:
            self._tenant_l0[tenant] = self._gdsf_l[0]
            self._sh_tenant_l0[tenant] = self._sh_l[0]
        else:
            for w in range(self._n_w):
                self._tenant_l[w][tenant] = self._gdsf_l[w]
                self._sh_tenant_l[w][tenant] = self._sh_l[w]
        return worth

    def on_request(self, i: int, v: int, now: float) -> None:
        """Count the request on the request clock (:meth:`count_request`), then v's shadows.

        The hot loop of the policy: written for the interpreter and mypyc (locals, the
        shadows inline); see :meth:`_shadow_hot` / :meth:`_shadow_warm` for the same steps at
        the first request of a version (and :attr:`_INLINE_SHADOWS`)."""
        worth = self.count_request(i, v, now)
        g = self._group_of[v]
        if g < 0:
            return  # first request: the shadows learn v's group when it is served
        w = self._worker_of[v]
        if self._prot[v] == _CANARY:
            cp = self._canary_prot[w]
            if v in cp:
                cp.move_to_end(v)
        if not self._INLINE_SHADOWS:
            self._shadow_hot(g, v)
            self._shadow_warm(w, v, worth)
            return
        hkey = self._hkey[v]
        wheat = self._wheat[v]
        reuse = self._reuse[v]
        # -- HOT shadows (same steps as _shadow_hot)
        keep = self._keep
        score = self._score_hot[g]
        s0 = score[0] * keep
        s1 = score[1] * keep
        lru = self._sh_lru[g]
        if v in lru:
            s0 += 1.0
            lru.move_to_end(v)
        else:
            if len(lru) >= self._slots:
                lru.popitem(last=False)
            lru[v] = None
        heat = self._sh_heat[g]
        hk = heat.key
        k = hk[v]
        if not math.isnan(k):
            s1 += 1.0
            if hkey < k:
                hk[v] = hkey
                heappush(heat.alive, (hkey, v))
            d = self._hdies[v]
            if d < heat.dies[v]:
                heat.dies[v] = d
                heappush(heat.death, (d, v))
        else:
            if heat.n >= self._slots:
                heat.evict(i)
            # _HeatRank.put of a new member, inline
            heat.n += 1
            hk[v] = hkey
            heappush(heat.alive, (hkey, v))
            d = self._hdies[v]
            heat.dies[v] = d
            if d != _NEVER:
                heappush(heat.death, (d, v))
        score[0] = s0
        score[1] = s1
        lead = self._lead_hot[g]
        if (s0 > s1 + 1.0) if lead else (s1 > s0 + 1.0):
            self._switch_hot(g, 1 - lead)
        # -- WARM shadows: hits here, misses in _shadow_warm (same steps). A key that rose keeps
        # its old entry as a lower bound (refreshed when it reaches the top), one that fell is
        # pushed again.
        keys = self._sh_key[_REUSE]
        old = keys[v]
        keys1 = self._sh_key[_HEAT]
        old1 = keys1[v]
        if old is None or old1 is None:
            self._shadow_warm(w, v, worth)
            return
        keep = self._warm_keep
        score = self._score_warm[w]
        s0 = score[0] * keep + worth
        s1 = score[1] * keep + worth
        k = self._sh_l[w] + reuse
        self._sh_rkey[v] = k
        if k < old:
            keys[v] = k
            heappush(self._sh_warm[w][_REUSE], (k, v))
        if wheat < old1:
            keys1[v] = wheat
            heappush(self._sh_warm[w][_HEAT], (wheat, v))
        score[0] = s0
        score[1] = s1
        lead = self._lead_warm[w]
        if (s0 > s1 * self._warm_margin + 1.0) if lead else (s1 > s0 * self._warm_margin + 1.0):
            self._lead_warm[w] = 1 - lead
            self._rebuild_warm(w)

    def _release(self, v: int, canary: int) -> None:
        """Stable traffic for v supersedes the adapter's previous stable version."""
        if self._superseded[v]:
            self._superseded[v] = False
            if not self._dead_gaps:
                self._hdies[v] = _NEVER
        if not canary:
            adapter = self._adapter[v]
            previous = self._stable.get(adapter, v)
            if previous != v:
                self._supersede(previous)
            self._stable[adapter] = v

    def _reprotect(self, v: int, kind: int) -> None:
        """v's protection kind changed: refile it in the real tiers."""
        old = self._prot[v]
        self._prot[v] = kind
        g = self._group_of[v]
        if g >= 0 and v in self._hot_lru[g]:
            if kind:
                self._hot_prot[g][v] = None
            else:
                self._hot_prot[g].pop(v, None)
        w = self._worker_of[v]
        if w >= 0 and v in self._warm_members[w]:
            if old != _NONE:
                self._unprotect_warm(w, v)
            self._file_warm(w, v)

    def _supersede(self, v: int) -> None:
        """Another version of v's adapter took the stable traffic: v goes first everywhere."""
        if self._superseded[v]:
            return
        self._superseded[v] = True
        self._hdies[v] = _GONE
        self._reuse[v] = _GONE
        self._wheat[v] = _GONE
        self._rkey[v] = _GONE
        self._sh_rkey[v] = _GONE
        g = self._group_of[v]
        if g < 0:
            return
        w = self._worker_of[v]
        for od in (self._hot_lru[g], self._sh_lru[g]):
            if v in od:
                od.move_to_end(v, last=False)
        for rank in (self._sh_heat[g], self._hot_heat[g]):
            if not math.isnan(rank.key[v]):
                rank.put(v)
        for e in (_REUSE, _HEAT):
            if self._sh_key[e][v] is not None:
                self._sh_key[e][v] = _GONE
                heappush(self._sh_warm[w][e], (_GONE, v))
        if v in self._warm_members[w]:
            if v in self._warm_prot[w]:
                self._unprotect_warm(w, v)
            self._file_warm(w, v)

    # -- shadows ----------------------------------------------------------------------------

    def _shadow_hot(self, g: int, v: int) -> None:
        keep = self._keep
        score = self._score_hot[g]
        s0 = score[0] * keep
        s1 = score[1] * keep
        lru = self._sh_lru[g]
        if v in lru:
            s0 += 1.0
            lru.move_to_end(v)
        else:
            if len(lru) >= self._slots:
                lru.popitem(last=False)
            lru[v] = None
        heat = self._sh_heat[g]
        k = heat.key[v]
        if not math.isnan(k):
            s1 += 1.0
            # a raised heat / later end keeps the old entries as lower bounds (see _HeatRank)
            h = self._hkey[v]
            if h < k:
                heat.key[v] = h
                heappush(heat.alive, (h, v))
            d = self._hdies[v]
            if d < heat.dies[v]:
                heat.dies[v] = d
                heappush(heat.death, (d, v))
        else:
            if heat.n >= self._slots:
                heat.evict(self._clock)
            # _HeatRank.put of a new member, inline
            heat.n += 1
            h = self._hkey[v]
            heat.key[v] = h
            heappush(heat.alive, (h, v))
            d = self._hdies[v]
            heat.dies[v] = d
            if d != _NEVER:
                heappush(heat.death, (d, v))
        score[0] = s0
        score[1] = s1
        lead = self._lead_hot[g]
        if (s0 > s1 + 1.0) if lead else (s1 > s0 + 1.0):
            self._switch_hot(g, 1 - lead)

    def _shadow_warm(self, w: int, v: int, worth: float) -> None:
        """v's request in worker ``w``'s WARM shadows; ``worth``: request-equivalents of one
        request from COLD (1 + penalty of v's class mix), the shadows' score weight."""
        keep = self._warm_keep
        score = self._score_warm[w]
        sizes = self._sizes
        size = sizes[v]
        cap = self._warm_bytes
        used = self._sh_used[w]
        count = self._sh_n[w]
        heaps = self._sh_warm[w]
        # reuse per byte (GDSF-style: L rises to each victim's key). A key that rose (a hit, a
        # request of its tenant) keeps its old entry as a lower bound: refreshed at the top.
        keys = self._sh_key[_REUSE]
        heap = heaps[_REUSE]
        rkey = self._sh_rkey
        s0 = score[0] * keep
        k = self._sh_l[w] + self._reuse[v]
        rkey[v] = k
        old = keys[v]
        if old is not None:
            s0 += worth
            if k < old:
                keys[v] = k
                heappush(heap, (k, v))
        else:
            u0 = used[0]
            if u0 + size > cap:
                tenant_l = self._sh_tenant_l[w]
                tenant = self._tenant
                phi = self._phi
                reuse = self._reuse
                lv = self._sh_l[w]
                n0 = count[0]
                while u0 + size > cap and heap:
                    ke, u = heap[0]
                    if keys[u] != ke:
                        heappop(heap)
                        continue
                    m = tenant_l[tenant[u]] + phi * reuse[u]
                    r = rkey[u]
                    if r > m:
                        m = r
                    if m > ke:
                        keys[u] = m
                        heapreplace(heap, (m, u))
                        continue
                    heappop(heap)
                    keys[u] = None
                    u0 -= sizes[u]
                    n0 -= 1
                    if ke > lv:
                        lv = ke
                self._sh_l[w] = lv
                count[0] = n0
            used[0] = u0 + size
            count[0] += 1
            keys[v] = k
            heappush(heap, (k, v))
        # heat per byte (the current key is self._wheat; same lazy refresh)
        keys = self._sh_key[_HEAT]
        heap = heaps[_HEAT]
        wheat = self._wheat
        s1 = score[1] * keep
        k = wheat[v]
        old = keys[v]
        if old is not None:
            s1 += worth
            if k < old:
                keys[v] = k
                heappush(heap, (k, v))
        else:
            u1 = used[1]
            n1 = count[1] + 1
            while u1 + size > cap and heap:
                ke, u = heap[0]
                if keys[u] != ke:
                    heappop(heap)
                    continue
                m = wheat[u]
                if m > ke:
                    keys[u] = m
                    heapreplace(heap, (m, u))
                    continue
                heappop(heap)
                keys[u] = None
                u1 -= sizes[u]
                n1 -= 1
            used[1] = u1 + size
            count[1] = n1
            keys[v] = k
            heappush(heap, (k, v))
            if len(heap) + len(heaps[_REUSE]) > self._sh_compact_at[w]:
                self._compact_shadows(w)
        score[0] = s0
        score[1] = s1
        lead = self._lead_warm[w]
        if (s0 > s1 * self._warm_margin + 1.0) if lead else (s1 > s0 * self._warm_margin + 1.0):
            self._lead_warm[w] = 1 - lead
            self._rebuild_warm(w)

    def _compact_shadows(self, w: int) -> None:
        """Drop stale shadow entries (when they outnumber the members about 3:1)."""
        for e in (_REUSE, _HEAT):
            keys = self._sh_key[e]
            heap = [(k, u) for k, u in self._sh_warm[w][e] if keys[u] == k]
            heapify(heap)
            self._sh_warm[w][e] = heap
        count = self._sh_n[w]
        self._sh_compact_at[w] = 128 + 4 * (count[0] + count[1])

    # -- membership -------------------------------------------------------------------------

    def on_served(self, g: int, w: int, v: int, now: float) -> None:
        """Recency and heat of v in its group; v's reuse key; learn v's group the first time
        (its shadows start with this request)."""
        if self._group_of[v] < 0:
            self._learn(g, w, v)
        self._hot_lru[g].move_to_end(v)
        if self._lead_hot[g] == _HEAT:
            # _HeatRank.put inline (the hot loop)
            rank = self._hot_heat[g]
            key = rank.key
            k = key[v]
            if math.isnan(k):
                rank.put(v)
            else:
                h = self._hkey[v]
                if h < k:
                    key[v] = h
                    heappush(rank.alive, (h, v))
                d = self._hdies[v]
                dies = rank.dies
                if d < dies[v]:
                    dies[v] = d
                    heappush(rank.death, (d, v))
        self._rkey[v] = self._gdsf_l[w] + self._reuse[v]

    def _learn(self, g: int, w: int, v: int) -> None:
        """v's first request was served in group ``g`` on worker ``w``: its home from now on;
        its shadows start with this request."""
        self._group_of[v] = g
        self._worker_of[v] = w
        self._shadow_hot(g, v)
        st = self._st[v]
        self._shadow_warm(w, v, 1.0 + st.pw / st.count)

    # -- the cache-manager's face (``ranking.py``): the same state, without simulated tiers

    def note_served(self, g: int, w: int, v: int) -> None:
        """v's request (after :meth:`on_request`) was served in group ``g`` on worker ``w`` of a
        real cluster whose tiers this object does not hold: what :meth:`on_served` learns
        beside the simulated tier (v's home and first shadow step, its own reuse key)."""
        if self._group_of[v] < 0:
            self._learn(g, w, v)
        self._rkey[v] = self._gdsf_l[w] + self._reuse[v]

    def note_evicted(self, w: int, v: int) -> None:
        """v left worker ``w``'s WARM tier by a decision outside this object: the reuse
        expert's inflation value ``L`` rises to v's key, as at a victim of :meth:`warm_victim`."""
        self._take_warm(w, v)

    def request_clock(self) -> float:
        """The request clock now (the last request's index): :meth:`hot_rank` ranks a stream
        whose end (:meth:`stream_end`) it has reached with the ended ones."""
        return self._clock

    def stream_end(self, v: int) -> float:
        """Request clock from which v's stream counts as ended (inf: never; -inf: superseded)."""
        return self._hdies[v]

    def time_base(self) -> float:
        """Request clock of the last rebase of the decayed counts (0: none yet). A rebase
        rescales every version's heat (two distinct keys can become equal), so every rank may
        change with it."""
        return self._base

    def home_group(self, v: int) -> int:
        """The slot group v's first request was served in (-1: none yet)."""
        return self._group_of[v]

    def hot_rank(self, g: int, v: int) -> tuple[float, float]:
        """v's rank in group ``g`` by the group's leading HOT expert (lower goes first; ties:
        the lower version): the order :meth:`hot_victim` takes its victims in."""
        return self._rank_hot(g, v)

    def warm_rank(self, w: int, v: int) -> float:
        """v's key on worker ``w`` by the worker's leading WARM expert (lower goes first; ties:
        the lower version): the order :meth:`warm_victim` takes its victims in."""
        return self._warm_key(w, v)

    def on_insert_hot(self, g: int, v: int, now: float) -> None:
        """Track ``v`` in the group (it leaves the WARM heap: HOT versions stay WARM)."""
        self._hot_lru[g][v] = None
        if self._prot[v]:
            self._hot_prot[g][v] = None
        self._in_hot[v] = True
        self._wkey[v] = None

    def on_remove_hot(self, g: int, v: int) -> None:
        """Forget ``v`` in the group; it becomes a WARM eviction candidate."""
        del self._hot_lru[g][v]
        prot = self._hot_prot[g]
        if prot:
            prot.pop(v, None)
        if self._lead_hot[g] == _HEAT:
            rank = self._hot_heat[g]
            if not math.isnan(rank.key[v]):
                rank.n -= 1
                rank.key[v] = _OUT
                rank.dies[v] = _NEVER
        self._in_hot[v] = False
        w = self._worker_of[v]
        if v in self._warm_members[w] and v not in self._warm_prot[w]:
            if self._lead_warm[w] == _REUSE:
                k = self._tenant_l[w][self._tenant[v]] + self._phi * self._reuse[v]
                own = self._rkey[v]
                if own > k:
                    k = own
            else:
                k = self._wheat[v]
            self._wkey[v] = k
            heappush(self._warm_heap[w], (k, v))

    def _switch_hot(self, g: int, lead: int) -> None:
        self._lead_hot[g] = lead
        rank = self._hot_heat[g]
        rank.clear()
        if lead == _HEAT:
            for u in self._hot_lru[g]:
                rank.put(u)

    def _reuse_key(self, w: int, v: int) -> float:
        """v's reuse key on worker ``w`` now: its own, or its tenant's refresh if higher."""
        m = self._tenant_l[w][self._tenant[v]] + self._phi * self._reuse[v]
        k = self._rkey[v]
        return max(m, k)

    def _warm_key(self, w: int, v: int) -> float:
        return self._reuse_key(w, v) if self._lead_warm[w] == _REUSE else self._wheat[v]

    def _push_warm(self, w: int, v: int) -> None:
        k = self._warm_key(w, v)
        self._wkey[v] = k
        heappush(self._warm_heap[w], (k, v))

    def _flush_warm(self, w: int) -> None:
        """Versions fetched since the last victim search that are not HOT join the heap (every
        fetch in the simulator is for a load into HOT, so usually none); drop stale entries."""
        members, prot, in_hot, wkey = (self._warm_members[w], self._warm_prot[w], self._in_hot,
                                        self._wkey)
        for u in self._pending[w]:
            if u in members and not in_hot[u] and u not in prot and wkey[u] is None:
                self._push_warm(w, u)
        self._pending[w].clear()
        heap = self._warm_heap[w]
        if len(heap) > 64 + 4 * len(members):
            self._warm_heap[w] = heap = [(k, u) for k, u in heap if wkey[u] == k]
            heapify(heap)

    def _rebuild_warm(self, w: int) -> None:
        """The WARM leader changed (or keys were rebased): refile the heap with its keys."""
        self._pending[w].clear()
        heap: list[tuple[float, int]] = []
        wkey = self._wkey
        prot = self._warm_prot[w]
        for u in self._warm_members[w]:
            if self._in_hot[u] or u in prot:
                continue
            k = self._warm_key(w, u)
            wkey[u] = k
            heap.append((k, u))
        heapify(heap)
        self._warm_heap[w] = heap

    def _file_warm(self, w: int, v: int) -> None:
        """Put WARM member v where it belongs: the protected set or (unless HOT) the heap."""
        if self._prot[v] != _NONE and not self._superseded[v]:
            prot = self._warm_prot[w]
            if v not in prot:
                prot[v] = None
                self._prot_bytes[w] += self._sizes[v]
                if self._prot[v] == _CANARY:
                    self._canary_prot[w][v] = None
            self._wkey[v] = None
        elif not self._in_hot[v]:
            self._push_warm(w, v)

    def _unprotect_warm(self, w: int, v: int) -> None:
        if v in self._warm_prot[w]:
            del self._warm_prot[w][v]
            self._prot_bytes[w] -= self._sizes[v]
        self._canary_prot[w].pop(v, None)

    def on_insert_warm(self, w: int, v: int, now: float) -> None:
        """Track ``v`` on the worker (an eviction candidate from the next victim search on,
        unless it became HOT meanwhile)."""
        self._warm_members[w][v] = None
        self._rkey[v] = self._gdsf_l[w] + self._reuse[v]
        if self._prot[v] != _NONE and not self._superseded[v]:
            self._file_warm(w, v)
        else:
            self._pending[w].append(v)

    def on_remove_warm(self, w: int, v: int) -> None:
        """Forget ``v`` on the worker."""
        del self._warm_members[w][v]
        self._wkey[v] = None
        if v in self._warm_prot[w]:
            self._unprotect_warm(w, v)

    # -- victims ----------------------------------------------------------------------------

    def hot_expert(self, g: int) -> str:
        """Name of the ranking group ``g`` follows now."""
        return HOT_EXPERTS[self._lead_hot[g]]

    def warm_expert(self, w: int) -> str:
        """Name of the ranking worker ``w``'s WARM tier follows now."""
        return WARM_EXPERTS[self._lead_warm[w]]

    def hot_victim(self, g: int, now: float, busy: Mapping[int, float]) -> int | None:
        """Lowest-ranked member (by the group's leading expert) that is neither busy nor
        protected within its kind's share; protected members beyond their share compete too,
        and when every free member is protected the lowest protected one goes."""
        prot = self._hot_prot[g]
        skip: set[int] | tuple[()] = ()
        if prot:
            idle_before = now - self._idle_s
            live_after = self._clock - self._pin_idle
            st, kinds = self._st, self._prot
            live: set[int] = set()
            n_canary = 0
            for u in prot:
                r = st[u]
                if r.last_s >= idle_before and r.last >= live_after:
                    live.add(u)
                    if kinds[u] == _CANARY:
                        n_canary += 1
            if live:
                if (n_canary > self._limit[_CANARY]
                        or len(live) - n_canary > self._limit[_PRIORITY]):
                    return self._hot_victim_shared(g, now, busy, live)
                skip = live
        found: int | None = None
        if self._lead_hot[g] == _LRU:
            for u in self._hot_lru[g]:
                if u in skip or busy.get(u, 0.0) > now:
                    continue
                found = u
                break
        else:
            found = self._hot_heat[g].victim(self._clock, skip, busy, now)
        if found is None and skip:
            return self._hot_victim_shared(g, now, busy, set(skip))
        return found

    def _rank_hot(self, g: int, u: int) -> tuple[float, float]:
        if self._lead_hot[g] == _LRU:
            return (0.0 if self._superseded[u] else 1.0, self._st[u].last)
        return self._hot_heat[g].rank(u, self._clock)

    def _hot_victim_shared(self, g: int, now: float, busy: Mapping[int, float],
                           live: set[int]) -> int | None:
        """The rare path: protected members over their share (or nothing else free)."""
        best: tuple[tuple[float, float], int] | None = None
        protected: dict[int, list[tuple[tuple[float, float], int]]] = {_CANARY: [], _PRIORITY: []}
        n_kind = {_CANARY: 0, _PRIORITY: 0}
        for u in self._hot_lru[g]:
            free = busy.get(u, 0.0) <= now
            if u in live:
                kind = self._prot[u]
                n_kind[kind] += 1
                if free:
                    protected[kind].append((self._rank_hot(g, u), u))
                continue
            if not free:
                continue
            r = (self._rank_hot(g, u), u)
            if best is None or r < best:
                best = r
        candidates = [] if best is None else [best]
        for kind in (_CANARY, _PRIORITY):
            members = sorted(protected[kind])
            candidates.extend(members[: max(n_kind[kind] - self._limit[kind], 0)])
        if not candidates:
            candidates = protected[_CANARY] + protected[_PRIORITY]
        return min(candidates)[1] if candidates else None

    def warm_victim(self, w: int, now: float, hot: Container[int]) -> int | None:
        """Lowest-ranked unprotected non-HOT member by the worker's leading WARM expert; ended
        canaries count as unprotected; the lowest protected member only when nothing else is left
        or the protected set is over its share."""
        cp = self._canary_prot[w]
        if cp:
            idle_before = now - self._idle_s
            st = self._st
            while cp:
                u = next(iter(cp))
                if st[u].last_s >= idle_before:
                    break
                # the canary's traffic ended: it keeps its priority's protection (platinum),
                # else it competes like any other version
                kind = self._prot_of[0][st[u].prio]
                self._prot[u] = kind
                self._unprotect_warm(w, u)
                self._file_warm(w, u)
                g = self._group_of[u]
                if g >= 0 and kind == _NONE:
                    self._hot_prot[g].pop(u, None)
        pending = self._pending[w]
        if pending:
            if len(pending) == 1 and self._in_hot[pending[0]]:
                # the usual case: the one version fetched since is HOT (nothing to file)
                pending.clear()
                if len(self._warm_heap[w]) > 64 + 4 * len(self._warm_members[w]):
                    self._flush_warm(w)
            else:
                self._flush_warm(w)
        heap = self._warm_heap[w]
        wkey = self._wkey
        top: int | None = None
        key = 0.0
        if self._lead_warm[w] == _REUSE:
            tenant_l, tenant, phi = self._tenant_l[w], self._tenant, self._phi
            reuse, rkey = self._reuse, self._rkey
            while heap:
                k, u = heap[0]
                if wkey[u] != k:
                    heappop(heap)
                    continue
                if u in hot:  # not expected: HOT members leave the heap
                    heappop(heap)
                    wkey[u] = None
                    continue
                m = tenant_l[tenant[u]] + phi * reuse[u]
                r = rkey[u]
                if r > m:
                    m = r
                if m > k:  # raised by its tenant since it was filed
                    wkey[u] = m
                    heapreplace(heap, (m, u))
                    continue
                top = u
                key = m
                break
        else:
            while heap:
                k, u = heap[0]
                if wkey[u] != k or u in hot:
                    heappop(heap)
                    if u in hot:
                        wkey[u] = None
                    continue
                top = u
                key = self._reuse_key(w, u)
                break
        if top is not None and self._prot_bytes[w] <= self._warm_share_bytes:
            # L rises to the victim's reuse key whichever expert chose it
            if key > self._gdsf_l[w]:
                self._gdsf_l[w] = key
            return top
        return self._warm_victim_protected(w, hot, top)

    def _warm_victim_protected(self, w: int, hot: Container[int], top: int | None) -> int | None:
        """The rare path: the protected set is over its share (or nothing else is left)."""
        lowest: tuple[float, int] | None = None
        for u in self._warm_prot[w]:
            if u in hot:
                continue
            key = (self._warm_key(w, u), u)
            if lowest is None or key < lowest:
                lowest = key
        if top is not None and (lowest is None or (self._warm_key(w, top), top) <= lowest):
            return self._take_warm(w, top)
        if lowest is None:
            return None
        self.protection_overflows += 1
        return self._take_warm(w, lowest[1])

    def _take_warm(self, w: int, v: int) -> int:
        # L rises to the victim's reuse key whichever expert chose it
        k = self._reuse_key(w, v)
        self._gdsf_l[w] = max(self._gdsf_l[w], k)
        return v
