"""Canary prewarm schedules: which workers must hold a staged canary's bytes, and whether
they do (pure: state in, answer out).

A canary staged at 0 % under a schedule (:class:`~loraplane.cache_manager.rules.CanaryPrewarm`
with ``start_percent > 0``) has *target workers*: the commandable workers serving its base
model (rank within their ``max_lora_rank``), those where the adapter's stable version is
resident first (they serve the adapter's traffic now, so the canary's share lands there),
then by id; the first ``workers`` of them, or every one. The planner prefetches it to WARM
on each (free bytes only, :meth:`~loraplane.cache_manager.planner.Planner.plan`), and the
canary analysis sets ``start_percent`` only when every target has *reported* it WARM or HOT
(``AdapterLoaded`` after the worker verified the files; a projected command does not count):
:func:`status` is the one answer both use.
"""

from __future__ import annotations

from dataclasses import dataclass

from loraplane.cache_manager.model import Tier, VersionRecord
from loraplane.cache_manager.rules import CanaryPrewarm
from loraplane.cache_manager.state import State


def targets(state: State, rec: VersionRecord, schedule: CanaryPrewarm) -> list[str]:
    """The target workers of a staged canary ``rec`` (empty without a schedule)."""
    if schedule.start_percent <= 0:
        return []
    bm = rec.ref.base_model
    stable = state.stable_of(rec.ref.adapter_id)
    out: list[tuple[bool, str]] = []
    for wid, w in state.workers.items():
        cap = w.capacities.get(bm)
        if cap is None or not w.commandable() or cap.slots <= 0:
            continue
        if cap.max_lora_rank and rec.rank > cap.max_lora_rank:
            continue
        out.append((not (stable and stable in w.placements), wid))
    out.sort()
    wids = [wid for _, wid in out]
    return wids[: schedule.workers] if schedule.workers else wids


@dataclass(frozen=True, slots=True)
class PrewarmStatus:
    """Where a staged canary's prewarm stands."""

    start_percent: int
    """The share to set once :attr:`done` (0: no schedule)."""
    targets: tuple[str, ...]
    ready: tuple[str, ...]
    """Targets that reported the version WARM or HOT."""

    @property
    def done(self) -> bool:
        """Every target holds verified bytes (and there is at least one target)."""
        return bool(self.targets) and len(self.ready) == len(self.targets)


def status(state: State, rec: VersionRecord, schedule: CanaryPrewarm) -> PrewarmStatus:
    """The prewarm of ``rec`` under ``schedule``, from the workers' reports."""
    wids = targets(state, rec, schedule)
    ready = tuple(
        w for w in wids if state.workers[w].tier_of(rec.version_id) in (Tier.WARM, Tier.HOT)
    )
    return PrewarmStatus(schedule.start_percent, tuple(wids), ready)
