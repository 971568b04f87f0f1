"""Rules configuration: shipped file = defaults, every problem reported, schedule windows."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import yaml

from loraplane.cache_manager.rules import RulesConfig, RulesConfigError, Schedule, load_rules
from loraplane.cache_manager.rules import rules_from_mapping as parse

REPO = Path(__file__).resolve().parents[3]


def test_shipped_file_equals_the_defaults() -> None:
    assert load_rules(REPO / "config" / "cache_manager.yaml") == RulesConfig()


def test_every_problem_is_reported() -> None:
    with pytest.raises(RulesConfigError) as err:
        parse({
            "canary": {"warm_replicas": -1, "colour": "red"},
            "commands": {"timeout_s": 0, "backoff_base_s": 10, "backoff_max_s": 5},
            "schedules": [{"name": "x", "tenant": "t", "start": "10:00", "end": "10:00",
                           "timezone": "Mars/Olympus"}],
            "nonsense": 1,
        })
    text = " | ".join(err.value.problems)
    for needle in ("canary.warm_replicas", "canary.colour", "commands.timeout_s",
                   "schedules.0.timezone", "nonsense"):
        assert needle in text, text
    assert len(err.value.problems) >= 5


def test_not_a_mapping_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(RulesConfigError):
        parse([1, 2])
    bad = tmp_path / "r.yaml"
    bad.write_text("canary: [unclosed")
    with pytest.raises(RulesConfigError):
        load_rules(bad)


def _at(text: str, tz: str = "UTC") -> float:
    return datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(tz)).timestamp()


def _sched(**kw: object) -> Schedule:
    raw = {"name": "s", "tenant": "acme", "start": "08:00", "end": "18:00", "lead_minutes": 5}
    raw.update(kw)
    return parse({"schedules": [raw]}).schedules[0]


@pytest.mark.parametrize(
    ("when", "expected"),
    [
        ("2026-11-30 07:54", False),   # Monday, before the lead time
        ("2026-11-30 07:56", True),    # inside the 5 min lead
        ("2026-11-30 12:00", True),
        ("2026-11-30 18:00", False),   # end is exclusive
        ("2026-11-29 12:00", False),   # Sunday: not a listed day
    ],
)
def test_window_with_days_and_lead(when: str, expected: bool) -> None:
    s = _sched(days=["mon", "tue", "wed", "thu", "fri"])
    assert s.is_open(_at(when)) is expected


@pytest.mark.parametrize(
    ("when", "expected"),
    [("2026-11-30 23:30", True), ("2026-12-01 01:59", True), ("2026-12-01 02:00", False),
     ("2026-11-30 21:00", False)],
)
def test_window_crossing_midnight_in_a_timezone(when: str, expected: bool) -> None:
    s = _sched(start="22:00", end="02:00", timezone="Europe/Paris", days=["mon"])
    assert s.is_open(_at(when, "Europe/Paris")) is expected


def test_schedule_matching() -> None:
    s = _sched(adapter="support")
    assert s.matches("acme", "support") and not s.matches("acme", "other")
    assert not s.matches("other", "support")
    assert _sched().matches("acme", "anything")
    assert yaml.safe_load(yaml.safe_dump(RulesConfig().model_dump(mode="json"))) is not None


def test_golden_sets_per_adapter_with_expected_answers() -> None:
    from loraplane.cache_manager.rules import GoldenPrompt
    from loraplane.cache_manager.shadow import judge_answer

    rules = parse({"canary": {
        "golden_set": ["Hello"],
        "golden_sets": {"acme/support": [{"prompt": "Hi", "expect": " there"}, "Bye"],
                        "acme/quiet": []},
    }})
    c = rules.canary
    assert c.any_golden_set
    assert c.golden_for("acme", "support") == [GoldenPrompt(prompt="Hi", expect=" there"),
                                               GoldenPrompt(prompt="Bye")]
    assert c.golden_for("acme", "code") == [GoldenPrompt(prompt="Hello")]  # the deployment's
    assert c.golden_for("acme", "quiet") == []  # its own, empty: no shadow requests
    hi, bye = c.golden_for("acme", "support")
    assert judge_answer(hi, " there") == ""
    why = judge_answer(hi, " world")
    assert "diverges from the golden expectation" in why and "' world'" in why, why
    assert judge_answer(bye, "anything at all") == ""  # no expectation: completing is enough
    assert not parse({}).canary.any_golden_set


def test_bad_golden_sets_are_refused_naming_the_entry() -> None:
    with pytest.raises(RulesConfigError) as err:
        parse({"canary": {"golden_sets": {"acme": ["Hi"], "acme/x": [{"prompt": ""}],
                                          "acme/y": [{"prompt": "a", "colour": 1}]}}})
    text = " | ".join(err.value.problems)
    for needle in ("golden_sets.acme/x", "golden_sets.acme/y", "colour"):
        assert needle in text, text
    with pytest.raises(RulesConfigError) as err:
        parse({"canary": {"golden_sets": {"acme": ["Hi"]}}})
    assert "golden_sets: key 'acme' is not 'tenant/adapter'" in str(err.value)
