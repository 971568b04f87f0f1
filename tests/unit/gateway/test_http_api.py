"""The OpenAI-compatible HTTP API (in-process ASGI): completions, chat, SSE streams,
models, OpenAI-style errors with the right HTTP status and Retry-After."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

from loraplane.gateway.budget import BudgetConfig
from loraplane.gateway.http_api import create_app

from . import events as ev
from .harness import ACME_KEY, GLOBEX_KEY, Harness, harness

AUTH = {"authorization": f"Bearer {ACME_KEY}"}


@asynccontextmanager
async def client(**kw: object) -> AsyncIterator[tuple[Harness, httpx.AsyncClient]]:
    async with harness(**kw) as h:  # type: ignore[arg-type]
        h.workers["w0"].hot.update({11, 21})
        h.report("w0")
        transport = httpx.ASGITransport(app=create_app(h.gateway))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            yield h, c


async def test_completion_json() -> None:
    async with client() as (_, c):
        r = await c.post("/v1/completions", headers=AUTH,
                         json={"model": "support", "prompt": "hi", "max_tokens": 3})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "text_completion"
        assert body["choices"][0]["text"] == "tok0 tok1 tok2 "
        assert body["usage"]["completion_tokens"] == 3
        assert body["loraplane"]["version"] == "v1" and body["loraplane"]["tier_at_arrival"] == "hot"
        assert r.headers["x-loraplane-adapter-version"] == "v1"
        assert r.headers["x-loraplane-degraded"] == "false"


async def test_chat_completion_stream_sse() -> None:
    async with client() as (_, c):
        async with c.stream("POST", "/v1/chat/completions", headers=AUTH, json={
            "model": "code", "stream": True, "max_tokens": 2,
            "messages": [{"role": "user", "content": "hello"}],
            "stream_options": {"include_usage": True},
        }) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            assert r.headers["x-loraplane-adapter-version"] == "c1"
            lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(line[6:]) for line in lines[:-1]]
        assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert chunks[0]["loraplane"]["adapter"] == "code"
        text = "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks[:-1])
        assert text == "tok0 tok1 "
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 2
        assert all(ch["usage"] is None for ch in chunks[:-1])


async def test_completion_stream_and_user_is_the_sticky_key() -> None:
    async with client() as (h, c):
        async with c.stream("POST", "/v1/completions", headers=AUTH, json={
            "model": "support", "prompt": "x", "stream": True, "user": "alice",
            "request_class": "background",
        }) as r:
            body = "".join([line async for line in r.aiter_lines()])
        assert "text_completion" in body and body.endswith("data: [DONE]")
        sent = h.workers["w0"].requests[-1]
        assert sent.params.request_key == "alice" and sent.request_class == 2


async def test_models_lists_the_base_model_and_the_callers_adapters() -> None:
    async with client() as (_, c):
        r = await c.get("/v1/models", headers=AUTH)
        assert r.status_code == 200
        ids = [(m["id"], m["version"], m["owned_by"]) for m in r.json()["data"]]
        assert ids == [("tiny", "tiny", "loraplane"), ("code", "c1", "acme"),
                       ("support", "v1", "acme")]
        r = await c.get("/v1/models", headers={"authorization": f"Bearer {GLOBEX_KEY}"})
        assert [m["id"] for m in r.json()["data"]] == ["tiny", "legal"]


async def test_every_model_object_says_the_versions_it_resolves_to() -> None:
    async with client() as (h, c):
        h.gateway.catalog.apply_lifecycle(ev.canary("acme", "support", "v2", 25, 12, at=2.0))
        data = {m["id"]: m for m in (await c.get("/v1/models", headers=AUTH)).json()["data"]}
        assert data["support"]["versions"] == [
            {"version": "v1", "role": "stable", "percent": 75},
            {"version": "v2", "role": "canary", "percent": 25},
        ]
        assert data["support"]["parent"] == "tiny" and data["support"]["canary_version"] == "v2"
        assert data["code"]["versions"] == [{"version": "c1", "role": "stable", "percent": 100}]
        assert data["tiny"]["versions"] == [{"version": "tiny", "role": "base", "percent": 100}]
        assert data["tiny"]["parent"] is None


async def test_retrieve_one_model() -> None:
    async with client() as (_, c):
        r = await c.get("/v1/models/support", headers=AUTH)
        assert r.status_code == 200, r.text
        assert r.json()["id"] == "support" and r.json()["version"] == "v1"
        r = await c.get("/v1/models/tiny", headers=AUTH)
        assert r.json()["owned_by"] == "loraplane"
        alias = (await c.get("/v1/models/base", headers=AUTH)).json()
        assert alias["id"] == "base" and alias["base_model"] == "tiny"
        for unknown in ("nope", "org/nope", "a/b/c", "s3:x"):
            r = await c.get(f"/v1/models/{unknown}", headers=AUTH)
            assert r.status_code == 404, (unknown, r.text)
            err = r.json()["error"]
            assert err["type"] == "not_found_error" and unknown in err["message"]
        r = await c.get("/v1/models/legal", headers=AUTH)  # another tenant's, as on generate
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
        r = await c.get("/v1/models/support")
        assert r.status_code == 401


async def test_the_base_model_by_its_served_name_and_an_adapter_of_that_name() -> None:
    async with client() as (h, c):
        # acme names an adapter like the base model: the base model wins, the adapter is
        # not listed (the registry refuses such names at release)
        h.gateway.catalog.apply_admission(ev.admitted("acme", "tiny", "t1", 41))
        h.gateway.catalog.apply_lifecycle(ev.promoted("acme", "tiny", "t1", 41, at=1.0))
        for model in ("tiny", "base"):
            r = await c.post("/v1/completions", headers=AUTH,
                             json={"model": model, "prompt": "hi", "max_tokens": 2})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["model"] == model
            assert body["loraplane"]["adapter"] == "" and body["loraplane"]["base_model"] == "tiny"
        sent = [x for w in h.workers.values() for x in w.requests]
        assert len(sent) == 2 and all(x.use_base and x.engine_id == 0 for x in sent)
        models = (await c.get("/v1/models", headers=AUTH)).json()["data"]
        assert [m["id"] for m in models].count("tiny") == 1
        assert (await c.get("/v1/models/tiny", headers=AUTH)).json()["owned_by"] == "loraplane"


async def test_a_missing_or_empty_model_is_400_naming_the_field() -> None:
    async with client() as (h, c):
        for body in ({"prompt": "x"}, {"model": "", "prompt": "x"}):
            r = await c.post("/v1/completions", headers=AUTH, json=body)
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["type"] == "invalid_request_error" and "model" in err["message"]
        r = await c.post("/v1/chat/completions", headers=AUTH,
                         json={"model": "", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("model is required")
        r = await c.post("/v1/completions", headers=AUTH, json={"model": "org/x", "prompt": "x"})
        assert r.status_code == 400
        assert r.json()["error"]["message"].startswith("model must be a name, not a path")
        # reported with every other problem of the request
        r = await c.post("/v1/completions", headers=AUTH,
                         json={"model": "", "prompt": "", "max_tokens": 99999})
        message = r.json()["error"]["message"]
        for part in ("model is required", "prompt must not be empty", "max_tokens"):
            assert part in message, message
        assert not any(w.requests for w in h.workers.values())


async def test_openai_style_errors() -> None:
    budgets = BudgetConfig.model_validate(
        {"overrides": {"globex": {"interactive": {"on_cold": "fail_fast"}}}})
    async with client(budgets=budgets) as (_, c):
        cases = [
            ({}, {"model": "support", "prompt": "x"}, 401, "authentication_error"),
            ({"authorization": "Bearer wrong"}, {"model": "support", "prompt": "x"}, 401,
             "authentication_error"),
            (AUTH, {"model": "legal", "prompt": "x"}, 403, "permission_error"),
            (AUTH, {"model": "nope", "prompt": "x"}, 404, "not_found_error"),
            (AUTH, {"model": "../legal", "prompt": "x"}, 400, "invalid_request_error"),
            (AUTH, {"model": "s3://b/k", "prompt": "x"}, 400, "invalid_request_error"),
            (AUTH, {"model": "support", "prompt": "x", "max_tokens": -1}, 400,
             "invalid_request_error"),
            (AUTH, {"prompt": "x"}, 400, "invalid_request_error"),
        ]
        for headers, body, status, kind in cases:
            r = await c.post("/v1/completions", headers=headers, json=body)
            assert r.status_code == status, (body, r.text)
            err = r.json()["error"]
            assert err["type"] == kind and err["message"] and err["code"]
        r = await c.post("/v1/completions", headers={"authorization": f"Bearer {GLOBEX_KEY}"},
                         json={"model": "legal", "prompt": "x"})
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "adapter_cold"


async def test_readyz_waits_for_the_key_view_and_unknown_keys_get_503_meanwhile() -> None:
    async with client() as (h, c):
        h.gateway.auth.loaded = False
        assert (await c.get("/healthz")).status_code == 200  # the process answers
        r = await c.get("/readyz")
        assert r.status_code == 503 and r.json()["waiting_for"] == "tenant.events"
        r = await c.get("/v1/models", headers={"authorization": "Bearer not-yet-seen"})
        assert r.status_code == 503 and r.headers.get("retry-after")
        assert (await c.get("/v1/models", headers=AUTH)).status_code == 200  # known key
        h.gateway.auth.loaded = True
        assert (await c.get("/readyz")).status_code == 200
        r = await c.get("/v1/models", headers={"authorization": "Bearer not-yet-seen"})
        assert r.status_code == 401


async def test_n_choices_logprobs_and_echo_non_streamed() -> None:
    async with client() as (h, c):
        r = await c.post("/v1/completions", headers=AUTH, json={
            "model": "support", "prompt": "hi", "max_tokens": 2, "n": 2, "temperature": 0.9,
            "logprobs": 1})
        assert r.status_code == 200, r.text
        body = r.json()
        assert [ch["index"] for ch in body["choices"]] == [0, 1]
        assert all(ch["text"] == "tok0 tok1 " and ch["finish_reason"] == "length"
                   for ch in body["choices"])
        lp = body["choices"][1]["logprobs"]
        assert lp == {"tokens": ["tok0 ", "tok1 "], "token_logprobs": [0.0, 0.0],
                      "top_logprobs": [{"tok0 ": 0.0}, {"tok1 ": 0.0}], "text_offset": [0, 5]}
        assert body["usage"]["completion_tokens"] == 4
        sent = h.workers["w0"].requests[-1].params
        assert (sent.n, sent.logprobs) == (2, 1)

        r = await c.post("/v1/completions", headers=AUTH, json={
            "model": "support", "prompt": "hi ", "max_tokens": 1, "echo": True})
        assert r.json()["choices"][0]["text"] == "hi tok0 "
        assert r.json()["choices"][0]["logprobs"] is None

        r = await c.post("/v1/chat/completions", headers=AUTH, json={
            "model": "code", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
            "logprobs": True, "top_logprobs": 1})
        choice = r.json()["choices"][0]
        assert choice["message"] == {"role": "assistant", "content": "tok0 ", "refusal": None}
        assert choice["logprobs"]["content"] == [{
            "token": "tok0 ", "logprob": 0.0, "bytes": list(b"tok0 "),
            "top_logprobs": [{"token": "tok0 ", "logprob": 0.0, "bytes": list(b"tok0 ")}]}]


async def test_n_choices_streamed_by_index() -> None:
    async with client() as (_, c):
        async with c.stream("POST", "/v1/chat/completions", headers=AUTH, json={
            "model": "code", "stream": True, "max_tokens": 2, "n": 2, "temperature": 1.0,
            "messages": [{"role": "user", "content": "hello"}], "logprobs": True,
        }) as r:
            lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        chunks = [json.loads(line[6:]) for line in lines[:-1]]
        texts: dict[int, str] = {}
        roles: dict[int, int] = {}
        finish: dict[int, str] = {}
        tokens = 0
        for ch in chunks:
            for choice in ch["choices"]:
                i = choice["index"]
                texts[i] = texts.get(i, "") + choice["delta"].get("content", "")
                roles[i] = roles.get(i, 0) + ("role" in choice["delta"])
                if choice["finish_reason"]:
                    finish[i] = choice["finish_reason"]
                if choice["logprobs"]:
                    tokens += len(choice["logprobs"]["content"])
        assert texts == {0: "tok0 tok1 ", 1: "tok0 tok1 "}
        assert roles == {0: 1, 1: 1} and finish == {0: "length", 1: "length"}
        assert tokens == 4 and "usage" not in chunks[-1]  # no include_usage: no usage


async def test_refused_and_unknown_fields_are_400_naming_them_and_reach_no_worker() -> None:
    async with client() as (h, c):
        before = len(h.workers["w0"].requests)
        cases = [
            ("/v1/chat/completions", {"tools": [{"type": "function"}]}, "tools is not supported"),
            ("/v1/chat/completions", {"response_format": {"type": "json_object"}},
             "response_format is not supported"),
            ("/v1/chat/completions", {"frobnicate": True}, "frobnicate is not a field"),
            ("/v1/completions", {"suffix": "end"}, "suffix is not supported"),
            ("/v1/completions", {"best_of": 3}, "best_of must equal n"),
            ("/v1/completions", {"n": 2, "temperature": 0}, "n > 1 needs a temperature"),
            ("/v1/completions", {"n": 17}, "n must be within 1..16"),
            ("/v1/completions", {"logprobs": 21}, "logprobs must be within 0..20"),
            ("/v1/completions", {"presence_penalty": 3}, "presence_penalty must be within"),
            ("/v1/completions", {"logit_bias": {"1": 101}}, "logit_bias takes at most"),
        ]
        for path, extra, named in cases:
            body: dict[str, object] = {"model": "support", "max_tokens": 1, **extra}
            if "chat" in path:
                body["messages"] = [{"role": "user", "content": "x"}]
            else:
                body["prompt"] = "x"
            r = await c.post(path, headers=AUTH, json=body)
            assert r.status_code == 400, (extra, r.text)
            err = r.json()["error"]
            assert err["type"] == "invalid_request_error" and named in err["message"], err
        assert len(h.workers["w0"].requests) == before
        noop = await c.post("/v1/chat/completions", headers=AUTH, json={
            "model": "code", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
            "tools": [], "store": False, "response_format": {"type": "text"},
            "service_tier": "auto", "stream": False})
        assert noop.status_code == 200, noop.text
        bad_json = await c.post("/v1/completions", headers={**AUTH, "content-type":
                                                            "application/json"}, content=b"{")
        assert bad_json.status_code == 400 and "not valid JSON" in bad_json.text


async def test_values_out_of_the_proto_range_are_400_not_500() -> None:
    async with client() as (_, c):
        for extra, named in (({"max_tokens": 2**40}, "max_tokens"),
                             ({"seed": 2**70}, "seed"),
                             ({"logit_bias": {str(2**40): 1}}, "logit_bias"),
                             ({"n": 2**40}, "n")):
            r = await c.post("/v1/completions", headers=AUTH,
                             json={"model": "support", "prompt": "x", **extra})
            assert r.status_code == 400, (extra, r.text)
            assert named in r.json()["error"]["message"]
        typed = await c.post("/v1/completions", headers=AUTH, json={
            "model": "support", "prompt": "x", "max_tokens": "2", "seed": "3"})
        assert typed.status_code == 200 and typed.json()["usage"]["completion_tokens"] == 2


async def test_safety_identifier_is_the_sticky_key_after_user() -> None:
    async with client() as (h, c):
        chat = {"model": "code", "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 1, "safety_identifier": "sid-1"}
        assert (await c.post("/v1/chat/completions", headers=AUTH, json=chat)).status_code == 200
        assert h.workers["w0"].requests[-1].params.request_key == "sid-1"
        await c.post("/v1/chat/completions", headers=AUTH, json={**chat, "user": "u-1"})
        assert h.workers["w0"].requests[-1].params.request_key == "u-1"
