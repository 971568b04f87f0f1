"""Cold-start budget decisions (table-driven) and the per-tenant / per-adapter config."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from loraplane.gateway.budget import (
    BACKGROUND,
    CANARY,
    INTERACTIVE,
    TIER_COLD,
    TIER_HOT,
    TIER_WARM,
    BudgetConfig,
    ClassBudget,
    ColdPolicy,
    Decision,
    Degrade,
    FailFast,
    LoadEstimates,
    Route,
    WaitForSlot,
    WorkerOption,
    decide,
    degrades_without_slot,
    load_budget_config,
)
from loraplane.v1 import common_pb2

EST = LoadEstimates(warm_ms=40, cold_ms=2000)
DEGRADE_300 = ClassBudget(budget_ms=300, on_cold=ColdPolicy.DEGRADE)
FAIL_300 = ClassBudget(budget_ms=300, on_cold=ColdPolicy.FAIL_FAST)
WAIT_30S = ClassBudget(budget_ms=30_000, on_cold=ColdPolicy.WAIT)


def w(wid: str, tier: int, load: int = 0, loading: bool = False, slots: int = 1) -> WorkerOption:
    return WorkerOption(wid, tier, load, loading, slots)


CASES: list[tuple[str, list[WorkerOption], ClassBudget, float, Decision]] = [
    ("hot wins over warm", [w("a", TIER_WARM), w("b", TIER_HOT, 5)], DEGRADE_300, 300,
     Decision(Route("b", TIER_HOT, 300))),
    ("least loaded hot", [w("a", TIER_HOT, 3), w("b", TIER_HOT, 1), w("c", TIER_HOT, 2)],
     DEGRADE_300, 300, Decision(Route("b", TIER_HOT, 300))),
    ("ties broken by id", [w("b", TIER_HOT, 1), w("a", TIER_HOT, 1)], DEGRADE_300, 300,
     Decision(Route("a", TIER_HOT, 300))),
    ("hot carries what is left of the budget", [w("a", TIER_HOT)], WAIT_30S, 12_345.6,
     Decision(Route("a", TIER_HOT, 12_345))),
    ("hot with the budget spent carries none", [w("a", TIER_HOT)], WAIT_30S, -5,
     Decision(Route("a", TIER_HOT, 0))),
    ("warm fits the interactive budget", [w("a", TIER_COLD), w("b", TIER_WARM, 9)],
     DEGRADE_300, 300, Decision(Route("b", TIER_WARM, 300))),
    ("warm does not fit what is left", [w("b", TIER_WARM)], DEGRADE_300, 30,
     Decision(Degrade("b"), prewarm=True, budget_exceeded=True)),
    ("cold interactive degrades to least loaded", [w("a", TIER_COLD, 4), w("b", TIER_COLD, 1)],
     DEGRADE_300, 300, Decision(Degrade("b"), prewarm=True, budget_exceeded=True)),
    ("cold interactive fails fast with hint", [w("a", TIER_COLD)], FAIL_300, 300,
     Decision(FailFast("", 2.0), prewarm=True, budget_exceeded=True)),
    ("cold load that fits is started", [w("a", TIER_COLD, 2), w("b", TIER_COLD, 0)],
     ClassBudget(budget_ms=5000, on_cold=ColdPolicy.DEGRADE), 5000,
     Decision(Route("b", TIER_COLD, 5000, starts_load=True))),
    ("background starts a cold load", [w("a", TIER_COLD)], WAIT_30S, 30_000,
     Decision(Route("a", TIER_COLD, 30_000, starts_load=True))),
    ("background joins a load under way", [w("a", TIER_COLD), w("b", TIER_COLD, 7, True, 0)],
     WAIT_30S, 20_000, Decision(Route("b", TIER_COLD, 20_000))),
    ("background skips workers without a slot", [w("a", TIER_COLD, 0, slots=0),
                                                 w("b", TIER_COLD, 9)],
     WAIT_30S, 30_000, Decision(Route("b", TIER_COLD, 30_000, starts_load=True))),
    ("background waits when every slot is taken", [w("a", TIER_COLD, slots=0)], WAIT_30S, 9000,
     Decision(WaitForSlot())),
    ("background out of budget is exhausted", [w("a", TIER_COLD, slots=0)], WAIT_30S, 0,
     Decision(FailFast("", 2.0, exhausted=True), prewarm=True, budget_exceeded=True)),
    ("background prefers warm even if slow", [w("a", TIER_WARM), w("b", TIER_COLD)],
     WAIT_30S, 10, Decision(Route("a", TIER_WARM, 10))),
    ("no worker at all", [], WAIT_30S, 30_000, Decision(FailFast("", 1.0))),
]


@pytest.mark.parametrize(("options", "budget", "remaining", "expected"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide(options: list[WorkerOption], budget: ClassBudget, remaining: float,
                expected: Decision) -> None:
    got = decide(options, budget, remaining, EST)
    if isinstance(expected.plan, FailFast):
        assert isinstance(got.plan, FailFast)
        assert got.plan.retry_after_s == expected.plan.retry_after_s
        assert got.plan.exhausted == expected.plan.exhausted
        assert got.plan.reason
        assert (got.prewarm, got.budget_exceeded) == (expected.prewarm, expected.budget_exceeded)
    else:
        assert got == expected


def test_fail_fast_hint_follows_the_estimate() -> None:
    got = decide([w("a", TIER_COLD)], FAIL_300, 300, LoadEstimates(40, 7400))
    assert isinstance(got.plan, FailFast) and got.plan.retry_after_s == 8.0


def test_defaults_follow_the_design() -> None:
    cfg = BudgetConfig()
    assert cfg.for_request("acme", "x", INTERACTIVE) == DEGRADE_300
    assert cfg.for_request("acme", "x", common_pb2.REQUEST_CLASS_UNSPECIFIED) == DEGRADE_300
    assert cfg.for_request("acme", "x", BACKGROUND) == WAIT_30S
    assert cfg.for_request("acme", "x", CANARY).on_cold is ColdPolicy.WAIT


def test_overrides_adapter_beats_tenant_field_by_field() -> None:
    cfg = BudgetConfig.model_validate(
        {
            "interactive": {"budget_ms": 200, "on_cold": "degrade"},
            "overrides": {
                "acme": {"interactive": {"on_cold": "fail_fast"}},
                "acme/support": {"interactive": {"budget_ms": 1000}},
            },
        }
    )
    assert cfg.for_request("acme", "support", INTERACTIVE) == ClassBudget(
        budget_ms=1000, on_cold=ColdPolicy.FAIL_FAST
    )
    assert cfg.for_request("acme", "code", INTERACTIVE) == ClassBudget(
        budget_ms=200, on_cold=ColdPolicy.FAIL_FAST
    )
    assert cfg.for_request("globex", "support", INTERACTIVE) == ClassBudget(
        budget_ms=200, on_cold=ColdPolicy.DEGRADE
    )


def test_yaml_file_and_every_problem_reported(tmp_path: Path) -> None:
    good = tmp_path / "b.yaml"
    good.write_text("background: {budget_ms: 5000, on_cold: wait}\n"
                    "overrides:\n  globex: {interactive: {on_cold: fail_fast}}\n")
    cfg = load_budget_config(good)
    assert cfg.background.budget_ms == 5000
    assert cfg.for_request("globex", "a", INTERACTIVE).on_cold is ColdPolicy.FAIL_FAST
    bad = tmp_path / "bad.yaml"
    bad.write_text("interactive: {budget_ms: -1, on_cold: sometimes}\n")
    with pytest.raises(ValidationError) as info:
        load_budget_config(bad)
    assert info.value.error_count() == 2


def test_override_keys_are_checked() -> None:
    with pytest.raises(ValidationError, match="tenant/adapter"):
        BudgetConfig.model_validate({"overrides": {"../x": {}}})


@pytest.mark.parametrize(("policy", "degrades"), [(ColdPolicy.DEGRADE, True),
                                                  (ColdPolicy.FAIL_FAST, False),
                                                  (ColdPolicy.WAIT, False)])
def test_no_hot_slot_within_the_budget_degrades_only_by_policy(policy: ColdPolicy,
                                                               degrades: bool) -> None:
    assert degrades_without_slot(ClassBudget(budget_ms=300, on_cold=policy)) is degrades
