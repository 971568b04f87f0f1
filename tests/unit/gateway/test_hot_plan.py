"""The request path's HOT shortcut (``Gateway._hot``) plans what ``decide`` plans.

``Gateway._plan`` routes a version HOT on some worker without building every worker's
option; these cases put the shortcut beside ``decide`` over ``worker_options`` on the same
views: HOT on none, one or several workers, loads from this gateway and from the reports,
ties, excluded workers, warm and cold copies, and engine id 0.
"""

from __future__ import annotations

import itertools
import random
import time

import pytest
from prometheus_client import CollectorRegistry

from loraplane.gateway.app import build_gateway
from loraplane.gateway.budget import (
    INTERACTIVE,
    ClassBudget,
    ColdPolicy,
    FailFast,
    Route,
    decide,
)
from loraplane.gateway.catalog import VersionInfo
from loraplane.gateway.errors import NoWorker
from loraplane.gateway.metrics import GatewayMetrics
from loraplane.gateway.placement import worker_options
from loraplane.gateway.request_path import Gateway
from loraplane.gateway.settings import GatewaySettings
from loraplane.v1 import common_pb2, events_pb2

from .test_emit import Recorder

TIERS = (None, common_pb2.TIER_HOT, common_pb2.TIER_WARM)
BUDGET = ClassBudget(budget_ms=300, on_cold=ColdPolicy.DEGRADE)


def _gateway() -> Gateway:
    s = GatewaySettings(bootstrap=False, consume_events=False, metrics_port=0)
    gw = build_gateway(s, Recorder(), metrics=GatewayMetrics(CollectorRegistry()))
    gw._monotonic = lambda: 100.0  # type: ignore[method-assign]
    return gw


def _report(gw: Gateway, worker_id: str, engine_id: int, tier: int | None,
            reported: int) -> None:
    st = events_pb2.WorkerState(worker_id=worker_id, base_models=["tiny"],
                                grpc_address=f"127.0.0.1:{1000 + int(worker_id[1:])}",
                                seq=1, ready=True)
    if tier is not None:
        st.placements.add(engine_id=engine_id, tier=tier, in_flight=reported)
    else:
        st.placements.add(engine_id=engine_id + 1000, tier=common_pb2.TIER_HOT,
                          in_flight=reported)
    gw.placement.apply_state(st, time.time())


def _info(engine_id: int) -> VersionInfo:
    return VersionInfo("acme", "support", "v1", "tiny", engine_id, "0" * 64, 8,
                       "s3://b/x/", 1000)


async def _both(gw: Gateway, info: VersionInfo, exclude: frozenset[str]) -> None:
    workers = gw.placement.routable("tiny")
    options = worker_options(workers, gw.local, info.engine_id, exclude=exclude)
    expected = decide(options, BUDGET, BUDGET.budget_ms - 50.0, gw.placement.estimates())
    if isinstance(expected.plan, FailFast):  # every worker excluded
        with pytest.raises(NoWorker):
            await gw._plan(info, BUDGET, INTERACTIVE, 100.0 - 0.05, exclude)
        return
    target = await gw._plan(info, BUDGET, INTERACTIVE, 100.0 - 0.05, exclude)
    if isinstance(expected.plan, Route):
        assert (target.worker.worker_id, target.tier, target.cold_budget_ms,
                target.starts_load, target.use_base) == (
            expected.plan.worker_id, expected.plan.tier, expected.plan.cold_budget_ms,
            expected.plan.starts_load, False)
    else:  # Degrade: the base model on decide's worker
        assert target.use_base and target.worker.worker_id == expected.plan.worker_id


@pytest.mark.parametrize("engine_id", [7, 0])
async def test_hot_shortcut_plans_what_decide_plans(engine_id: int) -> None:
    rng = random.Random(18)
    checked = 0
    for n, tiers in itertools.chain.from_iterable(
        ((n, t) for t in itertools.product(TIERS, repeat=n)) for n in (1, 2, 3)
    ):
        for _ in range(4):
            gw = _gateway()
            ids = [f"w{i}" for i in range(n)]
            for wid, tier in zip(ids, tiers, strict=True):
                _report(gw, wid, engine_id, tier, rng.choice((0, 0, 1, 3)))
                for _ in range(rng.choice((0, 1, 2, 3))):
                    gw.local.begin(wid)
            exclude = frozenset(w for w in ids if rng.random() < 0.25)
            await _both(gw, _info(engine_id), exclude)
            checked += 1
    assert checked == 4 * (3 + 9 + 27)


async def test_hot_shortcut_takes_the_least_loaded_then_the_smallest_id() -> None:
    gw = _gateway()
    for wid, reported in (("w2", 0), ("w1", 0), ("w3", 5)):
        _report(gw, wid, 7, common_pb2.TIER_HOT, reported)
    target = await gw._plan(_info(7), BUDGET, INTERACTIVE, 100.0, frozenset())
    assert target.worker.worker_id == "w1"  # a tie on load: the smaller id
    gw.local.begin("w1")
    target = await gw._plan(_info(7), BUDGET, INTERACTIVE, 100.0, frozenset())
    assert target.worker.worker_id == "w2"
    target = await gw._plan(_info(7), BUDGET, INTERACTIVE, 100.0, frozenset({"w2"}))
    assert target.worker.worker_id == "w1"
    assert (target.tier, target.cold_budget_ms) == (common_pb2.TIER_HOT, 300)
