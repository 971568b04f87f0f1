"""The official ``openai`` client against the HTTP API in process (echo workers): its
error classes for the refusals, ``n`` / ``logprobs`` parsed by its own types, and 64
streams at once, each completed or refused with a documented status and ``Retry-After``.
(The same against a real vLLM worker: ``tests/integration/gateway/test_openai_conformance.py``.)"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import openai
from openai import AsyncOpenAI

from loraplane.gateway.http_api import create_app

from .harness import ACME_KEY, Harness, harness

STREAMS = 64
DOCUMENTED_REFUSALS = {429, 503}


@asynccontextmanager
async def official(key: str = ACME_KEY, **kw: object) -> AsyncIterator[tuple[Harness,
                                                                             AsyncOpenAI]]:
    async with harness(**kw) as h:  # type: ignore[arg-type]
        h.workers["w0"].hot.update({11, 21})
        h.report("w0")
        transport = httpx.ASGITransport(app=create_app(h.gateway))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw/v1") as http:
            yield h, AsyncOpenAI(base_url="http://gw/v1", api_key=key, max_retries=0,
                                 http_client=http)


async def test_choices_and_logprobs_in_the_clients_types() -> None:
    async with official() as (_, c):
        r = await c.completions.create(model="support", prompt="hi", max_tokens=2, n=2,
                                       temperature=1.0, logprobs=1)
        assert [ch.index for ch in r.choices] == [0, 1]
        assert r.choices[1].logprobs is not None and r.choices[1].logprobs.tokens == [
            "tok0 ", "tok1 "]
        chat = await c.chat.completions.create(
            model="code", messages=[{"role": "user", "content": "x"}], max_tokens=1,
            logprobs=True, top_logprobs=1)
        content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
        assert content is not None and content[0].top_logprobs[0].token == "tok0 "


async def test_error_classes() -> None:
    async with official() as (_, c):
        for exc, call in (
            (openai.NotFoundError, c.completions.create(model="nope", prompt="x")),
            (openai.PermissionDeniedError, c.completions.create(model="legal", prompt="x")),
            (openai.BadRequestError, c.chat.completions.create(
                model="code", messages=[{"role": "user", "content": "x"}],
                tools=[{"type": "function", "function": {"name": "f"}}])),
        ):
            try:
                await call
            except exc:
                continue
            raise AssertionError(f"no {exc.__name__}")
    async with official(key="lp_not_a_key") as (_, c):
        try:
            await c.completions.create(model="support", prompt="x")
        except openai.AuthenticationError:
            pass
        else:
            raise AssertionError("a bad key was served")


async def test_64_streams_at_once_complete_or_are_refused_documented() -> None:
    async with official() as (h, c):
        for w in h.workers.values():
            w.token_delay_s = 0.01  # the streams overlap

        async def one(i: int) -> str:
            try:
                stream = await c.chat.completions.create(
                    model="code", stream=True, max_tokens=4,
                    messages=[{"role": "user", "content": f"#{i}"}],
                    stream_options={"include_usage": True})
                usage = None
                async for chunk in stream:
                    if chunk.usage is not None:
                        usage = chunk.usage.completion_tokens
                assert usage == 4, (i, usage)
                return "ok"
            except openai.APIStatusError as err:
                assert err.status_code in DOCUMENTED_REFUSALS, err
                assert int(err.response.headers["retry-after"]) >= 1
                return str(err.status_code)

        counts = Counter(await asyncio.gather(*(one(i) for i in range(STREAMS))))
        assert sum(counts.values()) == STREAMS and counts["ok"] >= 1, counts
        print(f"[measure] {STREAMS} streams at once through the official client: {counts}")
