"""Canary analysis (pure): statistics, rules validation and every decision, injected clock."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from pydantic import ValidationError

from loraplane.cache_manager.canary_analysis import (
    Action,
    AnalysisRules,
    CanarySnapshot,
    Reason,
    StableAction,
    StableSnapshot,
    VersionFigures,
    decide,
    decide_stable,
    quantile,
    quantile_lower_bound,
    sum_figures,
    wilson_bounds,
)
from loraplane.cache_manager.rules import RulesConfigError, load_rules, rules_from_mapping

RULES = AnalysisRules(dwell_s=60, window_s=120, min_requests=20)
T0 = 1_000_000.0


def snap(canary: VersionFigures, stable: VersionFigures | None = None, *, percent: int = 10,
         paused: bool = False) -> CanarySnapshot:
    return CanarySnapshot("acme/code", "v2", "v1", percent, T0, canary,
                          stable or VersionFigures(requests=1000), paused)


# --------------------------------------------------------------------------- statistics


def test_wilson_bounds_bracket_the_rate_and_narrow_with_n() -> None:
    lo10, hi10 = wilson_bounds(1, 10, 0.95)
    lo1000, hi1000 = wilson_bounds(100, 1000, 0.95)
    assert lo10 < 0.1 < hi10 and lo1000 < 0.1 < hi1000
    assert hi1000 - lo1000 < hi10 - lo10
    assert wilson_bounds(0, 0, 0.95) == (0.0, 1.0)
    assert wilson_bounds(0, 50, 0.95)[0] == 0.0
    with pytest.raises(ValueError, match="outside"):
        wilson_bounds(5, 3, 0.95)


def test_wilson_lower_bound_holds_its_confidence_by_simulation() -> None:
    rng = random.Random(7)
    p, n, trials = 0.05, 40, 2000
    above = sum(wilson_bounds(sum(rng.random() < p for _ in range(n)), n, 0.95)[0] > p
                for _ in range(trials))
    assert above / trials <= 0.05 + 0.015  # a true rate is above the lower bound ≥ 95 %


def test_quantile_lower_bound_is_an_order_statistic_below_the_quantile() -> None:
    rng = random.Random(3)
    xs = [rng.expovariate(1 / 100) for _ in range(500)]
    lower = quantile_lower_bound(xs, 0.99, 0.95)
    p99 = quantile(xs, 0.99)
    assert lower is not None and p99 is not None and lower <= p99 and lower in xs
    assert quantile_lower_bound(xs[:5], 0.99, 0.95) is not None  # max is a valid bound
    assert quantile_lower_bound([], 0.99, 0.95) is None


# --------------------------------------------------------------------------- rules


@pytest.mark.parametrize(("patch", "needle"), [
    ({"stages": [10, 5, 100]}, "strictly increasing"),
    ({"stages": [10, 50]}, "last stage must be 100"),
    ({"stages": [0, 100]}, "outside [1, 100]"),
    ({"stages": []}, "at least one stage"),
    ({"confidence": 1.5}, "confidence"),
    ({"max_error_rate_excess": 1.2}, "max_error_rate_excess"),
    ({"dwell_s": 600, "window_s": 300}, "shorter than dwell_s"),
    ({"min_requests": 0}, "min_requests"),
    ({"bogus": 1}, "bogus"),
])
def test_bad_rules_are_refused_naming_the_problem(patch: dict[str, object], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle.replace("[", r"\[")):
        AnalysisRules.model_validate(patch)


def test_rules_yaml_overrides_per_tenant_and_adapter_and_the_kill_switch() -> None:
    rules = rules_from_mapping({"canary": {
        "analysis": {"dwell_s": 30, "window_s": 60},
        "analysis_overrides": {"acme": {"min_requests": 5}, "acme/code": {"dwell_s": 10}},
        "analysis_disabled_tenants": ["globex"],
    }}).canary
    assert rules.analysis_for("acme", "code").min_requests == 5
    assert rules.analysis_for("acme", "code").dwell_s == 10
    assert rules.analysis_for("acme", "other").dwell_s == 30
    assert rules.analysis_for("initech", "x").min_requests == 20
    assert not rules.analysis_for("globex", "x").enabled
    with pytest.raises(RulesConfigError, match=r"acme/code\.ttft_quantile"):
        rules_from_mapping({"canary": {"analysis_overrides": {"acme/code":
                                                              {"ttft_quantile": 3}}}})
    with pytest.raises(RulesConfigError, match="not 'tenant' or 'tenant/adapter'"):
        rules_from_mapping({"canary": {"analysis_overrides": {"a/b/c": {}}}})


def test_a_rules_file_with_bad_analysis_is_refused_naming_every_problem(
    tmp_path: Path,
) -> None:
    """The cache manager's rules file (``load_rules``, as ``main`` reads it): an unknown
    stage, thresholds out of range and an unknown key are refused at once, each named by
    its path in the file."""
    path = tmp_path / "rules.yaml"
    path.write_text("canary:\n"
                    "  analysis:\n"
                    "    stages: [10, 150]\n"
                    "    confidence: 1.5\n"
                    "    max_error_rate_excess: -0.1\n"
                    "    stage: [10, 100]\n")
    with pytest.raises(RulesConfigError) as err:
        load_rules(path)
    text = str(err.value)
    for needle in ("canary.analysis.stages: Value error, stages [150] are outside [1, 100]",
                   "canary.analysis.confidence: Input should be less than 1",
                   "canary.analysis.max_error_rate_excess: Input should be greater than",
                   "canary.analysis.stage: Extra inputs are not permitted"):
        assert needle in text, text
    path.write_text("canary:\n  analysis_overrides:\n    acme/code: {stages: [50, 10, 100]}\n")
    with pytest.raises(RulesConfigError,
                       match=r"analysis_overrides\.acme/code\.stages: .*not strictly increasing"):
        load_rules(path)


def test_next_stage_continues_a_share_set_by_hand() -> None:
    assert [RULES.next_stage(p) for p in (0, 1, 10, 20, 50, 100)] == [1, 10, 50, 50, 100, None]


# --------------------------------------------------------------------------- decisions


def test_load_failures_abort_naming_the_error_and_the_figures() -> None:
    c = VersionFigures(load_attempts=2, load_failures=2,
                       last_load_error="LOAD_ERROR_CODE_DOWNLOAD_FAILED: no objects")
    d = decide(snap(c, percent=20), RULES, T0 + 5)
    assert (d.action, d.reason, d.to_percent) == (Action.ABORT, Reason.LOAD_FAILED, 0)
    assert "DOWNLOAD_FAILED" in d.detail and "2 of 2 loads failed" in d.detail
    fig = d.figures()
    assert fig["canary"]["load_failures"] == 2 and fig["checks"]["load"]["lower_bound"] > 0.2
    assert d.decision_id == "acme/code@v2:20:abort"


def test_one_load_failure_does_not_decide_and_stable_failing_too_holds() -> None:
    one = VersionFigures(load_attempts=1, load_failures=1)
    assert decide(snap(one), RULES, T0 + 5).action is Action.HOLD
    # an object-store outage: stable's loads fail as much in the same window
    both = VersionFigures(load_attempts=3, load_failures=3)
    assert decide(snap(both, both), RULES, T0 + 5).action is Action.HOLD


def test_a_handful_of_requests_never_decides_but_failures_alone_can() -> None:
    ok = VersionFigures(requests=3)
    assert decide(snap(ok), RULES, T0 + 600).reason is Reason.MIN_REQUESTS
    one_bad = VersionFigures(requests=3, errors=1)
    assert decide(snap(one_bad), RULES, T0 + 5).action is Action.HOLD
    two_bad = VersionFigures(requests=3, errors=2)
    d = decide(snap(two_bad), RULES, T0 + 5)
    assert (d.action, d.reason) == (Action.ABORT, Reason.ERROR_RATE)
    assert d.checks["error_rate"]["n_for_bound"] == 20


def test_error_rate_is_judged_against_stable_in_the_same_window() -> None:
    c = VersionFigures(requests=200, errors=12)
    noisy_stable = VersionFigures(requests=2000, errors=100)  # 5 %: canary 6 % is not worse
    assert decide(snap(c, noisy_stable), RULES, T0 + 5).action is Action.HOLD
    clean_stable = VersionFigures(requests=2000, errors=0)
    assert decide(snap(c, clean_stable), RULES, T0 + 5).reason is Reason.ERROR_RATE


def test_golden_set_failures_and_degraded_share_abort() -> None:
    g = VersionFigures(golden_ok=3, golden_failed=1, last_golden_error="UNAVAILABLE")
    d = decide(snap(g), RULES, T0 + 1)
    assert (d.action, d.reason) == (Action.ABORT, Reason.GOLDEN_SET_FAILED)
    deg = VersionFigures(requests=100, degraded=40)
    assert decide(snap(deg), RULES, T0 + 1).reason is Reason.DEGRADED_SHARE


def test_ttft_tail_worse_than_stable_aborts_per_class_only_with_enough_samples() -> None:
    rng = random.Random(11)
    stable = VersionFigures(requests=400, ttft_ms={
        "interactive": tuple(rng.uniform(20, 40) for _ in range(400))})
    slow = VersionFigures(requests=200, ttft_ms={
        "interactive": tuple(rng.uniform(300, 400) for _ in range(200))})
    d = decide(snap(slow, stable), RULES, T0 + 1)
    assert (d.action, d.reason) == (Action.ABORT, Reason.TTFT)
    assert d.checks["ttft"]["class"] == "interactive"
    few = VersionFigures(requests=20, ttft_ms={"interactive": (900.0,) * 20})
    assert decide(snap(few, stable), RULES, T0 + 1).action is Action.HOLD
    same = VersionFigures(requests=200, ttft_ms={
        "interactive": tuple(rng.uniform(20, 40) for _ in range(200))})
    assert decide(snap(same, stable), RULES, T0 + 1).reason is Reason.DWELL


def test_stages_advance_after_dwell_and_promote_after_the_last() -> None:
    clean = VersionFigures(requests=25)
    assert decide(snap(clean, percent=10), RULES, T0 + 59).reason is Reason.DWELL
    d = decide(snap(clean, percent=10), RULES, T0 + 60)
    assert (d.action, d.to_percent, d.decision_id) == (Action.ADVANCE, 50,
                                                       "acme/code@v2:10:advance")
    d = decide(snap(clean, percent=100), RULES, T0 + 61)
    assert (d.action, d.to_percent) == (Action.PROMOTE, 100)


def test_pause_holds_advances_but_not_aborts_and_disabled_holds_everything() -> None:
    clean = VersionFigures(requests=25)
    assert decide(snap(clean, paused=True), RULES, T0 + 600).reason is Reason.PAUSED
    broken = VersionFigures(load_attempts=2, load_failures=2)
    assert decide(snap(broken, paused=True), RULES, T0 + 1).action is Action.ABORT
    off = RULES.model_copy(update={"enabled": False})
    assert decide(snap(broken), off, T0 + 1).reason is Reason.DISABLED


def test_a_staged_canary_at_zero_percent_waits_unless_it_cannot_load() -> None:
    assert decide(snap(VersionFigures(), percent=0), RULES, T0 + 600).reason \
        is Reason.NOT_RUNNING
    broken = VersionFigures(load_attempts=2, load_failures=2)
    assert decide(snap(broken, percent=0), RULES, T0 + 1).action is Action.ABORT


# --------------------------------------------------------------------------- stable


def stable_snap(stable: VersionFigures, reference: VersionFigures | None = None, *,
                target: str = "v0") -> StableSnapshot:
    return StableSnapshot("acme/code", "v1", target, stable,
                          reference or VersionFigures(requests=1000, errors=2))


def test_failing_stable_is_rolled_back_to_its_target_with_the_figures() -> None:
    d = decide_stable(stable_snap(VersionFigures(requests=40, errors=8)), RULES, T0)
    assert (d.action, d.reason, d.to_version) == (StableAction.ROLLBACK,
                                                  Reason.STABLE_ERROR_RATE, "v0")
    fig = d.figures()
    assert fig["decision_id"] == "acme/code@v1:stable:rollback"
    assert fig["stable"]["errors"] == 8 and fig["reference"]["requests"] == 1000
    check = fig["checks"]["error_rate"]
    upper = wilson_bounds(2, 1000, RULES.confidence)[1]
    assert check["reference_upper_bound"] == pytest.approx(upper, abs=1e-4)
    assert check["lower_bound"] > check["limit"] == pytest.approx(upper + 0.02, abs=1e-4)
    assert "rolled back to v0" in d.detail


def test_failing_stable_without_a_target_is_withdrawn() -> None:
    d = decide_stable(stable_snap(VersionFigures(requests=40, errors=8), target=""), RULES, T0)
    assert (d.action, d.to_version) == (StableAction.WITHDRAW, "")
    assert "no version to roll back to" in d.detail
    # a target equal to the failing version is none
    assert decide_stable(stable_snap(VersionFigures(requests=40, errors=8), target="v1"),
                         RULES, T0).action is StableAction.WITHDRAW


def test_stable_is_kept_on_few_failures_healthy_figures_or_a_fleet_wide_outage() -> None:
    # one failure of a handful: n is floored at min_requests, nothing is proven
    assert decide_stable(stable_snap(VersionFigures(requests=3, errors=1)), RULES,
                         T0).action is StableAction.KEEP
    # 1 % errors against a 0.2 % reference, 0.02 allowed: kept
    assert decide_stable(stable_snap(VersionFigures(requests=1000, errors=10)), RULES,
                         T0).action is StableAction.KEEP
    # every stable version of the base model fails as much (a worker outage): no verdict
    outage = VersionFigures(requests=400, errors=100)
    assert decide_stable(stable_snap(VersionFigures(requests=40, errors=10), outage), RULES,
                         T0).action is StableAction.KEEP
    # alone on its base model (no reference traffic): an outage would look the same
    d = decide_stable(stable_snap(VersionFigures(requests=40, errors=40), VersionFigures()),
                      RULES, T0)
    assert (d.action, d.reason) == (StableAction.KEEP, Reason.NO_REFERENCE)
    assert "cannot be told from an outage" in d.detail
    # degraded requests were not served by it: not errors (one error of 10 served holds)
    d = decide_stable(stable_snap(VersionFigures(requests=60, errors=1, degraded=50)),
                      RULES, T0)
    assert d.action is StableAction.KEEP and d.reason is Reason.HEALTHY
    assert "1 of 10 requests" in d.detail


def test_stable_analysis_off_by_rule_or_kill_switch() -> None:
    bad = stable_snap(VersionFigures(requests=40, errors=8))
    for rules in (RULES.model_copy(update={"judge_stable": False}),
                  RULES.model_copy(update={"enabled": False})):
        d = decide_stable(bad, rules, T0)
        assert (d.action, d.reason) == (StableAction.KEEP, Reason.DISABLED)
    with pytest.raises(ValidationError):
        AnalysisRules(max_stable_error_rate=1.5)


def test_sum_figures_adds_request_counts() -> None:
    total = sum_figures([VersionFigures(requests=3, errors=1, degraded=1),
                         VersionFigures(requests=5, errors=2)])
    assert (total.requests, total.errors, total.degraded) == (8, 3, 1)


def test_a_canary_whose_golden_set_has_not_answered_neither_advances_nor_is_promoted() -> None:
    served = VersionFigures(requests=50)
    for percent in (10, 100):
        s = CanarySnapshot("acme/code", "v2", "v1", percent, T0, served,
                           VersionFigures(requests=1000), golden_pending=True)
        d = decide(s, RULES, T0 + 600)
        assert (d.action, d.reason) == (Action.HOLD, Reason.GOLDEN_PENDING)
    # failures still abort while it is pending
    s = CanarySnapshot("acme/code", "v2", "v1", 10, T0, VersionFigures(requests=20, errors=10),
                       VersionFigures(requests=1000), golden_pending=True)
    assert decide(s, RULES, T0 + 1).action is Action.ABORT
    # once answered (and clean) it advances
    s = CanarySnapshot("acme/code", "v2", "v1", 10, T0, VersionFigures(requests=50, golden_ok=2),
                       VersionFigures(requests=1000))
    assert decide(s, RULES, T0 + 600).action is Action.ADVANCE


def test_transport_failures_of_a_stable_version_are_no_verdict() -> None:
    # a killed worker: 10 of 40 requests UNAVAILABLE, on this version only (its worker)
    killed = VersionFigures(requests=40, errors=10, infra_errors=10)
    assert decide_stable(stable_snap(killed), RULES, T0).action is StableAction.KEEP
    # the same count of INTERNAL failures is one
    assert decide_stable(stable_snap(VersionFigures(requests=40, errors=10)), RULES,
                         T0).action is StableAction.ROLLBACK
