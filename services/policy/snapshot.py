"""Immutable input of :meth:`CachePolicy.plan`: versions, statistics, placement, capacities.

The cache-manager builds one :class:`Snapshot` from its live state (registry
metadata, heat statistics, the ``cache.state`` reports of every worker) and
asks the policy for a plan. Everything here is frozen, so one snapshot and one
clock always give the same plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .cost import Bandwidths
from .model import Priority
from .stats import StatsView

EMPTY_STATS = StatsView()


@dataclass(frozen=True, slots=True)
class VersionMeta:
    """Registry facts about one immutable adapter version (the cached unit)."""

    version_id: str
    """Stable id of the version, e.g. ``tenant-a/support@2026-07-09.1``."""
    tenant_id: str
    """Owning tenant."""
    base_model: str
    """Base model it applies to (HOT capacity is counted per base model)."""
    priority: Priority
    """Effective priority (tenant default or adapter override)."""
    size_bytes: int
    """Artifact size: WARM bytes it takes and the load cost it implies."""
    rank: int = 16
    """LoRA rank."""
    canary: bool = False
    """True while the version is an active canary (canary_percent > 0)."""
    warmup: float = 0.0
    """Scheduled warm-up signal in [0, 1] at snapshot time (1: a warm-up window is open)."""
    superseded: bool = False
    """The release pointer moved past this version (no new request resolves to it)."""


@dataclass(frozen=True, slots=True)
class WorkerState:
    """What one worker holds and can hold."""

    worker_id: str
    """Stable worker id (plans address actions to it)."""
    hot_slots: Mapping[str, int]
    """Engine LoRA slots (``max_loras``) per base model served by this worker."""
    warm_bytes: int
    """Host bytes for verified adapter files (HOT versions count here too)."""
    hot: frozenset[str] = frozenset()
    """Versions registered in the engine."""
    warm: frozenset[str] = frozenset()
    """Versions with verified files on the host (a HOT version is treated as WARM too)."""
    pinned: frozenset[str] = frozenset()
    """HOT versions pinned in the engine."""
    in_flight: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """Requests executing now, per version."""
    loaded_at: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    """When each HOT version was loaded (used by FIFO)."""

    def resident(self) -> frozenset[str]:
        """Every version with files on this worker (WARM ∪ HOT)."""
        return self.warm | self.hot

    def busy(self, version_id: str) -> bool:
        """True when ``version_id`` has in-flight requests here."""
        return self.in_flight.get(version_id, 0) > 0


@dataclass(frozen=True, slots=True)
class Ranks:
    """The adaptive experts' order, frozen for one plan.

    ``hot``: per version, a key that is higher the longer the version should stay HOT — in
    each slot group, minus its position in the group's leading expert's order from the top
    (0 = kept longest) divided by the group's slots, so versions of different groups compare
    by how far down their own group they stand. ``warm``: per (worker id, version id), the
    worker's leading WARM expert's key (lower goes first; ties: the lower id)."""

    hot: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    warm: Mapping[tuple[str, str], float] = field(default_factory=lambda: MappingProxyType({}))
    hot_experts: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Leading HOT expert per ``worker/base model`` group (for the decision log)."""
    warm_experts: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Leading WARM expert per worker."""

    def hot_key(self, version_id: str) -> float:
        """HOT keep key of a version (the lowest when never requested)."""
        return self.hot.get(version_id, -float("inf"))

    def warm_key(self, worker_id: str, version_id: str) -> float:
        """WARM key of a version on a worker (the lowest when unknown)."""
        return self.warm.get((worker_id, version_id), -float("inf"))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything a policy may look at, frozen."""

    versions: Mapping[str, VersionMeta]
    """Known versions by id (any version placed on a worker must be here)."""
    stats: Mapping[str, StatsView]
    """Request statistics by version id (missing: never requested)."""
    workers: tuple[WorkerState, ...]
    """Workers, sorted by id."""
    bandwidths: Bandwidths = field(default_factory=Bandwidths)
    """Measured load-path throughputs (for the load-cost term)."""
    next_access: Mapping[str, float] | None = None
    """Future knowledge for the offline optimum (Belady) only: next request time per version."""
    ranks: Ranks | None = None
    """The adaptive experts' order (:class:`~loraplane.policy.ranking.AdaptiveRanking`): the
    heat plan ranks HOT and WARM by it; None: by the plain heat score."""

    @staticmethod
    def build(
        versions: Iterable[VersionMeta],
        workers: Iterable[WorkerState],
        stats: Mapping[str, StatsView] | None = None,
        bandwidths: Bandwidths | None = None,
        next_access: Mapping[str, float] | None = None,
        ranks: Ranks | None = None,
    ) -> Snapshot:
        """Freeze the inputs into a snapshot (workers sorted by id, mappings read-only)."""
        return Snapshot(
            versions=MappingProxyType({v.version_id: v for v in versions}),
            stats=MappingProxyType(dict(stats or {})),
            workers=tuple(sorted(workers, key=lambda w: w.worker_id)),
            bandwidths=bandwidths or Bandwidths(),
            next_access=None if next_access is None else MappingProxyType(dict(next_access)),
            ranks=ranks,
        )

    def stats_of(self, version_id: str) -> StatsView:
        """Statistics of a version (empty when never requested)."""
        return self.stats.get(version_id, EMPTY_STATS)

    def problems(self) -> list[str]:
        """Every inconsistency in the snapshot (empty when it is usable as is)."""
        out: list[str] = []
        seen: set[str] = set()
        for w in self.workers:
            if w.worker_id in seen:
                out.append(f"worker {w.worker_id}: duplicate id")
            seen.add(w.worker_id)
            for v in sorted(w.resident()):
                if v not in self.versions:
                    out.append(f"worker {w.worker_id}: unknown version {v}")
            for v in sorted(w.pinned - w.hot):
                out.append(f"worker {w.worker_id}: {v} pinned but not HOT")
            for v in sorted(w.hot):
                meta = self.versions.get(v)
                if meta is not None and meta.base_model not in w.hot_slots:
                    out.append(f"worker {w.worker_id}: {v} HOT for unserved {meta.base_model}")
        return out

