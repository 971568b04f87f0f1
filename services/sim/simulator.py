"""Trace-driven cache simulator: every policy meets the same requests under the same rules.

Rules (``shared/traces/FORMAT.md``), for every policy alike:

* routing: a version always goes to its affinity worker (``crc32(adapter_id) % workers``),
  so workers partition the versions and Belady stays exact per worker;
* a request is served HOT; on a miss the version is loaded from WARM (host
  files on that worker) or COLD (object storage), making room first: WARM
  evicts non-HOT versions until the bytes fit, HOT demotes one version of the
  same (worker, base model) group. HOT ⊆ WARM (the engine loads host files);
* a version with in-flight requests on a worker is never demoted there: the
  policy must pick another; when every member is busy the request waits for
  the earliest one to finish, and that wait is part of its TTFT;
* the first request of each version is a compulsory miss, reported apart;
  "cold starts" are the later loads from COLD;
* HOT has vLLM's two levels when ``Capacities.active_slots`` is set: the policy places
  *registered* versions (``gpu_slots`` per group: ``max_cpu_loras``) and the engine keeps
  the ``active_slots`` (``max_loras``) most recently used of them in GPU slots, itself, as
  vLLM's LRU does; a HOT request whose version is registered but not in a slot pays an
  activation (``Bandwidths.activation_s``) in its TTFT, a load pays registration and
  activation. The limit of ``max_loras`` distinct versions per batch is not simulated (a
  request never waits for a slot, only for a registration). 0: one level (every HOT version
  sits in a slot).

The simulator checks capacities after every load and raises
:class:`SimulationError` if a policy breaks one.
"""

from __future__ import annotations

import math
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from loraplane.policy.model import PRIORITIES, REQUEST_CLASSES
from loraplane.policy.online import CachePolicy
from loraplane.sim.cost import CostModel
from loraplane.sim.trace import Trace


class SimulationError(RuntimeError):
    """A policy broke a rule of the simulation (a bug in the policy)."""

    retriable = False


@dataclass(frozen=True, slots=True)
class Capacities:
    """Simulated cluster: identical workers."""

    gpu_slots: int
    """Engine LoRA slots per worker and base model."""
    host_bytes: int
    """Host bytes per worker (WARM, including the HOT versions' files)."""
    workers: int = 1
    """Number of workers."""
    active_slots: int = 0
    """GPU slots per worker and base model (vLLM ``max_loras``) when fewer than the
    registered ``gpu_slots`` (``max_cpu_loras``); 0 = one level, every HOT version in a slot."""

    def problems(self, trace: Trace) -> list[str]:
        """Why these capacities cannot run ``trace`` (empty when they can)."""
        out = []
        if self.workers < 1:
            out.append(f"workers must be >= 1, got {self.workers}")
        if self.gpu_slots < 1:
            out.append(f"gpu slots must be >= 1, got {self.gpu_slots}")
        if not 0 <= self.active_slots <= self.gpu_slots:
            out.append(f"active slots must be in 0..gpu slots ({self.gpu_slots}), "
                       f"got {self.active_slots}")
        biggest = max(trace.version_size) if trace.version_size else 0
        need = (self.gpu_slots * max(1, len(trace.base_models)) + 1) * biggest
        if self.host_bytes < need:
            out.append(
                f"host bytes {self.host_bytes} cannot hold a full HOT tier plus one more of the "
                f"largest adapter ({biggest} B): need >= {need}"
            )
        return out


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100.0 * len(sorted_values)) - 1))
    return sorted_values[k]


@dataclass
class SimResult:
    """Figures of one policy on one trace and capacity."""

    policy: str
    requests: int
    gpu_hits: int
    host_hits: int
    compulsory_misses: int
    cold_starts: int
    cold_starts_by_priority: dict[str, int]
    cold_starts_by_class: dict[str, int]
    cold_starts_canary: int
    loads: int
    hot_evictions: int
    warm_evictions: int
    slot_waits: int
    ttft_ms: dict[str, dict[str, float]]
    """p50/p99 (ms) per request class and overall, compulsory misses left out."""
    compulsory_ttft_ms: dict[str, float]
    """p50/p99 (ms) of the compulsory misses alone."""
    sim_seconds: float
    """CPU seconds of the simulation loop (this process only: robust on a shared machine)."""
    sim_wall_seconds: float
    """Wall-clock seconds of the same loop."""
    capacities: Capacities
    cost_model: CostModel
    trace: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def gpu_hit_ratio(self) -> float:
        """Requests served HOT / all requests."""
        return self.gpu_hits / self.requests if self.requests else 0.0

    @property
    def host_hit_ratio(self) -> float:
        """Requests that were not HOT but WARM on their worker / all requests."""
        return self.host_hits / self.requests if self.requests else 0.0

    @property
    def sim_requests_per_s(self) -> float:
        """Simulation speed: requests per CPU second of the simulation loop."""
        return self.requests / self.sim_seconds if self.sim_seconds > 0 else math.inf

    @property
    def sim_requests_per_wall_s(self) -> float:
        """Requests per wall-clock second (lower when other processes share the CPUs)."""
        return self.requests / self.sim_wall_seconds if self.sim_wall_seconds > 0 else math.inf

    def as_dict(self) -> dict[str, Any]:
        """The JSON object ``loraplane sim --json`` prints for this policy."""
        return {
            "policy": self.policy,
            "trace": self.trace,
            "workers": self.capacities.workers,
            "gpu_slots": self.capacities.gpu_slots,
            "active_slots": self.capacities.active_slots,
            "host_bytes": self.capacities.host_bytes,
            "requests": self.requests,
            "gpu_hit_ratio": round(self.gpu_hit_ratio, 6),
            "host_hit_ratio": round(self.host_hit_ratio, 6),
            "compulsory_misses": self.compulsory_misses,
            "cold_starts": self.cold_starts,
            "cold_starts_by_priority": dict(self.cold_starts_by_priority),
            "cold_starts_by_class": dict(self.cold_starts_by_class),
            "cold_starts_canary": self.cold_starts_canary,
            "ttft_ms": {k: dict(v) for k, v in self.ttft_ms.items()},
            "compulsory_ttft_ms": dict(self.compulsory_ttft_ms),
            "loads": self.loads,
            "evictions": self.hot_evictions + self.warm_evictions,
            "hot_evictions": self.hot_evictions,
            "warm_evictions": self.warm_evictions,
            "slot_waits": self.slot_waits,
            "sim_requests_per_s": round(self.sim_requests_per_s, 1),
            "sim_requests_per_wall_s": round(self.sim_requests_per_wall_s, 1),
            "cost_model": self.cost_model.as_dict(),
            **self.extra,
        }


def affinity(version_ids: list[str], workers: int) -> list[int]:
    """Affinity worker of each version (stable across processes: crc32, not ``hash``)."""
    return [zlib.crc32(v.encode("utf-8")) % workers for v in version_ids]


def ttft_floor(trace: Trace, capacities: Capacities, cost: CostModel | None = None) -> dict[
    str, dict[str, float]
]:
    """TTFT percentiles no placement policy can beat on ``trace`` at ``capacities``.

    The same replay as :func:`simulate` with a clairvoyant, free cache: every
    request after a version's first is served as if HOT (no load); the first
    pays its COLD load as in :func:`simulate` (compulsory for every policy). A
    request still waits when every slot of its (worker, base model) group is
    held by *other* versions' in-flight requests: no policy can avoid that wait,
    since an in-flight version is never demoted. Shorter loads only end requests
    earlier, so a real policy holds at least these versions busy and waits at
    least as long. Same shape as :attr:`SimResult.ttft_ms` (``p50``, ``p99``,
    ``count`` per class and ``all``; compulsory misses left out).
    """
    cost = cost or CostModel()
    bw = cost.bandwidths
    n_bm = max(1, len(trace.base_models))
    slots = capacities.gpu_slots
    home = affinity(trace.version_ids, capacities.workers)
    group_of = [home[v] * n_bm + trace.version_base_model[v] for v in range(trace.n_versions)]
    busy: list[dict[int, float]] = [{} for _ in range(capacities.workers * n_bm)]
    seen = [False] * trace.n_versions
    ttfts: list[list[float]] = [[] for _ in REQUEST_CLASSES]
    base_s = cost.base_ttft_ms / 1000.0
    prefill_s = cost.prefill_ms_per_token / 1000.0
    tpot_s = cost.tpot_ms / 1000.0
    for i, now in enumerate(trace.ts):
        v = trace.version[i]
        held = busy[group_of[v]]
        if seen[v]:
            load = 0.0
        else:
            size = trace.version_size[v]
            load = bw.cold_to_warm_s(size) + bw.warm_to_hot_s(size)
        wait = 0.0
        if held.get(v, 0.0) <= now:
            others = sorted((end, u) for u, end in held.items() if end > now)
            if len(others) >= slots:
                # the slot frees when enough of the others finish; they leave the group
                freed = others[: len(others) - slots + 1]
                wait = freed[-1][0] - now
                for _, u in freed:
                    del held[u]
        ttft = wait + load + base_s + trace.prompt_tokens[i] * prefill_s
        if seen[v]:
            ttfts[trace.classes[i]].append(ttft)
        seen[v] = True
        end = now + ttft + trace.output_tokens[i] * tpot_s
        if held.get(v, 0.0) < end:
            held[v] = end
        if len(held) > 4 * slots:
            for u in [u for u, e in held.items() if e <= now]:
                del held[u]
    return _percentiles(ttfts)


def _percentiles(ttfts: list[list[float]]) -> dict[str, dict[str, float]]:
    """p50/p99 (ms) and count per request class and over all classes."""
    out: dict[str, dict[str, float]] = {}
    everything: list[float] = []
    for c, name in enumerate(REQUEST_CLASSES):
        values = sorted(ttfts[c])
        everything.extend(values)
        if values:
            out[name.value] = {
                "p50": round(percentile(values, 50) * 1000.0, 3),
                "p99": round(percentile(values, 99) * 1000.0, 3),
                "count": float(len(values)),
            }
    everything.sort()
    out["all"] = {
        "p50": round(percentile(everything, 50) * 1000.0, 3),
        "p99": round(percentile(everything, 99) * 1000.0, 3),
        "count": float(len(everything)),
    }
    return out


def simulate(
    trace: Trace,
    policy: CachePolicy,
    capacities: Capacities,
    cost: CostModel | None = None,
) -> SimResult:
    """Run ``trace`` through ``policy`` and return its figures."""
    cost = cost or CostModel()
    problems = capacities.problems(trace)
    if problems:
        raise ValueError("; ".join(problems))
    bw = cost.bandwidths
    n_bm = max(1, len(trace.base_models))
    n_workers = capacities.workers
    slots = capacities.gpu_slots
    cap_bytes = capacities.host_bytes
    ctx = trace.online_context(
        workers=n_workers, gpu_slots=slots, host_bytes=cap_bytes, bandwidths=bw
    )
    pol = policy.online(ctx)

    sizes = trace.version_size
    # per version: worker, slot group, load times (s)
    home = affinity(trace.version_ids, n_workers)
    group_of = [home[v] * n_bm + trace.version_base_model[v] for v in range(trace.n_versions)]
    warm_load = [bw.warm_to_hot_s(s) for s in sizes]
    cold_load = [bw.cold_to_warm_s(s) + bw.warm_to_hot_s(s) for s in sizes]
    seen = [False] * trace.n_versions
    # the second HOT level (vLLM's slot LRU per group); None: one level
    active = capacities.active_slots if capacities.active_slots < slots else 0
    activation = [bw.activation_s(s) for s in sizes] if active else []
    in_slot: list[dict[int, None]] | None = (
        [{} for _ in range(n_workers * n_bm)] if active else None)
    activations = 0

    hot: list[set[int]] = [set() for _ in range(n_workers * n_bm)]
    hot_on_worker: list[set[int]] = [set() for _ in range(n_workers)]
    warm: list[set[int]] = [set() for _ in range(n_workers)]
    warm_used = [0] * n_workers
    busy: list[dict[int, float]] = [{} for _ in range(n_workers)]

    n_cls = len(REQUEST_CLASSES)
    ttfts: list[list[float]] = [[] for _ in range(n_cls)]
    compulsory_ttfts: list[float] = []
    cold_by_prio = [0] * len(PRIORITIES)
    cold_by_cls = [0] * n_cls
    gpu_hits = host_hits = compulsory = cold = cold_canary = 0
    loads = hot_ev = warm_ev = waits = 0

    ts = trace.ts
    version = trace.version
    classes = trace.classes
    prios = trace.priorities
    canary = trace.canary
    prompt = trace.prompt_tokens
    output = trace.output_tokens
    base_s = cost.base_ttft_ms / 1000.0
    prefill_s = cost.prefill_ms_per_token / 1000.0
    tpot_s = cost.tpot_ms / 1000.0

    on_request = pol.on_request
    on_served = pol.on_served
    started = time.perf_counter()
    cpu_started = time.process_time()
    for i in range(len(ts)):
        now = ts[i]
        v = version[i]
        on_request(i, v, now)
        g = group_of[v]
        w = home[v]
        hot_g = hot[g]
        busy_w = busy[w]
        if v in hot_g:
            # the common case on its own path: served HOT, no load, no wait, not a first
            # request (the same figures as the general path below)
            gpu_hits += 1
            on_served(g, w, v, now)
            ttft = base_s + prompt[i] * prefill_s
            if in_slot is not None:
                lru = in_slot[g]
                if v in lru:
                    del lru[v]  # to the most recent end (dicts keep insertion order)
                else:
                    activations += 1
                    ttft += activation[v]
                    if len(lru) >= active:
                        del lru[next(iter(lru))]
                lru[v] = None
            ttfts[classes[i]].append(ttft)
            end = now + ttft + output[i] * tpot_s
            if busy_w.get(v, 0.0) < end:
                busy_w[v] = end
            continue
        wait = 0.0
        first = False
        warm_w = warm[w]
        if v in warm_w:
            host_hits += 1
            load = warm_load[v]
        else:
            if seen[v]:
                cold += 1
                cold_by_prio[prios[i]] += 1
                cold_by_cls[classes[i]] += 1
                if canary[i]:
                    cold_canary += 1
            else:
                compulsory += 1
                first = True
            load = cold_load[v]
            size = sizes[v]
            hot_w = hot_on_worker[w]
            while warm_used[w] + size > cap_bytes:
                victim = pol.warm_victim(w, now, hot_w)
                if victim is None or victim not in warm_w or victim in hot_w:
                    raise SimulationError(f"{policy.name}: bad WARM victim {victim}")
                warm_w.discard(victim)
                warm_used[w] -= sizes[victim]
                pol.on_remove_warm(w, victim)
                warm_ev += 1
            warm_w.add(v)
            warm_used[w] += size
            pol.on_insert_warm(w, v, now)
        if len(hot_g) >= slots:
            victim = pol.hot_victim(g, now, busy_w)
            if victim is None:
                # every member is busy: wait for the first one to finish
                victim = min(hot_g, key=lambda u: (busy_w.get(u, 0.0), u))
                wait = busy_w[victim] - now
                waits += 1
            elif victim not in hot_g or busy_w.get(victim, 0.0) > now:
                raise SimulationError(f"{policy.name}: bad HOT victim {victim}")
            hot_g.discard(victim)
            hot_on_worker[w].discard(victim)
            pol.on_remove_hot(g, victim)
            hot_ev += 1
            if in_slot is not None:
                in_slot[g].pop(victim, None)
        if in_slot is not None:  # registered and activated (add_lora does both)
            lru = in_slot[g]
            if len(lru) >= active:
                del lru[next(iter(lru))]
            lru[v] = None
        hot_g.add(v)
        hot_on_worker[w].add(v)
        pol.on_insert_hot(g, v, now)
        loads += 1
        seen[v] = True
        on_served(g, w, v, now)
        ttft = wait + load + base_s + prompt[i] * prefill_s
        if first:
            compulsory_ttfts.append(ttft)
        else:
            ttfts[classes[i]].append(ttft)
        end = now + ttft + output[i] * tpot_s
        if busy_w.get(v, 0.0) < end:
            busy_w[v] = end
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started

    for w in range(n_workers):
        if warm_used[w] > cap_bytes:
            raise SimulationError(f"{policy.name}: worker {w} over host bytes")
    for g in range(len(hot)):
        if len(hot[g]) > slots:
            raise SimulationError(f"{policy.name}: group {g} over slots")

    # TTFT percentiles leave compulsory misses out: they are the same for every policy
    # (an artefact of starting empty) and are counted in compulsory_misses.
    ttft_ms = _percentiles(ttfts)
    compulsory_ttfts.sort()
    return SimResult(
        policy=policy.name,
        requests=len(ts),
        gpu_hits=gpu_hits,
        host_hits=host_hits,
        compulsory_misses=compulsory,
        cold_starts=cold,
        cold_starts_by_priority={p.value: cold_by_prio[k] for k, p in enumerate(PRIORITIES)},
        cold_starts_by_class={c.value: cold_by_cls[k] for k, c in enumerate(REQUEST_CLASSES)},
        cold_starts_canary=cold_canary,
        loads=loads,
        hot_evictions=hot_ev,
        warm_evictions=warm_ev,
        slot_waits=waits,
        ttft_ms=ttft_ms,
        compulsory_ttft_ms={
            "p50": round(percentile(compulsory_ttfts, 50) * 1000.0, 3),
            "p99": round(percentile(compulsory_ttfts, 99) * 1000.0, 3),
        },
        sim_seconds=cpu,
        sim_wall_seconds=elapsed,
        capacities=capacities,
        cost_model=cost,
        trace=trace.name,
        extra={"protection_overflows": int(getattr(pol, "protection_overflows", 0)),
               "slot_activations": activations},
    )
