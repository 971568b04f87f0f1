"""Cache-policy configuration: dataclasses with defaults, loaded from YAML.

The defaults below are the ones shipped in ``config/policy.yaml`` (a test keeps
the two equal). :func:`load_config` reads a YAML file, :func:`config_from_mapping`
a parsed mapping; both report *every* problem at once in
:class:`PolicyConfigError`. See ``services/policy/README.md`` for what each key
does to the score and to the plans.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from loraplane.shared.resources import config_file

from .model import Priority, RequestClass

DEFAULT_CONFIG_PATH = config_file("policy.yaml")


class PolicyConfigError(ValueError):
    """The configuration is invalid; ``problems`` lists every reason."""

    retriable = False

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid policy configuration: " + "; ".join(self.problems))


def _priority_values() -> Mapping[Priority, float]:
    return MappingProxyType(
        {Priority.PLATINUM: 1.0, Priority.GOLD: 0.6, Priority.SILVER: 0.3, Priority.BRONZE: 0.0}
    )


def _class_weights() -> Mapping[RequestClass, float]:
    return MappingProxyType(
        {RequestClass.INTERACTIVE: 1.0, RequestClass.BACKGROUND: 0.05, RequestClass.CANARY: 1.0}
    )


def _class_budgets() -> Mapping[RequestClass, float]:
    return MappingProxyType(
        {RequestClass.INTERACTIVE: 0.1, RequestClass.BACKGROUND: 30.0, RequestClass.CANARY: 0.0}
    )


@dataclass(frozen=True, slots=True)
class Weights:
    """Weights of the heat-score terms (``heat = Σ weight · term``)."""

    qps: float = 0.45
    """Request rate over the last ``rate_window_s`` (term: ``qps / qps_ref``)."""
    ttft_penalty: float = 0.25
    """TTFT over budget if the version went one tier colder (term: ``qps/qps_ref * penalty/penalty_ref_s``)."""
    tenant_priority: float = 0.20
    """Tenant/adapter priority (term: ``priority_values[priority]``)."""
    scheduled_warmup: float = 0.10
    """Business warm-up signal from the snapshot (term in [0, 1])."""


@dataclass(frozen=True, slots=True)
class ScoreConfig:
    """How the heat score is computed."""

    rate_window_s: float = 300.0
    """Time constant of the decayed request count used for HOT: 300 s is the decayed
    equivalent of "qps over the last 10 minutes" (same mean sample age, 5 minutes)."""
    warm_rate_window_s: float = 3600.0
    """Time constant of the request count used for WARM, whose residency is hours, not minutes."""
    weights: Weights = field(default_factory=Weights)
    """Weights of the four terms."""
    qps_ref: float = 1.0 / 600.0
    """Request rate (req/s) that maps to 1.0 in the qps term: one request per window."""
    penalty_ref_s: float = 0.1
    """Seconds over budget per request that weigh as much as the request itself in the penalty term."""
    priority_values: Mapping[Priority, float] = field(default_factory=_priority_values)
    """Value of the priority term per priority."""
    class_weights: Mapping[RequestClass, float] = field(default_factory=_class_weights)
    """How much a second of TTFT over budget hurts, per request class."""
    class_budgets_s: Mapping[RequestClass, float] = field(default_factory=_class_budgets)
    """Load-time budget per request class: only reload time beyond it is a penalty. Interactive:
    the ~300 ms TTFT budget less the prefill of a long prompt (~200 ms)."""
    warm_size_exponent: float = 1.0
    """WARM ranks by ``heat / size_GB ** warm_size_exponent`` (0: ignore size, 1: value per byte)."""
    liveness_scale: float = 0.3
    """HOT rate discount once a version has been idle for many of its own mean request gaps (a
    burst or a switched-off stream that ended): the rate is multiplied by
    ``(1 + odds) / (1 + odds * exp(liveness_scale * idle / mean_gap))``. 0 turns it off."""
    liveness_odds: float = 0.01
    """Prior odds that a version's request stream has ended (the ``odds`` above)."""


@dataclass(frozen=True, slots=True)
class NeverEvictConfig:
    """Versions that must not leave a tier (see README "Which tier protects what")."""

    active_canary: bool = True
    """Active canaries (canary_percent > 0) never leave WARM and are pinned HOT within their share."""
    priorities: tuple[Priority, ...] = (Priority.PLATINUM,)
    """Priorities that never leave WARM and are pinned HOT within their share."""
    in_flight: bool = True
    """A version with in-flight requests is never demoted or evicted on that worker (required)."""
    hot_share_canary: float = 0.125
    """Most HOT slots (per worker and base model) that protected canaries may hold pinned."""
    hot_share_priority: float = 0.125
    """Most HOT slots (per worker and base model) that protected priorities may hold pinned."""
    warm_share: float = 0.4
    """Most host bytes per worker that protected versions (canaries and priorities together) hold
    protected in WARM; beyond it the lowest-valued protected versions compete like any other
    and each such eviction is counted as a protection overflow (online policy)."""


@dataclass(frozen=True, slots=True)
class DemoteConfig:
    """When a HOT version is demoted to WARM whatever its score."""

    idle_minutes: float = 60.0
    """No request for this long (protection does not prevent it; in-flight does)."""
    error_rate_after_load: float = 0.02
    """Failure share since the last load above which the version is demoted."""
    min_requests_for_error_rate: int = 20
    """Requests after load needed before the error rate is trusted."""


@dataclass(frozen=True, slots=True)
class EvictConfig:
    """When an unprotected WARM version is evicted to COLD without capacity pressure."""

    idle_minutes: float | None = None
    """No request for this long (None: evict only under capacity pressure)."""


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    """How HOT replicas are spread across workers by :meth:`plan`."""

    min_hot_replicas: int = 2
    """HOT replicas kept for the hottest versions and for protected priorities (capped by workers)."""
    hottest_top_n: int = 2
    """How many of the hottest versions (per base model) get ``min_hot_replicas``."""
    replica_qps: float = 5.0
    """One more HOT replica per this many requests per second."""
    max_hot_replicas: int = 4
    """Upper bound on HOT replicas of one version."""
    hysteresis: float = 0.2
    """A resident is displaced only by a version with heat > resident × (1 + hysteresis)."""
    promote_min_heat: float = 0.1
    """A version not HOT anywhere is promoted proactively only if its heat reaches this."""


@dataclass(frozen=True, slots=True)
class AdaptiveConfig:
    """The online victim choice of the heat policy (``adaptive.py``): experts over shadow
    caches on a request clock."""

    enabled: bool = True
    """Online (simulator) heat picks victims by the adaptive experts; false: the plain score."""
    hot_tau_per_slot: float = 25.0
    """HOT decayed-count time constant, in requests per HOT slot of the cluster (25: the 300 s
    of ``score.rate_window_s`` on the conv-1h reference trace, 4 workers x 16 slots)."""
    warm_tau_per_slot: float = 300.0
    """WARM decayed-count time constant, in requests per HOT slot of the cluster."""
    expert_window_per_slot: float = 8.0
    """HOT shadow hit counts decay over this many requests per slot of the group."""
    warm_expert_window_per_slot: float = 512.0
    """WARM shadow scores decay over this many requests per HOT slot of the worker (WARM
    residency is far longer than HOT's: 8 per slot switched experts too often, −10 % cold
    starts on large-1h from 8 to 512)."""
    warm_switch_margin: float = 1.05
    """The WARM leader changes only when the other expert's score exceeds this × its own (+1):
    1.0 flipped between GDSF and heat on conv-1h (P99 0.63 × LRU; 1.05: 0.58)."""
    pin_idle_per_slot: float = 2.0
    """A protected HOT version keeps its pinned slot while idle for fewer than this many
    requests per slot of its group (and less than ``demote.idle_minutes``): a pin protects a
    live stream, not a one-off request of a protected tenant."""
    session_gap_per_slot: float = 2.0
    """A request that comes after more than this many requests per HOT slot of the cluster
    without one for its version opens a new *session* of that version (a return after it left
    HOT): the reuse WARM expert values a version by its sessions, not its raw count."""
    reuse_count_weight: float = 0.1
    """Weight of the raw request count beside the sessions in the reuse WARM expert's value."""
    tail_load_s: float = 1.0
    """A latency-sensitive (interactive or canary) request whose version would load from COLD
    in this many seconds or more lands in the TTFT tail (a 168 MB adapter at the default
    bandwidths: 1.1 s, ~3.7 x the 300 ms interactive TTFT budget)."""
    tail_weight: float = 3.0
    """The reuse WARM expert counts a reuse that would otherwise be such a tail event this many
    times more (1 + tail_weight)."""
    tenant_weight: float = 0.5
    """A request of a tenant refreshes the reuse WARM value of the tenant's other versions at
    this share of their value (a tenant that is back tends to use its other adapters too;
    0: off)."""


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Full configuration of the cache policies (the heat policy uses all of it)."""

    score: ScoreConfig = field(default_factory=ScoreConfig)
    never_evict: NeverEvictConfig = field(default_factory=NeverEvictConfig)
    demote: DemoteConfig = field(default_factory=DemoteConfig)
    evict: EvictConfig = field(default_factory=EvictConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)

    def protected_priorities(self) -> frozenset[Priority]:
        """Priorities protected by never-evict."""
        return frozenset(self.never_evict.priorities)


# ---------------------------------------------------------------------------------------------
# loading


def _number(
    problems: list[str], where: str, value: Any, *, lo: float | None = None, hi: float | None = None
) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        problems.append(f"{where}: expected a number, got {value!r}")
        return math.nan
    number = float(value)
    if not math.isfinite(number):
        problems.append(f"{where}: must be finite, got {value!r}")
    elif lo is not None and number < lo:
        problems.append(f"{where}: must be >= {lo}, got {value!r}")
    elif hi is not None and number > hi:
        problems.append(f"{where}: must be <= {hi}, got {value!r}")
    return number


def _positive(problems: list[str], where: str, value: Any) -> float:
    number = _number(problems, where, value)
    if math.isfinite(number) and number <= 0:
        problems.append(f"{where}: must be > 0, got {value!r}")
    return number


def _integer(problems: list[str], where: str, value: Any, *, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"{where}: expected an integer, got {value!r}")
        return lo
    if value < lo:
        problems.append(f"{where}: must be >= {lo}, got {value!r}")
    return value


def _boolean(problems: list[str], where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        problems.append(f"{where}: expected true or false, got {value!r}")
        return False
    return value


def _section(problems: list[str], where: str, raw: Any, cls: type) -> dict[str, Any]:
    """Check that ``raw`` is a mapping with only keys known to dataclass ``cls``."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        problems.append(f"{where}: expected a mapping, got {type(raw).__name__}")
        return {}
    known = {f.name for f in fields(cls)}
    for key in raw:
        if key not in known:
            problems.append(f"{where}.{key}: unknown key (known: {', '.join(sorted(known))})")
    return {str(k): v for k, v in raw.items() if k in known}


def _enum_map(
    problems: list[str], where: str, raw: Any, enum: type[Priority | RequestClass],
    default: Mapping[Any, float],
) -> Mapping[Any, float]:
    if not isinstance(raw, Mapping):
        problems.append(f"{where}: expected a mapping, got {type(raw).__name__}")
        return default
    out: dict[Any, float] = dict(default)
    for key, value in raw.items():
        try:
            member = enum(str(key))
        except ValueError:
            problems.append(f"{where}.{key}: unknown ({', '.join(m.value for m in enum)})")
            continue
        out[member] = _number(problems, f"{where}.{key}", value, lo=0.0)
    return MappingProxyType(out)


def _score(problems: list[str], raw: Any) -> ScoreConfig:
    d = _section(problems, "score", raw, ScoreConfig)
    base = ScoreConfig()
    kwargs: dict[str, Any] = {}
    for key in ("rate_window_s", "warm_rate_window_s"):
        if key in d:
            kwargs[key] = _positive(problems, f"score.{key}", d[key])
    if "qps_ref" in d:
        kwargs["qps_ref"] = _positive(problems, "score.qps_ref", d["qps_ref"])
    if "penalty_ref_s" in d:
        kwargs["penalty_ref_s"] = _positive(problems, "score.penalty_ref_s", d["penalty_ref_s"])
    if "liveness_scale" in d:
        kwargs["liveness_scale"] = _number(
            problems, "score.liveness_scale", d["liveness_scale"], lo=0.0
        )
    if "liveness_odds" in d:
        kwargs["liveness_odds"] = _positive(problems, "score.liveness_odds", d["liveness_odds"])
    if "warm_size_exponent" in d:
        kwargs["warm_size_exponent"] = _number(
            problems, "score.warm_size_exponent", d["warm_size_exponent"], lo=0.0, hi=2.0
        )
    if "weights" in d:
        w = _section(problems, "score.weights", d["weights"], Weights)
        kwargs["weights"] = Weights(
            **{k: _number(problems, f"score.weights.{k}", v, lo=0.0) for k, v in w.items()}
        )
    if "priority_values" in d:
        kwargs["priority_values"] = _enum_map(
            problems, "score.priority_values", d["priority_values"], Priority,
            base.priority_values,
        )
    if "class_weights" in d:
        kwargs["class_weights"] = _enum_map(
            problems, "score.class_weights", d["class_weights"], RequestClass, base.class_weights
        )
    if "class_budgets_s" in d:
        kwargs["class_budgets_s"] = _enum_map(
            problems, "score.class_budgets_s", d["class_budgets_s"], RequestClass,
            base.class_budgets_s,
        )
    return ScoreConfig(**kwargs)


def _never_evict(problems: list[str], raw: Any) -> NeverEvictConfig:
    d = _section(problems, "never_evict", raw, NeverEvictConfig)
    kwargs: dict[str, Any] = {}
    if "active_canary" in d:
        kwargs["active_canary"] = _boolean(problems, "never_evict.active_canary", d["active_canary"])
    if "in_flight" in d:
        kwargs["in_flight"] = _boolean(problems, "never_evict.in_flight", d["in_flight"])
        if kwargs["in_flight"] is False:
            problems.append(
                "never_evict.in_flight: must stay true (evicting an adapter with in-flight "
                "requests breaks them and can kill the engine)"
            )
    for key in ("hot_share_canary", "hot_share_priority", "warm_share"):
        if key in d:
            kwargs[key] = _number(problems, f"never_evict.{key}", d[key], lo=0.0, hi=1.0)
    if "priorities" in d:
        raw_list = d["priorities"]
        prios: list[Priority] = []
        if not isinstance(raw_list, list):
            problems.append(f"never_evict.priorities: expected a list, got {raw_list!r}")
        else:
            for item in raw_list:
                try:
                    prios.append(Priority(str(item)))
                except ValueError:
                    problems.append(f"never_evict.priorities: unknown priority {item!r}")
        kwargs["priorities"] = tuple(prios)
    return NeverEvictConfig(**kwargs)


def _demote(problems: list[str], raw: Any) -> DemoteConfig:
    d = _section(problems, "demote", raw, DemoteConfig)
    kwargs: dict[str, Any] = {}
    if "idle_minutes" in d:
        kwargs["idle_minutes"] = _positive(problems, "demote.idle_minutes", d["idle_minutes"])
    if "error_rate_after_load" in d:
        kwargs["error_rate_after_load"] = _number(
            problems, "demote.error_rate_after_load", d["error_rate_after_load"], lo=0.0, hi=1.0
        )
    if "min_requests_for_error_rate" in d:
        kwargs["min_requests_for_error_rate"] = _integer(
            problems, "demote.min_requests_for_error_rate", d["min_requests_for_error_rate"], lo=1
        )
    return DemoteConfig(**kwargs)


def _evict(problems: list[str], raw: Any) -> EvictConfig:
    d = _section(problems, "evict", raw, EvictConfig)
    if d.get("idle_minutes") is None:
        return EvictConfig()
    return EvictConfig(idle_minutes=_positive(problems, "evict.idle_minutes", d["idle_minutes"]))


def _placement(problems: list[str], raw: Any) -> PlacementConfig:
    d = _section(problems, "placement", raw, PlacementConfig)
    kwargs: dict[str, Any] = {}
    for key in ("min_hot_replicas", "max_hot_replicas"):
        if key in d:
            kwargs[key] = _integer(problems, f"placement.{key}", d[key], lo=1)
    if "hottest_top_n" in d:
        kwargs["hottest_top_n"] = _integer(problems, "placement.hottest_top_n", d["hottest_top_n"], lo=0)
    if "replica_qps" in d:
        kwargs["replica_qps"] = _positive(problems, "placement.replica_qps", d["replica_qps"])
    if "hysteresis" in d:
        kwargs["hysteresis"] = _number(problems, "placement.hysteresis", d["hysteresis"], lo=0.0)
    if "promote_min_heat" in d:
        kwargs["promote_min_heat"] = _number(
            problems, "placement.promote_min_heat", d["promote_min_heat"], lo=0.0
        )
    cfg = PlacementConfig(**kwargs)
    if cfg.min_hot_replicas > cfg.max_hot_replicas:
        problems.append(
            f"placement: min_hot_replicas ({cfg.min_hot_replicas}) > max_hot_replicas "
            f"({cfg.max_hot_replicas})"
        )
    return cfg


def _adaptive(problems: list[str], raw: Any) -> AdaptiveConfig:
    d = _section(problems, "adaptive", raw, AdaptiveConfig)
    kwargs: dict[str, Any] = {}
    if "enabled" in d:
        kwargs["enabled"] = _boolean(problems, "adaptive.enabled", d["enabled"])
    for key in ("hot_tau_per_slot", "warm_tau_per_slot", "expert_window_per_slot",
                "warm_expert_window_per_slot", "pin_idle_per_slot", "warm_switch_margin",
                "session_gap_per_slot", "tail_load_s"):
        if key in d:
            kwargs[key] = _positive(problems, f"adaptive.{key}", d[key])
    for key in ("reuse_count_weight", "tail_weight", "tenant_weight"):
        if key in d:
            kwargs[key] = _number(problems, f"adaptive.{key}", d[key], lo=0.0)
    return AdaptiveConfig(**kwargs)


def config_from_mapping(raw: Mapping[str, Any] | None) -> PolicyConfig:
    """Build a :class:`PolicyConfig` from parsed YAML/JSON; raise with every problem found."""
    problems: list[str] = []
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise PolicyConfigError([f"top level: expected a mapping, got {type(raw).__name__}"])
    top = _section(problems, "policy", raw, PolicyConfig)
    cfg = PolicyConfig(
        score=_score(problems, top.get("score")),
        never_evict=_never_evict(problems, top.get("never_evict")),
        demote=_demote(problems, top.get("demote")),
        evict=_evict(problems, top.get("evict")),
        placement=_placement(problems, top.get("placement")),
        adaptive=_adaptive(problems, top.get("adaptive")),
    )
    if problems:
        raise PolicyConfigError(problems)
    return cfg


def load_config(path: str | Path | None = None) -> PolicyConfig:
    """Load ``path`` (default: the packaged ``config/policy.yaml``, else built-in defaults)."""
    if path is None:
        if not DEFAULT_CONFIG_PATH.is_file():
            return PolicyConfig()
        path = DEFAULT_CONFIG_PATH
    text = Path(path).read_text(encoding="utf-8")
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyConfigError([f"{path}: not valid YAML: {exc}"]) from exc
    return config_from_mapping(raw)
