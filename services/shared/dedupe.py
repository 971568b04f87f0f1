"""Idempotent consumers: remember which event ids a consumer has applied.

Every consumer of a Kafka topic may see an event more than once (at-least-once
delivery, redelivery after a crash before the offset commit). Record the event id
in ``processed_events`` **in the same transaction as the effect**, so the effect
and the memory of it commit or roll back together::

    async with transaction(pool) as conn:
        if not await claim(conn, "registry.admissions", meta.event_id):
            return                      # duplicate: the effect is already durable
        await apply_effect(conn, event)
    await consumer.commit()             # only after the effect is durable

``consumer`` names the logical consumer (one per effect, e.g. ``"registry.admissions"``),
not the process: replicas of one service share it.
"""

from __future__ import annotations

import uuid

import asyncpg

from loraplane.shared.errors import InvalidArgument


def _event_uuid(event_id: str | uuid.UUID) -> uuid.UUID:
    if isinstance(event_id, uuid.UUID):
        return event_id
    try:
        return uuid.UUID(event_id)
    except (ValueError, TypeError, AttributeError) as exc:
        raise InvalidArgument(f"event_id {event_id!r} is not a UUID") from exc


async def already_processed(
    conn: asyncpg.Connection, consumer: str, event_id: str | uuid.UUID
) -> bool:
    """Whether ``consumer`` has recorded ``event_id`` (read only)."""
    found = await conn.fetchval(
        "SELECT 1 FROM processed_events WHERE consumer = $1 AND event_id = $2",
        consumer,
        _event_uuid(event_id),
    )
    return found is not None


async def mark_processed(
    conn: asyncpg.Connection, consumer: str, event_id: str | uuid.UUID
) -> bool:
    """Record ``event_id`` for ``consumer``; ``True`` if it was new, ``False`` if seen before.

    Call it inside the transaction of the effect. Two transactions claiming the same
    id at once serialize on the primary key: the second waits, then gets ``False``.
    """
    inserted = await conn.fetchval(
        "INSERT INTO processed_events (consumer, event_id) VALUES ($1, $2) "
        "ON CONFLICT DO NOTHING RETURNING 1",
        consumer,
        _event_uuid(event_id),
    )
    return inserted is not None


claim = mark_processed
"""Alias read as a guard: ``if not await claim(conn, consumer, event_id): return``."""
