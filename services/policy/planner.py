"""Plan building blocks shared by the policies.

:func:`enforce_capacity` is the whole planner of the baselines (they are demand
policies: they never promote ahead of a request, they only make room): demote
the lowest-ranked HOT versions while a (worker, base model) is over its slots,
evict the lowest-ranked WARM versions while a worker is over its bytes. It
never touches a version with in-flight requests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .plan import Action, ActionKind, Plan, Reason
from .snapshot import Snapshot, WorkerState

KeyFn = Callable[[str, WorkerState], tuple[float, float]]
"""Rank of a version on a worker (primary, tie-break): the lowest goes first."""


def by_base_model(
    version_ids: Iterable[str], base_model_of: Callable[[str], str]
) -> dict[str, list[str]]:
    """Version ids grouped by base model, each group sorted: the one grouping of a worker's
    HOT (or pinned) versions into slot groups, for the policies' plans and the cache-manager's
    projection alike (``base_model_of``: where each side reads the base model)."""
    out: dict[str, list[str]] = {}
    for v in sorted(version_ids):
        out.setdefault(base_model_of(v), []).append(v)
    return out


def total_bytes(version_ids: Iterable[str], size_of: Callable[[str], int]) -> int:
    """Host bytes the versions take (``size_of``: where each side reads a version's size)."""
    return sum(size_of(v) for v in version_ids)


def hot_by_base_model(snapshot: Snapshot, worker: WorkerState) -> dict[str, list[str]]:
    """The worker's HOT versions grouped by base model (sorted ids)."""
    return by_base_model(worker.hot, lambda v: base_model_of(snapshot, v))


def base_model_of(snapshot: Snapshot, version_id: str) -> str:
    """Base model of a version ("" when unknown)."""
    meta = snapshot.versions.get(version_id)
    return "" if meta is None else meta.base_model


def size_of(snapshot: Snapshot, version_id: str) -> int:
    """Size of a version (0 when unknown)."""
    meta = snapshot.versions.get(version_id)
    return 0 if meta is None else meta.size_bytes


def enforce_capacity(snapshot: Snapshot, hot_key: KeyFn, warm_key: KeyFn) -> Plan:
    """Demote/evict the lowest-ranked versions until every capacity holds (in-flight kept)."""
    actions: list[Action] = []
    for w in snapshot.workers:
        hot_after: set[str] = set(w.hot)
        for bm, members in hot_by_base_model(snapshot, w).items():
            slots = w.hot_slots.get(bm, 0)
            excess = len(members) - slots
            if excess <= 0:
                continue
            order = sorted(
                (v for v in members if not w.busy(v)), key=lambda v: (hot_key(v, w), v)
            )
            for v in order[:excess]:
                hot_after.discard(v)
                if v in w.pinned:
                    actions.append(Action(ActionKind.UNPIN, w.worker_id, v, Reason.CAPACITY))
                actions.append(
                    Action(ActionKind.DEMOTE, w.worker_id, v, Reason.CAPACITY,
                           f"{len(members)} HOT for {slots} slots of {bm}")
                )
        resident = w.resident()
        used = total_bytes(resident, lambda v: size_of(snapshot, v))
        if used <= w.warm_bytes:
            continue
        # Evict non-HOT first, then demote+evict HOT that is not busy, lowest rank first.
        cold_first = sorted(
            resident,
            key=lambda v: (v in hot_after, warm_key(v, w), v),
        )
        for v in cold_first:
            if used <= w.warm_bytes:
                break
            if w.busy(v):
                continue
            if v in hot_after:
                hot_after.discard(v)
                if v in w.pinned:
                    actions.append(Action(ActionKind.UNPIN, w.worker_id, v, Reason.CAPACITY))
                actions.append(
                    Action(ActionKind.DEMOTE, w.worker_id, v, Reason.CAPACITY, "host bytes")
                )
            actions.append(
                Action(ActionKind.EVICT, w.worker_id, v, Reason.CAPACITY,
                       f"{used} of {w.warm_bytes} host bytes used")
            )
            used -= size_of(snapshot, v)
    return Plan.of(actions)
