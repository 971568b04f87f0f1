"""Statistics (decayed rate, error rate after load) and the YAML configuration."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from loraplane.policy.config import (
    PolicyConfig,
    PolicyConfigError,
    config_from_mapping,
    load_config,
)
from loraplane.policy.model import Priority, RequestClass
from loraplane.policy.stats import StatsView, VersionStats, decayed

ROOT = Path(__file__).resolve().parents[3]


def test_steady_stream_converges_to_its_rate() -> None:
    s = VersionStats(tau_s=600.0)
    for k in range(6000):  # 2 req/s for 50 minutes
        s.record_request(k * 0.5, RequestClass.INTERACTIVE)
    assert s.rate(3000.0) == pytest.approx(2.0, rel=0.01)
    assert s.view().rate_warm(3000.0, 3600.0) == pytest.approx(2.0 * (1 - math.exp(-3000 / 3600)),
                                                               rel=0.02)


def test_count_decays_by_e_per_time_constant_and_not_backwards() -> None:
    s = VersionStats(tau_s=600.0)
    s.record_request(100.0, RequestClass.BACKGROUND)
    v = s.view()
    assert v.count(700.0, 600.0) == pytest.approx(math.exp(-1.0))
    assert v.count(50.0, 600.0) == 1.0  # a clock that goes back decays nothing
    assert decayed(0.0, 0.0, 1e9, 600.0) == 0.0
    s.record_request(90.0, RequestClass.INTERACTIVE)  # late event: counted, not undecayed
    assert s.view().decayed_count == 2.0 and s.view().last_access == 100.0


def test_class_mix_error_rate_and_in_flight() -> None:
    s = VersionStats()
    for cls in (RequestClass.INTERACTIVE, RequestClass.INTERACTIVE, RequestClass.BACKGROUND,
                RequestClass.CANARY):
        s.record_request(1.0, cls)
        s.start_request()
    assert s.in_flight == 4
    assert s.view().class_shares() == (0.5, 0.25, 0.25)
    s.record_load()
    for k in range(4):
        s.finish_request(error=k == 0)
    assert s.in_flight == 0
    assert s.view().error_rate_after_load() == 0.25
    s.record_load()
    assert s.view().error_rate_after_load() == 0.0 and s.view().loads == 2
    assert StatsView().class_shares() == (1.0, 0.0, 0.0)
    assert StatsView().idle_s(5.0) == math.inf


def test_shipped_yaml_equals_the_built_in_defaults() -> None:
    assert load_config(ROOT / "config" / "policy.yaml") == PolicyConfig()


def test_partial_yaml_overrides_only_what_it_names(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(
        "score:\n  weights: {qps: 1.0}\n  priority_values: {gold: 0.9}\n"
        "never_evict:\n  priorities: [platinum, gold]\nevict:\n  idle_minutes: 30\n"
    )
    cfg = load_config(p)
    assert cfg.score.weights.qps == 1.0 and cfg.score.weights.ttft_penalty == 0.25
    assert cfg.score.priority_values[Priority.GOLD] == 0.9
    assert cfg.score.priority_values[Priority.PLATINUM] == 1.0
    assert cfg.protected_priorities() == {Priority.PLATINUM, Priority.GOLD}
    assert cfg.evict.idle_minutes == 30


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(PolicyConfigError) as err:
        config_from_mapping({
            "score": {"rate_window_s": -1, "weights": {"qps": "high", "bogus": 1},
                      "class_weights": {"urgent": 1}},
            "never_evict": {"in_flight": False, "priorities": ["diamond"], "hot_share_canary": 2},
            "placement": {"min_hot_replicas": 5, "max_hot_replicas": 2},
            "surprise": 1,
        })
    text = "\n".join(err.value.problems)
    for needle in ("score.rate_window_s", "score.weights.qps", "score.weights.bogus",
                   "score.class_weights.urgent", "never_evict.in_flight",
                   "unknown priority 'diamond'", "never_evict.hot_share_canary",
                   "min_hot_replicas (5) > max_hot_replicas", "policy.surprise"):
        assert needle in text, needle
    assert len(err.value.problems) == 9


def test_not_yaml_is_a_config_error(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("score: [unclosed\n")
    with pytest.raises(PolicyConfigError, match="not valid YAML"):
        load_config(p)


def test_mean_gap_is_a_smoothed_inter_arrival_time() -> None:
    from loraplane.policy.stats import GAP_SMOOTHING

    s = VersionStats()
    s.record_request(10.0, RequestClass.INTERACTIVE)
    assert s.view().mean_gap_s == 0.0  # unknown after one request
    s.record_request(30.0, RequestClass.INTERACTIVE)
    assert s.view().mean_gap_s == pytest.approx(20.0)  # the first gap
    s.record_request(130.0, RequestClass.BACKGROUND)
    assert s.view().mean_gap_s == pytest.approx((1 - GAP_SMOOTHING) * 20.0 + GAP_SMOOTHING * 100.0)


def test_out_of_order_requests_are_not_gaps_and_zero_means_unknown() -> None:
    from loraplane.policy.model import RequestClass
    from loraplane.policy.stats import VersionStats

    st = VersionStats()
    st.record_request(100.0, RequestClass.INTERACTIVE)
    st.record_request(110.0, RequestClass.INTERACTIVE)
    assert st.mean_gap_s == 10.0  # the first gap is taken as is
    st.record_request(105.0, RequestClass.BACKGROUND)  # late batch from another gateway
    assert st.mean_gap_s == 10.0 and st.last_access == 110.0
    restored = VersionStats()  # a row saved before mean_gap_s existed: requests, no gap
    restored.requests, restored.last_access = 40, 200.0
    restored.record_request(230.0, RequestClass.INTERACTIVE)
    assert restored.mean_gap_s == 30.0  # unknown gap: the new one is taken as is
