"""Several gateway processes on one host: each takes its share of the per-worker flow caps,
so that together they never admit more to a worker than one process would (pure)."""

from __future__ import annotations

import itertools

import pytest
from pydantic import ValidationError

from loraplane.gateway.flow import FlowConfig, FlowQueue
from loraplane.gateway.scale import share, split_flow
from loraplane.gateway.settings import GatewaySettings
from loraplane.shared.ordering import BANDS, band
from loraplane.v1 import common_pb2 as c

PLATINUM_INTERACTIVE = band(c.REQUEST_CLASS_INTERACTIVE, c.PRIORITY_PLATINUM)
GOLD_INTERACTIVE = band(c.REQUEST_CLASS_INTERACTIVE, c.PRIORITY_GOLD)
BRONZE_BACKGROUND = band(c.REQUEST_CLASS_BACKGROUND, c.PRIORITY_BRONZE)
CANARY = band(c.REQUEST_CLASS_CANARY, c.PRIORITY_SILVER)


def admitted(config: FlowConfig, plan: list[int], running: list[int] | None = None) -> list[int]:
    """Fill one worker of one process: requests of the bands of ``plan`` in that order, each
    admitted while it fits (``running``: what already runs); the admitted count per band."""
    queue: FlowQueue[str] = FlowQueue(config)
    running = list(running or [0] * BANDS)
    got = [0] * BANDS
    for b in plan:
        while queue.fits(b, running):
            running[b] += 1
            got[b] += 1
    return got


def total(config: FlowConfig, processes: int, plan: list[int],
          running: list[int] | None = None) -> list[int]:
    per = [admitted(split_flow(config, processes, i), plan, running) for i in range(processes)]
    return [sum(p[b] for p in per) for b in range(BANDS)]


def test_shares_add_up_and_keep_their_order() -> None:
    for n in range(1, 9):
        for t in range(40):
            shares = [share(t, n, i) for i in range(n)]
            assert sum(shares) == t and max(shares) - min(shares) <= 1
            assert all(share(t + 1, n, i) >= share(t, n, i) for i in range(n))
    with pytest.raises(ValueError):
        share(8, 2, 2)


def test_defaults_split_in_two() -> None:
    one = FlowConfig()
    for i in (0, 1):
        mine = split_flow(one, 2, i)
        assert (mine.max_in_flight_per_worker, mine.platinum_reserve, mine.interactive_reserve,
                mine.background_slots_with_interactive) == (4, 1, 1, 1)
        assert mine.weights == one.weights and mine.max_wait_s == one.max_wait_s
    assert split_flow(one, 1, 0) is one


ORDERS = [
    # every room filled from the worst band up, then from the best down, and mixed
    [BRONZE_BACKGROUND, CANARY, GOLD_INTERACTIVE, PLATINUM_INTERACTIVE],
    [PLATINUM_INTERACTIVE, GOLD_INTERACTIVE, CANARY, BRONZE_BACKGROUND],
    [GOLD_INTERACTIVE, BRONZE_BACKGROUND, PLATINUM_INTERACTIVE],
    [BRONZE_BACKGROUND], [GOLD_INTERACTIVE], [PLATINUM_INTERACTIVE],
]


@pytest.mark.parametrize("limit,platinum,interactive,bg", [
    (8, 2, 2, 2), (9, 2, 3, 3), (16, 3, 2, 5), (12, 0, 0, 4), (7, 1, 1, 0)])
def test_n_processes_never_admit_more_than_one(limit: int, platinum: int, interactive: int,
                                               bg: int) -> None:
    one = FlowConfig(max_in_flight_per_worker=limit, platinum_reserve=platinum,
                     interactive_reserve=interactive, background_slots_with_interactive=bg,
                     others_slots_with_platinum=bg)
    for n in (2, 3):
        if limit - platinum - interactive < n or 0 < bg < n:
            with pytest.raises(ValueError, match="cannot be split"):
                split_flow(one, n, n - 1)
            continue
        for plan in ORDERS:
            alone = admitted(one, plan)
            together = total(one, n, plan)
            # the same total in flight and the same per band: each reserve holds across them
            assert together == alone, (n, plan)
        # while interactive requests run (one on the worker, seen by every process: the
        # worst case), background beside them stays within background_slots_with_interactive
        running = [0] * BANDS
        running[GOLD_INTERACTIVE] = 1
        bg_alone = admitted(one, [BRONZE_BACKGROUND], running)[BRONZE_BACKGROUND]
        bg_together = total(one, n, [BRONZE_BACKGROUND], running)[BRONZE_BACKGROUND]
        assert bg_together <= bg_alone
        if bg:
            assert bg_together == bg
        # and beside a platinum request, every other band together within
        # others_slots_with_platinum
        running = [0] * BANDS
        running[PLATINUM_INTERACTIVE] = 1
        plan = [GOLD_INTERACTIVE, BRONZE_BACKGROUND]
        others_alone = sum(admitted(one, plan, running)[b] for b in plan)
        others_together = sum(total(one, n, plan, running)[b] for b in plan)
        assert others_together <= others_alone
        if bg:
            assert others_together == bg


def test_no_limit_stays_no_limit() -> None:
    one = FlowConfig(max_in_flight_per_worker=0)
    for i in (0, 1):
        assert split_flow(one, 2, i).max_in_flight_per_worker == 0
        assert split_flow(one, 2, i).background_slots_with_interactive == 1


def test_settings_split_instance_id_and_reuse_port() -> None:
    alone = GatewaySettings()
    assert (alone.processes, alone.reuse_port, alone.producer_id) == (1, False, "gateway/gateway-0")
    assert alone.process_flow() == alone.flow
    second = GatewaySettings(processes=2, process_index=1)
    assert second.reuse_port and second.producer_id == "gateway/gateway-1"
    assert second.process_flow().max_in_flight_per_worker == 4
    assert GatewaySettings(processes=2, instance_id="edge-a").producer_id == "gateway/edge-a"
    with pytest.raises(ValidationError, match="process_index 2 out of 0..1"):
        GatewaySettings(processes=2, process_index=2)
    with pytest.raises(ValidationError, match="background_slots_with_interactive"):
        GatewaySettings(processes=3, process_index=2)  # the default 2 background slots


def test_shares_of_every_small_config_add_up() -> None:
    for limit, platinum, interactive in itertools.product(range(2, 11), range(3), range(3)):
        if limit - platinum - interactive < 2:
            continue
        one = FlowConfig(max_in_flight_per_worker=limit, platinum_reserve=platinum,
                         interactive_reserve=interactive, background_slots_with_interactive=2)
        parts = [split_flow(one, 2, i) for i in (0, 1)]
        assert sum(p.max_in_flight_per_worker for p in parts) == limit
        assert sum(p.platinum_reserve for p in parts) == platinum
        assert sum(p.interactive_reserve for p in parts) == interactive
        assert all(p.platinum_reserve >= 0 and p.interactive_reserve >= 0 for p in parts)
