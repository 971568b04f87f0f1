"""close_within: a close that ignores its cancellation does not hold the caller."""

from __future__ import annotations

import asyncio

from loraplane.shared import aio


async def _stubborn(ended: asyncio.Event, release: asyncio.Event) -> None:
    """A close like aiokafka's consumer stop during an outage: cancelling it does not end
    it (it goes on waiting until ``release``)."""
    while not release.is_set():
        try:
            await release.wait()
        except asyncio.CancelledError:
            continue
    ended.set()


async def test_a_close_that_ignores_cancellation_is_abandoned_after_the_timeout() -> None:
    ended, release = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await aio.close_within(_stubborn(ended, release), 0.05, "stubborn stop") is False
    assert loop.time() - t0 < 1.0  # asyncio.wait_for would wait here for ever
    assert not ended.is_set() and len(aio._abandoned) == 1  # still referenced
    release.set()
    await asyncio.wait_for(ended.wait(), 1)
    await asyncio.sleep(0)
    assert not aio._abandoned  # forgotten once it ended


async def test_a_close_that_finishes_or_fails_in_time() -> None:
    async def ok() -> None:
        await asyncio.sleep(0)

    async def broken() -> None:
        raise ConnectionError("broker down")

    assert await aio.close_within(ok(), 1, "ok") is True
    assert await aio.close_within(broken(), 1, "broken") is False  # logged, not raised
