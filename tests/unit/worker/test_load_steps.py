"""A COLD->HOT load's timing (LoadOutcome and its FetchTiming) splits the load's wall time
into disjoint steps along its critical path, as bench-cold prints them (cold_steps)."""

from __future__ import annotations

import asyncio
import time

from worker_fakes import MakeAdapter, Rig

from benchmarks.cold import STEPS, cold_steps
from loraplane.worker.manager import TIER_COLD, TIER_HOT


async def test_cold_load_steps_are_disjoint_parts_of_its_wall_time(
    rig: Rig, make_adapter: MakeAdapter
) -> None:
    spec = make_adapter()
    t0 = time.perf_counter()
    cold = await rig.manager.load(spec, TIER_HOT)
    wall = time.perf_counter() - t0
    assert cold.source_tier == TIER_COLD and cold.fetch is not None
    steps = cold_steps(wall, cold)
    assert list(steps) == [*STEPS, "rest"]
    assert all(v >= 0 for v in steps.values()), steps  # rest >= 0: no step counted twice
    assert steps["register"] == cold.register_s > 0 and steps["stream"] > 0
    assert cold.lock_s >= 0 and cold.account_s > 0 and cold.ready_s > 0


async def test_a_load_behind_another_of_the_same_version_counts_its_lock_wait(
    rig: Rig, make_adapter: MakeAdapter
) -> None:
    spec = make_adapter()
    first, second = await asyncio.gather(rig.manager.load(spec, TIER_HOT),
                                         rig.manager.load(spec, TIER_HOT))
    assert first.source_tier == TIER_COLD and second.source_tier == TIER_HOT
    # the second waited under the version lock from the first's download on: at least its
    # verification and registration, which both began after the second had arrived
    assert first.fetch is not None
    assert second.lock_s >= first.fetch.verify_s + first.register_s > 0
