"""The version status machine and release-pointer planning (pure: no I/O).

Statuses (the ``version_status`` database enum)::

    pending ──► admitted ──► active (stable) ──► admitted (replaced / rolled back from)
       │           │  ▲           ▲
       │           ▼  │           │
       │         canary ──────────┘ (promoted)
       ▼
    rejected            any status but active ──► retired (terminal)

* only the admission verdict moves a version out of ``pending``;
* only ``admitted`` (or ``canary``) versions can be promoted or made canary;
* a rollback target must be ``admitted``;
* the stable version cannot be retired (promote or roll back first); retiring the
  canary clears the canary pointer; a retired version never serves again.

Planners take the current pointers and the status of the versions concerned and
return a :class:`ReleasePlan` (new pointers + status changes); the service layer
executes it. They raise ``FailedPrecondition`` / ``InvalidArgument`` /
``NotFound`` with a message naming the version.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from loraplane.shared.errors import FailedPrecondition, InvalidArgument, NotFound
from loraplane.shared.vocab import Status as _Status

# One Status for every service (the registry stores the lifecycle ones: pending ... retired).
Status = _Status

TRANSITIONS: Mapping[Status, frozenset[Status]] = {
    Status.PENDING: frozenset({Status.ADMITTED, Status.REJECTED, Status.RETIRED}),
    Status.ADMITTED: frozenset({Status.ACTIVE, Status.CANARY, Status.RETIRED}),
    Status.CANARY: frozenset({Status.ACTIVE, Status.ADMITTED, Status.RETIRED}),
    Status.ACTIVE: frozenset({Status.ADMITTED}),
    Status.REJECTED: frozenset({Status.RETIRED}),
    Status.RETIRED: frozenset(),
    # the cache-manager-only states (shared.vocab.Status): the registry never stores them
    Status.UNKNOWN: frozenset(),
    Status.GONE: frozenset(),
    Status.FOREIGN: frozenset(),
}
"""Allowed status changes (anything else is FAILED_PRECONDITION)."""

SERVABLE: frozenset[Status] = frozenset({Status.ACTIVE, Status.CANARY})
"""Statuses that receive traffic."""
LOADABLE: frozenset[Status] = frozenset({Status.ADMITTED, Status.ACTIVE, Status.CANARY})
"""Statuses an engine may load (passed admission, not retired)."""


def can_transition(current: Status, target: Status) -> bool:
    """Whether ``current → target`` is allowed."""
    return target in TRANSITIONS[current]


def check_transition(current: Status, target: Status, subject: str) -> None:
    """Raise ``FailedPrecondition`` unless ``current → target`` is allowed."""
    if not can_transition(current, target):
        raise FailedPrecondition(f"{subject} is {current.value}; cannot become {target.value}")


@dataclass(frozen=True)
class Pointers:
    """Release pointers of one adapter name."""

    stable: str | None = None
    canary: str | None = None
    canary_percent: int = 0
    rollback_to: str | None = None
    history: tuple[str, ...] = ()
    """Earlier stable versions, oldest first (the rollback candidates)."""


@dataclass(frozen=True)
class ReleasePlan:
    """What a release operation changes."""

    pointers: Pointers
    """Pointers after the operation."""
    status_changes: Mapping[str, Status] = field(default_factory=dict)
    """version → new status."""
    changed: bool = True
    """False for an idempotent no-op (no event, no audit)."""


def _status(statuses: Mapping[str, Status], version: str, subject: str) -> Status:
    try:
        return statuses[version]
    except KeyError:
        raise NotFound(f"{subject}@{version} does not exist") from None


def _rollback_target(history: tuple[str, ...], statuses: Mapping[str, Status]) -> str | None:
    """Newest entry of ``history`` that is still admitted."""
    for version in reversed(history):
        if statuses.get(version) == Status.ADMITTED:
            return version
    return None


def plan_promote(
    ptr: Pointers, version: str, statuses: Mapping[str, Status], subject: str
) -> ReleasePlan:
    """Make ``version`` stable. The old stable becomes ``admitted`` and the rollback
    target; promoting the canary clears the canary pointer."""
    current = _status(statuses, version, subject)
    if ptr.stable == version:
        return ReleasePlan(ptr, changed=False)
    if current not in (Status.ADMITTED, Status.CANARY):
        raise FailedPrecondition(
            f"{subject}@{version} is {current.value}; only admitted or canary versions "
            "can be promoted"
        )
    changes: dict[str, Status] = {version: Status.ACTIVE}
    history = tuple(v for v in ptr.history if v != version)
    if ptr.stable is not None:
        changes[ptr.stable] = Status.ADMITTED
        history = (*history, ptr.stable)
    canary, percent = ptr.canary, ptr.canary_percent
    if canary == version:
        canary, percent = None, 0
    after = {**statuses, **changes}
    new = Pointers(
        stable=version,
        canary=canary,
        canary_percent=percent,
        rollback_to=_rollback_target(history, after),
        history=history,
    )
    return ReleasePlan(new, changes)


def plan_canary(
    ptr: Pointers, version: str, percent: int, statuses: Mapping[str, Status], subject: str
) -> ReleasePlan:
    """Set the canary to ``version`` at ``percent`` % (``version=""`` and 0: clear it)."""
    if not 0 <= percent <= 100:
        raise InvalidArgument(f"percent: {percent} is outside [0, 100]")
    if not version:
        if percent != 0:
            raise InvalidArgument("version: required when percent > 0")
        if ptr.canary is None:
            return ReleasePlan(ptr, changed=False)
        return ReleasePlan(
            replace(ptr, canary=None, canary_percent=0), {ptr.canary: Status.ADMITTED}
        )
    current = _status(statuses, version, subject)
    if ptr.stable == version:
        raise FailedPrecondition(f"{subject}@{version} is the stable version")
    if ptr.canary == version:
        if ptr.canary_percent == percent:
            return ReleasePlan(ptr, changed=False)
        return ReleasePlan(replace(ptr, canary_percent=percent), {})
    if current != Status.ADMITTED:
        raise FailedPrecondition(
            f"{subject}@{version} is {current.value}; only admitted versions can be canaried"
        )
    changes: dict[str, Status] = {version: Status.CANARY}
    if ptr.canary is not None:
        changes[ptr.canary] = Status.ADMITTED
    return ReleasePlan(replace(ptr, canary=version, canary_percent=percent), changes)


def plan_rollback(
    ptr: Pointers, to_version: str, statuses: Mapping[str, Status], subject: str
) -> ReleasePlan:
    """Move the stable pointer back to ``to_version`` (``""``: the recorded
    ``rollback_to``, else the newest admitted earlier stable version)."""
    if ptr.stable is None:
        raise FailedPrecondition(f"{subject} has no stable version to roll back from")
    target = to_version or ptr.rollback_to or _rollback_target(ptr.history, statuses)
    if not target:
        raise FailedPrecondition(f"{subject} has no rollback target")
    current = _status(statuses, target, subject)
    if target == ptr.stable:
        raise FailedPrecondition(f"{subject}@{target} is already the stable version")
    if current != Status.ADMITTED:
        raise FailedPrecondition(
            f"{subject}@{target} is {current.value}; a rollback target must be admitted"
        )
    changes = {target: Status.ACTIVE, ptr.stable: Status.ADMITTED}
    # Forget the target and everything stable after it: the version rolled back from
    # never becomes a rollback target by itself.
    history = ptr.history[: ptr.history.index(target)] if target in ptr.history else ptr.history
    after = {**statuses, **changes}
    new = Pointers(
        stable=target,
        canary=ptr.canary,
        canary_percent=ptr.canary_percent,
        rollback_to=_rollback_target(history, after),
        history=history,
    )
    return ReleasePlan(new, changes)


def plan_retire(
    ptr: Pointers, version: str, statuses: Mapping[str, Status], subject: str
) -> ReleasePlan:
    """Retire ``version``: refused for the stable version; clears it from the canary
    pointer, the rollback target and the history."""
    current = _status(statuses, version, subject)
    if current == Status.RETIRED:
        return ReleasePlan(ptr, changed=False)
    if ptr.stable == version or current == Status.ACTIVE:
        raise FailedPrecondition(
            f"{subject}@{version} is the stable version; promote or roll back first"
        )
    check_transition(current, Status.RETIRED, f"{subject}@{version}")
    canary, percent = ptr.canary, ptr.canary_percent
    if canary == version:
        canary, percent = None, 0
    history = tuple(v for v in ptr.history if v != version)
    after = {**statuses, version: Status.RETIRED}
    new = Pointers(
        stable=ptr.stable,
        canary=canary,
        canary_percent=percent,
        rollback_to=_rollback_target(history, after),
        history=history,
    )
    return ReleasePlan(new, {version: Status.RETIRED})
