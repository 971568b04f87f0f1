"""Vocabulary of the cache manager: version ids, registry records, command kinds.

Everything here is plain data (frozen dataclasses and enums) shared by the pure
core (:mod:`~loraplane.cache_manager.state`, :mod:`~loraplane.cache_manager.tracker`,
:mod:`~loraplane.cache_manager.planner`) and the I/O around it. Conversions
between protobuf enums and the policy's string enums live here, in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from loraplane.policy.model import Priority, RequestClass
from loraplane.shared.vocab import Status as Status  # noqa: PLC0414 - re-exported
from loraplane.shared.vocab import Tier as Tier  # noqa: PLC0414 - re-exported
from loraplane.v1 import common_pb2

# --------------------------------------------------------------------------- ids


@dataclass(frozen=True, slots=True, order=True)
class Ref:
    """Immutable reference to one adapter version (the proto ``AdapterRef`` as a value)."""

    tenant_id: str
    adapter_name: str
    version: str
    base_model: str

    @property
    def adapter_id(self) -> str:
        """Kafka key / registry id of the adapter: ``tenant/name``."""
        return f"{self.tenant_id}/{self.adapter_name}"

    @property
    def version_id(self) -> str:
        """Cache id of the version: ``tenant/name@version`` (the policy's ``version_id``)."""
        return version_id(self.tenant_id, self.adapter_name, self.version)

    @staticmethod
    def of(ref: common_pb2.AdapterRef) -> Ref:
        """From the protobuf reference."""
        return Ref(ref.tenant_id, ref.adapter_name, ref.version, ref.base_model)

    def proto(self) -> common_pb2.AdapterRef:
        """To the protobuf reference."""
        return common_pb2.AdapterRef(
            tenant_id=self.tenant_id,
            adapter_name=self.adapter_name,
            version=self.version,
            base_model=self.base_model,
        )


def version_id(tenant_id: str, adapter_name: str, version: str) -> str:
    """``tenant/name@version``: the one spelling of a version id in the cache manager."""
    return f"{tenant_id}/{adapter_name}@{version}"


# --------------------------------------------------------------------------- enums

_PRIORITY_FROM_PROTO: dict[int, Priority] = {
    common_pb2.PRIORITY_PLATINUM: Priority.PLATINUM,
    common_pb2.PRIORITY_GOLD: Priority.GOLD,
    common_pb2.PRIORITY_SILVER: Priority.SILVER,
    common_pb2.PRIORITY_BRONZE: Priority.BRONZE,
}

_CLASS_FROM_PROTO: dict[int, RequestClass] = {
    common_pb2.REQUEST_CLASS_INTERACTIVE: RequestClass.INTERACTIVE,
    common_pb2.REQUEST_CLASS_BACKGROUND: RequestClass.BACKGROUND,
    common_pb2.REQUEST_CLASS_CANARY: RequestClass.CANARY,
}


def priority_from_proto(value: int, default: Priority = Priority.SILVER) -> Priority:
    """Policy priority of a proto ``Priority`` (``UNSPECIFIED`` → ``default``)."""
    return _PRIORITY_FROM_PROTO.get(value, default)


def priority_from_text(value: str | None, default: Priority = Priority.SILVER) -> Priority:
    """Policy priority of a registry text value (``None`` / unknown → ``default``)."""
    try:
        return Priority(value) if value else default
    except ValueError:
        return default


def request_class_from_proto(value: int) -> RequestClass:
    """Policy request class of a proto ``RequestClass`` (``UNSPECIFIED`` → interactive)."""
    return _CLASS_FROM_PROTO.get(value, RequestClass.INTERACTIVE)


# One Tier (the policy's) and one Status for every service: loraplane.shared.vocab (imported
# above; wire conversions: tier_to_proto / tier_from_proto there).


# --------------------------------------------------------------------------- registry facts


@dataclass(frozen=True, slots=True)
class VersionRecord:
    """What the cache manager knows about one version (registry record + admission)."""

    ref: Ref
    """The version."""
    status: Status
    """Registry status (or UNKNOWN while it is being resolved)."""
    engine_id: int = 0
    """Registry's stable engine id (vLLM ``lora_int_id``); 0 when not known yet."""
    artifact_uri: str = ""
    """Artifact root in object storage."""
    sha256: str = ""
    """Manifest digest the worker re-verifies."""
    size_bytes: int = 0
    """Artifact size."""
    rank: int = 0
    """LoRA rank."""
    priority: Priority = Priority.SILVER
    """Effective priority (version / adapter override, else tenant default)."""

    @property
    def version_id(self) -> str:
        """``tenant/name@version``."""
        return self.ref.version_id

    def with_status(self, status: Status) -> VersionRecord:
        """A copy with another status."""
        return replace(self, status=status)


@dataclass(frozen=True, slots=True)
class Pointers:
    """Release pointers of one adapter (registry ``release_pointers``)."""

    stable: str = ""
    """Stable version label ("" if none)."""
    canary: str = ""
    """Canary version label ("" if none)."""
    canary_percent: int = 0
    """Share of traffic routed to the canary (0..100)."""
    rollback_to: str = ""
    """Version a rollback returns to ("" = the previous stable, if any)."""
    previous_stable: str = ""
    """The stable version before the current one ("" if none)."""

    @property
    def rollback_target(self) -> str:
        """The version a rollback would make stable ("" if none)."""
        return self.rollback_to or self.previous_stable


REASON_PREFIX = "canary-analysis "
"""The audit reason of an automated step of the canary analysis: this prefix, then the
decision's figures as JSON."""
ACTOR = "system/canary-analysis"
"""Who acts for the canary analysis in the registry's audit log."""


ABORTED = "canary_aborted"
"""Reason of a block: the canary analysis aborted the canary."""
WITHDRAWN = "stable_withdrawn"
"""Reason of a block: the canary analysis withdrew the version (a failing stable one, or
the one a rollback left)."""


@dataclass(frozen=True, slots=True)
class TakenOut:
    """A step of the canary analysis that takes a version out of HOT, as the registry keeps
    it (its audit entry): what a new leader rebuilds its loading blocks from
    (:meth:`loraplane.cache_manager.core.CacheCore.restore_blocks`)."""

    version_id: str
    at: float
    """When the registry took the step (epoch seconds, the audit entry's time)."""
    reason: str
    """``canary_aborted`` (``SetCanary("", 0)`` of an abort) or ``stable_withdrawn``
    (``WithdrawVersion``, or the version a ``Rollback`` withdrew)."""
    detail: str = ""


# --------------------------------------------------------------------------- commands


class CommandKind(str, Enum):
    """One placement command; names match ``DecisionAction`` (``DECISION_ACTION_<NAME>``)."""

    UNPIN = "unpin"
    """Release the pin of a HOT version."""
    DEMOTE = "demote"
    """HOT → WARM (``EvictAdapter(to_tier=WARM)``; implies unpin)."""
    EVICT = "evict"
    """→ COLD (``EvictAdapter(to_tier=COLD)``; from HOT implies unpin + demote)."""
    LOAD_WARM = "load_warm"
    """COLD → WARM (``LoadAdapter(target_tier=WARM)``)."""
    LOAD_HOT = "load_hot"
    """→ HOT (``LoadAdapter(target_tier=HOT)``, optionally pinned)."""
    PIN = "pin"
    """Pin a HOT version."""

    @property
    def frees(self) -> bool:
        """Whether the command frees capacity (executed before the ones that take it)."""
        return self in (CommandKind.UNPIN, CommandKind.DEMOTE, CommandKind.EVICT)

    def target_tier(self, before: Tier) -> Tier:
        """Tier of the version on the worker once the command succeeded."""
        if self is CommandKind.LOAD_HOT:
            return Tier.HOT
        if self is CommandKind.LOAD_WARM:
            return Tier.HOT if before is Tier.HOT else Tier.WARM
        if self is CommandKind.DEMOTE:
            return Tier.WARM if before is not Tier.COLD else Tier.COLD
        if self is CommandKind.EVICT:
            return Tier.COLD
        return before


_KIND_ORDER = {kind: i for i, kind in enumerate(CommandKind)}


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """A command the planner wants sent: what, to whom, and why."""

    kind: CommandKind
    worker_id: str
    version_id: str
    reason: str
    """Machine-readable reason (policy ``Reason`` value or a business rule name)."""
    detail: str = ""
    """Human-readable specifics (scores, sizes, rule names)."""
    pin: bool = False
    """For LOAD_HOT: pin once HOT."""
    heat: float = 0.0
    """Heat score of the version when decided (for the decision log)."""
    source: str = "policy"
    """Who asked: the policy's name, or ``rule:<name>`` for business rules."""
    never_evict: bool = False
    """For loads: the version is protected by policy (active canary, protected priority);
    the worker's own request-path demotion must never pick it."""
    hot_keep: float | None = None
    """For LOAD_HOT: the version's HOT keep key in the round's adaptive ranking
    (``Ranks.hot_key``; ``LoadAdapter.hot_keep``), the order the worker's request-path
    victim follows; None without a ranking."""

    def sort_key(self) -> tuple[int, str, str]:
        """Execution order: what frees room first, then worker, then version."""
        return (_KIND_ORDER[self.kind], self.worker_id, self.version_id)
