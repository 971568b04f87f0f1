"""Never-evict and demotion predicates (pure functions of metadata, stats and the clock).

Which tier protects what:

* **in-flight** (always): a version with in-flight requests on a worker is never
  demoted or evicted there, by any policy and any predicate.
* **active canary** and **protected priorities** (default: platinum): never leave
  WARM on a worker that holds them; in HOT they are pinned, but only up to
  ``hot_share_canary`` / ``hot_share_priority`` of the slots of each worker and
  base model, and never more than ``slots - 1`` pins in total, so an
  unpinned slot always remains for other traffic. Beyond the share they compete
  on heat like everyone else. If protected versions alone exceed a worker's WARM
  bytes, the coolest of them is evicted (reason ``protection_overflow``).
* **demotion** (idle longer than ``demote.idle_minutes``, error rate after load
  above ``demote.error_rate_after_load``) applies to protected versions too:
  it moves them HOT → WARM, never to COLD.
"""

from __future__ import annotations

from enum import Enum

from .config import PolicyConfig
from .model import Priority
from .plan import Reason
from .snapshot import VersionMeta
from .stats import StatsView


class Protection(str, Enum):
    """Why a version is protected from eviction (in-flight is handled per worker)."""

    CANARY = "canary"
    PRIORITY = "priority"


def protection(canary: bool, priority: Priority, cfg: PolicyConfig) -> Protection | None:
    """The protection a version has from its canary flag and priority (canary first)."""
    if canary and cfg.never_evict.active_canary:
        return Protection.CANARY
    if priority in cfg.never_evict.priorities:
        return Protection.PRIORITY
    return None


def protection_of(meta: VersionMeta, cfg: PolicyConfig) -> Protection | None:
    """:func:`protection` of a version's metadata."""
    return protection(meta.canary, meta.priority, cfg)


def hot_share_limit(kind: Protection, slots: int, cfg: PolicyConfig) -> int:
    """How many HOT slots (of ``slots``) versions protected by ``kind`` may hold pinned."""
    share = (
        cfg.never_evict.hot_share_canary
        if kind is Protection.CANARY
        else cfg.never_evict.hot_share_priority
    )
    return min(int(share * slots + 1e-9), max(slots - 1, 0))


def max_pins(slots: int) -> int:
    """Pins allowed per worker and base model: always leave one slot unpinned."""
    return max(slots - 1, 0)


def demotion_reason(
    meta: VersionMeta, stats: StatsView, now: float, cfg: PolicyConfig
) -> Reason | None:
    """Why a HOT version must go back to WARM whatever its heat (None: it may stay).

    A version never requested yet is not idle when it is protected or in a
    warm-up window (it was warmed on purpose); otherwise it is.
    """
    if stats.last_access is None:
        if protection_of(meta, cfg) is None and meta.warmup <= 0.0:
            return Reason.IDLE
    elif stats.idle_s(now) > cfg.demote.idle_minutes * 60.0:
        return Reason.IDLE
    if (
        stats.requests_after_load >= cfg.demote.min_requests_for_error_rate
        and stats.error_rate_after_load() > cfg.demote.error_rate_after_load
    ):
        return Reason.ERROR_RATE
    return None


def eviction_reason(
    meta: VersionMeta, stats: StatsView, now: float, cfg: PolicyConfig
) -> Reason | None:
    """Why an unprotected WARM version should go to COLD without capacity pressure."""
    idle_minutes = cfg.evict.idle_minutes
    if idle_minutes is None or protection_of(meta, cfg) is not None or meta.warmup > 0.0:
        return None
    if stats.idle_s(now) > idle_minutes * 60.0:
        return Reason.IDLE
    return None
