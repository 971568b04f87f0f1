"""The adaptive policy's hot loop writes the shadow steps out inline (``on_request``); the
methods ``_shadow_hot`` / ``_shadow_warm`` are the one implementation they must equal. Both
paths run on the same traces here and must take every victim alike."""

from __future__ import annotations

import csv
import io
from collections.abc import Container, Mapping
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loraplane.policy.config import PolicyConfig
from loraplane.policy.heat import HeatPolicy
from loraplane.policy.online import OnlineContext
from loraplane.sim.cost import CostModel
from loraplane.sim.gentd26 import REQUEST_FILE, import_gentd26
from loraplane.sim.simulator import Capacities, SimResult, simulate
from loraplane.sim.trace import Trace, TraceRow, format_rows, parse_rows, read_trace
from tests.support.native import interpreted
from tests.unit.policy.test_adaptive import _trace, traces

# the interpreted class: a subclass sets _INLINE_SHADOWS (test_native.py: compiled == this)
AdaptiveHeatOnline = interpreted("loraplane.policy.adaptive").AdaptiveHeatOnline

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"
MB = 1_000_000
GIB = 2**30


class _Inline(AdaptiveHeatOnline):
    """The shipped path, recording every victim."""

    def __init__(self, ctx: OnlineContext, cfg: PolicyConfig) -> None:
        super().__init__(ctx, cfg)
        self.victims: list[tuple[str, int, int | None]] = []
        self.leaders: list[tuple[str, ...]] = []

    def hot_victim(self, g: int, now: float, busy: Mapping[int, float]) -> int | None:
        victim = super().hot_victim(g, now, busy)
        self.victims.append(("hot", g, victim))
        self.leaders.append((self.hot_expert(g),))
        return victim

    def warm_victim(self, w: int, now: float, hot: Container[int]) -> int | None:
        victim = super().warm_victim(w, now, hot)
        self.victims.append(("warm", w, victim))
        self.leaders.append((self.warm_expert(w),))
        return victim


class _Reference(_Inline):
    """Every request's shadow steps through the methods."""

    _INLINE_SHADOWS = False


class _Policy(HeatPolicy):
    def __init__(self, online: type[_Inline], cfg: PolicyConfig | None = None) -> None:
        super().__init__(cfg)
        self.kind = online
        self.last: _Inline | None = None

    def online(self, ctx: OnlineContext) -> _Inline:  # type: ignore[override]
        self.last = self.kind(ctx, self.config)
        return self.last


def _both(trace: Trace, caps: Capacities) -> tuple[tuple[SimResult, _Inline], ...]:
    out = []
    for kind in (_Inline, _Reference):
        policy = _Policy(kind)
        result = simulate(trace, policy, caps, CostModel())
        assert policy.last is not None
        out.append((result, policy.last))
    return tuple(out)


def _same(trace: Trace, caps: Capacities) -> int:
    (a, pa), (b, pb) = _both(trace, caps)
    assert pa.victims == pb.victims
    assert pa.leaders == pb.leaders
    assert (a.gpu_hits, a.host_hits, a.cold_starts, a.ttft_ms) == (
        b.gpu_hits, b.host_hits, b.cold_starts, b.ttft_ms)
    assert pa.protection_overflows == pb.protection_overflows
    return len(pa.victims)


@settings(max_examples=40, deadline=None)
@given(rows=traces(), slots=st.integers(min_value=1, max_value=4),
       room=st.sampled_from([1, 2, 5]), workers=st.integers(min_value=1, max_value=3))
def test_inline_and_method_shadows_take_the_same_victims(
    rows: list[TraceRow], slots: int, room: int, workers: int
) -> None:
    # host bytes: a full HOT tier plus `room` more of the largest (40 MB) adapter
    _same(_trace(rows), Capacities(slots, (slots + room) * 40 * MB, workers))


@cache
def _reference(name: str) -> Trace:
    if name == "gentd26":
        rows = import_gentd26(TRACES / "gentd26" / REQUEST_FILE)
        return parse_rows(csv.DictReader(io.StringIO("".join(format_rows(rows)))), name)
    return read_trace(TRACES / f"{name}.csv.gz")


@pytest.mark.parametrize(("name", "caps", "leaders"), [
    # the synthetic conversation trace: heat leads both tiers; GenTD26 (real traffic): LRU
    # and reuse lead (services/policy/README.md) — between them every expert of each tier
    ("conv-1h", Capacities(gpu_slots=8, host_bytes=10 * GIB, workers=4), {"heat"}),
    ("gentd26", Capacities(gpu_slots=16, host_bytes=8 * 10**9, workers=1), {"lru", "reuse"}),
])
def test_inline_and_method_shadows_agree_on_the_reference_traces(
    name: str, caps: Capacities, leaders: set[str]
) -> None:
    (a, pa), (b, pb) = _both(_reference(name), caps)
    assert len(pa.victims) > 1000
    assert pa.victims == pb.victims and pa.leaders == pb.leaders
    assert (a.gpu_hits, a.host_hits, a.cold_starts, a.ttft_ms) == (
        b.gpu_hits, b.host_hits, b.cold_starts, b.ttft_ms)
    assert leaders <= {lead for (lead,) in pa.leaders}
