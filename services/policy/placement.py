"""Where one more HOT replica of a version goes: the one host ranking (pure).

Both placement paths use it: the heat policy's plan (:meth:`HeatPolicy.plan
<loraplane.policy.heat.HeatPolicy.plan>`, replicas by heat) and the cache-manager's business
rules (canary warm-up, rollback, prewarm, schedules, demand: ``cache_manager/planner.py``),
which pass their requirement as a typed :class:`HostOption` per eligible worker (eligibility
— serves the base model, rank, backoff, golden-set blocks — stays theirs). Best first:

1. the worker the requirement names (``preferred``: e.g. a prewarm for the worker that
   degraded a request);
2. where the version is already HOT (affinity: nothing to load);
3. where a slot is free without displacing anyone;
4. where the version is WARM (a cheap load, no download);
5. the least loaded (Σ decayed request rate of its HOT versions; 0 when unknown);
6. a stable hash of (version, worker) — crc32, the same in every process.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HostOption:
    """One eligible worker for one more HOT replica of a version, as the ranking sees it."""

    worker_id: str
    preferred: bool = False
    """The requirement names this worker."""
    hot_here: bool = False
    """The version is already HOT there."""
    free_slots: int = 0
    """Slots of the version's base model free there without displacing anyone."""
    resident: bool = False
    """The version's files are there (WARM)."""
    load: float = 0.0
    """Σ decayed request rate of the worker's HOT versions (0: unknown)."""


def stable_hash(*parts: str) -> int:
    """A process-independent hash of ``parts`` (crc32 of ``a|b|…``)."""
    return zlib.crc32("|".join(parts).encode("utf-8"))


def host_key(version_id: str, o: HostOption) -> tuple[bool, bool, bool, bool, float, int]:
    """Sort key of ``o`` for ``version_id`` (lowest first; see the module docstring)."""
    return (not o.preferred, not o.hot_here, o.free_slots <= 0, not o.resident, o.load,
            stable_hash(version_id, o.worker_id))


def rank_hosts(version_id: str, options: Iterable[HostOption]) -> list[HostOption]:
    """``options`` best first for one more HOT replica of ``version_id``."""
    return sorted(options, key=lambda o: host_key(version_id, o))
