"""The heat policy's online victim choice, robust across workloads (issue 13).

Measured on real adapter-serving traffic (GenTD26) the plain heat score lost to
LRU in HOT and to GDSF in WARM, and lost more when the same trace ran 24×
faster: its time constants were absolute seconds tuned on synthetic traces,
where frequency wins; on GenTD26 recency wins. :class:`AdaptiveHeatOnline`
keeps the business rules of :class:`~loraplane.policy.heat.HeatOnline`
(in-flight, protected shares, WARM protection, superseded first) and changes
what ranks the rest:

* **A request clock instead of seconds.** Decayed counts and liveness run on
  the number of requests seen (the simulator's request index), with time
  constants per HOT slot of the cluster (``adaptive.hot_tau_per_slot``,
  ``adaptive.warm_tau_per_slot``): replaying a trace faster or slower changes
  nothing but the in-flight overlaps. Business rules that are wall-clock by
  definition (a canary ends after ``demote.idle_minutes`` without traffic) stay
  in seconds.
* **Experts over shadow caches, per tier.** Each HOT slot group runs two shadow
  caches of its size on the same requests, one ranked by recency (LRU) and one by
  heat (decayed rate × liveness + priority); each worker's WARM tier runs two
  shadow byte caches, one ranked GDSF-style (L + frequency since fetch × reload
  time / size, the strongest WARM baseline on GenTD26) and one by heat per byte
  (decayed rate × cost of a COLD load over the class budgets / size: the heat
  score's WARM value, strongest on the synthetic traces). A shadow's decayed score
  (HOT: hits over ``expert_window_per_slot`` × slots requests; WARM: hits weighted by
  what a miss would cost, ``1 + penalty``, over ``warm_expert_window_per_slot`` ×
  slots) says which ranking would have done best lately; the real tier picks its
  victim by the leader's ranking among its own eligible members (ARC / ACME-style
  adaptation); the HOT leader changes when the other is ahead by more than one hit, the
  WARM leader when the other's score exceeds ``warm_switch_margin`` × its own + 1.
* **Pins protect live streams.** A protected HOT version keeps its pinned slot
  only while idle for fewer than ``pin_idle_per_slot`` × slots requests (and less
  than ``demote.idle_minutes``): a one-off request of a platinum tenant no longer
  holds a slot for an hour (that cost GenTD26 0.010–0.016 of HOT hits).
* **Protected WARM share.** Protected versions hold at most
  ``never_evict.warm_share`` of a worker's host bytes protected; beyond it the
  lowest-ranked of them compete with the rest, and each such eviction is counted in
  :attr:`AdaptiveHeatOnline.protection_overflows` (reported by the simulator).

Every structure is O(1) or O(log n) per request except the victim scans over a
HOT group (tens of slots). Deterministic: ties break on the version id.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Container, Mapping

from ._lazyheap import LazyHeap
from .config import PolicyConfig
from .model import PRIORITIES, REQUEST_CLASSES, Tier
from .online import OnlineContext
from .predicates import Protection, hot_share_limit, protection
from .score import size_factor
from .stats import GAP_SMOOTHING

_NONE, _CANARY, _PRIORITY = 0, 1, 2
_KIND = {None: _NONE, Protection.CANARY: _CANARY, Protection.PRIORITY: _PRIORITY}
HOT_EXPERTS = ("lru", "heat")
"""HOT rankings the adaptive policy chooses from."""
WARM_EXPERTS = ("gdsf", "heat")
"""WARM rankings the adaptive policy chooses from."""


class AdaptiveHeatOnline:
    """Online state of the adaptive heat policy for one simulated run (see module doc)."""

    _REBASE = 500.0

    def __init__(self, ctx: OnlineContext, cfg: PolicyConfig) -> None:
        sc = cfg.score
        ad = cfg.adaptive
        bw = ctx.bandwidths
        n = ctx.n_versions
        self._ctx = ctx
        n_groups = ctx.n_workers * ctx.n_base_models
        total_slots = max(1, ctx.hot_slots * n_groups)
        self._tau = ad.hot_tau_per_slot * total_slots
        self._tau_w = ad.warm_tau_per_slot * total_slots
        self._base = 0.0
        self._clock = 0.0
        """Requests seen so far (the request clock)."""
        self._now_s = 0.0
        weights = [sc.class_weights[c] for c in REQUEST_CLASSES]
        budgets = [sc.class_budgets_s[c] for c in REQUEST_CLASSES]
        # penalty factor: seconds over budget per request-equivalent, as in the heat score
        factor = sc.weights.ttft_penalty / max(sc.weights.qps * sc.penalty_ref_s, 1e-12)
        self._pen_hot = [
            tuple(factor * w * max(0.0, bw.warm_to_hot_s(s) - b)
                  for w, b in zip(weights, budgets, strict=True))
            for s in ctx.sizes
        ]
        self._pen_warm = [
            tuple(factor * w * max(0.0, bw.load_s(s, Tier.COLD) - b)
                  for w, b in zip(weights, budgets, strict=True))
            for s in ctx.sizes
        ]
        self._cold_s = [bw.load_s(s, Tier.COLD) for s in ctx.sizes]
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
        self._prot_bytes = [0] * ctx.n_workers
        self.protection_overflows = 0
        """WARM evictions of protected versions beyond ``never_evict.warm_share`` (or with
        nothing else left)."""
        self._limit = (
            0,
            hot_share_limit(Protection.CANARY, slots, cfg),
            hot_share_limit(Protection.PRIORITY, slots, cfg),
        )
        self._inv_size = [1.0 / size_factor(s, sc.warm_size_exponent) for s in ctx.sizes]
        self._live_scale = sc.liveness_scale
        self._live_odds = sc.liveness_odds
        # per version
        self._k_hot = [0.0] * n
        self._k_warm = [0.0] * n
        self._count = [0] * n
        self._wfreq = [0] * n
        self._gkey = [0.0] * n
        """GDSF key of v when it was last filed (L then + value)."""
        """Requests since v was last fetched into WARM (GDSF's frequency)."""
        self._last = [-math.inf] * n
        """Request clock of the last request."""
        self._last_s = [-math.inf] * n
        """Seconds of the last request (wall-clock business rules)."""
        self._gap = [0.0] * n
        self._cls = [[0, 0, 0] for _ in range(n)]
        self._mult_hot = [1.0] * n
        self._worth_warm = [1.0] * n
        """Request-equivalents of one request from COLD (1 + penalty of the class mix)."""
        self._prio = [0.0] * n
        self._prot = [0] * n
        self._adapter = ctx.adapters
        self._superseded = [False] * n
        self._stable: dict[int, int] = {}
        # HOT: real members and shadows per group
        self._hot: list[set[int]] = [set() for _ in range(n_groups)]
        self._sh_lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(n_groups)]
        self._sh_heat: list[set[int]] = [set() for _ in range(n_groups)]
        self._score_hot = [[0.0, 0.0] for _ in range(n_groups)]
        self._lead_hot = [1] * n_groups
        """Index in :data:`HOT_EXPERTS` of each group's current leader (heat first)."""
        window = max(1.0, ad.expert_window_per_slot * slots)
        self._keep = 1.0 - 1.0 / window
        self._group_of = [-1] * n
        # WARM: real members per worker (one heap per expert) and shadows
        n_w = ctx.n_workers
        self._warm_window_keep = 1.0 - 1.0 / max(
            1.0, ad.warm_expert_window_per_slot * slots * n_groups / n_w
        )
        self._warm_heaps: list[list[LazyHeap]] = [
            [LazyHeap() for _ in WARM_EXPERTS] for _ in range(n_w)
        ]
        self._warm_prot: list[set[int]] = [set() for _ in range(n_w)]
        self._warm_of: list[list[int]] = [[] for _ in range(n)]
        self._sh_warm: list[list[LazyHeap]] = [[LazyHeap() for _ in WARM_EXPERTS]
                                               for _ in range(n_w)]
        self._sh_used = [[0] * len(WARM_EXPERTS) for _ in range(n_w)]
        self._sh_freq: list[dict[int, int]] = [{} for _ in range(n_w)]
        self._score_warm = [[0.0] * len(WARM_EXPERTS) for _ in range(n_w)]
        self._lead_warm = [1] * n_w
        self._warm_margin = ad.warm_switch_margin
        self._gdsf_l = [0.0] * n_w
        self._sh_gdsf_l = [0.0] * n_w
        self._sizes = ctx.sizes
        self._warm_bytes = ctx.warm_bytes
        self._worker_of = [-1] * n

    # -- statistics -------------------------------------------------------------------------

    def _rebase(self, now: float) -> None:
        shift = now - self._base
        fh = math.exp(-shift / self._tau)
        fw = math.exp(-shift / self._tau_w)
        self._k_hot = [k * fh for k in self._k_hot]
        self._k_warm = [k * fw for k in self._k_warm]
        self._base = now
        heat = 1
        for w in range(len(self._warm_heaps)):
            for heaps in (self._warm_heaps[w], self._sh_warm[w]):
                h = heaps[heat]
                for u in h.members():
                    h.push(u, self._warm_key(heat, u, w))

    def on_request(self, i: int, v: int, now: float) -> None:
        """Count the request on the request clock; refresh v's class mix, priority and flags."""
        ctx = self._ctx
        t = float(i)
        self._clock = t
        self._now_s = now
        if (t - self._base) / self._tau_w > self._REBASE or (t - self._base) / self._tau > self._REBASE:
            self._rebase(t)
        rel = t - self._base
        self._k_hot[v] += math.exp(rel / self._tau)
        self._k_warm[v] += math.exp(rel / self._tau_w)
        self._count[v] += 1
        if self._warm_of[v]:
            self._wfreq[v] += 1
        last = self._last[v]
        if last > -math.inf:
            gap = t - last
            self._gap[v] = gap if self._gap[v] == 0.0 else (
                (1.0 - GAP_SMOOTHING) * self._gap[v] + GAP_SMOOTHING * gap
            )
        self._last[v] = t
        self._last_s[v] = max(self._last_s[v], now)
        cls = self._cls[v]
        cls[ctx.classes[i]] += 1
        ci, cb, cc = cls
        total = ci + cb + cc
        ph, pw = self._pen_hot[v], self._pen_warm[v]
        self._mult_hot[v] = 1.0 + (ci * ph[0] + cb * ph[1] + cc * ph[2]) / total
        self._worth_warm[v] = 1.0 + (ci * pw[0] + cb * pw[1] + cc * pw[2]) / total
        p = ctx.priorities[i]
        canary = ctx.canary[i]
        self._prio[v] = self._prio_term[p]
        self._prot[v] = self._prot_of[canary][p]
        was_superseded = self._superseded[v]
        self._superseded[v] = False
        if not canary:
            adapter = self._adapter[v]
            previous = self._stable.get(adapter, v)
            if previous != v:
                self._superseded[previous] = True
                self._refile(previous)
            self._stable[adapter] = v
        self._shadow_request(v)
        if self._warm_of[v] or was_superseded:
            self._refile(v)

    # -- rankings ---------------------------------------------------------------------------

    def _heat(self, v: int, decay: float) -> float:
        """HOT heat on the request clock: decayed rate × liveness × penalty + priority."""
        if self._superseded[v]:
            return -1.0
        rate = self._k_hot[v] * decay * self._mult_hot[v]
        gap = self._gap[v]
        if gap > 0.0 and self._live_scale > 0.0:
            x = self._live_scale * (self._clock - self._last[v]) / gap
            if x > 0.0:
                odds = self._live_odds
                rate *= (1.0 + odds) / (1.0 + odds * math.exp(min(x, 50.0)))
        return rate + self._prio[v]

    def _coolest(self, members: set[int]) -> int:
        """The member with the lowest :meth:`_heat` (ties: lowest id), inlined for speed."""
        decay = math.exp(-(self._clock - self._base) / self._tau)
        k, mult, prio, sup = self._k_hot, self._mult_hot, self._prio, self._superseded
        last, gaps, clock = self._last, self._gap, self._clock
        scale, odds = self._live_scale, self._live_odds
        exp = math.exp
        best = math.inf
        best_v = -1
        for u in members:
            if sup[u]:
                h = -1.0
            else:
                h = k[u] * decay * mult[u]
                gap = gaps[u]
                if gap > 0.0 and scale > 0.0:
                    x = scale * (clock - last[u]) / gap
                    if x > 0.0:
                        h *= (1.0 + odds) / (1.0 + odds * exp(min(50.0, x)))
                h += prio[u]
            if h < best or (h == best and u < best_v):
                best, best_v = h, u
        return best_v

    def _hot_key(self, expert: int, v: int, decay: float) -> float:
        if expert == 0:
            return -2.0 if self._superseded[v] else self._last[v]
        return self._heat(v, decay)

    def _warm_key(
        self, expert: int, v: int, w: int, gdsf_l: float | None = None, freq: int | None = None
    ) -> float:
        """Time-invariant heap key of ``v`` under WARM expert ``expert`` (lowest goes first)."""
        if self._superseded[v]:
            return -math.inf
        if expert == 0:  # GDSF: L + (frequency since fetched + priority) × reload s / GB
            base = self._gdsf_l[w] if gdsf_l is None else gdsf_l
            f = self._wfreq[v] if freq is None else freq
            return base + (f + self._prio[v]) * self._cold_s[v] / max(self._sizes[v], 1) * 1e9
        # heat per byte: rebased decayed count × worth / size^e (+ priority per byte)
        # the priority counts as request-equivalents added at v's last request
        prio = self._prio[v] * math.exp((self._last[v] - self._base) / self._tau_w) if self._prio[
            v] else 0.0
        return (self._k_warm[v] * self._worth_warm[v] + prio) * self._inv_size[v]

    # -- shadows ----------------------------------------------------------------------------

    def _shadow_request(self, v: int) -> None:
        """Score v's request in every shadow cache of its group and worker, then admit it."""
        g = self._group_of[v]
        if g >= 0:
            self._shadow_hot(g, v)
        w = self._worker_of[v]
        if w >= 0:
            self._shadow_warm(w, v)

    def _shadow_hot(self, g: int, v: int) -> None:
        keep = self._keep
        score = self._score_hot[g]
        score[0] *= keep
        score[1] *= keep
        lru = self._sh_lru[g]
        if v in lru:
            score[0] += 1.0
            lru.move_to_end(v)
        else:
            if len(lru) >= self._slots:
                lru.popitem(last=False)
            lru[v] = None
        heat = self._sh_heat[g]
        if v in heat:
            score[1] += 1.0
        else:
            if len(heat) >= self._slots:
                heat.discard(self._coolest(heat))
            heat.add(v)
        lead = self._lead_hot[g]
        other = 1 - lead
        if score[other] > score[lead] + 1.0:
            self._lead_hot[g] = other

    def _shadow_warm(self, w: int, v: int) -> None:
        keep = self._warm_window_keep
        score = self._score_warm[w]
        worth = self._worth_warm[v]
        size = self._sizes[v]
        cap = self._warm_bytes
        freq = self._sh_freq[w]
        for e, heap in enumerate(self._sh_warm[w]):
            score[e] *= keep
            if v in heap:
                score[e] += worth
                if e == 0:
                    freq[v] += 1
            else:
                used = self._sh_used[w][e]
                while used + size > cap and len(heap):
                    u = heap.pop_min(lambda _u: True)
                    assert u is not None
                    if e == 0:
                        self._sh_gdsf_l[w] = max(self._sh_gdsf_l[w], heap.key(u))
                        del freq[u]
                    heap.discard(u)
                    used -= self._sizes[u]
                self._sh_used[w][e] = used + size
                if e == 0:
                    freq[v] = 1
            if e == 0:
                heap.push(v, self._warm_key(e, v, w, self._sh_gdsf_l[w], freq[v]), v)
            else:
                heap.push(v, self._warm_key(e, v, w), v)
        lead = self._lead_warm[w]
        other = 1 - lead
        if score[other] > score[lead] * self._warm_margin + 1.0:
            self._lead_warm[w] = other

    # -- membership -------------------------------------------------------------------------

    def on_served(self, g: int, w: int, v: int, now: float) -> None:
        """Learn v's group and worker the first time (its shadows start with this request)."""
        if self._group_of[v] < 0:
            self._group_of[v] = g
            self._worker_of[v] = w
            self._shadow_request(v)

    def on_insert_hot(self, g: int, v: int, now: float) -> None:
        """Track ``v`` in the group."""
        self._hot[g].add(v)

    def on_remove_hot(self, g: int, v: int) -> None:
        """Forget ``v`` in the group."""
        self._hot[g].discard(v)

    def _warm_protected(self, v: int) -> bool:
        return self._prot[v] != _NONE and not self._superseded[v]

    def _file(self, w: int, v: int) -> None:
        prot = self._warm_prot[w]
        if self._warm_protected(v):
            if v not in prot:
                prot.add(v)
                self._prot_bytes[w] += self._sizes[v]
            for heap in self._warm_heaps[w]:
                heap.discard(v)
        else:
            if v in prot:
                prot.discard(v)
                self._prot_bytes[w] -= self._sizes[v]
            for e, heap in enumerate(self._warm_heaps[w]):
                heap.push(v, self._warm_key(e, v, w), v)
        self._gkey[v] = self._warm_key(0, v, w)

    def _refile(self, v: int) -> None:
        for w in self._warm_of[v]:
            self._file(w, v)

    def on_insert_warm(self, w: int, v: int, now: float) -> None:
        """Track ``v`` on the worker."""
        self._warm_of[v].append(w)
        self._wfreq[v] = 1
        self._file(w, v)

    def on_remove_warm(self, w: int, v: int) -> None:
        """Forget ``v`` on the worker."""
        self._warm_of[v].remove(w)
        if v in self._warm_prot[w]:
            self._warm_prot[w].discard(v)
            self._prot_bytes[w] -= self._sizes[v]
        for heap in self._warm_heaps[w]:
            heap.discard(v)

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
        expert = self._lead_hot[g]
        decay = math.exp(-(self._clock - self._base) / self._tau)
        last_s, prot = self._last_s, self._prot
        idle_before = now - self._idle_s
        live_after = self._clock - self._pin_idle
        last = self._last
        best = math.inf
        best_v = -1
        n_canary = n_priority = 0
        protected: list[tuple[float, int, int]] = []
        for u in self._hot[g]:
            kind = prot[u]
            free = busy.get(u, 0.0) <= now
            if kind and last_s[u] >= idle_before and last[u] >= live_after:
                if kind == _CANARY:
                    n_canary += 1
                else:
                    n_priority += 1
                if free:
                    protected.append((self._hot_key(expert, u, decay), u, kind))
                continue
            if not free:
                continue
            key = self._hot_key(expert, u, decay)
            if key < best or (key == best and u < best_v):
                best, best_v = key, u
        within = n_canary <= self._limit[_CANARY] and n_priority <= self._limit[_PRIORITY]
        if within and best_v >= 0:
            return best_v
        excess = {_CANARY: n_canary - self._limit[_CANARY],
                  _PRIORITY: n_priority - self._limit[_PRIORITY]}
        protected.sort()
        candidates = [] if best_v < 0 else [(best, best_v)]
        for kind in (_CANARY, _PRIORITY):
            members = [(k, u) for k, u, kd in protected if kd == kind]
            candidates.extend(members[: max(excess[kind], 0)])
        if not candidates:
            candidates = [(k, u) for k, u, _ in protected]
        return min(candidates)[1] if candidates else None

    def warm_victim(self, w: int, now: float, hot: Container[int]) -> int | None:
        """Lowest-ranked unprotected non-HOT member by the worker's leading WARM expert; ended
        canaries count as unprotected; the lowest protected member only when nothing else is left.
        """
        expert = self._lead_warm[w]
        heap = self._warm_heaps[w][expert]
        idle_before = now - self._idle_s
        # canaries whose traffic ended lose their protection
        for u in [u for u in self._warm_prot[w]
                  if self._prot[u] == _CANARY and self._last_s[u] < idle_before]:
            self._prot[u] = _NONE
            self._refile(u)
        top = heap.pop_min(lambda u: u not in hot)
        over_share = self._prot_bytes[w] > self._warm_share_bytes
        lowest: tuple[float, int] | None = None
        if top is None or over_share:
            for u in self._warm_prot[w]:
                if u in hot:
                    continue
                key = (self._gkey[u] if expert == 0 else self._warm_key(expert, u, w), u)
                if lowest is None or key < lowest:
                    lowest = key
        if top is not None and (lowest is None or (heap.key(top), top) <= lowest):
            # L rises to the victim's GDSF key whichever expert chose it
            self._gdsf_l[w] = max(self._gdsf_l[w], self._warm_heaps[w][0].key(top))
            return top
        if lowest is None:
            return None
        self.protection_overflows += 1
        return lowest[1]
