"""On-demand HOT victims: which version a full worker demotes to serve a request now.

Pure code (no I/O, clock passed in). The worker calls :func:`hot_victim` on the request
path when a version must become HOT and every HOT slot is taken; the cache manager's
:class:`~loraplane.policy.heat.HeatPolicy` makes the same decision ahead of time from the
same functions: :func:`~loraplane.policy.score.hot_terms` (the HOT heat),
:func:`~loraplane.policy.predicates.protection_of` and
:func:`~loraplane.policy.predicates.demotion_reason`. Only the inputs are the worker's
own: the statistics of the requests *it* served, and ``protected`` = the never-evict flag
the cache manager (``LoadAdapter.never_evict``) or the gateway (an active canary) set.

Rules, in order:

1. **never** a pinned version, nor a *busy* one: requests in flight, a request waiting for
   it (a version loaded for a waiting request is reserved until that request has run), or
   an operation under way on it;
2. **unprotected first**: among the other members, versions the demotion predicates
   already send back to WARM (idle longer than ``demote.idle_minutes``, error rate after
   load over the limit) lead — protected ones included, as in the policy (HOT → WARM only)
   — then the lowest by the cache manager's HOT order (``keep``: its adaptive ranking, the
   order :class:`~loraplane.policy.heat.HeatPolicy` demotes in), members it has not ranked
   yet after the ranked ones; the coolest by HOT heat among those without a keep; ties by
   least recently used, then by id;
3. **protection overflow**: a protected version (active canary, protected priority) goes
   only when protected and pinned versions hold *every* HOT slot of the worker, so that
   waiting can never free one; then the coolest idle protected version goes (reason
   ``protection_overflow``; demotion keeps its files, which is the policy's WARM
   guarantee; its HOT guarantee is the pin). Otherwise nothing is chosen and the request
   waits for a busy unprotected version to become idle.

A never-requested protected version is not idle (it was warmed on purpose).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from .config import PolicyConfig
from .cost import Bandwidths
from .plan import Reason
from .predicates import demotion_reason, protection_of
from .score import hot_terms
from .snapshot import VersionMeta
from .stats import StatsView


@dataclass(frozen=True, slots=True)
class HotMember:
    """One version HOT on the worker, as the victim choice sees it."""

    meta: VersionMeta
    """Registry facts (``version_id`` identifies the member)."""
    stats: StatsView
    """Requests this worker served for it."""
    last_used: float
    """Last request (or load, if never requested) on this worker, epoch seconds."""
    pinned: bool = False
    """Pinned in the engine: never a victim."""
    busy: bool = False
    """In flight, reserved for a waiting request, or an operation runs on it: never a victim."""
    protected: bool = False
    """Never-evict flag from the cache manager or the gateway (besides ``meta``'s own)."""
    keep: float | None = None
    """The cache manager's HOT keep key (``Ranks.hot_key``, carried by ``LoadAdapter.hot_keep``
    and ``HotOrder``): higher stays longer. None: not ranked (ranks after the ranked ones, by
    heat)."""


@dataclass(frozen=True, slots=True)
class VictimChoice:
    """The outcome of :func:`hot_victim`."""

    victim: str | None
    """Version to demote, or ``None``: nothing may go now."""
    reason: Reason | None = None
    """Why the victim goes: ``idle`` / ``error_rate`` / ``superseded`` (demotion predicates),
    ``capacity`` (coolest unprotected), ``protection_overflow``."""
    heat: float = 0.0
    """The victim's HOT heat."""
    why_none: str = ""
    """When ``victim`` is None: what holds every slot (for the caller's message)."""


def is_protected(member: HotMember, cfg: PolicyConfig) -> bool:
    """Whether ``member`` is protected (flag from outside, or canary/priority in its meta)."""
    return member.protected or protection_of(member.meta, cfg) is not None


def _demotion(member: HotMember, now: float, cfg: PolicyConfig) -> Reason | None:
    if member.meta.superseded:
        return Reason.SUPERSEDED
    if member.stats.last_access is None and is_protected(member, cfg):
        return None  # warmed on purpose, not idle
    return demotion_reason(member.meta, member.stats, now, cfg)


_Key = tuple[int, int, float, float, str]


def _key(member: HotMember, heat: float, demote: Reason | None) -> _Key:
    ranked = member.keep is not None
    return (0 if demote is not None else 1, 0 if ranked else 1,
            member.keep if member.keep is not None else heat, member.last_used,
            member.meta.version_id)


def hot_victim(
    members: Iterable[HotMember],
    now: float,
    cfg: PolicyConfig,
    bandwidths: Bandwidths | None = None,
) -> VictimChoice:
    """The version to demote so that another can become HOT (see the module docstring).

    ``members``: every version HOT on the worker (for the base model of the request).
    Deterministic for the same members and clock.
    """
    bw = bandwidths or Bandwidths()
    plain: list[tuple[_Key, HotMember, Reason | None, float]] = []
    protected: list[tuple[_Key, HotMember, Reason | None, float]] = []
    unprotected_unpinned = 0
    pinned = busy = 0
    for m in members:
        prot = is_protected(m, cfg)
        if not prot and not m.pinned:
            unprotected_unpinned += 1
        if m.pinned:
            pinned += 1
            continue
        if m.busy:
            busy += 1
            continue
        demote = _demotion(m, now, cfg)
        heat = -1.0 if m.meta.superseded else hot_terms(m.meta, m.stats, now, cfg.score, bw).heat
        entry = (_key(m, heat, demote), m, demote, heat)
        if prot and demote is None:
            protected.append(entry)
        else:
            plain.append(entry)
    if plain:
        _, m, demote, heat = min(plain, key=lambda e: e[0])
        return VictimChoice(m.meta.version_id, demote or Reason.CAPACITY, heat)
    if protected and unprotected_unpinned == 0:
        _, m, _, heat = min(protected, key=lambda e: e[0])
        return VictimChoice(m.meta.version_id, Reason.PROTECTION_OVERFLOW, heat)
    parts = [f"{busy} busy (in flight or reserved for a waiting request)"]
    if pinned:
        parts.append(f"{pinned} pinned")
    if protected:
        parts.append(f"{len(protected)} protected (canary / priority)")
    return VictimChoice(None, None, math.nan, "; ".join(parts))
