"""No request field accepted and dropped: every field of both OpenAI APIs (as the pinned
official ``openai`` client sends them) is in the table, every honoured one sent with a
non-default value reaches the gRPC request, every refused one is refused naming itself
(and accepted with the value that asks for nothing), unknown fields are refused, and the
README's table is the table."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
from openai.resources.chat.completions import Completions as ChatResource
from openai.resources.completions import Completions as CompletionsResource

from loraplane.gateway.openai_fields import (
    CHAT,
    COMPLETIONS,
    FIELDS,
    Api,
    chat_logprobs,
    chat_prompt,
    check_fields,
    completion_logprobs,
    markdown_table,
    rules,
    to_generate_request,
)
from loraplane.v1 import inference_pb2

CLIENT_ONLY = {"extra_headers", "extra_query", "extra_body", "timeout"}
"""Parameters of the client's ``create`` that are not body fields."""
README = Path(__file__).resolve().parents[3] / "services" / "gateway" / "README.md"

BASE_BODY: dict[Api, dict[str, Any]] = {
    COMPLETIONS: {"model": "support", "prompt": "hi"},
    CHAT: {"model": "support", "messages": [{"role": "user", "content": "hi"}]},
}


def client_fields(resource: type) -> set[str]:
    return set(inspect.signature(resource.create).parameters) - {"self"} - CLIENT_ONLY


def translate(api: Api, **fields: Any) -> inference_pb2.GenerateRequest:
    body = {**BASE_BODY[api], **fields}
    assert check_fields(body, api) == []
    prompt = chat_prompt(body["messages"]) if api == CHAT else body["prompt"]
    return to_generate_request(body, api, prompt=prompt, default_max_tokens=16)


# honoured field → (a non-default value, what the gRPC request (or the prompt) shows)
HONOURED: dict[Api, dict[str, tuple[Any, Any]]] = {
    COMPLETIONS: {
        "model": ("legal", lambda r: r.adapter == "legal"),
        "prompt": (["once"], None),  # a list of one prompt: the HTTP layer (tested there)
        "max_tokens": (7, lambda r: r.max_tokens == 7),
        "temperature": (0.7, lambda r: r.HasField("temperature") and round(r.temperature, 3)
                        == 0.7),
        "top_p": (0.5, lambda r: r.top_p == 0.5),
        "n": (3, lambda r: r.n == 3),
        "seed": (42, lambda r: r.HasField("seed") and r.seed == 42),
        "stop": (["\n", "END"], lambda r: list(r.stop) == ["\n", "END"]),
        "presence_penalty": (1.5, lambda r: r.presence_penalty == 1.5),
        "frequency_penalty": (-0.5, lambda r: r.frequency_penalty == -0.5),
        "logit_bias": ({"42": 5.0}, lambda r: dict(r.logit_bias) == {42: 5.0}),
        "logprobs": (3, lambda r: r.HasField("logprobs") and r.logprobs == 3),
        "echo": (True, lambda r: r.echo),
        "best_of": (1, None),  # equal to n: accepted (nothing to map); other values refused
        "stream": (True, None),  # the HTTP layer (SSE)
        "stream_options": ({"include_usage": True}, None),
        "user": ("alice", None),  # request_key: the HTTP layer (headers win)
        "request_class": ("background", None),
        "request_key": ("k", None),
        "base_model": ("org/tiny", lambda r: r.base_model == "org/tiny"),
    },
    CHAT: {
        "model": ("legal", lambda r: r.adapter == "legal"),
        "messages": ([{"role": "system", "content": "be brief"},
                      {"role": "user", "name": "ann", "content": [{"type": "text",
                                                                   "text": "hi"}]}],
                     lambda r: r.prompt == "system: be brief\nuser (ann): hi\nassistant:"),
        "max_tokens": (7, lambda r: r.max_tokens == 7),
        "max_completion_tokens": (9, lambda r: r.max_tokens == 9),
        "temperature": (1.5, lambda r: r.temperature == 1.5),
        "top_p": (0.25, lambda r: r.top_p == 0.25),
        "n": (2, lambda r: r.n == 2),
        "seed": (0, lambda r: r.HasField("seed") and r.seed == 0),
        "stop": ("END", lambda r: list(r.stop) == ["END"]),
        "presence_penalty": (-2.0, lambda r: r.presence_penalty == -2.0),
        "frequency_penalty": (2.0, lambda r: r.frequency_penalty == 2.0),
        "logit_bias": ({"7": -100}, lambda r: dict(r.logit_bias) == {7: -100.0}),
        "logprobs": (True, lambda r: r.HasField("logprobs") and r.logprobs == 0),
        "top_logprobs": (4, None),  # with logprobs: below
        "stream": (True, None),
        "stream_options": ({"include_usage": True}, None),
        "user": ("alice", None),
        "safety_identifier": ("hash-1", None),
        "request_class": ("canary", None),
        "request_key": ("k", None),
        "base_model": ("org/tiny", lambda r: r.base_model == "org/tiny"),
    },
}

# refused field → a value that asks for something
REFUSED: dict[str, Any] = {
    "suffix": "tail", "response_format": {"type": "json_object"},
    "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto",
    "parallel_tool_calls": True, "functions": [{"name": "f"}], "function_call": "auto",
    "audio": {"voice": "alloy", "format": "mp3"}, "modalities": ["text", "audio"],
    "prediction": {"type": "content", "content": "x"}, "reasoning_effort": "high",
    "verbosity": "low", "web_search_options": {}, "store": True, "metadata": {"a": "b"},
    "service_tier": "flex", "prompt_cache_key": "k", "prompt_cache_retention": "24h",
    "prompt_cache_options": {"x": 1}, "moderation": {"x": 1},
}


@pytest.mark.parametrize(("api", "resource"), [(COMPLETIONS, CompletionsResource),
                                               (CHAT, ChatResource)])
def test_every_field_of_the_official_client_is_in_the_table(api: Api, resource: type) -> None:
    extensions = {"request_class", "request_key", "base_model"}
    assert client_fields(resource) == set(rules(api)) - extensions
    tested = set(HONOURED[api]) | {n for n in REFUSED if n in rules(api)}
    assert tested == set(rules(api))  # every row has a case below
    assert {n for n, r in rules(api).items() if r.honoured} == set(HONOURED[api])


@pytest.mark.parametrize("api", [COMPLETIONS, CHAT])
def test_each_honoured_field_reaches_the_grpc_request(api: Api) -> None:
    default = translate(api)
    for name, (value, shows) in HONOURED[api].items():
        if shows is None:
            continue
        req = translate(api, **{name: value})
        assert shows(req), (name, req)
        assert req != default, name  # the value changed the request
    req = translate(CHAT, logprobs=True, top_logprobs=4)
    assert req.HasField("logprobs") and req.logprobs == 4
    assert not default.HasField("logprobs") and default.n == 0 and not default.logit_bias


def test_max_tokens_defaults() -> None:
    assert translate(COMPLETIONS).max_tokens == 16  # OpenAI's completions default
    body = BASE_BODY[CHAT]
    req = to_generate_request(body, CHAT, prompt="p", default_max_tokens=None)
    assert req.max_tokens == 0  # the worker's default


def test_each_refused_field_is_refused_by_name_and_its_noop_value_accepted() -> None:
    for name, value in REFUSED.items():
        rule = next(r for r in FIELDS if r.name == name)
        for api in rule.apis:
            problems = check_fields({**BASE_BODY[api], name: value}, api)
            assert len(problems) == 1 and problems[0].startswith(f"{name} is not supported"), (
                name, problems)
            for noop in rule.noop:
                assert check_fields({**BASE_BODY[api], name: noop}, api) == [], (name, noop)


@pytest.mark.parametrize(("api", "fields", "named"), [
    (COMPLETIONS, {"frobnicate": 1}, "frobnicate is not a field of the completions API"),
    (COMPLETIONS, {"messages": []}, "messages is not a field of the completions API"),
    (CHAT, {"prompt": "x"}, "prompt is not a field of the chat API"),
    (CHAT, {"echo": True}, "echo is not a field of the chat API"),
    (COMPLETIONS, {"best_of": 3, "n": 2}, "best_of must equal n (2)"),
    (COMPLETIONS, {"echo": True, "logprobs": 1}, "echo with logprobs is not supported"),
    (COMPLETIONS, {"stream_options": {"include_usage": True}}, "stream_options is only"),
    (COMPLETIONS, {"stream": True, "stream_options": {"include_obfuscation": True}},
     "stream_options.include_obfuscation is not supported"),
    (CHAT, {"top_logprobs": 2}, "top_logprobs needs logprobs: true"),
    (CHAT, {"max_tokens": 2, "max_completion_tokens": 3}, "max_tokens and max_completion"),
    (CHAT, {"messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}]},
     "messages[0].role 'tool' is not supported"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0].type 'image_url' is not supported"),
    (CHAT, {"messages": [{"role": "assistant", "content": "",
                          "tool_calls": [{"id": "1"}]}]},
     "messages[0].tool_calls is not supported"),
    (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role must be"),
])
def test_combinations_and_unknown_fields_are_refused(api: Api, fields: dict[str, Any],
                                                     named: str) -> None:
    problems = check_fields({**BASE_BODY[api], **fields}, api)
    assert any(p.startswith(named) for p in problems), problems


def test_every_problem_is_reported_at_once() -> None:
    problems = check_fields({**BASE_BODY[CHAT], "tools": [{}], "store": True, "foo": 1}, CHAT)
    assert [p.split()[0] for p in problems] == ["tools", "store", "foo"]


def test_logprobs_shapes() -> None:
    entries = [inference_pb2.TokenLogprob(
        token_id=1, token="hé", logprob=-0.5,
        top=[inference_pb2.TopLogprob(token_id=1, token="hé", logprob=-0.5),
             inference_pb2.TopLogprob(token_id=2, token="x", logprob=-1.5)]),
        inference_pb2.TokenLogprob(token_id=3, token="!", logprob=-2.0)]
    done = completion_logprobs(entries, 1, offset=4)
    assert done == {"tokens": ["hé", "!"], "token_logprobs": [-0.5, -2.0],
                    "top_logprobs": [{"hé": -0.5}, {}], "text_offset": [4, 6]}
    chat = chat_logprobs(entries, 2)
    assert chat["refusal"] is None
    assert chat["content"][0] == {
        "token": "hé", "logprob": -0.5, "bytes": [104, 195, 169],
        "top_logprobs": [{"token": "hé", "logprob": -0.5, "bytes": [104, 195, 169]},
                         {"token": "x", "logprob": -1.5, "bytes": [120]}]}


def test_the_readme_table_is_the_table() -> None:
    assert markdown_table() in README.read_text()
