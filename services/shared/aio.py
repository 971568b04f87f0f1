"""Small asyncio helpers the services share.

:func:`close_within` bounds a client's close (``stop()`` of an aiokafka consumer or
producer) and never raises what the close raised, ``CancelledError`` included.

Both matter during a broker outage. An aiokafka 0.14.0 consumer whose start was followed
by a lost broker awaits, in ``stop()``, a group-coordination task that aiokafka had already
cancelled, so ``stop()`` raises ``CancelledError`` though nobody cancelled the caller.
``asyncio.wait_for(consumer.stop(), 5)`` inside ``except Exception`` let it through, and
the admission release consumer's task ended as if cancelled: admission decided nothing
more until restarted (the registry e2e test, every run). ``wait_for`` also waits, past its
timeout, for the cancelled step to finish, which a close stuck on a dead connection may
never do; :func:`close_within` cancels such a step and leaves it behind.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

log = logging.getLogger(__name__)

_abandoned: set[asyncio.Future[Any]] = set()
"""Closes given up on, kept referenced until they end (an unreferenced task may be
collected mid-run)."""


def _forget(task: asyncio.Future[Any]) -> None:
    _abandoned.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.debug("abandoned close ended with %r", task.exception())


def abandon(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and leave it to end on its own (kept referenced until it does)."""
    task.cancel()
    _abandoned.add(task)
    task.add_done_callback(_forget)


async def close_within(step: Awaitable[object], timeout_s: float, what: str) -> bool:
    """Await ``step`` for at most ``timeout_s``; True if it finished (an exception it
    raised is logged at debug level, not raised: a dead broker may fail a close). Past the
    timeout the step is cancelled and left to end on its own; the caller is not held."""
    task = asyncio.ensure_future(step)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    except asyncio.CancelledError:
        abandon(task)
        raise
    if task in done:
        if task.cancelled():
            log.info("%s ended cancelled (an inner task of the client was cancelled)", what)
            return False
        if task.exception() is not None:
            log.debug("%s failed: %s", what, task.exception())
            return False
        return True
    log.warning("%s did not finish within %g s; abandoned", what, timeout_s)
    abandon(task)
    return False
