"""OpenAI conformance, proven with the official ``openai`` client (pinned test extra).

The platform: the test stack's Kafka, a worker on the real vLLM engine (tiny local
model), and the gateway (HTTP; over TLS trusting the stack's dev CA, as a tenant of
``make run`` calls it, unless the stack's edge is plaintext), its views fed by the events the registry and admission
would publish. Every honoured row of the field table (``openai_fields.FIELDS``) is driven
through ``client.completions.create`` / ``client.chat.completions.create`` with a
non-default value, streamed and not, and the answer must show it: ``n`` choices, the
``logprobs`` shapes, ``echo``, ``stop``, ``seed`` (same seed = same text, streamed or not),
``top_p``, penalties, ``logit_bias``, token limits, ``include_usage``. Refused rows
must raise ``BadRequestError`` naming the field. Then the error classes the client maps
statuses to (``NotFoundError``, ``AuthenticationError``, ``PermissionDeniedError`` for
another tenant's adapter, ``BadRequestError``, ``RateLimitError`` with ``Retry-After``
when a cold-start budget is spent) and 64 streams at once: each completes, or fails with
a documented status (429 / 503 with ``Retry-After``).

Heavy (starts vLLM): run it alone under ``flock /tmp/loraplane-heavy.lock``.
"""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from loraplane.cli.main import app as cli_app
from loraplane.devkit.builder import DemoManifest, build_demo
from loraplane.gateway.app import GatewayApp
from loraplane.gateway.auth import key_hash
from loraplane.shared import topics
from loraplane.shared.errors import LoraplaneError
from loraplane.shared.tls import WORKER
from loraplane.stack.stack import Stack
from loraplane.worker.app import WorkerApp
from loraplane.worker.settings import WorkerSettings
from loraplane.worker.vllm_engine import VllmEngine
from tests.support.tls import tenant_env, tenant_http, tenant_url, tls_settings

from .conftest import eventually, gateway_app, publisher
from .events import admitted, key_created, promoted

pytestmark = pytest.mark.engine

PROMPT = "Hello, how are you?"
STREAMS = 64
"""Streams opened at once by the concurrency check."""
DOCUMENTED_REFUSALS = {429, 503}
"""Statuses a request may be refused with under load (both carry ``Retry-After``)."""


@dataclass
class Platform:
    demo: DemoManifest
    gateway: GatewayApp
    worker: WorkerApp
    tenant: str
    key: str
    other_key: str
    base: str
    stack: Stack

    def client(self, key: str | None = None) -> AsyncOpenAI:
        """The official client as a tenant configures it: over TLS trusting the dev CA
        (its ``http_client``, as the README's snippet) when the edge serves TLS."""
        return AsyncOpenAI(base_url=f"{tenant_url(self.stack, self.gateway.http_port)}/v1",
                           api_key=key or self.key, max_retries=0, timeout=120,
                           http_client=tenant_http(self.stack))


@pytest.fixture(scope="module")
async def platform(stack: Stack, tmp_path_factory: pytest.TempPathFactory
                   ) -> AsyncIterator[Platform]:
    unique = uuid.uuid4().hex[:8]
    work = tmp_path_factory.mktemp("openai")
    demo = await asyncio.to_thread(build_demo)
    s = stack.settings
    base = demo.base_model.name
    wsettings = WorkerSettings(
        worker_id=f"w-oa-{unique}", worker_grpc_port=0, worker_metrics_port=0,
        kafka_bootstrap=s.kafka_bootstrap, **s.s3_settings(),
        artifact_bucket=s.artifact_bucket, base_model=base,
        base_model_dir=demo.base_model.dir, trusted_keys=str(demo.keys.public_key),
        tokenizer_revision=demo.base_model.tokenizer_revision,
        worker_host_dir=work / "worker-host", worker_state_interval_s=1.0,
        worker_heat_flush_s=0.5, worker_drain_timeout_s=10.0, **tls_settings(stack, WORKER),
    )
    engine = await VllmEngine.start(demo.base_model.dir, wsettings.engine_options())
    worker = WorkerApp(wsettings, engine, registry=CollectorRegistry())
    await worker.start()

    tenant, other = f"oa-{unique}", f"ob-{unique}"
    key, other_key = f"lp_oa_{unique}", f"lp_ob_{unique}"
    budgets = work / "budgets.yaml"
    # the adapter `spent` may not wait at all for its (never finished) cold load: the
    # cold-start budget is spent at once (429 + Retry-After)
    budgets.write_text(f"overrides:\n  {tenant}/spent: "
                       "{interactive: {budget_ms: 0, on_cold: wait}}\n")
    async with publisher(stack) as pub:
        await pub.publish(topics.TENANT_EVENTS, key_created(tenant, f"k-{unique}",
                                                            key_hash(key)))
        await pub.publish(topics.TENANT_EVENTS, key_created(other, f"o-{unique}",
                                                            key_hash(other_key)))
        for owner, name, engine_id in ((tenant, "spent", 97_001), (other, "legal", 97_002)):
            await pub.publish(topics.ADAPTER_ADMISSIONS,
                              admitted(owner, name, "v1", engine_id, base))
            await pub.publish(topics.ADAPTER_LIFECYCLE,
                              promoted(owner, name, "v1", engine_id, base))
    try:
        async with gateway_app(stack, default_base_model=base, budgets_file=budgets) as gw:
            g = gw.gateway

            async def ready() -> bool:
                try:
                    return bool(g.placement.routable(base)) and g.catalog.lookup(
                        tenant, "spent").release.stable == "v1"
                except LoraplaneError:
                    return False

            await eventually(ready, timeout_s=60)
            yield Platform(demo, gw, worker, tenant, key, other_key, base, stack)
    finally:
        await worker.stop()
        await engine.close()
        del engine
        gc.collect()


# --------------------------------------------------------------------------- helpers


async def complete(c: AsyncOpenAI, stream: bool, **kw: Any) -> dict[str, Any]:
    """One completion, streamed or not, as {texts by index, finish by index, usage,
    logprobs by index (tokens / token_logprobs / top_logprobs)}."""
    if not stream:
        r = await c.completions.create(**kw)
        return {
            "texts": {ch.index: ch.text for ch in r.choices},
            "finish": {ch.index: ch.finish_reason for ch in r.choices},
            "usage": r.usage.completion_tokens if r.usage else None,
            "logprobs": {ch.index: ch.logprobs for ch in r.choices},
        }
    texts: dict[int, str] = {}
    finish: dict[int, str] = {}
    lps: dict[int, list[Any]] = {}
    usage = None
    async for chunk in await c.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
            if ch.logprobs is not None:
                lps.setdefault(ch.index, []).append(ch.logprobs)
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
    return {"texts": texts, "finish": finish, "usage": usage, "logprobs": lps}


async def chat(c: AsyncOpenAI, stream: bool, **kw: Any) -> dict[str, Any]:
    if not stream:
        r = await c.chat.completions.create(**kw)
        return {
            "texts": {ch.index: ch.message.content for ch in r.choices},
            "finish": {ch.index: ch.finish_reason for ch in r.choices},
            "usage": r.usage.completion_tokens if r.usage else None,
            "logprobs": {ch.index: ch.logprobs.content if ch.logprobs else None
                         for ch in r.choices},
        }
    texts: dict[int, str] = {}
    finish: dict[int, str] = {}
    lps: dict[int, list[Any]] = {}
    roles: Counter[int] = Counter()
    usage = None
    async for chunk in await c.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
            roles[ch.index] += ch.delta.role == "assistant"
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
            if ch.logprobs is not None and ch.logprobs.content:
                lps.setdefault(ch.index, []).extend(ch.logprobs.content)
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
    assert all(n == 1 for n in roles.values()), roles  # the role once per choice
    return {"texts": texts, "finish": finish, "usage": usage, "logprobs": lps}


# --------------------------------------------------------------------------- fields


async def test_every_honoured_field_shows_in_the_answer_streamed_and_not(
    platform: Platform,
) -> None:
    p = platform
    c = p.client()
    m = p.base
    usage = {"stream_options": {"include_usage": True}}

    for stream in (False, True):
        extra = usage if stream else {}
        greedy = await complete(c, stream, model=m, prompt=PROMPT, max_tokens=6, **extra)
        assert greedy["usage"] == 6 and greedy["finish"] == {0: "length"}, greedy
        text = greedy["texts"][0]
        assert (await complete(c, stream, model=m, prompt=PROMPT, max_tokens=6,
                               temperature=0, **extra))["texts"] == {0: text}

        # seed: the same seed gives the same sampled text, streamed or not
        seeded = await complete(c, stream, model=m, prompt=PROMPT, max_tokens=8,
                                temperature=1.0, seed=11, **extra)
        again = await complete(c, False, model=m, prompt=PROMPT, max_tokens=8,
                               temperature=1.0, seed=11)
        other = await complete(c, False, model=m, prompt=PROMPT, max_tokens=8,
                               temperature=1.0, seed=12)
        assert seeded["texts"] == again["texts"] and other["texts"] != again["texts"]
        # top_p this small keeps only the most likely token: greedy text at temperature 1
        nucleus = await complete(c, stream, model=m, prompt=PROMPT, max_tokens=6,
                                 temperature=1.0, top_p=1e-6, **extra)
        assert nucleus["texts"] == {0: text}

        # n: three choices by index, usage counts all of them
        three = await complete(c, stream, model=m, prompt=PROMPT, max_tokens=4, n=3,
                               temperature=1.0, seed=5, **extra)
        assert sorted(three["texts"]) == [0, 1, 2] and three["usage"] == 12
        assert three["finish"] == {0: "length", 1: "length", 2: "length"}
        assert len(set(three["texts"].values())) > 1  # independent samples (seed + i)
        best = await complete(c, stream, model=m, prompt=PROMPT, max_tokens=4, n=3,
                              best_of=3, temperature=1.0, seed=5, **extra)
        assert best["texts"] == three["texts"]

        # stop: the text ends before the stop string
        cut = text[2:5]
        stopped = await complete(c, stream, model=m, prompt=PROMPT, max_tokens=6, stop=[cut],
                                 **extra)
        assert stopped["texts"][0] == text[:text.index(cut)]
        assert stopped["finish"] == {0: "stop"}

        # echo: the prompt first
        echoed = await complete(c, stream, model=m, prompt=PROMPT, max_tokens=6, echo=True,
                                **extra)
        assert echoed["texts"] == {0: PROMPT + text} and echoed["usage"] == 6

        # penalties change the greedy text (it repeats tokens); logit_bias forces a token
        for field in ("presence_penalty", "frequency_penalty"):
            pen = await complete(c, stream, model=m, prompt=PROMPT, max_tokens=6,
                                 **{field: 2.0}, **extra)
            assert pen["texts"][0] != text, field
        forced = await complete(c, False, model=m, prompt=PROMPT, max_tokens=3, logprobs=0,
                                logit_bias={"42": 100})
        lp = forced["logprobs"][0]
        assert len(set(lp.tokens)) == 1 and forced["texts"][0] == lp.tokens[0] * 3
        assert forced["texts"][0] != text[:len(forced["texts"][0])]

        # logprobs: one entry per token, k alternatives each
        logp = await complete(c, stream, model=m, prompt=PROMPT, max_tokens=4, logprobs=2,
                              **extra)
        entries = logp["logprobs"][0]
        if stream:
            tokens = [t for e in entries for t in e.tokens]
            tops = [t for e in entries for t in e.top_logprobs]
            values = [v for e in entries for v in e.token_logprobs]
        else:
            tokens, tops, values = entries.tokens, entries.top_logprobs, entries.token_logprobs
        assert len(tokens) == len(tops) == len(values) == 4
        assert all(len(t) == 2 for t in tops) and all(v <= 0 for v in values)
        assert logp["texts"] == {0: text[:len(logp["texts"][0])]}  # logprobs change nothing

        # chat: max_completion_tokens, system + named user, n, logprobs + top_logprobs
        messages = [{"role": "system", "content": "You are terse."},
                    {"role": "user", "name": "ann", "content": PROMPT}]
        ch = await chat(c, stream, model=m, messages=messages, max_completion_tokens=5,
                        **extra)
        assert ch["usage"] == 5 and ch["finish"] == {0: "length"}
        ch2 = await chat(c, stream, model=m, messages=messages, max_tokens=3, n=2,
                         temperature=1.0, seed=3, logprobs=True, top_logprobs=3,
                         user="alice", safety_identifier="sid", **extra)
        assert sorted(ch2["texts"]) == [0, 1] and ch2["usage"] == 6
        for i in (0, 1):
            content = ch2["logprobs"][i]
            assert len(content) == 3 and all(len(e.top_logprobs) == 3 for e in content)
            assert all(e.bytes == list(e.token.encode()) for e in content)
        if stream:
            unstreamed = await chat(c, False, model=m, messages=messages, max_tokens=3, n=2,
                                    temperature=1.0, seed=3)
            assert unstreamed["texts"] == ch2["texts"]  # streamed = non-streamed


async def test_refused_fields_raise_bad_request_naming_them(platform: Platform) -> None:
    c = platform.client()
    m = platform.base
    messages = [{"role": "user", "content": PROMPT}]
    refused: list[tuple[str, Any]] = [
        ("tools", c.chat.completions.create(
            model=m, messages=messages,
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])),
        ("response_format", c.chat.completions.create(
            model=m, messages=messages, response_format={"type": "json_object"})),
        ("reasoning_effort", c.chat.completions.create(
            model=m, messages=messages, reasoning_effort="high")),
        ("store", c.chat.completions.create(model=m, messages=messages, store=True)),
        ("suffix", c.completions.create(model=m, prompt=PROMPT, suffix="end")),
        ("best_of", c.completions.create(model=m, prompt=PROMPT, best_of=2)),
        ("frobnicate", c.completions.create(model=m, prompt=PROMPT,
                                            extra_body={"frobnicate": 1})),
        ("n", c.completions.create(model=m, prompt=PROMPT, n=2, temperature=0)),
        ("max_tokens", c.completions.create(model=m, prompt=PROMPT, max_tokens=10**6)),
        ("logit_bias", c.completions.create(model=m, prompt=PROMPT,
                                            logit_bias={"99999": 1})),  # the engine's vocab
    ]
    for name, call in refused:
        with pytest.raises(openai.BadRequestError) as err:
            await call
        assert err.value.status_code == 400 and name in err.value.message, (name, err.value)
    # the value that asks for nothing is accepted
    ok = await c.chat.completions.create(model=m, messages=messages, max_tokens=1, tools=[],
                                         store=False, response_format={"type": "text"})
    assert ok.choices[0].message.content is not None


# --------------------------------------------------------------------------- errors and models


async def test_models_and_error_classes(platform: Platform) -> None:
    p = platform
    c = p.client()
    listed = {m.id: m for m in (await c.models.list()).data}
    assert listed[p.base].owned_by == "loraplane" and "spent" in listed
    assert (await c.models.retrieve(p.base)).id == p.base

    with pytest.raises(openai.NotFoundError):
        await c.models.retrieve("no-such-model")
    with pytest.raises(openai.NotFoundError):
        await c.completions.create(model="no-such-adapter", prompt=PROMPT, max_tokens=1)
    with pytest.raises(openai.AuthenticationError):
        await p.client("lp_wrong_key").completions.create(model=p.base, prompt=PROMPT)
    with pytest.raises(openai.PermissionDeniedError):  # the other tenant's adapter
        await c.completions.create(model="legal", prompt=PROMPT, max_tokens=1)
    with pytest.raises(openai.BadRequestError):
        await c.completions.create(model="", prompt=PROMPT)
    t0 = time.monotonic()
    with pytest.raises(openai.RateLimitError) as limited:  # the cold-start budget is spent
        await c.completions.create(model="spent", prompt=PROMPT, max_tokens=1)
    assert time.monotonic() - t0 < 5.0
    assert int(limited.value.response.headers["retry-after"]) >= 1
    assert limited.value.code == "cold_start_budget_exceeded"
    # the other tenant gets its own adapter's refusal, not ours
    with pytest.raises(openai.PermissionDeniedError):
        await p.client(p.other_key).completions.create(model="spent", prompt=PROMPT)


async def test_64_streams_at_once_complete_or_fail_documented(platform: Platform) -> None:
    c = platform.client()

    async def one(i: int) -> tuple[str, int | None]:
        try:
            text = ""
            usage = None
            async for chunk in await c.chat.completions.create(
                model=platform.base, stream=True, max_tokens=8, temperature=1.0, seed=i,
                messages=[{"role": "user", "content": f"{PROMPT} #{i}"}],
                stream_options={"include_usage": True},
            ):
                for ch in chunk.choices:
                    text += ch.delta.content or ""
                if chunk.usage is not None:
                    usage = chunk.usage.completion_tokens
            assert usage == 8 and text, (i, usage, text)
            return "ok", None
        except openai.APIStatusError as err:
            assert err.status_code in DOCUMENTED_REFUSALS, err
            assert int(err.response.headers["retry-after"]) >= 1
            return "refused", err.status_code

    t0 = time.monotonic()
    results = await asyncio.gather(*(one(i) for i in range(STREAMS)))
    elapsed = time.monotonic() - t0
    counts = Counter(r for r, _ in results)
    print(f"\n[measure] {STREAMS} concurrent streams (official client, vLLM CPU): "
          f"{dict(counts)} in {elapsed:.1f}s")
    assert sum(counts.values()) == STREAMS and counts["ok"] >= 1


async def test_n_and_logprobs_through_grpc_and_loraplane_generate(platform: Platform) -> None:
    p = platform
    env = {"LORAPLANE_GATEWAY_GRPC": f"127.0.0.1:{p.gateway.grpc_port}",
           "LORAPLANE_API_KEY": p.key, **tenant_env(p.stack)}  # the dev CA, with edge TLS
    args = ["generate", "-a", p.base, "-p", PROMPT, "--max-tokens", "3", "--n", "2",
            "--temperature", "1.0", "--seed", "3", "--logprobs", "2"]
    result = await asyncio.to_thread(CliRunner().invoke, cli_app, args, env=env)
    assert result.exit_code == 0, result.stderr
    assert result.stderr.count("[logprob choice=0 ") == 3
    assert result.stderr.count("[logprob choice=1 ") == 3
    assert "6 output tokens" in result.stderr
    # the same request over HTTP samples the same two texts (seed + index per choice)
    r = await p.client().completions.create(model=p.base, prompt=PROMPT, n=2, temperature=1.0,
                                            seed=3, max_tokens=3)
    texts = {ch.index: ch.text for ch in r.choices}
    assert result.stdout == f"[0] {texts[0]}\n[1] {texts[1]}\n"
