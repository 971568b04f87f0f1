"""SafeEngine: the operations that kill or corrupt vLLM never reach the engine double.

Each rule is shown twice: the raw double records a violation for the dangerous
sequence, and the same sequence through :class:`SafeEngine` is refused or made safe.
A property test then runs random operation sequences through the guard.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from worker_fakes import VllmModel

from loraplane.worker.engine import EngineAdapter, EngineLimits, EngineRequest, Sampling
from loraplane.worker.errors import InUse, NoCapacity, NotPresent, PinLimit, RankTooLarge
from loraplane.worker.guard import SafeEngine, SlotGate, SlotResidency

LIMITS = EngineLimits(max_loras=3, max_cpu_loras=5, max_lora_rank=16)


def adapter(i: int, rank: int = 8) -> EngineAdapter:
    return EngineAdapter(i, f"t/a{i}@v1", Path(f"/a/{i}"), rank)


async def run(engine: object, i: int, tokens: int = 3, rank: int = 8) -> list[int]:
    req = EngineRequest(f"r{i}-{id(object())}", "p", Sampling(tokens, 0.0), adapter(i, rank))
    out: list[int] = []
    async for chunk in engine.generate(req):  # type: ignore[attr-defined]
        out.extend(chunk.token_ids)
    return out


async def test_pin_all_slots_then_new_adapter_is_a_violation_on_the_raw_engine() -> None:
    raw = VllmModel(LIMITS)
    for i in (1, 2, 3):
        await raw.register(adapter(i))
        await raw.pin(i)
    await raw.register(adapter(4))
    assert any("all slots pinned" in v for v in raw.violations)


async def test_guard_refuses_the_pin_that_would_pin_every_slot() -> None:
    model = VllmModel(LIMITS)
    engine = SafeEngine(model)
    for i in (1, 2, 3):
        await engine.register(adapter(i))
    await engine.pin(1)
    await engine.pin(2)
    with pytest.raises(PinLimit, match="2 of 3 engine slots are pinned"):
        await engine.pin(3)
    await engine.register(adapter(4))
    assert await run(engine, 4) == [4, 4, 4]
    assert model.violations == []
    assert engine.pinned == {1, 2}


async def test_rank_above_max_is_refused_before_the_engine() -> None:
    model = VllmModel(LIMITS)
    engine = SafeEngine(model)
    with pytest.raises(RankTooLarge, match="rank 32 > max_lora_rank 16"):
        await engine.register(adapter(9, rank=32))
    await engine.register(adapter(5))
    with pytest.raises(RankTooLarge):
        await run(engine, 5, rank=64)  # same id, a request claiming a larger rank
    assert model.calls == [("register", 5)]
    assert model.violations == []


async def test_raw_engine_records_the_rank_killer() -> None:
    raw = VllmModel(LIMITS)
    await run(raw, 7, rank=64)
    assert any("reached generate" in v for v in raw.violations)


async def test_registrations_are_capped_at_max_cpu_loras() -> None:
    model = VllmModel(LIMITS)
    engine = SafeEngine(model)
    for i in range(1, 6):
        await engine.register(adapter(i))
    with pytest.raises(NoCapacity, match="max_cpu_loras 5"):
        await engine.register(adapter(6))
    assert model.violations == []
    raw = VllmModel(LIMITS)
    for i in range(1, 7):
        await raw.register(adapter(i))
    assert any("silently evicted" in v for v in raw.violations)


async def test_unregistered_adapter_never_reaches_generate() -> None:
    engine = SafeEngine(VllmModel(LIMITS))
    with pytest.raises(NotPresent):
        await run(engine, 42)


async def test_unregister_refused_while_a_request_runs() -> None:
    model = VllmModel(LIMITS, step_delay_s=0.01)
    engine = SafeEngine(model)
    await engine.register(adapter(1))
    task = asyncio.create_task(run(engine, 1, tokens=20))
    await asyncio.sleep(0.03)
    with pytest.raises(InUse):
        await engine.unregister(1)
    assert await task == [1] * 20
    await engine.unregister(1)
    assert await engine.list() == set()


async def test_slot_gate_keeps_batch_plus_pins_within_slots() -> None:
    """With 1 pin and 3 slots, three other adapters cannot run at once; the third waits."""
    model = VllmModel(LIMITS, step_delay_s=0.005)
    engine = SafeEngine(model)
    for i in (1, 2, 3, 4):
        await engine.register(adapter(i))
    await engine.pin(1)
    results = await asyncio.gather(*(run(engine, i, tokens=10) for i in (2, 3, 4)))
    assert results == [[2] * 10, [3] * 10, [4] * 10]
    assert model.violations == []
    raw = VllmModel(LIMITS, step_delay_s=0.005)
    for i in (1, 2, 3, 4):
        await raw.register(adapter(i))
    await raw.pin(1)
    await asyncio.gather(*(run(raw, i, tokens=10) for i in (2, 3, 4)))
    assert raw.violations, "the double should show why the gate is needed"


async def test_slot_gate_waits_and_wakes() -> None:
    gate = SlotGate(2)
    await gate.enter(1)
    await gate.enter(2)
    waiter = asyncio.create_task(gate.enter(3))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    await gate.enter(1)  # an adapter holding a slot never waits
    gate.leave(2)
    await asyncio.wait_for(waiter, 1)
    assert gate.occupied() == {1, 3}


async def test_unpin_frees_the_pin_budget() -> None:
    engine = SafeEngine(VllmModel(LIMITS))
    for i in (1, 2, 3):
        await engine.register(adapter(i))
    await engine.pin(1)
    await engine.pin(2)
    await engine.unpin(adapter(1))
    await engine.pin(3)
    assert engine.pinned == {2, 3}
    assert set(engine.registered) == {1, 2, 3}


OPS = st.lists(
    st.tuples(st.sampled_from(["register", "unregister", "pin", "unpin", "generate"]),
              st.integers(1, 7), st.sampled_from([8, 8, 16, 32])),
    min_size=1, max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_random_operation_sequences_never_violate(ops: list[tuple[str, int, int]]) -> None:
    async def scenario() -> list[str]:
        model = VllmModel(LIMITS, step_delay_s=0.0005)
        engine = SafeEngine(model, pin_wait_s=0.05)
        running: list[asyncio.Task[list[int]]] = []
        for op, i, rank in ops:
            try:
                if op == "register":
                    await engine.register(adapter(i, rank))
                elif op == "unregister":
                    await engine.unregister(i)
                elif op == "pin":
                    await engine.pin(i)
                elif op == "unpin":
                    await engine.unpin(adapter(i))
                else:
                    running.append(asyncio.create_task(run(engine, i, tokens=4, rank=rank)))
                    await asyncio.sleep(0)
            except (PinLimit, RankTooLarge, NoCapacity, NotPresent, InUse):
                pass
        await asyncio.gather(*running, return_exceptions=True)
        assert len(engine.pinned) <= LIMITS.max_loras - 1
        return model.violations

    assert asyncio.run(scenario()) == []


async def test_null_engine_implements_the_engine_protocol(tmp_path: Path) -> None:
    """Conformance only: the null engine exists for control-plane benchmarks."""
    from loraplane.worker.engine import Engine
    from loraplane.worker.null_engine import NullEngine
    from loraplane.worker.vllm_engine import VllmEngine

    null = NullEngine(LIMITS, tmp_path)
    assert isinstance(null, Engine) and isinstance(SafeEngine(null), Engine)
    assert all(hasattr(VllmEngine, name) for name in ("register", "unregister", "pin", "unpin",
                                                      "list", "generate", "abort", "close"))
    engine = SafeEngine(null)
    await engine.register(adapter(3))
    assert await run(engine, 3, tokens=2) == [3, 3]


# --------------------------------------------------------------------------- slot residency


def test_slot_residency_is_vllms_lru_of_activations_with_pins_kept() -> None:
    s = SlotResidency(2)
    assert s.touch(1) and s.touch(2)  # registered: activated into the free slots
    assert s.resident == {1, 2}
    assert not s.touch(1)  # already in a slot: only its recency changes
    assert s.touch(3)  # 2 is the least recently activated
    assert s.resident == {1, 3}
    s.pin(3)
    assert s.touch(2) and s.resident == {2, 3}  # 1 goes, the pinned 3 stays
    assert s.touch(1) and s.resident == {1, 3}
    s.remove(3)
    assert s.resident == {1} and s.activations == 5
    s.unpin(1)  # remove + add again in vLLM: still resident, activated once more
    assert s.resident == {1} and s.activations == 6


async def test_guard_reports_which_registered_adapters_sit_in_slots() -> None:
    engine = SafeEngine(VllmModel(LIMITS))  # max_loras 3, max_cpu_loras 5
    for i in (1, 2, 3, 4, 5):
        await engine.register(adapter(i))
    assert set(engine.registered) == {1, 2, 3, 4, 5}
    assert engine.slots.resident == {3, 4, 5}  # the last three activated
    await run(engine, 1)
    assert engine.slots.resident == {1, 4, 5}
    await engine.pin(4)
    await run(engine, 2)
    await run(engine, 3)
    assert engine.slots.resident == {2, 3, 4}  # pinned 4 kept, 1 and 5 moved out
    await engine.unregister(2)
    assert engine.slots.resident == {3, 4}
