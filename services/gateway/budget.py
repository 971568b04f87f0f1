"""Cold-start budgets: what to do with a request whose adapter version is not HOT.

Pure code: :func:`decide` takes the candidate workers (with the version's tier on
each and their load), the request class's :class:`ClassBudget`, the time left and
the load estimates, and returns a :class:`Decision`; the gateway executes it.

=============  ===========  =============================================================
class          default      when the version is not HOT on any worker
=============  ===========  =============================================================
interactive    300 ms       WARM somewhere and the WARM load fits → route there; a COLD load
                            that fits → load there; else degrade to the base model or fail
                            fast with a retry hint (per policy), and ask for a prewarm
background     30 s         route to WARM, join a load under way, or start a cold load on a
                            worker with a free cold-load slot and wait; no slot → wait
canary         30 s         like background (shadow / golden-set traffic warms the canary)
=============  ===========  =============================================================

What is left of the budget travels to the worker with every routed request
(``cold_budget_ms``), HOT ones included: a full worker makes room or queues the request
for a HOT slot that long, then answers RESOURCE_EXHAUSTED (reason ``no_slot`` /
``queue_full``); :func:`degrades_without_slot` says whether the gateway then serves the
base model (policy ``degrade``) or returns that 429 with the worker's retry hint.

Budgets and policies are configurable per tenant and per adapter
(:class:`BudgetConfig`, YAML)::

    interactive: {budget_ms: 300, on_cold: degrade}
    background:  {budget_ms: 30000, on_cold: wait}
    overrides:
      acme:            {interactive: {on_cold: fail_fast}}
      acme/support:    {interactive: {budget_ms: 1000}}
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from loraplane.shared import vocab
from loraplane.v1 import common_pb2

# wire tier values and their names: the one vocabulary (loraplane.shared.vocab)
TIER_HOT, TIER_WARM, TIER_COLD = vocab.TIER_HOT, vocab.TIER_WARM, vocab.TIER_COLD

INTERACTIVE = common_pb2.REQUEST_CLASS_INTERACTIVE
BACKGROUND = common_pb2.REQUEST_CLASS_BACKGROUND
CANARY = common_pb2.REQUEST_CLASS_CANARY

CLASS_NAMES: dict[int, str] = {
    common_pb2.REQUEST_CLASS_UNSPECIFIED: "interactive",
    INTERACTIVE: "interactive",
    BACKGROUND: "background",
    CANARY: "canary",
}
"""Request class enum value → name (unspecified is treated as interactive)."""

TIER_NAMES: dict[int, str] = vocab.TIER_NAMES
"""Tier enum value → lowercase name (metric labels, headers)."""

MIN_RETRY_AFTER_S = 1.0
"""Smallest retry hint given with a fail-fast answer."""

_OVERRIDE_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9-]{1,62}(/[a-z0-9][a-z0-9._-]{0,62})?$")


class ColdPolicy(StrEnum):
    """What a request does when its version cannot be served within the budget."""

    DEGRADE = "degrade"
    """Serve with the base model (the response says so) and request a prewarm."""
    FAIL_FAST = "fail_fast"
    """Refuse with UNAVAILABLE and a retry hint, and request a prewarm."""
    WAIT = "wait"
    """Trigger the load and wait for it, up to the budget."""


class ClassBudget(BaseModel):
    """Budget of one request class."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    budget_ms: float = Field(ge=0)
    """Longest wait for an adapter load before the first token, in milliseconds."""
    on_cold: ColdPolicy
    """What to do when the load does not fit the budget."""


class ClassBudgetOverride(BaseModel):
    """Partial :class:`ClassBudget`: unset fields inherit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    budget_ms: float | None = Field(default=None, ge=0)
    """Overrides ``budget_ms`` when set."""
    on_cold: ColdPolicy | None = None
    """Overrides ``on_cold`` when set."""

    def apply(self, base: ClassBudget) -> ClassBudget:
        """``base`` with this override's set fields."""
        return ClassBudget(
            budget_ms=base.budget_ms if self.budget_ms is None else self.budget_ms,
            on_cold=base.on_cold if self.on_cold is None else self.on_cold,
        )


class BudgetOverride(BaseModel):
    """Overrides for one tenant or one adapter."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    interactive: ClassBudgetOverride | None = None
    """Interactive class override."""
    background: ClassBudgetOverride | None = None
    """Background class override."""
    canary: ClassBudgetOverride | None = None
    """Canary class override."""


class BudgetConfig(BaseModel):
    """Default budgets per class, plus overrides keyed ``tenant`` or ``tenant/adapter``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    interactive: ClassBudget = ClassBudget(budget_ms=300, on_cold=ColdPolicy.DEGRADE)
    """Latency-sensitive requests."""
    background: ClassBudget = ClassBudget(budget_ms=30_000, on_cold=ColdPolicy.WAIT)
    """Throughput requests that may wait for a load."""
    canary: ClassBudget = ClassBudget(budget_ms=30_000, on_cold=ColdPolicy.WAIT)
    """Shadow / golden-set requests that warm a canary version."""
    overrides: dict[str, BudgetOverride] = Field(default_factory=dict)
    """``"tenant"`` or ``"tenant/adapter"`` → override (adapter beats tenant)."""

    @model_validator(mode="after")
    def _check_keys(self) -> BudgetConfig:
        bad = [k for k in self.overrides if not _OVERRIDE_KEY_RE.match(k)]
        if bad:
            raise ValueError(f"override keys must be 'tenant' or 'tenant/adapter': {sorted(bad)}")
        return self

    def for_request(self, tenant_id: str, adapter_name: str, request_class: int) -> ClassBudget:
        """Effective budget of a request of ``request_class`` on ``tenant_id/adapter_name``."""
        name = CLASS_NAMES.get(request_class, "interactive")
        budget: ClassBudget = getattr(self, name)
        for key in (tenant_id, f"{tenant_id}/{adapter_name}"):
            override = self.overrides.get(key)
            part = getattr(override, name) if override is not None else None
            if part is not None:
                budget = part.apply(budget)
        return budget


def load_budget_config(path: Path) -> BudgetConfig:
    """Read a budgets YAML file (every problem reported at once by pydantic)."""
    data: Any = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    return BudgetConfig.model_validate(data)


# --------------------------------------------------------------------------- decision


@dataclass(frozen=True, slots=True)
class WorkerOption:
    """A ready worker serving the request's base model, seen from one adapter version."""

    worker_id: str
    """Worker id."""
    tier: int
    """Tier of the version on this worker (TIER_COLD: not there)."""
    load: int
    """Requests in flight on the worker."""
    loading: bool = False
    """A load of this version, started by this gateway, is under way on the worker."""
    cold_slots_free: int = 1
    """Cold loads this gateway may still start on the worker."""


@dataclass(frozen=True, slots=True)
class LoadEstimates:
    """Expected time to make a version HOT, by source tier."""

    warm_ms: float
    """WARM → HOT."""
    cold_ms: float
    """COLD → HOT (fetch, verify, register)."""


@dataclass(frozen=True, slots=True)
class Route:
    """Send the request with the adapter to ``worker_id``."""

    worker_id: str
    """Chosen worker."""
    tier: int
    """Tier of the version there on arrival."""
    cold_budget_ms: int
    """What is left of the class budget, passed to the worker: how long it may wait for a
    load and for a HOT slot (a HOT version may have been demoted meanwhile); 0 = none left."""
    starts_load: bool = False
    """The request starts a cold load (holds a cold-load slot until its first token)."""


@dataclass(frozen=True, slots=True)
class Degrade:
    """Serve with the base model on ``worker_id``."""

    worker_id: str
    """Chosen worker (least loaded among those serving the base model)."""


@dataclass(frozen=True, slots=True)
class FailFast:
    """Refuse the request now."""

    reason: str
    """Explanation for the caller."""
    retry_after_s: float
    """Retry hint."""
    exhausted: bool = False
    """RESOURCE_EXHAUSTED (budget spent waiting for capacity) instead of UNAVAILABLE."""


@dataclass(frozen=True, slots=True)
class WaitForSlot:
    """Every candidate's cold-load slots are taken: wait for one, then decide again."""


Plan = Route | Degrade | FailFast | WaitForSlot
"""What the gateway does with a request."""


@dataclass(frozen=True, slots=True)
class Decision:
    """A plan plus its side effects."""

    plan: Plan
    """What to do."""
    prewarm: bool = False
    """Ask the cache manager to make the version HOT."""
    budget_exceeded: bool = False
    """The version could not be served within the budget."""


def degrades_without_slot(budget: ClassBudget) -> bool:
    """Whether a request the worker could not give a HOT slot within its budget is served
    by the base model (policy ``degrade``) rather than refused with 429."""
    return budget.on_cold is ColdPolicy.DEGRADE


def least_loaded(options: Sequence[WorkerOption]) -> WorkerOption:
    """The option with the smallest load (ties: smallest worker id, so choices are stable)."""
    return min(options, key=lambda o: (o.load, o.worker_id))


def _retry_after(ms: float) -> float:
    return max(MIN_RETRY_AFTER_S, math.ceil(ms / 1000.0))


def decide(
    options: Sequence[WorkerOption],
    budget: ClassBudget,
    remaining_ms: float,
    estimates: LoadEstimates,
) -> Decision:
    """Decide where (and whether) to serve a request for one adapter version.

    ``options``: the ready workers serving the version's base model, each with the
    version's tier there. ``remaining_ms``: what is left of the budget (the budget
    minus the time already spent waiting).
    """
    if not options:
        return Decision(FailFast("no ready worker serves the base model", MIN_RETRY_AFTER_S))
    left = max(0, int(remaining_ms))
    hot = [o for o in options if o.tier == TIER_HOT]
    if hot:
        # the budget travels even to a HOT version: a full worker that demoted it queues
        # the request for a HOT slot at most that long
        return Decision(Route(least_loaded(hot).worker_id, TIER_HOT, left))
    waits = budget.on_cold is ColdPolicy.WAIT
    warm = [o for o in options if o.tier == TIER_WARM]
    if warm and left > 0 and (waits or estimates.warm_ms <= remaining_ms):
        return Decision(Route(least_loaded(warm).worker_id, TIER_WARM, left))
    cold_fits = left > 0 and (waits or estimates.cold_ms <= remaining_ms)
    if cold_fits:
        joinable = [o for o in options if o.loading]
        if joinable:
            return Decision(Route(least_loaded(joinable).worker_id, TIER_COLD, left))
        free = [o for o in options if o.cold_slots_free > 0]
        if free:
            return Decision(Route(least_loaded(free).worker_id, TIER_COLD, left, starts_load=True))
        if waits:
            return Decision(WaitForSlot())
    expected_ms = estimates.warm_ms if warm else estimates.cold_ms
    if budget.on_cold is ColdPolicy.DEGRADE:
        return Decision(Degrade(least_loaded(options).worker_id), True, True)
    if waits:
        return Decision(
            FailFast(
                f"cold-start budget of {budget.budget_ms:.0f} ms spent waiting for a load slot",
                _retry_after(expected_ms),
                exhausted=True,
            ),
            True,
            True,
        )
    return Decision(
        FailFast(
            f"adapter is not loaded; expected load {expected_ms:.0f} ms > budget "
            f"{budget.budget_ms:.0f} ms",
            _retry_after(expected_ms),
        ),
        True,
        True,
    )
