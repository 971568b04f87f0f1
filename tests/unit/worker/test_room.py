"""Room on the request path: victims by the policy, a bounded ordered queue, no thrash,
every on-demand change reported (the manager over the engine double)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from worker_fakes import MakeAdapter, Rig

from loraplane.v1 import common_pb2
from loraplane.worker.errors import NoCapacity, NoSlot, SlotQueueFull
from loraplane.worker.host_tier import ArtifactSpec
from loraplane.worker.manager import TIER_HOT, TIER_WARM, EvictOutcome, LoadOutcome

I = common_pb2.REQUEST_CLASS_INTERACTIVE
C = common_pb2.REQUEST_CLASS_CANARY
B = common_pb2.REQUEST_CLASS_BACKGROUND


@dataclass
class Held:
    """A request holding its version until released."""

    task: asyncio.Task[None]
    spec: ArtifactSpec
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def done(self) -> None:
        self.release.set()
        await self.task


def hold(rig: Rig, spec: ArtifactSpec, *, klass: int = B, wait_s: float | None = 30.0,
         log: list[str] | None = None, name: str = "") -> Held:
    held: Held

    async def run() -> None:
        async with rig.manager.use(spec, allow_cold=True, request_class=klass, wait_s=wait_s):
            if log is not None:
                log.append(name)
            held.entered.set()
            await held.release.wait()

    held = Held(asyncio.ensure_future(run()), spec)
    return held


async def until(pred, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not pred():
            await asyncio.sleep(0.001)


async def fill(rig: Rig, make_adapter: MakeAdapter, n: int | None = None) -> list[Held]:
    """Every HOT slot taken by a version with a request in flight."""
    held = []
    for i in range(n if n is not None else rig.manager.hot_capacity):
        h = hold(rig, make_adapter(f"busy{i}"))
        await h.entered.wait()
        held.append(h)
    return held


def demoted(rig: Rig) -> list[tuple[int, str]]:
    return [(e.engine_id, e.reason) for e in rig.events if isinstance(e, EvictOutcome)]


async def test_a_full_worker_demotes_the_coolest_idle_version(
    rig: Rig, make_adapter: MakeAdapter
) -> None:
    m = rig.manager
    t = [datetime(2026, 12, 1, tzinfo=UTC)]

    def clock() -> datetime:  # one second per request
        t[0] += timedelta(seconds=1)
        return t[0]

    m.clock = clock
    specs = [make_adapter(f"v{i}") for i in range(m.hot_capacity + 1)]
    for s in specs[:-1]:
        async with m.use(s, allow_cold=True):
            pass
    for _ in range(5):  # v1 and v2 are hotter than v0
        for s in specs[1:-1]:
            async with m.use(s, allow_cold=True):
                pass
    async with m.use(specs[-1], allow_cold=True, request_class=B, wait_s=1.0) as lease:
        assert lease.tier_at_arrival == common_pb2.TIER_COLD
    assert demoted(rig) == [(specs[0].engine_id, "on_demand_capacity")]
    assert m.placements[specs[0].engine_id].tier == TIER_WARM  # demoted, files kept
    assert rig.model.violations == []


async def test_a_request_waits_for_a_slot_and_takes_the_first_freed(
    rig: Rig, make_adapter: MakeAdapter
) -> None:
    m = rig.manager
    busy = await fill(rig, make_adapter)
    waiter = hold(rig, make_adapter("late"))
    await until(lambda: len(m.slot_queue) == 1)
    depth = rig.metrics.slot_queue_depth.labels(m.base_model, "background")
    assert depth._value.get() == 1
    assert not waiter.entered.is_set()
    await busy[1].done()  # busy1's request ends: it is the only possible victim
    await waiter.entered.wait()
    assert demoted(rig) == [(busy[1].spec.engine_id, "on_demand_capacity")]
    assert depth._value.get() == 0
    served = rig.metrics.slot_waits.labels(m.base_model, "background", "served")
    assert served._value.get() == 1
    for h in [*busy, waiter]:
        await h.done()
    assert rig.model.violations == []


async def test_the_budget_spent_gives_resource_exhausted_naming_the_cause(
    rig: Rig, make_adapter: MakeAdapter
) -> None:
    busy = await fill(rig, make_adapter)
    spec = make_adapter("late")
    # WARM first, so the whole budget goes to the wait for a slot: fetched inside a 0.05 s
    # budget, a loaded machine spent it on the download and the refusal was AdapterCold
    await rig.manager.load(spec, TIER_WARM)
    with pytest.raises(NoSlot) as info:
        async with rig.manager.use(spec, allow_cold=True, request_class=I, cold_timeout_s=0.05):
            pass
    err = info.value
    assert err.grpc_code == grpc.StatusCode.RESOURCE_EXHAUSTED and err.retry_after_s == 1.0
    assert "no HOT slot for acme/late@v1 within its budget" in err.message
    assert "3 versions HOT = capacity 3 (3 busy" in err.message
    assert len(rig.manager.slot_queue) == 0
    # the refused request leaves the version WARM: the next one need not fetch it
    assert rig.manager.placements[spec.engine_id].tier == TIER_WARM
    for h in busy:
        await h.done()


async def test_the_queue_serves_interactive_then_canary_then_background_fifo(
    rig: Rig, make_adapter: MakeAdapter
) -> None:
    m = rig.manager
    busy = await fill(rig, make_adapter)
    order: list[str] = []
    waiters = {}
    for name, klass in [("b1", B), ("b2", B), ("c1", C), ("i1", I), ("b3", B), ("i2", I)]:
        waiters[name] = hold(rig, make_adapter(name), klass=klass, log=order, name=name)
        await until(lambda: len(m.slot_queue) == len(waiters))
    # free one slot at a time; a served waiter keeps its slot until the next round
    expected = ["i1", "i2", "c1", "b1", "b2", "b3"]
    holding = list(busy)
    for i, name in enumerate(expected):
        await holding.pop(0).done()
        await waiters[name].entered.wait()
        await until(lambda k=i + 1: len(order) == k)
        assert order == expected[: i + 1]
        holding.append(waiters[name])
    for h in holding:
        await h.done()
    assert rig.model.violations == []


async def test_a_full_queue_refuses_at_once(rig: Rig, make_adapter: MakeAdapter,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    m = rig.manager
    monkeypatch.setattr(m.slot_queue, "max_depth", 1)
    busy = await fill(rig, make_adapter)
    first = hold(rig, make_adapter("q1"))
    await until(lambda: len(m.slot_queue) == 1)
    with pytest.raises(SlotQueueFull, match="queue depth 1"):
        async with m.use(make_adapter("q2"), allow_cold=True, request_class=I, wait_s=5):
            pass
    full = rig.metrics.slot_waits.labels(m.base_model, "interactive", "queue_full")
    assert full._value.get() == 1
    await busy[0].done()
    await first.entered.wait()
    for h in [*busy[1:], first]:
        await h.done()


async def test_a_version_loaded_for_a_waiting_request_stays_until_it_ran(
    rig: Rig, make_adapter: MakeAdapter
) -> None:
    """The load's report is held back; meanwhile the new version is HOT with nothing in
    flight, and another request needing room must wait instead of demoting it."""
    m = rig.manager
    gate = asyncio.Event()
    events = rig.events

    async def slow_sink(outcome: object) -> None:
        events.append(outcome)
        if isinstance(outcome, LoadOutcome) and outcome.spec.adapter_name == "fresh":
            await gate.wait()

    m.on_event = slow_sink
    busy = await fill(rig, make_adapter, m.hot_capacity - 1)
    fresh_spec = make_adapter("fresh")
    fresh = hold(rig, fresh_spec)
    await until(lambda: m.placements.get(fresh_spec.engine_id) is not None
                and m.placements[fresh_spec.engine_id].hot)
    assert m.placements[fresh_spec.engine_id].in_flight == 0  # reported first, then served
    other = hold(rig, make_adapter("other"))
    await until(lambda: len(m.slot_queue) == 1)  # waits: "fresh" is reserved
    assert m.choose_victim().victim is None
    gate.set()
    await fresh.entered.wait()
    await fresh.done()  # "fresh" ran: now it may go
    await other.entered.wait()
    assert demoted(rig) == [(fresh_spec.engine_id, "on_demand_capacity")]
    for h in [*busy, other]:
        await h.done()
    assert rig.model.violations == []


async def test_concurrent_loads_never_overfill_and_every_change_is_reported(
    rig: Rig, make_adapter: MakeAdapter
) -> None:
    m = rig.manager
    specs = [make_adapter(f"c{i}") for i in range(2 * m.hot_capacity)]
    for s in specs:  # WARM first, as after a first request each
        await m.load(s, TIER_WARM)

    async def one(spec: ArtifactSpec, klass: int) -> None:
        async with m.use(spec, allow_cold=True, request_class=klass, wait_s=30):
            assert m.hot_count() <= m.hot_capacity
            await asyncio.sleep(0.002)

    await asyncio.gather(*(one(specs[i % len(specs)], (B, I, C)[i % 3]) for i in range(60)))
    assert rig.model.violations == []
    assert m.hot_count() <= m.hot_capacity
    loads = [e for e in rig.events if isinstance(e, LoadOutcome) and e.tier == TIER_HOT]
    evictions = [e for e in rig.events if isinstance(e, EvictOutcome)]
    # every on-demand change went to the sink: what is HOT now is loads minus evictions
    hot_now = {eid for eid, p in m.placements.items() if p.hot}
    net: dict[int, int] = {}
    for e in loads:
        net[e.spec.engine_id] = net.get(e.spec.engine_id, 0) + 1
    for ev in evictions:
        net[ev.engine_id] = net.get(ev.engine_id, 0) - 1
        assert ev.reason.startswith("on_demand_")
    assert {eid for eid, n in net.items() if n > 0} == hot_now
    assert all(n in (0, 1) for n in net.values())
    assert len(evictions) >= len(specs) - m.hot_capacity


async def test_commands_still_fail_fast_when_full(rig: Rig, make_adapter: MakeAdapter) -> None:
    specs = [make_adapter(f"k{i}") for i in range(rig.manager.hot_capacity + 1)]
    for s in specs[:-1]:
        await rig.manager.load(s, TIER_HOT)
    with pytest.raises(NoCapacity, match="capacity 3; evict one before loading"):
        await rig.manager.load(specs[-1], TIER_HOT)
    assert rig.manager.placements[specs[-1].engine_id].tier == TIER_WARM
    assert not demoted(rig)
    assert TIER_HOT == rig.manager.placements[specs[0].engine_id].tier


async def test_a_request_for_the_victim_during_its_demotion_waits_and_is_served(
    rig: Rig, make_adapter: MakeAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The victim is not HOT from the moment it is chosen: a request arriving while the
    engine unregisters it loads it again instead of starting on a vanishing adapter."""
    m = rig.manager
    specs = [make_adapter(f"d{i}") for i in range(m.hot_capacity)]
    for s in specs:
        async with m.use(s, allow_cold=True):
            pass
    victim = specs[0]  # least recently used of the equally cool ones
    gate = asyncio.Event()
    unregister = rig.model.unregister

    async def slow_unregister(engine_id: int) -> None:
        if engine_id == victim.engine_id:
            await gate.wait()
        await unregister(engine_id)

    monkeypatch.setattr(rig.model, "unregister", slow_unregister)
    newcomer = hold(rig, make_adapter("new"))
    await until(lambda: not m.placements[victim.engine_id].hot)
    again = hold(rig, victim)  # arrives mid-demotion
    await asyncio.sleep(0.01)
    assert not again.entered.is_set()
    gate.set()
    await newcomer.entered.wait()
    await again.entered.wait()
    lease_ids = {victim.engine_id, newcomer.spec.engine_id}
    assert lease_ids <= {eid for eid, p in m.placements.items() if p.hot}
    for h in (newcomer, again):
        await h.done()
    assert rig.model.violations == []


async def test_an_interactive_request_never_waits_behind_a_background_load_it_needs(
    rig: Rig, make_adapter: MakeAdapter
) -> None:
    m = rig.manager
    busy = await fill(rig, make_adapter)
    order: list[str] = []
    shared, other = make_adapter("shared"), make_adapter("other")
    await m.load(shared, TIER_WARM)
    bg_other = hold(rig, other, klass=B, log=order, name="bg-other")
    await until(lambda: len(m.slot_queue) == 1)
    bg_shared = hold(rig, shared, klass=B, log=order, name="bg-shared")
    await until(lambda: len(m.slot_queue) == 2)
    # an interactive request for "shared" joins its queued load: it moves ahead
    inter = hold(rig, shared, klass=I, log=order, name="i-shared")
    await until(lambda: next(iter(m.slot_queue)).rank == 0)
    await busy[0].done()
    await until(lambda: len(order) == 2)
    assert sorted(order) == ["bg-shared", "i-shared"]  # one load serves both
    assert not bg_other.entered.is_set()
    # and with its short budget spent while the load waits, it is refused at its own
    # deadline (not the background request's 30 s)
    late = make_adapter("late")
    await m.load(late, TIER_WARM)
    bg_late = hold(rig, late, klass=B)
    await until(lambda: len(m.slot_queue) == 2)  # bg-other, bg-late; nothing is free
    with pytest.raises(NoSlot, match="no HOT slot for acme/late@v1"):
        async with m.use(late, allow_cold=True, request_class=I, cold_timeout_s=0.05):
            pass
    assert not bg_late.task.done()  # the background request still waits for its slot
    for h in [*busy[1:], inter, bg_shared, bg_other, bg_late]:
        await h.done()
    assert rig.model.violations == []
