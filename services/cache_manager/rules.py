"""Business rules of the cache manager, from YAML (``config/cache_manager.yaml``).

The cache *policy* (``config/policy.yaml``, :mod:`loraplane.policy`) ranks versions
and decides promotions, demotions, evictions and pins, including never-evict,
demotion and minimum-HOT-replica rules. These rules sit on top of it and express
what the business requires whatever the heat:

* ``canary``: a canary version (as soon as its pointer is set, share 0 included)
  is HOT on ``warm_replicas`` workers before traffic reaches it, and, when a
  ``golden_set`` is configured, exercised with those shadow requests; with a prewarm
  schedule (``canary.prewarm``) its verified bytes are WARM on every target worker
  before the analysis sets its first share (:mod:`.prewarm`);
* ``rollback``: the version a rollback would return to stays WARM next to the
  stable version, and after a rollback it is made HOT on as many workers as the
  version it replaces was;
* ``schedules``: warm-up windows per tenant / adapter / version;
* ``prewarm``: how long a ``PrewarmRequested`` keeps a version required HOT;
* ``join_prewarm``: a worker that started recently gets its base models' hottest versions
  WARM (free bytes only);
* ``demand``: a version requested recently but HOT nowhere is loaded where a slot is free;
* ``commands``: timeout and backoff of commands; ``limits``: per-round caps.

Validation reports every problem at once (pydantic); unknown keys are refused.
"""

from __future__ import annotations

from datetime import datetime, time
from enum import Enum
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml  # type: ignore[import-untyped, unused-ignore]
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from loraplane.cache_manager.canary_analysis import AnalysisRules
from loraplane.shared.errors import InvalidArgument
from loraplane.shared.resources import config_file

DEFAULT_RULES_PATH = config_file("cache_manager.yaml")


class RulesConfigError(InvalidArgument, ValueError):
    """The rules file is invalid; ``problems`` lists every reason."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid cache-manager rules: " + "; ".join(self.problems))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Weekday(str, Enum):
    """Days of the week (``datetime.weekday()`` order)."""

    MON = "mon"
    TUE = "tue"
    WED = "wed"
    THU = "thu"
    FRI = "fri"
    SAT = "sat"
    SUN = "sun"


_WEEKDAYS = list(Weekday)


class GoldenPrompt(_Strict):
    """One golden-set entry: a prompt and, optionally, the answer it must get."""

    prompt: str = Field(min_length=1)
    expect: str | None = None
    """The exact greedy answer (``golden_max_tokens`` tokens, temperature 0) the adapter's
    golden set was recorded with; a canary answering anything else fails it. None: the
    request only has to complete."""


GoldenEntry = str | GoldenPrompt
"""A plain prompt (checked to complete) or a :class:`GoldenPrompt`."""


def _prompts(entries: list[GoldenEntry]) -> list[GoldenPrompt]:
    return [e if isinstance(e, GoldenPrompt) else GoldenPrompt(prompt=e) for e in entries]


class CanaryPrewarm(_Strict):
    """A canary's prewarm schedule: staged at 0 %, its verified bytes reach the WARM tier of
    the workers that will serve it, and only then does the analysis set its first share."""

    start_percent: int = Field(default=0, ge=0, le=100)
    """Share the analysis sets once every target worker reports the canary WARM (or HOT);
    0 = no schedule (a person sets the share, nothing is prefetched for it)."""
    workers: int = Field(default=0, ge=0)
    """Target workers: the first ``workers`` of the commandable workers serving its base
    model, those holding the stable version first, then by id (0 = every one)."""


class CanaryRules(_Strict):
    """Canary warm-up before traffic."""

    warm_replicas: int = Field(default=1, ge=0)
    """HOT replicas a canary version gets as soon as its pointer is set (0 = leave to policy)."""
    prewarm: CanaryPrewarm = Field(default_factory=CanaryPrewarm)
    """The prewarm schedule of every staged canary (:mod:`.prewarm`)."""
    prewarm_overrides: dict[str, CanaryPrewarm] = Field(default_factory=dict)
    """Per ``tenant`` or ``tenant/adapter``: its own schedule (the most specific key wins)."""
    golden_set: list[GoldenEntry] = Field(default_factory=list)
    """Prompts sent as shadow requests (class CANARY) to each worker where a canary
    became HOT; empty = no shadow requests. An entry is a prompt (the request must
    complete) or ``{prompt, expect}`` (its greedy answer must be ``expect``)."""
    golden_sets: dict[str, list[GoldenEntry]] = Field(default_factory=dict)
    """Per ``tenant/adapter``: the adapter's own golden set, replacing ``golden_set``
    for its canaries (typically with the answers recorded from a trusted version)."""
    golden_max_tokens: int = Field(default=8, ge=1)
    """Tokens generated per shadow request."""
    golden_timeout_s: float = Field(default=20.0, gt=0)
    """Deadline of each shadow request."""
    golden_max_failures: int = Field(default=0, ge=0)
    """Shadow failures tolerated per worker; beyond, the canary is demoted there."""
    analysis: AnalysisRules = Field(default_factory=AnalysisRules)
    """Automated analysis, stages, promotion and abort (:mod:`.canary_analysis`)."""
    analysis_overrides: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Per ``tenant`` or ``tenant/adapter``: fields of ``analysis`` replaced (the most
    specific key wins; each merge is validated at load)."""
    analysis_disabled_tenants: list[str] = Field(default_factory=list)
    """Kill switch: the analysis takes no step for these tenants' canaries."""

    @model_validator(mode="after")
    def _overrides(self) -> CanaryRules:
        problems: list[str] = []
        for key in self.golden_sets:
            tenant, _, adapter = key.partition("/")
            if not tenant or not adapter or "/" in adapter:
                problems.append(f"golden_sets: key {key!r} is not 'tenant/adapter'")
        for key in self.prewarm_overrides:
            tenant, _, adapter = key.partition("/")
            if not tenant or "/" in adapter:
                problems.append(f"prewarm_overrides: key {key!r} is not 'tenant' or "
                                "'tenant/adapter'")
        for key, patch in self.analysis_overrides.items():
            tenant, _, adapter = key.partition("/")
            if not tenant or "/" in adapter:
                problems.append(f"analysis_overrides: key {key!r} is not 'tenant' or "
                                "'tenant/adapter'")
                continue
            try:
                self.analysis.with_overrides(patch)
            except ValidationError as exc:
                problems += [f"analysis_overrides.{key}.{'.'.join(map(str, e['loc']))}: "
                             f"{e['msg']}" for e in exc.errors()]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def prewarm_for(self, tenant: str, adapter: str) -> CanaryPrewarm:
        """The prewarm schedule of one adapter's canaries."""
        for key in (f"{tenant}/{adapter}", tenant):
            own = self.prewarm_overrides.get(key)
            if own is not None:
                return own
        return self.prewarm

    def golden_for(self, tenant: str, adapter: str) -> list[GoldenPrompt]:
        """The golden set of one adapter's canaries (its own, else the deployment's)."""
        own = self.golden_sets.get(f"{tenant}/{adapter}")
        return _prompts(own if own is not None else self.golden_set)

    @property
    def any_golden_set(self) -> bool:
        """Whether some canary gets shadow requests."""
        return bool(self.golden_set) or any(self.golden_sets.values())

    def analysis_for(self, tenant: str, adapter: str) -> AnalysisRules:
        """The analysis rules of one adapter (overrides and the kill switch applied)."""
        rules = self.analysis
        for key in (tenant, f"{tenant}/{adapter}"):
            patch = self.analysis_overrides.get(key)
            if patch:
                rules = rules.with_overrides(patch)
        if tenant in self.analysis_disabled_tenants:
            rules = rules.model_copy(update={"enabled": False})
        return rules


class RollbackRules(_Strict):
    """Rollback readiness."""

    keep_target_warm: bool = True
    """Keep the rollback target WARM where the stable version is HOT (free bytes only)."""
    warm_replicas: int = Field(default=1, ge=0)
    """Workers that keep the rollback target WARM."""
    boost_ttl_s: float = Field(default=600.0, gt=0)
    """After a rollback, how long the restored version is required HOT."""


class Schedule(_Strict):
    """A warm-up window: the matching versions are HOT during it (and ``lead_minutes`` before)."""

    name: str = Field(min_length=1)
    tenant: str = Field(min_length=1)
    adapter: str | None = None
    """Adapter name (None: every adapter of the tenant)."""
    version: str | None = None
    """Version label (None: the stable and canary versions)."""
    days: list[Weekday] = Field(default_factory=lambda: list(Weekday))
    start: time
    """Local start time (``HH:MM``)."""
    end: time
    """Local end time; earlier than ``start`` = the window crosses midnight."""
    timezone: str = "UTC"
    hot_replicas: int = Field(default=1, ge=1)
    lead_minutes: float = Field(default=5.0, ge=0)
    """Warm up this long before ``start``."""

    @field_validator("timezone")
    @classmethod
    def _tz(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown timezone {value!r}") from exc
        return value

    @model_validator(mode="after")
    def _window(self) -> Schedule:
        if self.start == self.end:
            raise ValueError("start and end are equal (empty window)")
        if self.version is not None and self.adapter is None:
            raise ValueError("version needs adapter")
        return self

    def is_open(self, now: float) -> bool:
        """Whether the window (with its lead time) is open at epoch ``now``."""
        tz = ZoneInfo(self.timezone)
        lead = self.lead_minutes * 60.0
        # Check the window starting today and the one starting yesterday (midnight crossing).
        local = datetime.fromtimestamp(now + lead, tz)
        for days_back in (0, 1):
            day = local.date().toordinal() - days_back
            start_day = datetime.fromordinal(day)
            if _WEEKDAYS[start_day.weekday()] not in self.days:
                continue
            start = datetime.combine(start_day.date(), self.start, tz)
            end_date = start_day.date() if self.end > self.start else \
                datetime.fromordinal(day + 1).date()
            end = datetime.combine(end_date, self.end, tz)
            if start.timestamp() - lead <= now < end.timestamp():
                return True
        return False

    def matches(self, tenant: str, adapter: str) -> bool:
        """Whether an adapter falls under this schedule (version checked by the caller)."""
        return tenant == self.tenant and (self.adapter is None or self.adapter == adapter)


class PrewarmRules(_Strict):
    """``PrewarmRequested`` handling."""

    ttl_s: float = Field(default=300.0, gt=0)
    """How long a prewarm request keeps its version required HOT."""


class JoinPrewarmRules(_Strict):
    """A worker that (re)started recently gets the hottest versions of its base models WARM."""

    top: int = Field(default=0, ge=0)
    """Versions per base model, hottest first (the WARM ranking's value: request rate over
    the WARM window per size, as the loads are WARM; requested ones only); 0 = off."""
    window_s: float = Field(default=300.0, gt=0)
    """How long after the worker's start the rule applies."""


class DemandRules(_Strict):
    """Load on demand where a slot is free (covers demand-only policies such as LRU)."""

    enabled: bool = True
    window_s: float = Field(default=120.0, gt=0)
    """A version requested within this window and HOT nowhere is loaded (free slots only)."""


class CommandRules(_Strict):
    """Command tracking."""

    timeout_s: float = Field(default=30.0, gt=0)
    """A command unanswered after this long is timed out (and its deadline passed)."""
    backoff_base_s: float = Field(default=1.0, ge=0)
    """First retry delay after a failure (doubles per consecutive failure)."""
    backoff_max_s: float = Field(default=120.0, gt=0)
    """Longest retry delay; also the block after a non-retriable failure."""

    @model_validator(mode="after")
    def _order(self) -> CommandRules:
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError("backoff_max_s < backoff_base_s")
        return self


class Limits(_Strict):
    """Caps per planning round (the rest waits for the next round)."""

    max_commands_per_round: int = Field(default=128, ge=1)
    max_removals_per_round: int = Field(default=32, ge=1)
    """Demotions + evictions per round: a wrong picture never evicts everything at once."""
    max_loads_per_worker: int = Field(default=4, ge=1)
    """Loads in flight per worker (bounded concurrent cold loads)."""


class RulesConfig(_Strict):
    """Everything in ``config/cache_manager.yaml``."""

    policy: str = "heat"
    """Cache policy name (``loraplane.policy.factory.POLICIES``)."""
    policy_config: Path | None = None
    """Policy YAML (None: ``config/policy.yaml`` when present, else the defaults)."""
    canary: CanaryRules = Field(default_factory=CanaryRules)
    rollback: RollbackRules = Field(default_factory=RollbackRules)
    schedules: list[Schedule] = Field(default_factory=list)
    prewarm: PrewarmRules = Field(default_factory=PrewarmRules)
    join_prewarm: JoinPrewarmRules = Field(default_factory=JoinPrewarmRules)
    demand: DemandRules = Field(default_factory=DemandRules)
    commands: CommandRules = Field(default_factory=CommandRules)
    limits: Limits = Field(default_factory=Limits)

    @model_validator(mode="after")
    def _unique_schedules(self) -> RulesConfig:
        names = [s.name for s in self.schedules]
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            raise ValueError(f"duplicate schedule names: {', '.join(dups)}")
        return self


def rules_from_mapping(raw: Any) -> RulesConfig:
    """Validate parsed YAML; raises :class:`RulesConfigError` listing every problem."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise RulesConfigError([f"top level: expected a mapping, got {type(raw).__name__}"])
    try:
        return RulesConfig.model_validate(raw)
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(p) for p in err['loc']) or 'rules'}: {err['msg']}"
            for err in exc.errors()
        ]
        raise RulesConfigError(problems) from None


def load_rules(path: str | Path | None = None) -> RulesConfig:
    """Load ``path`` (default: the packaged ``config/cache_manager.yaml``, else defaults)."""
    if path is None:
        if not DEFAULT_RULES_PATH.is_file():
            return RulesConfig()
        path = DEFAULT_RULES_PATH
    text = Path(path).read_text(encoding="utf-8")
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RulesConfigError([f"{path}: not valid YAML: {exc}"]) from exc
    return rules_from_mapping(raw)
