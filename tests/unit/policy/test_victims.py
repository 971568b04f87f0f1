"""On-demand HOT victims (``loraplane.policy.victims``): pure, clock passed in."""

from __future__ import annotations

from dataclasses import replace

import pytest

from loraplane.policy.config import PolicyConfig
from loraplane.policy.cost import Bandwidths
from loraplane.policy.model import Priority, RequestClass
from loraplane.policy.plan import Reason
from loraplane.policy.score import hot_terms
from loraplane.policy.snapshot import VersionMeta
from loraplane.policy.stats import StatsView, VersionStats
from loraplane.policy.victims import HotMember, hot_victim

NOW = 1_000_000.0
CFG = PolicyConfig()


def stats(*ages_s: float, klass: RequestClass = RequestClass.BACKGROUND) -> StatsView:
    """Statistics of requests that arrived ``ages_s`` seconds before NOW."""
    s = VersionStats(CFG.score.rate_window_s, CFG.score.warm_rate_window_s)
    for age in sorted(ages_s, reverse=True):
        s.record_request(NOW - age, klass)
    return s.view()


def member(vid: str, st: StatsView | None = None, *, last_used: float | None = None,
           **kw: object) -> HotMember:
    st = st if st is not None else StatsView()
    meta = VersionMeta(vid, "acme", "tiny", Priority.BRONZE, 1 << 20)
    if last_used is None:
        last_used = st.last_access if st.last_access is not None else NOW - 10_000
    return HotMember(meta, st, last_used, **kw)  # type: ignore[arg-type]


def test_coolest_by_the_policy_heat_goes_first() -> None:
    busy_stream = stats(*range(1, 60))  # 59 requests over the last minute
    one = stats(30)
    members = [member("hot", busy_stream), member("cool", one), member("warmish", stats(5, 20))]
    choice = hot_victim(members, NOW, CFG)
    assert choice.victim == "cool" and choice.reason is Reason.CAPACITY
    # the ranking is the cache manager's HOT heat, computed by the same function
    expected = hot_terms(members[1].meta, one, NOW, CFG.score, Bandwidths())
    assert choice.heat == pytest.approx(expected.heat)


def test_ties_go_to_the_least_recently_used_then_the_id() -> None:
    a = member("a", stats(100), last_used=NOW - 100)
    b = member("b", stats(100), last_used=NOW - 100)
    assert hot_victim([b, a], NOW, CFG).victim == "a"
    # equal heat (never requested, both idle by the demotion predicate): older use first
    x, y = member("x", last_used=NOW - 5), member("y", last_used=NOW - 50)
    choice = hot_victim([x, y], NOW, CFG)
    assert (choice.victim, choice.reason) == ("y", Reason.IDLE)


def test_idle_or_erroring_versions_lead_whatever_their_heat() -> None:
    idle_s = CFG.demote.idle_minutes * 60.0
    old_but_busy_once = stats(*(idle_s + 10 + i for i in range(200)))  # many, long ago
    fresh = stats(1)
    choice = hot_victim([member("fresh", fresh), member("old", old_but_busy_once)], NOW, CFG)
    assert (choice.victim, choice.reason) == ("old", Reason.IDLE)
    superseded = member("sup", stats(*range(1, 30)))
    superseded = replace(superseded, meta=replace(superseded.meta, superseded=True))
    choice = hot_victim([member("fresh", fresh), superseded], NOW, CFG)
    assert (choice.victim, choice.reason) == ("sup", Reason.SUPERSEDED)


def test_never_busy_never_pinned() -> None:
    members = [member("busy", busy=True), member("pinned", pinned=True)]
    choice = hot_victim(members, NOW, CFG)
    assert choice.victim is None
    assert "1 busy" in choice.why_none and "1 pinned" in choice.why_none
    members.append(member("free", stats(*range(1, 100))))
    assert hot_victim(members, NOW, CFG).victim == "free"


def test_protected_only_when_protected_and_pinned_versions_hold_every_slot() -> None:
    canary = member("canary", stats(300), protected=True)  # cooler than the plain one
    plain = member("plain", stats(*range(1, 50)))
    assert hot_victim([canary, plain], NOW, CFG).victim == "plain"
    # the plain one is busy: wait for it rather than demote the canary
    choice = hot_victim([canary, replace(plain, busy=True)], NOW, CFG)
    assert choice.victim is None and "1 protected" in choice.why_none
    # only protected and pinned versions left: the coolest protected one overflows
    platinum = member("platinum", stats(*range(1, 10)), protected=True)
    pinned_plain = replace(plain, pinned=True)
    choice = hot_victim([canary, platinum, pinned_plain], NOW, CFG)
    assert (choice.victim, choice.reason) == ("canary", Reason.PROTECTION_OVERFLOW)
    # protection also comes from the version's own metadata (canary / protected priority)
    meta_canary = replace(plain, meta=replace(plain.meta, canary=True))
    other = member("other", stats(*range(1, 80)))
    assert hot_victim([meta_canary, other], NOW, CFG).victim == "other"


def test_protected_but_idle_loses_its_hot_protection_never_requested_does_not() -> None:
    idle_s = CFG.demote.idle_minutes * 60.0
    long_idle = member("idle-canary", stats(idle_s + 60), protected=True)
    warmed = member("warmed-canary", protected=True)  # loaded on purpose, no request yet
    plain = member("plain", stats(*range(1, 50)))
    choice = hot_victim([warmed, long_idle, plain], NOW, CFG)
    assert (choice.victim, choice.reason) == ("idle-canary", Reason.IDLE)
    assert hot_victim([warmed, plain], NOW, CFG).victim == "plain"


def test_deterministic_for_the_same_members_and_clock() -> None:
    members = [member(f"v{i}", stats(*range(i + 1, 3 * i + 2))) for i in range(8)]
    first = hot_victim(members, NOW, CFG)
    assert all(hot_victim(list(reversed(members)), NOW, CFG) == first for _ in range(3))


def test_the_cache_managers_keep_order_ranks_before_the_heat() -> None:
    # by heat "cool" would go; the cache manager's ranking keeps it and drops "hot"
    members = [member("hot", stats(*range(1, 60)), keep=-0.75),
               member("cool", stats(30), keep=0.0),
               member("warmish", stats(5, 20), keep=-0.25)]
    assert hot_victim(members, NOW, CFG).victim == "hot"
    # a member not ranked yet (loaded since the last order) goes after every ranked one
    fresh = member("fresh", stats(1000))
    assert hot_victim([fresh, *members], NOW, CFG).victim == "hot"
    assert hot_victim([fresh, members[1]], NOW, CFG).victim == "cool"
    # the demotion predicates still lead: an idle version goes whatever its keep
    idle = member("idle", stats(CFG.demote.idle_minutes * 60 + 10), keep=1.0)
    choice = hot_victim([*members, idle], NOW, CFG)
    assert (choice.victim, choice.reason) == ("idle", Reason.IDLE)
