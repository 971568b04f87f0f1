"""The per-request (online) interface the simulator drives, and the policy interface.

A simulation is demand paging: every request must be served HOT, so on a
miss the simulator loads the version and asks the policy for victims when a
tier is full. The simulator owns the tier contents and checks every rule
(capacities, in-flight); the policy keeps whatever ordering it needs and only
answers "which one goes". Versions, workers and slot groups are small
integers here so the hot loop stays fast; everything is deterministic.

Slot groups: HOT capacity is per (worker, base model); group ``g`` is
``worker * n_base_models + base_model``.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .cost import Bandwidths
from .model import PRIORITIES, REQUEST_CLASSES, Priority, RequestClass
from .plan import Plan
from .snapshot import Snapshot

PRIORITY_CODE: dict[Priority, int] = {p: i for i, p in enumerate(PRIORITIES)}
"""Integer code of each priority in :class:`OnlineContext` columns (platinum = 0)."""
CLASS_CODE: dict[RequestClass, int] = {c: i for i, c in enumerate(REQUEST_CLASSES)}
"""Integer code of each request class (interactive = 0, background = 1, canary = 2)."""


@dataclass(frozen=True)
class OnlineContext:
    """What an online policy may know about a simulated run (columns indexed by request)."""

    n_versions: int
    """Versions are 0 .. n_versions - 1."""
    n_workers: int
    """Workers are 0 .. n_workers - 1."""
    n_base_models: int
    """Base models are 0 .. n_base_models - 1."""
    hot_slots: int
    """Engine slots per (worker, base model) group."""
    warm_bytes: int
    """Host bytes per worker."""
    sizes: Sequence[int]
    """Artifact size per version."""
    adapters: Sequence[int]
    """Adapter (name, all versions alike) of each version: versions of one adapter share it."""
    versions: Sequence[int]
    """Version of each request."""
    classes: Sequence[int]
    """Request class code of each request (:data:`CLASS_CODE`)."""
    priorities: Sequence[int]
    """Priority code of each request (:data:`PRIORITY_CODE`)."""
    canary: Sequence[int]
    """1 when the requested version is an active canary at that time."""
    bandwidths: Bandwidths = field(default_factory=Bandwidths)
    """Load-path constants of the simulated cost model."""
    tenants: Sequence[int] = ()
    """Tenant (interned) of each version (empty: unknown)."""

    def next_use(self) -> list[int]:
        """For each request, the index of the next request of the same version (n if none)."""
        n = len(self.versions)
        nxt = [n] * n
        last: dict[int, int] = {}
        versions = self.versions
        for i in range(n - 1, -1, -1):
            v = versions[i]
            nxt[i] = last.get(v, n)
            last[v] = i
        return nxt


class OnlinePolicy(Protocol):
    """Per-request hooks; calls arrive in trace order with a non-decreasing clock."""

    def on_request(self, i: int, v: int, now: float) -> None:
        """Request ``i`` for version ``v`` arrived (before any placement change)."""

    def on_served(self, g: int, w: int, v: int, now: float) -> None:
        """The request was served HOT in group ``g`` on worker ``w`` (after any load)."""

    def on_insert_hot(self, g: int, v: int, now: float) -> None:
        """``v`` was loaded into group ``g``."""

    def on_remove_hot(self, g: int, v: int) -> None:
        """``v`` left group ``g`` (it stays WARM on that worker)."""

    def on_insert_warm(self, w: int, v: int, now: float) -> None:
        """``v`` was fetched onto worker ``w``."""

    def on_remove_warm(self, w: int, v: int) -> None:
        """``v`` was evicted from worker ``w`` to COLD."""

    def hot_victim(self, g: int, now: float, busy: Mapping[int, float]) -> int | None:
        """A member of group ``g`` to demote, skipping any ``u`` with ``busy.get(u, 0) > now``.

        None when every member is busy.
        """

    def warm_victim(self, w: int, now: float, hot: Container[int]) -> int | None:
        """A WARM member of worker ``w`` not in ``hot`` to evict; None when there is none."""


class CachePolicy(Protocol):
    """A cache policy: a planner for the cache-manager and a factory of online state."""

    name: str

    def plan(self, snapshot: Snapshot, now: float) -> Plan:
        """Actions that move the snapshot's placement towards the policy's target."""

    def online(self, ctx: OnlineContext) -> OnlinePolicy:
        """Fresh per-run state for the simulator."""
