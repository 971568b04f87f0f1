"""The heat score.

::

    heat = w.qps              * qps / qps_ref
         + w.ttft_penalty     * (qps / qps_ref) * (penalty_s / penalty_ref_s)
         + w.tenant_priority  * priority_values[priority]
         + w.scheduled_warmup * warmup

    penalty_s = Σ_class share(class) * class_weight(class) * max(0, reload_s - budget(class))

``qps`` is the decayed request rate (:mod:`loraplane.policy.stats`).
``qps * penalty_s`` is the *TTFT penalty if cold*: the seconds over budget the
version's traffic would suffer per second if it went one tier colder
(normalised: one request per window that would be ``penalty_ref_s`` over budget
scores 1). The
reload time comes from the size and the measured bandwidths: WARM→HOT for
the HOT ranking (tens of ms: within every budget, so HOT ranks on rate and
priority), COLD→WARM→HOT for the WARM ranking (0.1–2 s: large interactive
adapters blow the 300 ms budget, background ones never blow 30 s). The
priority and warm-up terms do not decay: they keep rarely used but important
versions ahead of equally rare unimportant ones.

WARM holds bytes, so it ranks by value per byte:
``warm_value = heat_warm / size_GB ** warm_size_exponent``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .config import ScoreConfig
from .cost import Bandwidths
from .model import REQUEST_CLASSES, Tier
from .snapshot import VersionMeta
from .stats import StatsView

_MAX_EXPONENT = 50.0
"""exp() argument cap of :func:`liveness` (the factor is ~1e-20 there anyway)."""
SIZE_FLOOR_GB = 0.001
"""Sizes below 1 MB count as 1 MB in the WARM value (no division blow-up)."""


@dataclass(frozen=True, slots=True)
class HeatTerms:
    """The four normalised terms and their weighted sum."""

    qps: float
    ttft_penalty: float
    tenant_priority: float
    scheduled_warmup: float
    heat: float


def penalty_s(reload_s: float, shares: tuple[float, float, float], cfg: ScoreConfig) -> float:
    """Weighted seconds over budget of one request, for a request mix (interactive, background,
    canary shares) that meets a reload of ``reload_s``."""
    w, b = cfg.class_weights, cfg.class_budgets_s
    total = 0.0
    for share, cls in zip(shares, REQUEST_CLASSES, strict=True):
        if share > 0.0:
            total += share * w[cls] * max(0.0, reload_s - b[cls])
    return total


def terms(
    rate: float,
    penalty: float,
    priority_value: float,
    warmup: float,
    cfg: ScoreConfig,
) -> HeatTerms:
    """The score from its raw inputs (the single formula every caller goes through)."""
    w = cfg.weights
    qps = rate / cfg.qps_ref
    ttft = qps * penalty / cfg.penalty_ref_s
    heat = (
        w.qps * qps
        + w.ttft_penalty * ttft
        + w.tenant_priority * priority_value
        + w.scheduled_warmup * warmup
    )
    return HeatTerms(qps, ttft, priority_value, warmup, heat)


def size_factor(size_bytes: int, exponent: float) -> float:
    """Divisor of the WARM value: size in GB (floored at 1 MB) to the given power."""
    gb: float = max(size_bytes / 1e9, SIZE_FLOOR_GB)
    return float(gb**exponent)


def liveness(idle_s: float, mean_gap_s: float, cfg: ScoreConfig) -> float:
    """Factor in (0, 1] on the HOT rate: how likely the version's request stream is still going.

    A decayed count remembers a burst (or a stream that was switched off) for
    several time constants after it ended; a version idle for many of its own mean
    gaps has most likely stopped. ``(1 + odds) / (1 + odds * exp(scale * idle / gap))``:
    1 right after a request, 1/2 after ``ln(1/odds) / scale`` gaps (15 with the
    defaults). 1 when the gap is unknown (fewer than two requests) or ``scale`` is 0.
    """
    if mean_gap_s <= 0.0 or cfg.liveness_scale == 0.0 or idle_s <= 0.0:
        return 1.0
    x = min(cfg.liveness_scale * idle_s / mean_gap_s, _MAX_EXPONENT)
    odds = cfg.liveness_odds
    return (1.0 + odds) / (1.0 + odds * math.exp(x))


def hot_terms(
    meta: VersionMeta, stats: StatsView, now: float, cfg: ScoreConfig, bw: Bandwidths
) -> HeatTerms:
    """Heat for the HOT ranking: the penalty is a reload from WARM."""
    alive = liveness(stats.idle_s(now), stats.mean_gap_s, cfg)
    return hot_terms_at(meta, stats, stats.rate(now, cfg.rate_window_s) * alive, cfg, bw)


def hot_terms_at(
    meta: VersionMeta, stats: StatsView, rate: float, cfg: ScoreConfig, bw: Bandwidths
) -> HeatTerms:
    """:func:`hot_terms` of a discounted rate already at hand (``stats.rate(now)`` ×
    :func:`liveness`, as the heat plan computes it for its replicas)."""
    return terms(
        rate,
        penalty_s(bw.warm_to_hot_s(meta.size_bytes), stats.class_shares(), cfg),
        cfg.priority_values[meta.priority],
        meta.warmup,
        cfg,
    )


def warm_terms(
    meta: VersionMeta, stats: StatsView, now: float, cfg: ScoreConfig, bw: Bandwidths
) -> HeatTerms:
    """Heat for the WARM ranking: rate over the WARM window, penalty of a full load from COLD."""
    return terms(
        stats.rate_warm(now, cfg.warm_rate_window_s),
        penalty_s(bw.load_s(meta.size_bytes, Tier.COLD), stats.class_shares(), cfg),
        cfg.priority_values[meta.priority],
        meta.warmup,
        cfg,
    )


def warm_value(
    meta: VersionMeta, stats: StatsView, now: float, cfg: ScoreConfig, bw: Bandwidths
) -> float:
    """WARM ranking key: WARM heat per (GB ** exponent)."""
    return warm_terms(meta, stats, now, cfg, bw).heat / size_factor(
        meta.size_bytes, cfg.warm_size_exponent
    )
