"""One vocabulary for every service: tiers, version statuses, and their wire values.

* :class:`Tier` is the cache policy's (:mod:`loraplane.policy.model`): where a version's
  weights live on one worker. On the wire it is the proto ``loraplane.v1.Tier``;
  :func:`tier_to_proto` / :func:`tier_from_proto` convert, :data:`TIER_NAMES` names a wire
  value (metric labels, headers). The gateway and the worker, which handle wire values, take
  :data:`TIER_HOT` / :data:`TIER_WARM` / :data:`TIER_COLD` from here.
* :class:`Status` is the status of an adapter version: the registry's lifecycle (the
  ``version_status`` database enum: pending … retired) plus three states only the
  cache-manager's view of the registry has (``unknown`` while it resolves a version it met on
  a worker first, ``gone`` when the registry does not know it, ``foreign`` for a tenant this
  deployment does not manage). The registry never stores those three.
* The reasons of placement decisions are the policy's :class:`~loraplane.policy.plan.Reason`.

Pure: enums and tables, no I/O.
"""

from __future__ import annotations

from enum import StrEnum

from loraplane.policy.model import Tier
from loraplane.v1 import common_pb2

__all__ = [
    "LIFECYCLE",
    "TIER_COLD",
    "TIER_HOT",
    "TIER_NAMES",
    "TIER_WARM",
    "Status",
    "Tier",
    "tier_from_proto",
    "tier_to_proto",
]

TIER_HOT = common_pb2.TIER_HOT
TIER_WARM = common_pb2.TIER_WARM
TIER_COLD = common_pb2.TIER_COLD

_TO_PROTO: dict[Tier, int] = {Tier.HOT: TIER_HOT, Tier.WARM: TIER_WARM, Tier.COLD: TIER_COLD}
_FROM_PROTO: dict[int, Tier] = {v: k for k, v in _TO_PROTO.items()}

TIER_NAMES: dict[int, str] = {
    common_pb2.TIER_UNSPECIFIED: "unspecified",
    **{wire: tier.value for tier, wire in _TO_PROTO.items()},
}
"""Wire tier value → lowercase name (metric labels, headers)."""


def tier_to_proto(tier: Tier) -> common_pb2.Tier:
    """The proto ``Tier`` value of ``tier``."""
    return _TO_PROTO[tier]  # type: ignore[return-value]


def tier_from_proto(value: int) -> Tier:
    """The tier of a proto ``Tier`` value (``UNSPECIFIED`` → COLD: not on the worker)."""
    return _FROM_PROTO.get(value, Tier.COLD)


class Status(StrEnum):
    """Status of an adapter version (values: the registry's database enum labels, then the
    cache-manager-only states)."""

    PENDING = "pending"
    ADMITTED = "admitted"
    REJECTED = "rejected"
    ACTIVE = "active"
    CANARY = "canary"
    RETIRED = "retired"
    UNKNOWN = "unknown"
    """Cache-manager only: seen on a worker or in heat before the registry told it about the
    version (being resolved)."""
    GONE = "gone"
    """Cache-manager only: the registry does not know it: nothing may load it, workers drop it."""
    FOREIGN = "foreign"
    """Cache-manager only: of a tenant this deployment does not manage: neither loaded nor
    evicted, its room counts."""

    @property
    def loadable(self) -> bool:
        """Whether a worker may be told to load the version (passed admission, not retired)."""
        return self in (Status.ADMITTED, Status.ACTIVE, Status.CANARY)

    @property
    def to_drop(self) -> bool:
        """Whether every worker must drain and evict the version."""
        return self in (Status.RETIRED, Status.REJECTED, Status.GONE)


LIFECYCLE: frozenset[Status] = frozenset({
    Status.PENDING, Status.ADMITTED, Status.REJECTED, Status.ACTIVE, Status.CANARY,
    Status.RETIRED,
})
"""The statuses the registry stores (its ``version_status`` enum)."""
