"""What every registry operation shares: who acts (:class:`Ctx`) and the conventions.

Every operation is a function over one connection, in the module of its domain:
:mod:`~loraplane.registry.tenants`, :mod:`~loraplane.registry.keys`,
:mod:`~loraplane.registry.shares`, :mod:`~loraplane.registry.quotas`,
:mod:`~loraplane.registry.versions`, :mod:`~loraplane.registry.releases`,
the admission verdicts in :mod:`~loraplane.registry.admissions`.

Each function runs inside the caller's transaction (``async with transaction(pool) as
conn``), validates its input (INVALID_ARGUMENT names every bad field), applies the
state change, appends the audit entry and writes the event to the outbox, so the
change, its audit entry and its event commit together or not at all.

Entities changed by a function are locked (``SELECT ... FOR UPDATE``) before the
outbox row is written, which makes outbox id order equal to commit order per adapter
(the relay's per-key ordering relies on it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loraplane.shared.topics import Clock, utc_now


@dataclass(frozen=True)
class Ctx:
    """Who acts and how events are stamped."""

    actor: str
    """Recorded in the audit log (e.g. ``ci/acme-pipeline``, ``system/admission``)."""
    producer: str = "registry/registry-0"
    """``meta.producer`` of the events written."""
    clock: Clock = field(default=utc_now)
    """Time source of ``meta.occurred_at``."""
    topic_prefix: str = ""
    """Prefix of the topics events go to (an isolated namespace; "" in production)."""
    canary_clearance: bool = True
    """A new canary waits for the canary analysis to clear it (``ClearCanary``) before
    tenant traffic; False: it is cleared when set (no analysis runs)."""
