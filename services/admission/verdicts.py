"""Admission's verdict record: decide once per version, republish the same verdict after.

:class:`VerdictStore` is the interface; :class:`PostgresVerdictStore` keeps verdicts in
the ``admission_verdicts`` table (migration ``20261129100001``) and
:class:`MemoryVerdictStore` in a dict (unit tests). ``put`` is insert-or-return-existing,
so two replicas deciding the same release at once still publish one verdict.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Protocol

import asyncpg

from loraplane.shared.db import transaction
from loraplane.shared.topics import event_meta
from loraplane.v1 import events_pb2


@dataclass(frozen=True, slots=True)
class VerdictKey:
    """What a verdict is about: one version's content."""

    adapter_id: str
    version: str
    sha256: str


def verdict_result(event: events_pb2.AdmissionEvent) -> str:
    """``"admitted"`` or ``"rejected"``."""
    arm = event.WhichOneof("verdict")
    if arm not in ("admitted", "rejected"):
        raise ValueError("AdmissionEvent without a verdict")
    return str(arm)


class VerdictStore(Protocol):
    """Where verdicts are remembered."""

    async def get(self, key: VerdictKey) -> events_pb2.AdmissionEvent | None:
        """The stored verdict for ``key``, if any."""
        ...

    async def put(self, key: VerdictKey, release_event_id: str,
                  event: events_pb2.AdmissionEvent, *, decided_by: str
                  ) -> tuple[events_pb2.AdmissionEvent, bool]:
        """Store ``event`` unless a verdict exists; returns ``(the stored verdict, new?)``."""
        ...


class MemoryVerdictStore:
    """In-process :class:`VerdictStore` (tests)."""

    def __init__(self) -> None:
        """Empty store."""
        self.rows: dict[VerdictKey, bytes] = {}

    async def get(self, key: VerdictKey) -> events_pb2.AdmissionEvent | None:
        """See :meth:`VerdictStore.get`."""
        raw = self.rows.get(key)
        return None if raw is None else events_pb2.AdmissionEvent.FromString(raw)

    async def put(self, key: VerdictKey, release_event_id: str,
                  event: events_pb2.AdmissionEvent, *, decided_by: str
                  ) -> tuple[events_pb2.AdmissionEvent, bool]:
        """See :meth:`VerdictStore.put`."""
        if key in self.rows:
            return events_pb2.AdmissionEvent.FromString(self.rows[key]), False
        self.rows[key] = event.SerializeToString(deterministic=True)
        return event, True


class PostgresVerdictStore:
    """:class:`VerdictStore` on the ``admission_verdicts`` table."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        """Use connections of ``pool``."""
        self.pool = pool

    async def get(self, key: VerdictKey) -> events_pb2.AdmissionEvent | None:
        """See :meth:`VerdictStore.get`."""
        async with transaction(self.pool, readonly=True) as conn:
            raw = await conn.fetchval(
                "SELECT event FROM admission_verdicts "
                "WHERE adapter_id = $1 AND version = $2 AND sha256 = $3",
                key.adapter_id, key.version, key.sha256)
        return None if raw is None else events_pb2.AdmissionEvent.FromString(bytes(raw))

    async def put(self, key: VerdictKey, release_event_id: str,
                  event: events_pb2.AdmissionEvent, *, decided_by: str
                  ) -> tuple[events_pb2.AdmissionEvent, bool]:
        """See :meth:`VerdictStore.put`."""
        result = verdict_result(event)
        verdict = getattr(event, result)
        meta = event_meta(event)
        assert meta is not None
        reasons = [{"code": events_pb2.RejectionCode.Name(r.code), "message": r.message,
                    "path": r.path} for r in getattr(verdict, "reasons", [])]
        async with transaction(self.pool) as conn:
            inserted = await conn.fetchval(
                "INSERT INTO admission_verdicts (adapter_id, version, sha256, "
                "release_event_id, verdict_event_id, result, reasons, event, duration_ms, "
                "decided_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) "
                "ON CONFLICT (adapter_id, version, sha256) DO NOTHING RETURNING 1",
                key.adapter_id, key.version, key.sha256, _uuid(release_event_id),
                uuid.UUID(meta.event_id), result, reasons,
                event.SerializeToString(deterministic=True), verdict.duration_ms, decided_by)
            if inserted is not None:
                return event, True
            raw = await conn.fetchval(
                "SELECT event FROM admission_verdicts "
                "WHERE adapter_id = $1 AND version = $2 AND sha256 = $3",
                key.adapter_id, key.version, key.sha256)
        return events_pb2.AdmissionEvent.FromString(bytes(raw)), False


def _uuid(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        # a release without a UUID event id still gets a stable record
        return uuid.uuid5(uuid.NAMESPACE_URL, f"loraplane-release:{value}")
