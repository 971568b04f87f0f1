"""The heat score (table tests) and the never-evict / demotion predicates."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from loraplane.policy.config import EvictConfig, NeverEvictConfig, PolicyConfig
from loraplane.policy.cost import MB, Bandwidths
from loraplane.policy.model import Priority, RequestClass, Tier
from loraplane.policy.plan import Reason
from loraplane.policy.predicates import (
    Protection,
    demotion_reason,
    eviction_reason,
    hot_share_limit,
    max_pins,
    protection_of,
)
from loraplane.policy.score import hot_terms, penalty_s, terms, warm_terms, warm_value

from .helpers import meta, requested

CFG = PolicyConfig()
SC = CFG.score
BW = Bandwidths()
NOW = 1000.0


def test_terms_is_the_documented_weighted_sum() -> None:
    t = terms(rate=SC.qps_ref * 2, penalty=SC.penalty_ref_s * 3, priority_value=0.6,
              warmup=1.0, cfg=SC)
    assert (t.qps, t.ttft_penalty, t.tenant_priority, t.scheduled_warmup) == pytest.approx(
        (2.0, 6.0, 0.6, 1.0))
    assert t.heat == pytest.approx(0.45 * 2 + 0.25 * 6 + 0.20 * 0.6 + 0.10 * 1.0)


@pytest.mark.parametrize(
    ("reload_s", "shares", "expected"),
    [
        (0.05, (1.0, 0.0, 0.0), 0.0),              # interactive within its 0.1 s load budget
        (0.60, (1.0, 0.0, 0.0), 0.5),              # 0.5 s over budget, weight 1
        (20.0, (0.0, 1.0, 0.0), 0.0),              # background within 30 s
        (40.0, (0.0, 1.0, 0.0), 0.05 * 10.0),      # background over budget, weight 0.05
        (0.60, (0.5, 0.5, 0.0), 0.25),             # a mix
        (0.01, (0.0, 0.0, 1.0), 0.01),             # canary: any load is over budget
    ],
)
def test_penalty_counts_only_time_over_each_class_budget(
    reload_s: float, shares: tuple[float, float, float], expected: float
) -> None:
    assert penalty_s(reload_s, shares, SC) == pytest.approx(expected)


def test_more_traffic_more_heat_and_recent_beats_old() -> None:
    busy = requested([NOW - 60.0 * k for k in range(10)])
    quiet = requested([NOW - 60.0])
    old = requested([NOW - 3000.0])
    m = meta("t/a@v1")
    h = [hot_terms(m, s, NOW, SC, BW).heat for s in (busy, quiet, old)]
    assert h[0] > h[1] > h[2] > 0


def test_priority_orders_equally_used_versions() -> None:
    s = requested([NOW - 100.0])
    heats = [hot_terms(meta("t/a@v1", priority=p), s, NOW, SC, BW).heat for p in Priority]
    assert heats == sorted(heats, reverse=True) and heats[0] > heats[-1]


def test_warm_value_prefers_large_interactive_versions_over_background_at_equal_rate() -> None:
    big = meta("t/big@v1", size_mb=300)
    inter = requested([NOW - 100.0, NOW - 50.0], RequestClass.INTERACTIVE)
    bg = requested([NOW - 100.0, NOW - 50.0], RequestClass.BACKGROUND)
    assert warm_terms(big, inter, NOW, SC, BW).ttft_penalty > 0
    assert warm_terms(big, bg, NOW, SC, BW).ttft_penalty == 0  # 30 s budget
    assert warm_value(big, inter, NOW, SC, BW) > 3 * warm_value(big, bg, NOW, SC, BW)
    # HOT reloads come from WARM: tens of ms, within every budget, so no penalty there
    assert BW.load_s(300 * MB, Tier.WARM) < 0.1
    assert hot_terms(big, inter, NOW, SC, BW).ttft_penalty == 0


def test_load_cost_grows_with_size_and_tier() -> None:
    assert BW.load_s(10 * MB, Tier.HOT) == 0
    assert BW.load_s(10 * MB, Tier.WARM) < BW.load_s(10 * MB, Tier.COLD)
    assert BW.load_s(10 * MB, Tier.COLD) < BW.load_s(300 * MB, Tier.COLD)
    assert BW.load_s(300 * MB, Tier.COLD) == pytest.approx(0.05 + 1.5 + 0.3 + 0.025 + 0.015)


@pytest.mark.parametrize(
    ("canary", "priority", "expected"),
    [
        (True, Priority.BRONZE, Protection.CANARY),
        (True, Priority.PLATINUM, Protection.CANARY),
        (False, Priority.PLATINUM, Protection.PRIORITY),
        (False, Priority.GOLD, None),
    ],
)
def test_protection(canary: bool, priority: Priority, expected: Protection | None) -> None:
    assert protection_of(meta("t/a@v1", canary=canary, priority=priority), CFG) is expected


def test_protection_is_configurable() -> None:
    cfg = PolicyConfig(never_evict=NeverEvictConfig(active_canary=False,
                                                   priorities=(Priority.GOLD,)))
    assert protection_of(meta("t/a@v1", canary=True), cfg) is None
    assert protection_of(meta("t/a@v1", priority=Priority.GOLD), cfg) is Protection.PRIORITY


@pytest.mark.parametrize(("slots", "limit"), [(1, 0), (2, 0), (8, 1), (16, 2), (64, 8)])
def test_hot_share_leaves_room(slots: int, limit: int) -> None:
    assert hot_share_limit(Protection.PRIORITY, slots, CFG) == limit
    assert max_pins(slots) == slots - 1
    generous = PolicyConfig(never_evict=NeverEvictConfig(hot_share_priority=1.0))
    assert hot_share_limit(Protection.PRIORITY, slots, generous) == slots - 1


def test_demotion_and_eviction_predicates() -> None:
    m = meta("t/a@v1")
    plat = meta("t/p@v1", priority=Priority.PLATINUM)
    assert demotion_reason(m, requested([NOW - 59 * 60]), NOW, CFG) is None
    assert demotion_reason(m, requested([NOW - 61 * 60]), NOW, CFG) is Reason.IDLE
    # protection does not stop idle demotion (it only keeps the version WARM)
    assert demotion_reason(plat, requested([NOW - 61 * 60]), NOW, CFG) is Reason.IDLE
    # never requested: idle, unless protected or warmed up on purpose
    assert demotion_reason(m, requested([]), NOW, CFG) is Reason.IDLE
    assert demotion_reason(plat, requested([]), NOW, CFG) is None
    assert demotion_reason(meta("t/w@v1", warmup=1.0), requested([]), NOW, CFG) is None
    # error rate after load: 3 of 20 > 2 %, but 1 of 10 is too few requests to judge
    assert demotion_reason(m, requested([NOW], errors=3, finished=20), NOW, CFG) is Reason.ERROR_RATE
    assert demotion_reason(m, requested([NOW], errors=1, finished=10), NOW, CFG) is None
    # eviction without pressure is off by default, on when configured
    assert eviction_reason(m, requested([0.0]), 1e6, CFG) is None
    cfg = replace(CFG, evict=EvictConfig(idle_minutes=10))
    assert eviction_reason(m, requested([0.0]), 11 * 60, cfg) is Reason.IDLE
    assert eviction_reason(plat, requested([0.0]), 11 * 60, cfg) is None


def test_liveness_discounts_a_stream_idle_for_many_of_its_gaps() -> None:
    from loraplane.policy.score import liveness

    cfg = PolicyConfig().score
    assert liveness(0.0, 2.0, cfg) == 1.0  # right after a request
    assert liveness(500.0, 0.0, cfg) == 1.0  # gap unknown (fewer than two requests)
    assert liveness(500.0, 2.0, replace(cfg, liveness_scale=0.0)) == 1.0  # off
    half = math.log(1.0 / cfg.liveness_odds) / cfg.liveness_scale  # gaps idle for a factor 1/2
    assert liveness(half * 10.0, 10.0, cfg) == pytest.approx((1 + cfg.liveness_odds) / 2)
    values = [liveness(idle, 10.0, cfg) for idle in (1.0, 10.0, 100.0, 1000.0)]
    assert values == sorted(values, reverse=True) and values[-1] < 1e-9


def test_a_burst_that_ended_ranks_below_a_steady_stream_with_a_smaller_count() -> None:
    cfg = PolicyConfig().score
    burst = requested([1000.0 + k for k in range(30)])  # 30 requests 1 s apart, then silence
    steady = requested([600.0, 900.0, 1200.0, 1500.0])  # every 5 minutes, still going
    now = 1560.0
    m = meta("t/a@v1")
    assert burst.count(now, cfg.rate_window_s) > steady.count(now, cfg.rate_window_s)
    assert hot_terms(m, burst, now, cfg, Bandwidths()).heat < hot_terms(
        m, steady, now, cfg, Bandwidths()).heat
    off = replace(cfg, liveness_scale=0.0)  # a decayed count alone keeps the burst
    assert hot_terms(m, burst, now, off, Bandwidths()).heat > hot_terms(
        m, steady, now, off, Bandwidths()).heat
