"""The Prometheus rules of infra/prometheus/: valid, unit-tested with promtool (each alert
firing and silent), annotated with a runbook section, and reading only series the
services export or the rules record."""

from __future__ import annotations

import re

import yaml

from tests.unit.observability.catalogue import families
from tests.unit.observability.promql import (
    OPERATOR_DECLARED,
    PROM_DIR,
    RULE_TESTS,
    RULES,
    alerts,
    load_rules,
    recorded,
    run_promtool,
    selectors,
)

RUNBOOK = PROM_DIR / "RUNBOOK.md"
SYNTHETIC = frozenset({"up"})
"""Series Prometheus makes itself for every target."""


def exported_samples() -> set[str]:
    return {s for f in families().values() for s in f.samples()}


def test_promtool_check_rules() -> None:
    out = run_promtool("check", "rules", str(RULES), str(PROM_DIR / "tests" / "priorities.yml"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(load_rules())} rules found" in out.stdout, out.stdout


def test_promtool_rule_unit_tests_pass() -> None:
    assert RULE_TESTS, "no promtool rule tests in infra/prometheus/tests"
    out = run_promtool("test", "rules", *map(str, RULE_TESTS))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "FAILED" not in out.stdout + out.stderr


def _alert_cases() -> dict[str, list[list[dict[str, object]]]]:
    cases: dict[str, list[list[dict[str, object]]]] = {}
    for path in RULE_TESTS:
        doc = yaml.safe_load(path.read_text())
        for test in doc["tests"]:
            for case in test.get("alert_rule_test") or []:
                cases.setdefault(case["alertname"], []).append(case.get("exp_alerts") or [])
    return cases


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    cases = _alert_cases()
    missing = []
    for name in alerts():
        got = cases.get(name, [])
        if not any(got):
            missing.append(f"{name}: no case where it fires")
        if not any(not c for c in got):
            missing.append(f"{name}: no case where it stays silent")
    assert not missing, missing
    unknown = set(cases) - set(alerts())
    assert not unknown, f"tests for alerts that do not exist: {unknown}"


def test_every_alert_is_annotated_and_has_a_runbook_section() -> None:
    headings = {
        re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", RUNBOOK.read_text(), flags=re.MULTILINE)
    }
    problems = []
    for name, rule in alerts().items():
        ann = rule.get("annotations", {})
        for key in ("summary", "description", "runbook"):
            if not str(ann.get(key, "")).strip():
                problems.append(f"{name}: no {key}")
        anchor = str(ann.get("runbook", "")).partition("#")[2]
        if anchor != name.lower() or anchor not in headings:
            problems.append(f"{name}: runbook {ann.get('runbook')!r} is not its section")
        if rule.get("labels", {}).get("severity") not in ("page", "ticket"):
            problems.append(f"{name}: severity must be page or ticket")
    assert not problems, problems


def test_descriptions_name_the_labels_the_alert_carries() -> None:
    """Every label a firing case expects (severity aside) is named in the summary or the
    description, so the notification says which tenant / adapter / worker it is about."""
    rules = alerts()
    problems = []
    for path in RULE_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test") or []:
                ann = rules[case["alertname"]]["annotations"]
                text = ann["summary"] + ann["description"]
                for exp in case.get("exp_alerts") or []:
                    for label in exp["exp_labels"]:
                        if label != "severity" and f"$labels.{label}" not in text:
                            problems.append(f"{case['alertname']}: {label} not named")
    assert not problems, sorted(set(problems))


def test_rules_read_only_exported_or_recorded_series() -> None:
    exported = exported_samples()
    known = exported | recorded() | OPERATOR_DECLARED | SYNTHETIC
    unknown = {}
    for rule in load_rules():
        for name in selectors(rule["expr"]) - known:
            unknown.setdefault(name, rule.get("record") or rule.get("alert"))
    assert not unknown, unknown
    # the check itself sees the names (a selector parser that found nothing would pass)
    read = set().union(*(selectors(r["expr"]) for r in load_rules()))
    assert len(read & exported) >= 20, read

