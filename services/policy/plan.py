"""Output of a policy: a plan of actions, each addressed to a worker, each with a reason.

Actions are ordered so that executing them in sequence never exceeds a
capacity: first what frees room (unpin, demote, evict), then what takes it
(prefetch, promote), then pins.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum, StrEnum


class ActionKind(str, Enum):
    """What to do; the declaration order is the execution order."""

    UNPIN = "unpin"
    """Let the engine evict the version again (it stays HOT)."""
    DEMOTE = "demote"
    """HOT → WARM: unregister from the engine, keep the host files."""
    EVICT = "evict"
    """WARM → COLD: delete the host files (object storage keeps the artifact)."""
    PREFETCH = "prefetch"
    """COLD → WARM: download and verify onto the host, do not register."""
    PROMOTE = "promote"
    """→ HOT: register in the engine (fetching first when COLD on that worker)."""
    PIN = "pin"
    """Forbid the engine to evict this HOT version."""


_ORDER = {kind: i for i, kind in enumerate(ActionKind)}


class Reason(StrEnum):
    """Why a placement action is taken: the policy's reasons, then the cache-manager's business
    rules' (one vocabulary for plans, commands and decision events; values are the wire words)."""

    HEAT = "heat"
    """Promote: among the hottest versions for the slots available."""
    MIN_REPLICAS = "min_replicas"
    """Promote: one of the hottest or protected versions needs more HOT replicas."""
    LOAD_SPREAD = "load_spread"
    """Promote: its request rate needs another replica."""
    PROTECTED = "protected"
    """Pin / prefetch: never-evict (active canary or protected priority)."""
    CANARY_PREWARM = "canary_prewarm"
    """Prefetch / promote: an active canary is warmed before real traffic meets it."""
    SCHEDULED_WARMUP = "scheduled_warmup"
    """Prefetch / promote: a scheduled warm-up window is open."""
    REPLICA_SURPLUS = "replica_surplus"
    """Demote: the version has more HOT replicas elsewhere than its rate needs."""
    DISPLACED = "displaced"
    """Demote / evict: versions with more heat need the room."""
    CAPACITY = "capacity"
    """Demote / evict: the tier is over capacity in the snapshot."""
    IDLE = "idle"
    """Demote / evict: no request for longer than configured."""
    ERROR_RATE = "error_rate"
    """Demote: too many failures since the last load."""
    SUPERSEDED = "superseded"
    """Demote / evict: the release pointer moved past this version."""
    PROTECTION_OVERFLOW = "protection_overflow"
    """Evict / unpin: protected versions alone exceed the tier; the coolest gives way."""
    UNPROTECTED = "unprotected"
    """Unpin: no longer protected, or beyond its kind's share of HOT slots."""
    # -- business rules of the cache manager (cache_manager/rules.py)
    CANARY_WARMUP = "canary_warmup"
    """Load: a canary version is HOT on ``canary.warm_replicas`` workers before traffic."""
    ROLLBACK = "rollback"
    """Load: after a rollback the restored version is HOT where the replaced one was."""
    ROLLBACK_TARGET = "rollback_target"
    """Prefetch: the version a rollback would return to stays WARM beside the stable one."""
    PREWARM = "prewarm"
    """Load: a ``PrewarmRequested`` asked for the version HOT."""
    DEMAND = "demand"
    """Load: requested recently, HOT nowhere, and a slot is free."""
    RETIRED = "retired"
    """Evict: the version was retired."""
    REJECTED = "rejected"
    """Evict: the version was rejected by admission."""
    UNKNOWN_VERSION = "unknown_version"
    """Evict: the registry does not know the version."""


@dataclass(frozen=True, slots=True)
class Action:
    """One step of a plan."""

    kind: ActionKind
    worker_id: str
    version_id: str
    reason: Reason
    detail: str = ""
    """Human-readable specifics (scores, sizes), for logs and audit."""

    def sort_key(self) -> tuple[int, str, str]:
        """Execution order: kind, then worker, then version."""
        return (_ORDER[self.kind], self.worker_id, self.version_id)


@dataclass(frozen=True, slots=True)
class Plan:
    """Ordered, immutable list of actions."""

    actions: tuple[Action, ...] = ()

    @staticmethod
    def of(actions: list[Action]) -> Plan:
        """Sort ``actions`` into execution order."""
        return Plan(tuple(sorted(actions, key=Action.sort_key)))

    def __iter__(self) -> Iterator[Action]:
        return iter(self.actions)

    def __len__(self) -> int:
        return len(self.actions)

    def of_kind(self, kind: ActionKind) -> tuple[Action, ...]:
        """Actions of one kind, in order."""
        return tuple(a for a in self.actions if a.kind is kind)

    def for_worker(self, worker_id: str) -> Plan:
        """The part of the plan addressed to one worker."""
        return Plan(tuple(a for a in self.actions if a.worker_id == worker_id))
