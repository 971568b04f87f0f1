"""Trace generator: Azure LLM inference arrivals (2023) → multi-tenant LoRA request traces.

The Azure traces give real arrival times and token counts but no adapter ids.
On top of them this synthesises, from one seed:

* **tenants** in tiers (platinum / gold / silver / bronze), each with a handful
  of adapters (a heavy-tailed count); a few adapters override their tenant's
  priority;
* **power-law popularity**: adapter weights ``1 / rank ** zipf_alpha`` over a
  random permutation, mildly scaled by tier (big customers send more);
* **drift**: every ``drift_period_s`` each log-weight takes a Gaussian step, and a
  few adapters jump (a new integration goes live, an old one is switched off);
* **flash bursts** on cold adapters: a batch job or a launch sends a share of all
  traffic to one adapter from the unpopular part for tens of seconds to minutes;
* **kinds and classes**: chat-style adapters send mostly interactive requests,
  batch adapters mostly background ones;
* **ranks and sizes**: rank 8–64 on q,v or all linear layers of a Llama-3-8B-sized
  model (bf16), so artifacts range from ~7 MB to ~340 MB;
* **releases with canaries**: a popular adapter publishes a new version that
  first gets ``canary_percent`` of its traffic (request class ``canary``,
  ``canary=1``) and is then promoted (the old version stops receiving traffic)
  or rolled back.

The output follows ``shared/traces/FORMAT.md``. Same inputs and seed, same bytes.
"""

from __future__ import annotations

import bisect
import csv
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from loraplane.policy.model import Priority, RequestClass
from loraplane.sim.trace import TraceRow

DEFAULT_AZURE_DIR = Path("../shared/traces/azure-llm-2023")
"""Where the Azure files are, relative to the repository root (CI layout)."""
AZURE_FILES = {
    "conv": "AzureLLMInferenceTrace_conv.csv",
    "code": "AzureLLMInferenceTrace_code.csv",
}
USE_CASES = (
    "support", "sales", "legal", "finance", "code", "sql", "summarize", "translate",
    "extract", "tone", "moderation", "search", "ops", "medical", "tutor", "marketing",
)
TIER_WEIGHT = {Priority.PLATINUM: 2.0, Priority.GOLD: 1.5, Priority.SILVER: 1.0,
               Priority.BRONZE: 0.7}
"""Traffic multiplier per tier (platinum customers are the bigger ones)."""

# Llama-3-8B shapes: per layer, rank r adds r * (in + out) parameters per adapted matrix.
_HIDDEN, _KV, _INTER, _LAYERS, _BYTES = 4096, 1024, 14336, 32, 2
_QV_PER_RANK = (_HIDDEN + _HIDDEN) + (_HIDDEN + _KV)
_ALL_PER_RANK = _QV_PER_RANK + (_HIDDEN + _KV) + (_HIDDEN + _HIDDEN) + 3 * (_HIDDEN + _INTER)


def adapter_size_bytes(rank: int, all_linear: bool) -> int:
    """Safetensors size of a bf16 LoRA adapter for an 8B Llama (plus a small header)."""
    per_rank = _ALL_PER_RANK if all_linear else _QV_PER_RANK
    return rank * per_rank * _LAYERS * _BYTES + 16_384


@dataclass(frozen=True)
class GenConfig:
    """Knobs of the generator (defaults: a few hundred adapters, one base model)."""

    seed: int = 1
    sources: tuple[str, ...] = ("conv",)
    """Which Azure files to merge: ``conv``, ``code`` or both."""
    hours: int = 1
    """How many times the (≈1 h) arrival sequence is tiled end to end; drift continues."""
    azure_dir: Path = DEFAULT_AZURE_DIR
    tenants: int = 60
    tier_shares: tuple[float, float, float, float] = (0.07, 0.18, 0.30, 0.45)
    """Share of tenants that are platinum, gold, silver, bronze."""
    mean_adapters_per_tenant: float = 6.0
    zipf_alpha: float = 1.0
    """Popularity exponent over adapters."""
    drift_period_s: float = 300.0
    drift_sigma: float = 0.3
    """Std-dev of the log-weight step per period."""
    jump_probability: float = 0.01
    """Per adapter and period: chance of a popularity jump (×/÷ 10–100)."""
    bursts_per_hour: float = 10.0
    burst_duration_s: tuple[float, float] = (30.0, 240.0)
    burst_share: tuple[float, float] = (0.05, 0.25)
    """Share of all arrivals a burst takes while it lasts."""
    burst_background_share: float = 0.6
    """Bursts that are batch jobs (background); the rest are interactive flash crowds."""
    batch_adapters: tuple[int, int] = (1, 8)
    """A batch job walks through this many cold adapters, one after the other."""
    batch_adapter_share: float = 0.35
    """Adapters of the batch kind (mostly background requests)."""
    interactive_share_chat: float = 0.92
    interactive_share_batch: float = 0.1
    priority_override_share: float = 0.03
    releases_per_hour: float = 6.0
    canary_duration_s: tuple[float, float] = (600.0, 1800.0)
    canary_percents: tuple[int, ...] = (5, 10, 20)
    rollback_share: float = 0.2
    rank_weights: dict[int, float] = field(
        default_factory=lambda: {8: 0.3, 16: 0.4, 32: 0.2, 64: 0.1}
    )
    all_linear_share: float = 0.6
    base_models: tuple[str, ...] = ("llama-3.1-8b",)


@dataclass(frozen=True, slots=True)
class Arrival:
    """One real arrival: seconds since the start, prompt and output tokens."""

    ts: float
    prompt_tokens: int
    output_tokens: int


def read_azure(azure_dir: Path, sources: tuple[str, ...]) -> list[Arrival]:
    """Merge the chosen Azure files into arrivals sorted by time, starting at 0."""
    rows: list[tuple[datetime, int, int]] = []
    for source in sources:
        if source not in AZURE_FILES:
            raise ValueError(f"unknown source {source!r} (known: {', '.join(AZURE_FILES)})")
        path = azure_dir / AZURE_FILES[source]
        with path.open(encoding="utf-8", newline="") as fh:
            for row in csv.DictReader(fh):
                stamp = row["TIMESTAMP"].strip()
                # 7 fractional digits: keep microseconds
                if "." in stamp:
                    head, frac = stamp.split(".", 1)
                    stamp = f"{head}.{frac[:6]:0<6}"
                rows.append(
                    (datetime.fromisoformat(stamp), int(row["ContextTokens"]),
                     int(row["GeneratedTokens"]))
                )
    if not rows:
        raise ValueError(f"no arrivals in {azure_dir} for {sources}")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    return [Arrival((t - t0).total_seconds(), p, o) for t, p, o in rows]


@dataclass
class _Adapter:
    tenant: str
    name: str
    priority: Priority
    batch: bool
    rank: int
    size: int
    base_model: str
    log_weight: float
    version: int = 1
    canary_version: int | None = None
    canary_percent: int = 0

    def version_id(self, version: int) -> str:
        return f"{self.tenant}/{self.name}@v{version}"


@dataclass(order=True)
class _Event:
    t: float
    order: int
    kind: str = field(compare=False)
    adapter: int = field(compare=False)
    value: float = field(compare=False, default=0.0)
    end: float = field(compare=False, default=0.0)
    flag: bool = field(compare=False, default=False)
    """Burst: a batch job (background). Release: rolled back instead of promoted."""
    adapters: list[int] = field(compare=False, default_factory=list)
    """Burst: the adapters it walks through, in order."""


def _weighted_choice(rng: random.Random, weights: dict[int, float]) -> int:
    keys = sorted(weights)
    return rng.choices(keys, weights=[weights[k] for k in keys])[0]


def _make_adapters(cfg: GenConfig, rng: random.Random) -> list[_Adapter]:
    tiers = list(Priority)
    adapters: list[_Adapter] = []
    for t in range(cfg.tenants):
        tenant = f"t{t:03d}"
        tier = rng.choices(tiers, weights=cfg.tier_shares)[0]
        # heavy-tailed adapter count: geometric-ish with the configured mean
        count = 1 + int(rng.expovariate(1.0 / max(cfg.mean_adapters_per_tenant - 1.0, 0.1)))
        for a in range(count):
            prio = tier
            if rng.random() < cfg.priority_override_share:
                prio = rng.choice([p for p in tiers if p is not tier])
            rank = _weighted_choice(rng, cfg.rank_weights)
            all_linear = rng.random() < cfg.all_linear_share
            adapters.append(
                _Adapter(
                    tenant=tenant,
                    name=f"{rng.choice(USE_CASES)}-{a}",
                    priority=prio,
                    batch=rng.random() < cfg.batch_adapter_share,
                    rank=rank,
                    size=adapter_size_bytes(rank, all_linear),
                    base_model=rng.choice(cfg.base_models),
                    log_weight=0.0,
                )
            )
    order = list(range(len(adapters)))
    rng.shuffle(order)
    for popularity_rank, a in enumerate(order, start=1):
        ad = adapters[a]
        ad.log_weight = math.log(TIER_WEIGHT[ad.priority]) - cfg.zipf_alpha * math.log(
            popularity_rank
        )
    return adapters


def _cumulative(adapters: list[_Adapter]) -> list[float]:
    top = max(a.log_weight for a in adapters)
    cum: list[float] = []
    total = 0.0
    for a in adapters:
        total += math.exp(a.log_weight - top)
        cum.append(total)
    return cum


def _events(cfg: GenConfig, rng: random.Random, duration: float, n_adapters: int) -> list[_Event]:
    events: list[_Event] = []
    order = 0
    t = 0.0
    while cfg.bursts_per_hour > 0:
        t += rng.expovariate(cfg.bursts_per_hour / 3600.0)
        if t >= duration:
            break
        length = rng.uniform(*cfg.burst_duration_s)
        events.append(
            _Event(t, order, "burst", -1, rng.uniform(*cfg.burst_share), t + length,
                   rng.random() < cfg.burst_background_share)
        )
        order += 1
    t = 0.0
    while cfg.releases_per_hour > 0:
        t += rng.expovariate(cfg.releases_per_hour / 3600.0)
        if t >= duration:
            break
        length = rng.uniform(*cfg.canary_duration_s)
        events.append(
            _Event(t, order, "release", -1, float(rng.choice(cfg.canary_percents)), t + length,
                   rng.random() < cfg.rollback_share)
        )
        order += 1
    events.sort()
    return events


def generate(cfg: GenConfig, arrivals: list[Arrival] | None = None) -> Iterator[TraceRow]:
    """Yield the trace's requests in time order (deterministic for ``cfg``)."""
    if arrivals is None:
        arrivals = read_azure(cfg.azure_dir, cfg.sources)
    rng = random.Random(cfg.seed)
    adapters = _make_adapters(cfg, rng)
    span = arrivals[-1].ts + 1.0
    duration = span * cfg.hours
    events = _events(cfg, rng, duration, len(adapters))
    cum = _cumulative(adapters)
    epoch = 0
    next_event = 0
    active_bursts: list[_Event] = []
    canary_ends: list[_Event] = []

    def pick_by_weight() -> int:
        return min(bisect.bisect_right(cum, rng.random() * cum[-1]), len(cum) - 1)

    for copy in range(cfg.hours):
        offset = copy * span
        for arr in arrivals:
            now = offset + arr.ts
            # popularity drift
            while now >= (epoch + 1) * cfg.drift_period_s:
                epoch += 1
                for ad in adapters:
                    ad.log_weight += rng.gauss(0.0, cfg.drift_sigma)
                    if rng.random() < cfg.jump_probability:
                        ad.log_weight += rng.choice((-1.0, 1.0)) * math.log(rng.uniform(10, 100))
                cum = _cumulative(adapters)
            # canary phases that end
            for ev in [e for e in canary_ends if e.end <= now]:
                canary_ends.remove(ev)
                ad = adapters[ev.adapter]
                if ad.canary_version is not None and not ev.flag:  # promoted
                    ad.version = ad.canary_version
                ad.canary_version = None
                ad.canary_percent = 0
            active_bursts = [b for b in active_bursts if b.end > now]
            # events that start
            while next_event < len(events) and events[next_event].t <= now:
                ev = events[next_event]
                next_event += 1
                if ev.kind == "burst":
                    # cold adapters: from the less popular 80 %; a batch job walks several
                    ranked = sorted(range(len(adapters)), key=lambda a: -adapters[a].log_weight)
                    count = rng.randint(*cfg.batch_adapters) if ev.flag else 1
                    ev.adapters = [rng.choice(ranked[len(ranked) // 5:]) for _ in range(count)]
                    active_bursts.append(ev)
                else:
                    # busy adapters release more often: pick by current popularity
                    ev.adapter = pick_by_weight()
                    ad = adapters[ev.adapter]
                    if ad.canary_version is not None:
                        continue
                    ad.canary_version = ad.version + 1
                    ad.canary_percent = int(ev.value)
                    canary_ends.append(ev)
            # choose the adapter of this request
            chosen = -1
            burst_class: RequestClass | None = None
            for b in active_bursts:
                if rng.random() < b.value:
                    step = int((now - b.t) / (b.end - b.t) * len(b.adapters))
                    chosen = b.adapters[min(step, len(b.adapters) - 1)]
                    burst_class = (
                        RequestClass.BACKGROUND if b.flag else RequestClass.INTERACTIVE
                    )
                    break
            if chosen < 0:
                chosen = pick_by_weight()
            ad = adapters[chosen]
            version = ad.version
            is_canary = False
            if ad.canary_version is not None and rng.random() * 100.0 < ad.canary_percent:
                version = ad.canary_version
                is_canary = True
            if is_canary:
                cls = RequestClass.CANARY
            elif burst_class is not None:
                cls = burst_class
            else:
                share = cfg.interactive_share_batch if ad.batch else cfg.interactive_share_chat
                cls = (
                    RequestClass.INTERACTIVE if rng.random() < share else RequestClass.BACKGROUND
                )
            yield TraceRow(
                ts=round(now, 6),
                tenant_id=ad.tenant,
                adapter_id=ad.version_id(version),
                priority=ad.priority,
                request_class=cls,
                rank=ad.rank,
                size_bytes=ad.size,
                canary=is_canary,
                prompt_tokens=arr.prompt_tokens,
                output_tokens=arr.output_tokens,
                base_model=ad.base_model,
            )
