"""Canary analysis: per-version figures + rules + clock → one decision (pure, no I/O).

A canary is judged against the stable version of the same adapter over the same
window (``max(stage start, now - window_s)`` … ``now``). :func:`decide` returns
one :class:`Decision`:

* ``abort`` — a failure rule holds (checked first, in this order):
  ``load_failed`` (its loads fail: artifact gone or corrupt, the worker's
  verification refused it), ``golden_set_failed`` (its shadow requests failed),
  ``error_rate`` (its requests fail after load), ``degraded_share`` (its requests
  degrade to the base model), ``ttft_p<q>`` (its first-token tail, per request
  class, is worse than stable's beyond the rule);
* ``hold`` — nothing failed, but the stage is not over (dwell time or minimum
  requests not reached, or its golden set has not answered yet), or the analysis is
  paused / disabled; a canary staged at 0 % under a prewarm schedule holds
  (``prewarming``) until every target worker reported it WARM or HOT;
* ``advance`` — the stage is over and clean: next share in ``stages``; a prewarmed
  staged canary gets its schedule's first share (``prewarmed``);
* ``promote`` — the last stage (100 %) is over and clean: make it stable.

Rates are judged with a one-sided Wilson score bound, so a handful of requests never
decides: a rate rule fails only when the *lower* bound of the canary's rate, at
``confidence``, is above the stable version's rate plus the rule's allowed excess.
Until ``min_requests`` were seen, the bound is computed as if the missing requests
had all succeeded (``n = max(n, min_requests)``): failures alone can then prove a
canary bad early — at the defaults the second failed request of twenty aborts —
while a success never counts before it happened. Latency uses a distribution-free
bound on the quantile (order statistics of a binomial): the canary's lower bound
of its p99 must exceed ``ttft_max_ratio`` × stable's p99 + ``ttft_slack_ms``, with
at least ``ttft_min_samples`` on each side.

Every decision carries the figures that decided it (:meth:`Decision.figures`), which
the executor writes into the registry's audit entry.

A **stable** version is judged too (:func:`decide_stable`): when the lower bound of its
error rate after load, over the window, is above the upper bound of the rest of its base
model's stable traffic (the reference: a worker or engine outage fails every version
alike and is no verdict on one; a sample too, hence its upper bound) plus
``max_stable_error_rate``, it is taken out of routing (never without ``min_requests``
reference requests: alone on its base model, a failing version and an outage look alike) —
``rollback`` to the release's rollback target when there is one the analysis has not
taken out itself, else ``withdraw`` (no version to fall back to: it is taken out of HOT
and its requests follow their class's cold-start budget).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_STAGES = (1, 10, 50, 100)
"""Canary shares, in percent, a canary goes through before promotion."""


class Action(str, Enum):
    """What the analysis asks for."""

    HOLD = "hold"
    ADVANCE = "advance"
    PROMOTE = "promote"
    ABORT = "abort"


class Reason(str, Enum):
    """Why (machine-readable; the audit entry and the metrics carry it)."""

    # abort
    LOAD_FAILED = "load_failed"
    GOLDEN_SET_FAILED = "golden_set_failed"
    ERROR_RATE = "error_rate"
    DEGRADED_SHARE = "degraded_share"
    TTFT = "ttft_tail"
    # hold
    DWELL = "dwell"
    MIN_REQUESTS = "min_requests"
    PAUSED = "paused"
    DISABLED = "disabled"
    NOT_RUNNING = "not_running"
    """No canary share yet (staged at 0 %): the analysis starts when a share is set."""
    GOLDEN_PENDING = "golden_pending"
    """Its golden set has not answered yet."""
    PREWARMING = "prewarming"
    """Staged under a prewarm schedule: not yet WARM on every target worker."""
    PREWARMED = "prewarmed"
    """Staged under a prewarm schedule and WARM on every target worker: first share."""
    # advance / promote
    STAGE_PASSED = "stage_passed"
    # stable versions
    STABLE_ERROR_RATE = "stable_error_rate"
    """The stable version's requests fail after load (rollback or withdraw)."""
    HEALTHY = "healthy"
    NO_REFERENCE = "no_reference"
    """Too little other stable traffic on the base model to judge a stable version."""


class AnalysisRules(BaseModel):
    """Rules of the canary analysis (``canary.analysis`` in the cache-manager rules YAML;
    per tenant or adapter in ``canary.analysis_overrides``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    """False: the canary is left where a person puts it (manual canaries)."""
    stages: tuple[int, ...] = DEFAULT_STAGES
    """Shares in percent, strictly increasing, ending at 100; after the last, promotion.
    A share set by hand between two stages continues with the next higher stage."""
    dwell_s: float = Field(default=300.0, gt=0)
    """Time in each stage before it may advance (failures abort at any time)."""
    window_s: float = Field(default=900.0, gt=0)
    """Longest look-back of the figures (the window also starts at the stage start)."""
    min_requests: int = Field(default=20, ge=1)
    """Canary requests in the stage before it may advance; also the floor ``n`` of the
    rate bounds (missing requests count as successes)."""
    confidence: float = Field(default=0.95, ge=0.5, lt=1.0)
    """One-sided confidence of every bound (Wilson for rates, order statistics for TTFT)."""
    max_error_rate_excess: float = Field(default=0.02, ge=0.0, le=1.0)
    """Error rate after load the canary may have above stable's."""
    max_degraded_excess: float = Field(default=0.10, ge=0.0, le=1.0)
    """Share of its requests degraded to the base model above stable's."""
    min_load_failures: int = Field(default=2, ge=1)
    """Failed loads (any worker) before the load rule can decide."""
    max_load_failure_excess: float = Field(default=0.20, ge=0.0, le=1.0)
    """Share of failed loads above stable's in the window."""
    golden_max_failures: int = Field(default=0, ge=0)
    """Golden-set (shadow) failures tolerated, summed over every run of the canary version
    kept (all workers, all stages: the golden set judges the weights, not a stage's
    traffic); beyond: abort. A worker's own run beyond it also demotes the canary there."""
    ttft_quantile: float = Field(default=0.99, gt=0.5, lt=1.0)
    """The tail compared (0.99 = p99), per request class."""
    ttft_min_samples: int = Field(default=50, ge=10)
    """Samples of a class on each side before its tail is compared."""
    ttft_max_ratio: float = Field(default=1.5, ge=1.0)
    """Canary tail allowed up to ``ratio × stable's tail + slack``."""
    ttft_slack_ms: float = Field(default=50.0, ge=0.0)
    judge_stable: bool = True
    """Also judge the stable version (:func:`decide_stable`); False: only canaries."""
    max_stable_error_rate: float = Field(default=0.02, ge=0.0, le=1.0)
    """Error rate after load a stable version may have above the rest of its base model's
    stable traffic (the seed's ``error_rate_after_load > 0.02``); beyond, with the Wilson
    bound at ``confidence`` and ``n`` floored at ``min_requests``: rollback or withdraw."""

    @field_validator("stages")
    @classmethod
    def _stages(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value:
            raise ValueError("at least one stage is required")
        bad = [s for s in value if not 1 <= s <= 100]
        if bad:
            raise ValueError(f"stages {bad} are outside [1, 100] percent")
        if any(b <= a for a, b in itertools.pairwise(value)):
            raise ValueError(f"stages {list(value)} are not strictly increasing")
        if value[-1] != 100:
            raise ValueError(f"the last stage must be 100 (got {value[-1]})")
        return value

    @model_validator(mode="after")
    def _window(self) -> AnalysisRules:
        if self.window_s < self.dwell_s:
            raise ValueError(f"window_s ({self.window_s}) is shorter than dwell_s "
                             f"({self.dwell_s}): a stage's figures would not cover it")
        return self

    def with_overrides(self, patch: Mapping[str, Any]) -> AnalysisRules:
        """These rules with ``patch``'s fields replaced (validated again)."""
        return AnalysisRules.model_validate({**self.model_dump(), **patch})

    def next_stage(self, percent: int) -> int | None:
        """The first stage above ``percent`` (None: the last stage is reached)."""
        for s in self.stages:
            if s > percent:
                return s
        return None


# --------------------------------------------------------------------------- statistics


def z_of(confidence: float) -> float:
    """One-sided normal quantile of ``confidence`` (``statistics.NormalDist``)."""
    from statistics import NormalDist

    return NormalDist().inv_cdf(confidence)


def wilson_bounds(k: int, n: int, confidence: float) -> tuple[float, float]:
    """One-sided Wilson score bounds ``(lower, upper)`` of a rate ``k / n`` at
    ``confidence`` (each bound alone holds with that confidence). ``n = 0``: (0, 1)."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= k <= n:
        raise ValueError(f"k={k} is outside [0, n={n}]")
    z = z_of(confidence)
    p = k / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(Binomial(n, p) ≤ k), summed in log space (n up to many thousands)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    lp, lq = math.log(p), math.log1p(-p)
    total = 0.0
    for i in range(k + 1):
        total += math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                          + i * lp + (n - i) * lq)
    return min(1.0, total)


def quantile_lower_bound(samples: Sequence[float], q: float, confidence: float) -> float | None:
    """A distribution-free lower confidence bound of the ``q`` quantile: the largest
    order statistic ``x_(k)`` with P(Binomial(n, q) ≥ k) ≥ ``confidence``. None when
    no order statistic is low enough (too few samples)."""
    n = len(samples)
    if n == 0:
        return None
    xs = sorted(samples)
    best: float | None = None
    # P(x_(k) <= true quantile) = P(Binomial(n, q) >= k) = 1 - cdf(k - 1)
    for k in range(1, n + 1):
        if 1.0 - _binom_cdf(k - 1, n, q) >= confidence:
            best = xs[k - 1]
        else:
            break
    return best


def quantile(samples: Sequence[float], q: float) -> float | None:
    """The empirical ``q`` quantile (nearest rank); None when empty."""
    if not samples:
        return None
    xs = sorted(samples)
    rank = max(1, math.ceil(q * len(xs)))
    return xs[rank - 1]


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True, slots=True)
class VersionFigures:
    """What one version did over the window (counts over distinct requests)."""

    requests: int = 0
    """Requests resolved to it that completed or failed (shadow requests excluded)."""
    errors: int = 0
    """Of those, failed ones served by it (not degraded), i.e. failures after load."""
    degraded: int = 0
    """Of those, served by the base model because it was cold."""
    refused: int = 0
    infra_errors: int = 0
    """Of ``errors``, those with a transport / capacity status (cancelled, deadline,
    exhausted, unavailable): the stable analysis leaves them out (a killed worker fails
    every version on it alike); the canary's comparison with stable keeps them."""
    """Not in ``requests``: failed while it was COLD at arrival (refused per the cold-start
    budget, or its load on the request path failed): no verdict on its answers."""
    load_attempts: int = 0
    """Load commands answered for it (success or failure)."""
    load_failures: int = 0
    last_load_error: str = ""
    """``code: message`` of the last failed load."""
    golden_ok: int = 0
    golden_failed: int = 0
    last_golden_error: str = ""
    ttft_ms: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    """Time to first token of its successful, non-degraded requests by request class."""

    def as_dict(self) -> dict[str, Any]:
        """Counts (not the samples) for audit entries and the CLI."""
        out: dict[str, Any] = {
            "requests": self.requests, "errors": self.errors, "degraded": self.degraded,
            "refused": self.refused, "infra_errors": self.infra_errors,
            "load_attempts": self.load_attempts, "load_failures": self.load_failures,
            "golden_ok": self.golden_ok, "golden_failed": self.golden_failed,
        }
        if self.last_load_error:
            out["last_load_error"] = self.last_load_error
        if self.last_golden_error:
            out["last_golden_error"] = self.last_golden_error
        return out


@dataclass(frozen=True, slots=True)
class CanarySnapshot:
    """One canary as the analysis sees it."""

    adapter_id: str
    canary_version: str
    stable_version: str
    percent: int
    """Current share (0: staged, not yet running)."""
    stage_started_at: float
    """When the current share was set (or first seen by the analysis)."""
    canary: VersionFigures
    stable: VersionFigures
    paused: bool = False
    golden_pending: bool = False
    """A golden set applies to it and has not answered yet (never run, or running): it
    may abort but neither advance nor be promoted before its golden set is in."""
    prewarm_start: int = 0
    """Its prewarm schedule's first share (0: no schedule, a person sets the share)."""
    prewarm_targets: tuple[str, ...] = ()
    """The schedule's target workers (:mod:`loraplane.cache_manager.prewarm`)."""
    prewarm_ready: tuple[str, ...] = ()
    """Targets that reported it WARM or HOT."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The analysis' answer for one canary."""

    action: Action
    reason: Reason
    detail: str
    adapter_id: str
    canary_version: str
    from_percent: int
    to_percent: int
    """Share after the decision (abort: 0; promote: 100; hold: unchanged)."""
    canary: VersionFigures
    stable: VersionFigures
    stage_age_s: float
    checks: Mapping[str, Any] = field(default_factory=dict)
    """The bounds and thresholds that decided (rule name → figures)."""

    @property
    def decision_id(self) -> str:
        """Stable id of the step: the same canary, share and action give the same id (a
        decision re-taken after a restart or a leader change is recognised)."""
        return (f"{self.adapter_id}@{self.canary_version}:{self.from_percent}:"
                f"{self.action.value}")

    @property
    def acts(self) -> bool:
        """Whether the registry must change something."""
        return self.action is not Action.HOLD

    def figures(self) -> dict[str, Any]:
        """Everything that decided, as JSON-ready data (the audit entry's payload)."""
        return {
            "decision_id": self.decision_id,
            "action": self.action.value,
            "reason": self.reason.value,
            "detail": self.detail,
            "from_percent": self.from_percent,
            "to_percent": self.to_percent,
            "stage_age_s": round(self.stage_age_s, 3),
            "canary": {"version": self.canary_version, **self.canary.as_dict()},
            "stable": self.stable.as_dict(),
            "checks": dict(self.checks),
        }


# --------------------------------------------------------------------------- rules


def _rate_check(name: str, k: int, n: int, base_k: int, base_n: int, excess: float,
                rules: AnalysisRules) -> tuple[bool, dict[str, Any]]:
    """Whether the canary's rate ``k/n`` is proven worse than stable's ``base_k/base_n``
    plus ``excess`` (one-sided Wilson lower bound; ``n`` floored at ``min_requests``)."""
    floor_n = max(n, rules.min_requests)
    lower, _ = wilson_bounds(k, floor_n, rules.confidence)
    base = base_k / base_n if base_n else 0.0
    limit = base + excess
    return lower > limit, {
        "rule": name, "failed": k, "of": n, "n_for_bound": floor_n,
        "lower_bound": round(lower, 4), "stable_rate": round(base, 4),
        "limit": round(limit, 4), "confidence": rules.confidence,
    }


def _failures(s: CanarySnapshot, rules: AnalysisRules) -> tuple[Reason, str, dict[str, Any]] | None:
    c, b = s.canary, s.stable
    checks: dict[str, Any] = {}
    # loads: a canary that cannot be loaded never serves (its requests go to stable)
    if c.load_failures >= rules.min_load_failures:
        bad, fig = _rate_check("load_failure_rate", c.load_failures, c.load_attempts,
                               b.load_failures, b.load_attempts,
                               rules.max_load_failure_excess,
                               rules.model_copy(update={"min_requests": rules.min_load_failures}))
        if bad:
            return (Reason.LOAD_FAILED,
                    (f"{c.load_failures} of {c.load_attempts} loads failed "
                    f"(last: {c.last_load_error or 'unknown'})"), {"load": fig})
        checks["load"] = fig
    if c.golden_failed > rules.golden_max_failures:
        return (Reason.GOLDEN_SET_FAILED,
                (f"{c.golden_failed} of {c.golden_ok + c.golden_failed} golden-set requests "
                f"failed (tolerated {rules.golden_max_failures}; last: "
                f"{c.last_golden_error or 'unknown'})"),
                {"golden": {"failed": c.golden_failed, "ok": c.golden_ok,
                            "max_failures": rules.golden_max_failures}})
    served, base_served = c.requests - c.degraded, b.requests - b.degraded
    if c.errors:
        bad, fig = _rate_check("error_rate_after_load", c.errors, served, b.errors,
                               base_served, rules.max_error_rate_excess, rules)
        if bad:
            return (Reason.ERROR_RATE,
                    (f"{c.errors} of {served} requests served by the canary failed "
                    f"(lower bound {fig['lower_bound']:.3f} > limit {fig['limit']:.3f})"),
                    {"error_rate": fig})
    if c.degraded:
        bad, fig = _rate_check("degraded_share", c.degraded, c.requests, b.degraded,
                               b.requests, rules.max_degraded_excess, rules)
        if bad:
            return (Reason.DEGRADED_SHARE,
                    (f"{c.degraded} of {c.requests} canary requests degraded to the base model "
                    f"(lower bound {fig['lower_bound']:.3f} > limit {fig['limit']:.3f})"),
                    {"degraded": fig})
    q = rules.ttft_quantile
    label = f"p{round(q * 100, 1):g}"
    for klass in sorted(c.ttft_ms):
        mine, theirs = c.ttft_ms[klass], b.ttft_ms.get(klass, ())
        if len(mine) < rules.ttft_min_samples or len(theirs) < rules.ttft_min_samples:
            continue
        lower = quantile_lower_bound(mine, q, rules.confidence)
        base = quantile(theirs, q)
        if lower is None or base is None:
            continue
        limit = base * rules.ttft_max_ratio + rules.ttft_slack_ms
        if lower > limit:
            return (Reason.TTFT,
                    (f"{klass} TTFT {label} lower bound {lower:.1f} ms > {limit:.1f} ms "
                    f"(stable {label} {base:.1f} ms × {rules.ttft_max_ratio} + "
                    f"{rules.ttft_slack_ms} ms)"),
                    {"ttft": {"class": klass, "quantile": q, "canary_lower_bound_ms": lower,
                              "stable_ms": base, "limit_ms": limit, "canary_n": len(mine),
                              "stable_n": len(theirs)}})
    return None


def decide(s: CanarySnapshot, rules: AnalysisRules, now: float) -> Decision:
    """The decision for one canary at ``now`` (see the module docstring)."""
    age = max(0.0, now - s.stage_started_at)

    def out(action: Action, reason: Reason, detail: str, to: int,
            checks: Mapping[str, Any] | None = None) -> Decision:
        return Decision(action, reason, detail, s.adapter_id, s.canary_version, s.percent, to,
                        s.canary, s.stable, age, checks or {})

    if not rules.enabled:
        return out(Action.HOLD, Reason.DISABLED, "canary analysis disabled by the rules",
                   s.percent)

    def staged() -> Decision:
        if s.paused:
            return out(Action.HOLD, Reason.PAUSED, "paused by an operator", 0)
        if s.prewarm_start <= 0:
            return out(Action.HOLD, Reason.NOT_RUNNING, "staged at 0 %: no share yet", 0)
        checks = {"prewarm": {"targets": list(s.prewarm_targets),
                              "ready": list(s.prewarm_ready)}}
        if not s.prewarm_targets or len(s.prewarm_ready) < len(s.prewarm_targets):
            return out(Action.HOLD, Reason.PREWARMING,
                       f"WARM on {len(s.prewarm_ready)} of {len(s.prewarm_targets)} target "
                       f"worker(s) before its {s.prewarm_start} % share", 0, checks)
        if s.golden_pending:
            return out(Action.HOLD, Reason.GOLDEN_PENDING,
                       "prewarmed; its golden set has not answered yet", 0, checks)
        return out(Action.ADVANCE, Reason.PREWARMED,
                   f"WARM on every target worker ({', '.join(s.prewarm_targets)}): "
                   f"{s.prewarm_start} %", s.prewarm_start, checks)

    if s.percent <= 0 and s.canary.load_failures < rules.min_load_failures:
        return staged()
    failure = _failures(s, rules)
    if failure is not None:
        reason, detail, checks = failure
        return out(Action.ABORT, reason, detail, 0, checks)
    if s.percent <= 0:
        return staged()
    if s.paused:
        return out(Action.HOLD, Reason.PAUSED, "paused by an operator", s.percent)
    if s.golden_pending:
        return out(Action.HOLD, Reason.GOLDEN_PENDING,
                   "its golden set has not answered yet", s.percent)
    if age < rules.dwell_s:
        return out(Action.HOLD, Reason.DWELL,
                   f"{age:.0f} s of {rules.dwell_s:.0f} s in the {s.percent} % stage",
                   s.percent)
    served = s.canary.requests
    if served < rules.min_requests:
        return out(Action.HOLD, Reason.MIN_REQUESTS,
                   f"{served} of {rules.min_requests} canary requests in the "
                   f"{s.percent} % stage", s.percent)
    nxt = rules.next_stage(s.percent)
    if nxt is None:
        return out(Action.PROMOTE, Reason.STAGE_PASSED,
                   f"last stage ({s.percent} %) passed: {served} requests, "
                   f"{s.canary.errors} errors", 100)
    return out(Action.ADVANCE, Reason.STAGE_PASSED,
               f"{s.percent} % stage passed ({served} requests, {s.canary.errors} errors): "
               f"{nxt} %", nxt)


# --------------------------------------------------------------------------- stable


class StableAction(str, Enum):
    """What the analysis asks for a stable version."""

    KEEP = "keep"
    ROLLBACK = "rollback"
    """Make the rollback target stable again (the registry's ``Rollback``)."""
    WITHDRAW = "withdraw"
    """No version to fall back to: take it out of HOT (its requests follow their class's
    cold-start budget: degrade to the base model or fail fast with a retry hint)."""


@dataclass(frozen=True, slots=True)
class StableSnapshot:
    """One stable version as the analysis sees it."""

    adapter_id: str
    stable_version: str
    rollback_target: str
    """The release's rollback target ("" if none, or one the analysis took out itself)."""
    stable: VersionFigures
    reference: VersionFigures
    """The other stable versions of the same base model over the same window, summed."""


@dataclass(frozen=True, slots=True)
class StableDecision:
    """The analysis' answer for one stable version."""

    action: StableAction
    reason: Reason
    detail: str
    adapter_id: str
    stable_version: str
    to_version: str
    """Rollback: the version made stable; otherwise ""."""
    stable: VersionFigures
    reference: VersionFigures
    checks: Mapping[str, Any] = field(default_factory=dict)

    @property
    def decision_id(self) -> str:
        """``adapter@version:stable:action`` (one step per failing stable version)."""
        return f"{self.adapter_id}@{self.stable_version}:stable:{self.action.value}"

    @property
    def acts(self) -> bool:
        return self.action is not StableAction.KEEP

    def figures(self) -> dict[str, Any]:
        """Everything that decided, as JSON-ready data (the audit entry's payload)."""
        return {
            "decision_id": self.decision_id, "action": self.action.value,
            "reason": self.reason.value, "detail": self.detail,
            "stable": {"version": self.stable_version, **self.stable.as_dict()},
            "reference": self.reference.as_dict(), "to_version": self.to_version,
            "checks": dict(self.checks),
        }


def decide_stable(s: StableSnapshot, rules: AnalysisRules, now: float) -> StableDecision:
    """The decision for one stable version at ``now`` (see the module docstring)."""
    del now  # the window is the caller's; kept for the same signature as :func:`decide`

    def out(action: StableAction, reason: Reason, detail: str, to: str = "",
            checks: Mapping[str, Any] | None = None) -> StableDecision:
        return StableDecision(action, reason, detail, s.adapter_id, s.stable_version, to,
                              s.stable, s.reference, checks or {})

    if not rules.enabled or not rules.judge_stable:
        return out(StableAction.KEEP, Reason.DISABLED, "stable analysis disabled by the rules")
    c, ref = s.stable, s.reference
    served, ref_served = c.requests - c.degraded, ref.requests - ref.degraded
    # a transport or capacity failure is no verdict on a version's answers
    c = replace(c, errors=c.errors - c.infra_errors, infra_errors=0)
    ref = replace(ref, errors=ref.errors - ref.infra_errors, infra_errors=0)
    if c.errors and ref_served < rules.min_requests:
        return out(StableAction.KEEP, Reason.NO_REFERENCE,
                   f"{c.errors} of {served} requests served by stable failed, but the base "
                   f"model's other stable versions served {ref_served} (< {rules.min_requests}"
                   "): a version failure cannot be told from an outage")
    if c.errors:
        bad, fig = _rate_check("stable_error_rate_after_load", c.errors, served, ref.errors,
                               ref_served, rules.max_stable_error_rate, rules)
        # the reference is a sample too (often a small one): compare with its upper bound
        ref_upper = wilson_bounds(ref.errors, ref_served, rules.confidence)[1] \
            if ref_served else 0.0
        limit = ref_upper + rules.max_stable_error_rate
        bad = fig["lower_bound"] > limit
        fig.update(reference_upper_bound=round(ref_upper, 4), limit=round(limit, 4))
        if bad:
            detail = (f"{c.errors} of {served} requests served by stable {s.stable_version} "
                      f"failed (lower bound {fig['lower_bound']:.3f} > limit "
                      f"{fig['limit']:.3f})")
            if s.rollback_target and s.rollback_target != s.stable_version:
                return out(StableAction.ROLLBACK, Reason.STABLE_ERROR_RATE,
                           f"{detail}: rolled back to {s.rollback_target}",
                           s.rollback_target, {"error_rate": fig})
            return out(StableAction.WITHDRAW, Reason.STABLE_ERROR_RATE,
                       f"{detail}: no version to roll back to, taken out of HOT", "",
                       {"error_rate": fig})
    return out(StableAction.KEEP, Reason.HEALTHY,
               f"{c.errors} of {served} requests served by stable failed")


def sum_figures(figs: Sequence[VersionFigures]) -> VersionFigures:
    """Request counts of several versions added up (the stable analysis' reference)."""
    return VersionFigures(requests=sum(f.requests for f in figs),
                          errors=sum(f.errors for f in figs),
                          degraded=sum(f.degraded for f in figs),
                          infra_errors=sum(f.infra_errors for f in figs))
