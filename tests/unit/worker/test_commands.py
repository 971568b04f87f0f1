"""Cache commands and the adapter manager: tiers, idempotency, drain-before-evict, versions."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from worker_fakes import BASE, LIMITS, MakeAdapter, Rig

from loraplane.shared.consumer import OffsetTracker
from loraplane.shared.topics import new_meta
from loraplane.v1 import common_pb2, events_pb2
from loraplane.worker.commands import CommandExecutor
from loraplane.worker.errors import AdapterCold, Draining, NoCapacity
from loraplane.worker.host_tier import ArtifactSpec
from loraplane.worker.manager import (
    TIER_COLD,
    TIER_HOT,
    TIER_WARM,
    AdapterManager,
    EvictOutcome,
    LoadOutcome,
)

HOT, WARM, COLD = common_pb2.TIER_HOT, common_pb2.TIER_WARM, common_pb2.TIER_COLD
_n = iter(range(1, 10_000))


def ref(spec: ArtifactSpec) -> common_pb2.AdapterRef:
    return common_pb2.AdapterRef(tenant_id=spec.tenant_id, adapter_name=spec.adapter_name,
                                 version=spec.version, base_model=spec.base_model)


def command(spec: ArtifactSpec, worker: str = "w1", **action: object) -> events_pb2.CacheCommand:
    cmd = events_pb2.CacheCommand(meta=new_meta("cache-manager/test", ref(spec)),
                                  command_id=f"c{next(_n)}", worker_id=worker)
    for kind, msg in action.items():
        getattr(cmd, kind).CopyFrom(msg)
    return cmd


def load(spec: ArtifactSpec, tier: int = HOT, pin: bool = False,
         worker: str = "w1") -> events_pb2.CacheCommand:
    return command(spec, worker, load=events_pb2.LoadAdapter(
        target_tier=tier, pin=pin, engine_id=spec.engine_id, artifact_uri=spec.artifact_uri,
        sha256=spec.sha256, size_bytes=spec.size_bytes, rank=spec.rank))


def evict(spec: ArtifactSpec, to: int = COLD) -> events_pb2.CacheCommand:
    return command(spec, evict=events_pb2.EvictAdapter(to_tier=to, reason="test",
                                                       engine_id=spec.engine_id))


async def run(ex: CommandExecutor, cmd: events_pb2.CacheCommand) -> events_pb2.WorkerReport:
    report = await ex.execute(cmd)
    assert report is not None
    return report


def failure_code(report: events_pb2.WorkerReport) -> int:
    assert report.WhichOneof("report") == "failed", report
    return report.failed.code


async def test_load_warm_then_hot_then_again(rig: Rig, make_adapter: MakeAdapter) -> None:
    ex = CommandExecutor(rig.manager, worker_id="w1")
    spec = make_adapter()
    warm = await run(ex, load(spec, WARM))
    assert warm.loaded.tier == WARM and warm.loaded.source_tier == COLD
    assert warm.loaded.bytes > spec.size_bytes and warm.loaded.duration_ms > 0
    assert warm.meta.adapter == ref(spec) and warm.command_id and warm.worker_id == "w1"
    hot = await run(ex, load(spec, HOT))
    assert (hot.loaded.tier, hot.loaded.source_tier, hot.loaded.bytes) == (HOT, WARM, 0)
    again = await run(ex, load(spec, HOT))
    assert (again.loaded.tier, again.loaded.source_tier) == (HOT, HOT)
    assert rig.model.calls.count(("register", spec.engine_id)) == 1
    assert spec.engine_id in await rig.engine.list()  # the registry's id is the engine's id


async def test_duplicate_command_id_is_answered_without_running_again(
    rig: Rig, make_adapter: MakeAdapter
) -> None:
    ex = CommandExecutor(rig.manager, worker_id="w1")
    cmd = load(make_adapter(), HOT)
    first = await run(ex, cmd)
    second = await run(ex, cmd)
    assert second == first and second.meta.event_id == first.meta.event_id
    assert len([c for c in rig.model.calls if c[0] == "register"]) == 2  # zero adapter + one


async def test_other_workers_commands_are_ignored(rig: Rig, make_adapter: MakeAdapter) -> None:
    ex = CommandExecutor(rig.manager, worker_id="w1")
    assert await ex.execute(load(make_adapter(), HOT, worker="w2")) is None
    assert rig.manager.placements == {}


async def test_expired_command_is_refused(rig: Rig, make_adapter: MakeAdapter) -> None:
    ex = CommandExecutor(rig.manager, worker_id="w1")
    cmd = load(make_adapter(), HOT)
    cmd.deadline.FromDatetime(datetime.now(UTC) - timedelta(seconds=1))
    report = await run(ex, cmd)
    assert failure_code(report) == events_pb2.LOAD_ERROR_CODE_DEADLINE_EXCEEDED
    assert rig.manager.placements == {}


async def test_failures_are_classified(rig: Rig, make_adapter: MakeAdapter) -> None:
    ex = CommandExecutor(rig.manager, worker_id="w1")
    other_base = make_adapter(base_model="other/model")
    assert failure_code(await run(ex, load(other_base))) == (
        events_pb2.LOAD_ERROR_CODE_BASE_MODEL_NOT_SERVED)
    big = await run(ex, load(make_adapter(rank=32)))
    assert failure_code(big) == events_pb2.LOAD_ERROR_CODE_RANK_TOO_LARGE
    assert "rank 32 > max_lora_rank 16" in big.failed.message and not big.failed.retriable
    bad = dataclasses.replace(make_adapter(), sha256="f" * 64)
    assert failure_code(await run(ex, load(bad))) == events_pb2.LOAD_ERROR_CODE_DIGEST_MISMATCH
    ghost = make_adapter()
    pin = command(ghost, pin=events_pb2.PinAdapter(engine_id=ghost.engine_id))
    assert failure_code(await run(ex, pin)) == events_pb2.LOAD_ERROR_CODE_NOT_PRESENT
    failures = rig.metrics.load_failures
    assert failures.labels(base_model=BASE, tenant="acme", adapter="support",
                           version="v1", reason="rank_too_large")._value.get() == 1


async def test_pin_all_is_refused_with_no_capacity(rig: Rig, make_adapter: MakeAdapter) -> None:
    ex = CommandExecutor(rig.manager, worker_id="w1")
    specs = [make_adapter(f"a{i}") for i in range(LIMITS.max_loras)]
    for s in specs[:-1]:
        assert (await run(ex, load(s, HOT, pin=True))).loaded.pinned
    last = await run(ex, load(specs[-1], HOT, pin=True))
    assert failure_code(last) == events_pb2.LOAD_ERROR_CODE_NO_CAPACITY
    assert "would leave no unpinned slot" in last.failed.message
    assert rig.manager.placements[specs[-1].engine_id].tier == HOT  # loaded, not pinned
    assert len(rig.engine.pinned) == LIMITS.max_loras - 1
    assert rig.model.violations == []


async def test_unpin_then_pin_commands(rig: Rig, make_adapter: MakeAdapter) -> None:
    ex = CommandExecutor(rig.manager, worker_id="w1")
    spec = make_adapter()
    await run(ex, load(spec, HOT, pin=True))
    unpinned = await run(ex, command(spec, unpin=events_pb2.UnpinAdapter(engine_id=spec.engine_id)))
    assert unpinned.loaded.tier == HOT and not unpinned.loaded.pinned
    pinned = await run(ex, command(spec, pin=events_pb2.PinAdapter(engine_id=spec.engine_id)))
    assert pinned.loaded.pinned and rig.engine.pinned == {spec.engine_id}


async def test_demote_and_evict_are_idempotent(rig: Rig, make_adapter: MakeAdapter) -> None:
    ex = CommandExecutor(rig.manager, worker_id="w1")
    spec = make_adapter()
    await run(ex, load(spec, HOT))
    demoted = await run(ex, evict(spec, WARM))
    assert (demoted.evicted.from_tier, demoted.evicted.to_tier) == (HOT, WARM)
    assert spec.engine_id not in await rig.engine.list()
    assert rig.host.get(spec.engine_id) is not None
    gone = await run(ex, evict(spec, COLD))
    assert (gone.evicted.from_tier, gone.evicted.to_tier) == (WARM, COLD)
    assert rig.host.get(spec.engine_id) is None and rig.host.used_bytes == 0
    again = await run(ex, evict(spec, COLD))
    assert (again.evicted.from_tier, again.evicted.to_tier) == (COLD, COLD)


async def test_eviction_waits_for_in_flight_requests(rig: Rig, make_adapter: MakeAdapter) -> None:
    spec = make_adapter()
    await rig.manager.load(spec, TIER_HOT)
    async with rig.manager.use(spec, allow_cold=False) as lease:
        assert lease.tier_at_arrival == HOT
        task = asyncio.create_task(rig.manager.evict(spec.engine_id, TIER_COLD, "test"))
        await asyncio.sleep(0.05)
        assert not task.done()
        assert rig.manager.placements[spec.engine_id].draining
        with pytest.raises(Draining):  # no new request starts on a draining version
            async with rig.manager.use(spec, allow_cold=True, wait_s=0.0):
                pass
    outcome = await asyncio.wait_for(task, 2)
    assert (outcome.from_tier, outcome.to_tier) == (HOT, COLD)
    assert rig.manager.placements == {}


async def _served(manager: AdapterManager, spec: ArtifactSpec,
                  cold_timeout_s: float) -> tuple[int, int]:
    """One request for ``spec`` that may not load it from COLD: its tier at arrival and the
    tier it was served from."""
    async with manager.use(spec, allow_cold=False, cold_timeout_s=cold_timeout_s) as lease:
        return lease.tier_at_arrival, manager.placements[spec.engine_id].tier


async def test_a_request_that_meets_a_demotion_waits_for_it_and_loads_the_version_again(
    rig: Rig, make_adapter: MakeAdapter
) -> None:
    """The cache manager demotes a version a request is still using: a request arriving
    then waits for the drain (within its budget), finds the version WARM and promotes it
    again, with no download; it failed UNAVAILABLE (draining) before, and on a worker
    alone the gateway's one re-plan met the same drain. Past its budget it still gets
    Draining (the gateway plans again)."""
    spec = make_adapter()
    await rig.manager.load(spec, TIER_HOT)
    fetched = rig.metrics.load_bytes.labels(**rig.manager.labels(spec))._value.get()
    demote = None
    async with rig.manager.use(spec, allow_cold=False):
        demote = asyncio.create_task(rig.manager.evict(spec.engine_id, TIER_WARM, "test"))
        await asyncio.sleep(0)
        assert rig.manager.placements[spec.engine_id].draining
        with pytest.raises(Draining):  # no budget left: refused at once, as before
            async with rig.manager.use(spec, allow_cold=False, cold_timeout_s=0.0):
                pass
        waiting = asyncio.create_task(_served(rig.manager, spec, 30.0))
        await asyncio.sleep(0.05)
        assert not waiting.done() and not demote.done()  # waits: no new request starts
    demoted = await asyncio.wait_for(demote, 5)
    assert (demoted.from_tier, demoted.to_tier) == (HOT, WARM)
    assert await asyncio.wait_for(waiting, 5) == (HOT, HOT)  # arrived HOT, served HOT again
    assert rig.manager.placements[spec.engine_id].hot
    assert rig.model.calls.count(("register", spec.engine_id)) == 2  # promoted from WARM
    assert rig.metrics.load_bytes.labels(**rig.manager.labels(spec))._value.get() == fetched


async def test_drain_timeout_reports_in_use(rig: Rig, make_adapter: MakeAdapter) -> None:
    ex = CommandExecutor(rig.manager, worker_id="w1")
    spec = make_adapter()
    await rig.manager.load(spec, TIER_HOT)
    cmd = evict(spec, COLD)
    cmd.deadline.FromDatetime(datetime.now(UTC) + timedelta(milliseconds=100))
    async with rig.manager.use(spec, allow_cold=False):
        report = await run(ex, cmd)
    assert failure_code(report) == events_pb2.LOAD_ERROR_CODE_IN_USE and report.failed.retriable
    p = rig.manager.placements[spec.engine_id]
    assert p.tier == HOT and not p.draining  # still serving


async def test_new_version_loads_beside_the_old(rig: Rig, make_adapter: MakeAdapter) -> None:
    v1, v2 = make_adapter(version="v1"), make_adapter(version="v2")
    await rig.manager.load(v1, TIER_HOT)
    await rig.manager.load(v2, TIER_HOT)
    assert {v1.engine_id, v2.engine_id} <= await rig.engine.list()
    async with rig.manager.use(v1, allow_cold=False) as a, \
            rig.manager.use(v2, allow_cold=False) as b:
        assert (a.adapter.engine_id, b.adapter.engine_id) == (v1.engine_id, v2.engine_id)
        assert a.adapter.name == "acme/support@v1" and b.adapter.name == "acme/support@v2"


async def test_hot_capacity_command_vs_request_path(rig: Rig, make_adapter: MakeAdapter) -> None:
    specs = [make_adapter(f"a{i}") for i in range(rig.manager.hot_capacity + 1)]
    for s in specs[:-1]:
        await rig.manager.load(s, TIER_HOT)
    with pytest.raises(NoCapacity, match="evict one"):
        await rig.manager.load(specs[-1], TIER_HOT)  # the cache manager must evict first
    async with rig.manager.use(specs[-1], allow_cold=False) as lease:  # WARM now
        assert lease.tier_at_arrival == WARM
    assert rig.manager.placements[specs[-1].engine_id].tier == HOT
    demoted = [e for e in rig.events if isinstance(e, EvictOutcome)]
    assert [(d.engine_id, d.reason) for d in demoted] == [(specs[0].engine_id, "on_demand_idle")]
    loaded = [e for e in rig.events if isinstance(e, LoadOutcome)]
    assert [(x.spec.engine_id, x.source_tier, x.tier) for x in loaded] == [
        (specs[-1].engine_id, WARM, HOT)]
    assert rig.model.violations == []


async def test_request_path_never_demotes_never_evict_versions(
    rig: Rig, make_adapter: MakeAdapter
) -> None:
    ex = CommandExecutor(rig.manager, worker_id="w1")
    cap = rig.manager.hot_capacity
    assert cap == 3  # one protected and two plain versions fill it
    specs = [make_adapter(f"n{i}") for i in range(cap + 2)]
    protected_cmd = load(specs[0], HOT)
    protected_cmd.load.never_evict = True  # e.g. the active canary, loaded by the cache manager
    assert (await run(ex, protected_cmd)).loaded.tier == HOT
    for s in specs[1:cap]:
        await rig.manager.load(s, TIER_HOT)
    # the request path loads a version the gateway marks never-evict (its adapter's canary):
    # room is made from the least recently used *plain* version, never the protected one
    async with rig.manager.use(specs[cap], allow_cold=True, never_evict=True):
        pass
    demoted = [e.engine_id for e in rig.events if isinstance(e, EvictOutcome)]
    assert demoted == [specs[1].engine_id]
    assert rig.manager.placements[specs[0].engine_id].tier == HOT
    assert rig.manager.placements[specs[cap].engine_id].never_evict
    # next request-path load: both protected versions are skipped again
    async with rig.manager.use(specs[cap + 1], allow_cold=True):
        pass
    demoted = [e.engine_id for e in rig.events if isinstance(e, EvictOutcome)]
    assert demoted == [specs[1].engine_id, specs[2].engine_id]  # LRU order among plain ones
    assert {specs[0].engine_id, specs[cap].engine_id} <= {
        eid for eid, p in rig.manager.placements.items() if p.hot}
    # a later load command without the flag lifts the protection (the canary was promoted)
    assert (await run(ex, load(specs[0], HOT))).loaded.tier == HOT
    assert not rig.manager.placements[specs[0].engine_id].never_evict
    # the cache manager's explicit evict still works on a protected version
    await run(ex, evict(specs[cap], WARM))
    assert rig.manager.placements[specs[cap].engine_id].tier == WARM
    assert rig.model.violations == []


async def test_a_worker_full_of_protected_versions_still_serves(
    rig: Rig, make_adapter: MakeAdapter
) -> None:
    ex = CommandExecutor(rig.manager, worker_id="w1")
    specs = [make_adapter(f"p{i}") for i in range(rig.manager.hot_capacity + 1)]
    for s in specs[:-1]:
        cmd = load(s, HOT)
        cmd.load.never_evict = True
        await run(ex, cmd)
    pinned = load(specs[1], HOT, pin=True)  # a pin is the hard HOT guarantee
    await run(ex, pinned)
    # nothing unprotected is left: the least recently used protected, unpinned version goes
    # back to WARM (what the policy guarantees beyond its pinned share) instead of the
    # request failing; the reason says it was a protected one
    async with rig.manager.use(specs[-1], allow_cold=True) as lease:
        assert lease.tier_at_arrival == COLD
    demoted = [(e.engine_id, e.reason) for e in rig.events if isinstance(e, EvictOutcome)]
    assert demoted == [(specs[0].engine_id, "on_demand_protection_overflow")]
    assert rig.manager.placements[specs[0].engine_id].tier == WARM
    assert rig.manager.placements[specs[1].engine_id].tier == HOT
    assert rig.model.violations == []


async def test_cold_request_needs_permission_and_budget(rig: Rig,
                                                        make_adapter: MakeAdapter) -> None:
    spec = make_adapter()
    with pytest.raises(AdapterCold):
        async with rig.manager.use(spec, allow_cold=False):
            pass
    async with rig.manager.use(spec, allow_cold=True, cold_timeout_s=5) as lease:
        assert lease.tier_at_arrival == COLD and lease.spec == spec
    assert rig.manager.placements[spec.engine_id].tier == TIER_HOT
    assert rig.manager.placements[spec.engine_id].in_flight == 0


async def test_metrics_count_loads_by_source_tier(rig: Rig, make_adapter: MakeAdapter) -> None:
    spec = make_adapter()
    await rig.manager.load(spec, TIER_WARM)
    await rig.manager.load(spec, TIER_HOT)
    labels = {"base_model": BASE, "tenant": "acme", "adapter": "support", "version": "v1"}
    loads = rig.metrics.loads
    assert loads.labels(**labels, source_tier="cold", target_tier="warm")._value.get() == 1
    assert loads.labels(**labels, source_tier="warm", target_tier="hot")._value.get() == 1
    assert rig.metrics.host_bytes.labels("used")._value.get() == rig.host.used_bytes > 0
    assert rig.metrics.engine_slots.labels(BASE, "used")._value.get() == 2  # zero + one


def test_offset_tracker_commits_below_the_oldest_unfinished() -> None:
    from aiokafka.structs import TopicPartition

    tp = TopicPartition("cache.commands", 0)
    t = OffsetTracker()
    for off in (5, 6, 7):
        t.started(tp, off)
    t.finished(tp, 6)
    assert t.commit_points() == {}  # 5 is where the consumer read from: nothing moved
    t.finished(tp, 5)
    assert t.commit_points() == {tp: 7}
    t.finished(tp, 7)
    assert t.commit_points() == {tp: 8}


async def _fill_hot(rig: Rig, make_adapter: MakeAdapter, ex: CommandExecutor,
                    prefix: str) -> list[ArtifactSpec]:
    specs = [make_adapter(f"{prefix}{i}") for i in range(rig.manager.hot_capacity + 1)]
    for s in specs[:-1]:
        assert (await run(ex, load(s, HOT))).loaded.tier == HOT
    return specs


async def test_a_round_s_load_waits_for_the_slot_its_demotion_frees(
    rig: Rig, make_adapter: MakeAdapter
) -> None:
    """The cache manager's round demotes one version and loads another; the worker runs
    them concurrently (different versions). The load used to be checked before the
    demotion finished and failed NO_CAPACITY (make stress, 84 in one run)."""
    ex = CommandExecutor(rig.manager, worker_id="w1", slot_wait_s=5.0)
    specs = await _fill_hot(rig, make_adapter, ex, "r")
    busy = asyncio.Event()

    async def hold() -> None:  # a request keeps the demoted version in flight a moment
        async with rig.manager.use(specs[0], allow_cold=False):
            busy.set()
            await asyncio.sleep(0.2)

    request = asyncio.create_task(hold())
    await busy.wait()
    loaded, evicted = await asyncio.gather(run(ex, load(specs[-1], HOT)),
                                           run(ex, evict(specs[0], WARM)))
    await request
    assert evicted.WhichOneof("report") == "evicted"
    assert loaded.WhichOneof("report") == "loaded", loaded
    assert loaded.loaded.tier == HOT
    assert rig.manager.hot_count() == rig.manager.hot_capacity
    assert rig.model.violations == []


async def test_a_command_load_on_a_full_worker_fails_after_its_wait_and_demotes_nothing(
    rig: Rig, make_adapter: MakeAdapter
) -> None:
    ex = CommandExecutor(rig.manager, worker_id="w1", slot_wait_s=0.05)
    specs = await _fill_hot(rig, make_adapter, ex, "f")
    report = await run(ex, load(specs[-1], HOT))
    assert failure_code(report) == events_pb2.LOAD_ERROR_CODE_NO_CAPACITY
    assert {eid for eid, p in rig.manager.placements.items() if p.hot} == {
        s.engine_id for s in specs[:-1]}  # the cache manager chooses what leaves, not it
    assert not [e for e in rig.events if isinstance(e, EvictOutcome)]
    assert len(rig.manager.slot_queue) == 0


async def test_a_request_for_a_version_whose_command_load_waits_makes_room(
    rig: Rig, make_adapter: MakeAdapter
) -> None:
    """A request inherits the parked command load's place and the load makes room as the
    request path would: the request is not held for the command's whole wait."""
    ex = CommandExecutor(rig.manager, worker_id="w1", slot_wait_s=30.0)
    specs = await _fill_hot(rig, make_adapter, ex, "q")
    command_load = asyncio.create_task(run(ex, load(specs[-1], HOT)))
    async with asyncio.timeout(5):
        while specs[-1].engine_id not in rig.manager._slot_waiting:
            await asyncio.sleep(0.005)
    async with asyncio.timeout(5):  # far below the command's 30 s wait
        async with rig.manager.use(specs[-1], allow_cold=False, wait_s=10) as lease:
            assert lease.tier_at_arrival == WARM
    report = await asyncio.wait_for(command_load, 5)
    assert report.WhichOneof("report") == "loaded" and report.loaded.tier == HOT
    demoted = [e.engine_id for e in rig.events if isinstance(e, EvictOutcome)]
    assert len(demoted) == 1 and demoted[0] in {s.engine_id for s in specs[:-1]}
    assert rig.model.violations == []


async def test_the_request_path_victim_follows_the_cache_managers_hot_order(
    rig: Rig, make_adapter: MakeAdapter
) -> None:
    ex = CommandExecutor(rig.manager, worker_id="w1")
    cap = rig.manager.hot_capacity
    specs = [make_adapter(f"o{i}") for i in range(cap + 2)]
    for s in specs[:cap]:
        assert (await run(ex, load(s, HOT))).loaded.tier == HOT
    # used in order o0, o1, o2: by its own heat / recency the worker would demote o0 first
    for s in specs[:cap]:
        async with rig.manager.use(s, allow_cold=False):
            pass
    assert rig.manager.choose_victim().victim == str(specs[0].engine_id)
    # the cache manager's ranking keeps o0 longest and o1 least: the order replaces the heat
    keeps = {specs[0].engine_id: -0.0, specs[1].engine_id: -2 / cap, specs[2].engine_id: -1 / cap}
    order = command(specs[0], hot_order=events_pb2.HotOrder(keeps=[
        events_pb2.HotKeep(engine_id=eid, keep=k) for eid, k in keeps.items()]))
    assert await ex.execute(order) is None  # no report answers an order
    assert {eid: rig.manager.placements[eid].hot_keep for eid in keeps} == keeps
    async with rig.manager.use(specs[cap], allow_cold=True):
        pass
    demoted = [e.engine_id for e in rig.events if isinstance(e, EvictOutcome)]
    assert demoted == [specs[1].engine_id]
    assert rig.manager.placements[specs[1].engine_id].hot_keep is None  # left HOT: no keep
    # the version the request path loaded is not ranked yet: the ranked o2 goes before it
    async with rig.manager.use(specs[cap + 1], allow_cold=True):
        pass
    demoted = [e.engine_id for e in rig.events if isinstance(e, EvictOutcome)]
    assert demoted == [specs[1].engine_id, specs[2].engine_id]
    # a HOT load carries its own keep; a later order without it clears it
    cmd = load(specs[1], HOT)
    cmd.load.hot_keep = 5.0
    await run(ex, evict(specs[cap], WARM))
    assert (await run(ex, cmd)).loaded.tier == HOT
    assert rig.manager.placements[specs[1].engine_id].hot_keep == 5.0
    await ex.execute(command(specs[0], hot_order=events_pb2.HotOrder(keeps=[
        events_pb2.HotKeep(engine_id=specs[0].engine_id, keep=1.0)])))
    assert rig.manager.placements[specs[1].engine_id].hot_keep is None
    assert rig.model.violations == []
