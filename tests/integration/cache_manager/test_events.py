"""The cache manager over the real broker, driven by published worker reports and heat.

Each test publishes real ``WorkerReport`` / ``HeatBatch`` / lifecycle events on Tansu,
answers the commands the way a worker would (``AdapterLoaded`` / ``AdapterEvicted``),
and asserts the commands the cache-manager process publishes on ``cache.commands``.
"""

from __future__ import annotations

import asyncio
import time

from loraplane.v1 import cache_pb2, common_pb2
from tests.support import eventgen as ev
from tests.support.cache_manager import (
    Bus,
    Heartbeat,
    Launcher,
    Registry,
    Responder,
    describe,
    is_cmd,
)

HOT, WARM = common_pb2.TIER_HOT, common_pb2.TIER_WARM


async def test_burst_on_cold_adapter_leads_to_load_and_read_api_explains(
    bus: Bus, registry: Registry, managers: Launcher, unique: str
) -> None:
    a = await registry.version("support")
    w = ev.WorkerSpec(f"w1-{unique}", slots=2)
    hb = await Heartbeat(bus, w).start()
    m = managers.start()
    await m.wait_planning()
    assert bus.commands == []  # nothing requested, nothing loaded

    t0 = time.monotonic()
    await bus.publish(ev.heat(a, 20, time.time()))
    [cmd] = await bus.wait_for(is_cmd("load_hot", a, w.worker_id), timeout=10)
    latency = time.monotonic() - t0
    assert cmd.load.engine_id > 0 and cmd.load.artifact_uri.endswith("/v1/")
    assert cmd.deadline.ToSeconds() > cmd.issued_at.ToSeconds()
    await bus.publish(ev.answer(cmd, time.time()))
    w.held.append(ev.Held(a, engine_id=cmd.load.engine_id))

    for _ in range(50):
        if await m.placement(a) == [(w.worker_id, HOT)]:
            break
        await asyncio.sleep(0.1)
    assert await m.placement(a) == [(w.worker_id, HOT)]
    ch, stub = m.stub()
    async with ch:
        decisions = await stub.ListDecisions(cache_pb2.ListDecisionsRequest(
            tenant_id=registry.tenant, adapter_name="support"), timeout=5)
        workers = await stub.ListWorkers(cache_pb2.ListWorkersRequest(), timeout=5)
    [d] = decisions.decisions
    assert d.action == cache_pb2.DECISION_ACTION_LOAD_HOT and d.command_id == cmd.command_id
    assert d.reason and d.policy and d.to_tier == HOT
    [info] = [x for x in workers.workers if x.state.worker_id == w.worker_id]
    assert info.alive and info.state.capacities[0].hot_slots_used == 1
    # No duplicate: the version stays loaded once.
    await asyncio.sleep(2)
    assert len(bus.matching(is_cmd("load_hot", a))) == 1, [describe(c) for c in bus.commands]
    lines = m.metric_lines("loraplane_cache_commands_total")
    assert any('kind="load_hot",result="ok"' in ln for ln in lines), lines
    print(f"burst -> load command: {latency * 1000:.0f} ms")
    await hb.stop()


async def test_worker_restart_is_reconciled(
    bus: Bus, registry: Registry, managers: Launcher, unique: str
) -> None:
    a = await registry.version("support")
    b = await registry.version("summary")
    w = ev.WorkerSpec(f"w1-{unique}", slots=2, held=[ev.Held(a), ev.Held(b)])
    hb = await Heartbeat(bus, w).start()
    await bus.publish(ev.heat(a, 30, time.time()), ev.heat(b, 30, time.time()))
    m = managers.start()
    await m.wait_planning()
    await asyncio.sleep(1.5)
    # nothing to reconcile: no load and no eviction; the one command a steady worker gets
    # is the HOT order of its versions for its request-path victim (d6b26be), which
    # changes no placement
    acts = [describe(c) for c in bus.commands if not is_cmd("hot_order")(c)]
    assert acts == [], acts

    # The worker restarts: new incarnation, its engine is empty, b's files stayed WARM.
    w.started_at = time.time()
    w.held = [ev.Held(b, tier=WARM)]
    hb.seq = 0
    await hb.beat()
    loads = await bus.wait_for(lambda c: is_cmd("load_hot", a, w.worker_id)(c)
                               or is_cmd("load_hot", b, w.worker_id)(c), count=2, timeout=10)
    assert {c.meta.adapter.adapter_name for c in loads} == {"support", "summary"}
    assert not bus.matching(lambda c: c.WhichOneof("command") == "evict")
    await hb.stop()


async def test_retired_version_drains_then_is_evicted_everywhere(
    bus: Bus, registry: Registry, managers: Launcher, unique: str
) -> None:
    a = await registry.version("support")
    w1 = ev.WorkerSpec(f"w1-{unique}", held=[ev.Held(a, in_flight=1)])
    w2 = ev.WorkerSpec(f"w2-{unique}", held=[ev.Held(a, tier=WARM)])
    hb1, hb2 = await Heartbeat(bus, w1).start(), await Heartbeat(bus, w2).start()
    m = managers.start()
    await m.wait_planning()
    await bus.publish(ev.retired(a, time.time()))
    [e2] = await bus.wait_for(is_cmd("evict", a, w2.worker_id), timeout=10)
    assert e2.evict.to_tier == common_pb2.TIER_COLD and "retired" in e2.reason
    await asyncio.sleep(1.5)
    assert not bus.matching(is_cmd("evict", a, w1.worker_id))  # one request still in flight
    w1.held = [ev.Held(a, in_flight=0)]
    await bus.wait_for(is_cmd("evict", a, w1.worker_id), timeout=10)
    assert not bus.matching(lambda c: c.WhichOneof("command") == "load")
    await hb1.stop()
    await hb2.stop()


async def test_canary_is_warmed_before_traffic_and_rollback_target_rewarmed(
    bus: Bus, registry: Registry, managers: Launcher, unique: str
) -> None:
    v1 = await registry.version("support", "v1")
    v2 = await registry.version("support", "v2", status="admitted")
    w1 = ev.WorkerSpec(f"w1-{unique}", slots=3)
    w2 = ev.WorkerSpec(f"w2-{unique}", slots=3)
    hbs = [await Heartbeat(bus, w).start() for w in (w1, w2)]
    responder = Responder(bus, w1, w2).start()
    m = managers.start()
    await m.wait_planning()
    # Staged canary (share 0): warmed before any traffic reaches it.
    await bus.publish(ev.canary(v2, 0, time.time()))
    [load] = await bus.wait_for(is_cmd("load_hot", v2), timeout=10)
    assert load.reason.startswith("canary_warmup"), load.reason
    await asyncio.sleep(1.0)
    assert len(bus.matching(is_cmd("load_hot", v2))) == 1  # warm_replicas: 1, no traffic yet

    # v2 becomes stable and serves on both workers; v1 is the rollback target: kept WARM.
    await bus.publish(ev.promoted(v2, time.time(), previous="v1"),
                      ev.heat(v2, 30, time.time()))
    await bus.wait_for(is_cmd("load_hot", v2), count=2, timeout=10)
    [warm] = await bus.wait_for(is_cmd("load_warm", v1), timeout=10)
    assert warm.reason.startswith("rollback_target"), warm.reason
    await asyncio.sleep(1.5)
    assert not bus.matching(is_cmd("load_hot", v1))
    # Rollback: v1 is HOT again on both workers where v2 was.
    await bus.publish(ev.rolled_back(v1, "v2", time.time()))
    loads = await bus.wait_for(is_cmd("load_hot", v1), count=2, timeout=10)
    assert {c.worker_id for c in loads} == {w1.worker_id, w2.worker_id}
    assert all(c.reason.startswith("rollback") for c in loads), [describe(c) for c in loads]
    await responder.stop()
    for hb in hbs:
        await hb.stop()


async def test_worker_that_stops_reporting_is_gone_and_replaced(
    bus: Bus, registry: Registry, managers: Launcher, unique: str
) -> None:
    a = await registry.version("support")
    w1 = ev.WorkerSpec(f"w1-{unique}", held=[ev.Held(a)])
    w2 = ev.WorkerSpec(f"w2-{unique}")
    hb1, hb2 = await Heartbeat(bus, w1).start(), await Heartbeat(bus, w2).start()
    await bus.publish(ev.heat(a, 30, time.time()))
    # Placement by the policy alone, one HOT replica is enough while w1 lives.
    m = managers.start(rules={"demand": {"enabled": False}},
                       policy={"placement": {"min_hot_replicas": 1}})
    await m.wait_planning()
    await asyncio.sleep(1.0)
    assert not bus.matching(is_cmd("load_hot", a))
    await hb1.stop()  # w1 dies
    t0 = time.monotonic()
    [cmd] = await bus.wait_for(is_cmd("load_hot", a, w2.worker_id), timeout=15)
    assert time.monotonic() - t0 < 4 + 2  # worker timeout + a round or two
    ch, stub = m.stub()
    async with ch:
        info = await stub.GetWorker(cache_pb2.GetWorkerRequest(worker_id=w1.worker_id),
                                    timeout=5)
    assert not info.worker.alive
    assert cmd.load.target_tier == HOT
    await hb2.stop()
