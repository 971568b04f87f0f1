"""Every request field of the OpenAI completions and chat APIs: honoured or refused.

:data:`FIELDS` is the one table of what the HTTP API does with each field the OpenAI API
reference defines for ``POST /v1/completions`` and ``POST /v1/chat/completions`` (plus
loraplane's own extensions): **honoured** end to end (mapped onto
``loraplane.v1.GenerateRequest``, which the worker maps onto vLLM's ``SamplingParams``),
or **refused** with 400 naming the field. A refused field is accepted only with the
value that asks for nothing (``tools: []``, ``store: false``, ``response_format:
{"type": "text"}``, …). A field the table does not know is refused too: no field is ever
accepted and dropped. The gateway README's field table is rendered from :data:`FIELDS`
(:func:`markdown_table`; a unit test keeps the two equal).

:func:`check_fields` lists every problem of a raw JSON body; :func:`to_generate_request`
maps a valid body onto the gRPC request; :func:`completion_logprobs` and
:func:`chat_logprobs` shape the worker's per-token log probabilities as each API does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from loraplane.shared.errors import InvalidArgument
from loraplane.v1 import inference_pb2

Api = Literal["completions", "chat"]
COMPLETIONS: Api = "completions"
CHAT: Api = "chat"
BOTH: tuple[Api, ...] = (COMPLETIONS, CHAT)

@dataclass(frozen=True, slots=True)
class FieldRule:
    """What the HTTP API does with one request field."""

    name: str
    """Field name in the JSON body."""
    apis: tuple[Api, ...]
    """The APIs that define it."""
    honoured: bool
    """True: the answer reflects it; False: refused unless it asks for nothing."""
    grpc: str
    """How it maps onto ``GenerateRequest`` (or why it is refused), for the docs."""
    noop: tuple[Any, ...] = (None,)
    """Values of a refused field that ask for nothing (accepted; ``None`` = JSON null)."""


def _honoured(name: str, grpc: str, apis: tuple[Api, ...] = BOTH) -> FieldRule:
    return FieldRule(name, apis, True, grpc)


def _refused(name: str, why: str, *noop: Any, apis: tuple[Api, ...] = BOTH) -> FieldRule:
    return FieldRule(name, apis, False, why, (None, *noop))


FIELDS: tuple[FieldRule, ...] = (
    _honoured("model", "`adapter` (an adapter name, a served base-model name or `base`)"),
    _honoured("prompt", "`prompt` (a string, or a list of exactly one string; token-id "
              "prompts and several prompts are refused)", (COMPLETIONS,)),
    _honoured("messages", "`prompt`: `role: content` lines then `assistant:` (roles system, "
              "developer, user, assistant; `name` shown as `role (name):`; text content "
              "parts only; tool messages and tool calls refused)", (CHAT,)),
    _honoured("max_tokens", "`max_tokens` (completions default 16; chat default: the "
              "worker's)"),
    _honoured("max_completion_tokens", "`max_tokens` (wins over `max_tokens`; both set and "
              "different is refused)", (CHAT,)),
    _honoured("temperature", "`temperature` (0..2; default: the worker's, 0 = greedy)"),
    _honoured("top_p", "`top_p` (0 < top_p <= 1)"),
    _honoured("n", "`n` (1..16; above 1 needs a temperature > 0, as vLLM refuses n > 1 "
              "greedy and the worker's default temperature is 0); choices come back by "
              "`index`, streamed too"),
    _honoured("seed", "`seed` (choice i samples with seed + i)"),
    _honoured("stop", "`stop` (a string or up to 16 strings)"),
    _honoured("presence_penalty", "`presence_penalty` (-2..2)"),
    _honoured("frequency_penalty", "`frequency_penalty` (-2..2)"),
    _honoured("logit_bias", "`logit_bias` (token id → bias in -100..100, at most 300)"),
    _honoured("logprobs", "`logprobs` = k (0..20): per token `tokens`, `token_logprobs`, "
              "`top_logprobs` (k entries), `text_offset`", (COMPLETIONS,)),
    _honoured("echo", "`echo`: each choice's text starts with the prompt (not with "
              "`logprobs`: prompt log probabilities are not returned)", (COMPLETIONS,)),
    _honoured("logprobs", "`logprobs` = `top_logprobs` (0 when unset) when true: "
              "`choices[].logprobs.content`", (CHAT,)),
    _honoured("top_logprobs", "`logprobs` (0..20; needs `logprobs: true`)", (CHAT,)),
    _honoured("best_of", "accepted when it equals `n` (the choices generated are the "
              "choices returned); any other value refused", (COMPLETIONS,)),
    _honoured("stream", "server-sent events of the gRPC stream, ending with `data: [DONE]`"),
    _honoured("stream_options", "`include_usage: true` adds a last chunk with `usage` and no "
              "choices; only with `stream: true`; `include_obfuscation: true` refused"),
    _honoured("user", "`request_key` (sticky canary split) unless `request_key` is set"),
    _honoured("safety_identifier", "`request_key` unless `request_key` or `user` is set",
              (CHAT,)),
    _honoured("request_class", "`request_class` (loraplane: interactive, background, canary; "
              "also header `x-loraplane-request-class`)"),
    _honoured("request_key", "`request_key` (loraplane; also header `x-loraplane-request-key`)"),
    _honoured("base_model", "`base_model` (loraplane: which base model `base` means)"),
    _refused("suffix", "refused: no insertion (fill-in-the-middle) mode", "",
             apis=(COMPLETIONS,)),
    _refused("response_format", "refused unless `{\"type\": \"text\"}`: no JSON mode or "
             "schema-constrained decoding", {"type": "text"}, apis=(CHAT,)),
    _refused("tools", "refused unless empty: no tool calling", [], apis=(CHAT,)),
    _refused("tool_choice", "refused unless `none`", "none", apis=(CHAT,)),
    _refused("parallel_tool_calls", "refused unless false (no tool calling)", False,
             apis=(CHAT,)),
    _refused("functions", "refused unless empty (deprecated tool calling)", [], apis=(CHAT,)),
    _refused("function_call", "refused unless `none` (deprecated tool calling)", "none",
             apis=(CHAT,)),
    _refused("audio", "refused: text output only", apis=(CHAT,)),
    _refused("modalities", "refused unless `[\"text\"]`", ["text"], apis=(CHAT,)),
    _refused("prediction", "refused: no predicted outputs", apis=(CHAT,)),
    _refused("reasoning_effort", "refused: the served models do not reason", apis=(CHAT,)),
    _refused("verbosity", "refused: no verbosity control", apis=(CHAT,)),
    _refused("web_search_options", "refused: no web search", apis=(CHAT,)),
    _refused("store", "refused unless false: completions are not stored", False,
             apis=(CHAT,)),
    _refused("metadata", "refused unless empty: only meaningful with `store`", {},
             apis=(CHAT,)),
    _refused("service_tier", "refused unless `auto` or `default` (one tier; the cold-start "
             "class is `request_class`)", "auto", "default", apis=(CHAT,)),
    _refused("prompt_cache_key", "refused: no prompt-cache routing", apis=(CHAT,)),
    _refused("prompt_cache_retention", "refused: no prompt-cache retention", apis=(CHAT,)),
    _refused("prompt_cache_options", "refused: no prompt-cache options", apis=(CHAT,)),
    _refused("moderation", "refused: no moderation of outputs", apis=(CHAT,)),
)
"""Every field of both APIs (a name defined by both with the same meaning is one row)."""

_RULES: dict[Api, dict[str, FieldRule]] = {
    api: {r.name: r for r in FIELDS if api in r.apis} for api in BOTH
}
ROLES = ("system", "developer", "user", "assistant")
"""Chat roles turned into prompt lines."""
MESSAGE_KEYS = frozenset({"role", "content", "name"})
"""Message fields that become prompt text; ``refusal`` is accepted only null."""


def rules(api: Api) -> Mapping[str, FieldRule]:
    """Field name → rule for one API."""
    return _RULES[api]


def _is_noop(value: Any, rule: FieldRule) -> bool:
    return any(value == v and type(value) is type(v) for v in rule.noop)


def _message_problems(messages: Any) -> list[str]:
    if not isinstance(messages, list):
        return []  # the schema check names it
    problems = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            continue
        where = f"messages[{i}]"
        role = m.get("role")
        if role == "tool" or role == "function":
            problems.append(f"{where}.role {role!r} is not supported (no tool calling)")
        elif isinstance(role, str) and role not in ROLES:
            problems.append(f"{where}.role must be one of {list(ROLES)}")
        for key in m:
            if key in MESSAGE_KEYS or (key == "refusal" and m[key] is None):
                continue
            if key in ("tool_calls", "function_call") and m[key] in (None, []):
                continue
            problems.append(f"{where}.{key} is not supported")
        content = m.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text":
                    problems.append(f"{where}.content[{j}].type {kind!r} is not supported "
                                    "(text parts only)")
    return problems


def check_fields(body: Mapping[str, Any], api: Api) -> list[str]:
    """Every problem of a request body's fields (empty: nothing is refused).

    Unknown fields, refused fields with a value that asks for something, and the
    combinations a field's rule forbids; the value types are the schema's job.
    """
    known = _RULES[api]
    problems = []
    for name, value in body.items():
        rule = known.get(name)
        if rule is None:
            problems.append(f"{name} is not a field of the {api} API (unknown fields are "
                            "refused, never ignored)")
        elif not rule.honoured and not _is_noop(value, rule):
            problems.append(f"{name} is not supported: {rule.grpc}")
    options = body.get("stream_options")
    if options is not None:
        if body.get("stream") is not True:
            problems.append("stream_options is only allowed with stream: true")
        if isinstance(options, dict):
            for key, value in options.items():
                if key == "include_obfuscation" and value in (False, None):
                    continue
                if key != "include_usage":
                    problems.append(f"stream_options.{key} is not supported")
    if api == COMPLETIONS:
        n = body.get("n") or 1
        best_of = body.get("best_of")
        if best_of is not None and best_of != n:
            problems.append(f"best_of must equal n ({n}): the choices generated are the "
                            "choices returned")
        if body.get("echo") and body.get("logprobs") is not None:
            problems.append("echo with logprobs is not supported (prompt log probabilities "
                            "are not returned)")
    else:
        if body.get("top_logprobs") is not None and body.get("logprobs") is not True:
            problems.append("top_logprobs needs logprobs: true")
        mt, mct = body.get("max_tokens"), body.get("max_completion_tokens")
        if mt is not None and mct is not None and mt != mct:
            problems.append("max_tokens and max_completion_tokens differ: set one")
        problems.extend(_message_problems(body.get("messages")))
    return problems


def chat_prompt(messages: Iterable[Mapping[str, Any]]) -> str:
    """Plain-text prompt of a chat (``role: content`` lines, then ``assistant:``)."""
    lines = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            text = "".join(str(part.get("text", "")) for part in content)
        else:
            text = content or ""
        who = f"{m['role']} ({m['name']})" if m.get("name") else m["role"]
        lines.append(f"{who}: {text}")
    lines.append("assistant:")
    return "\n".join(lines)


def _set(req: inference_pb2.GenerateRequest, name: str, value: Any, field: str) -> None:
    try:
        setattr(req, name, value)
    except (TypeError, ValueError) as exc:  # out of the proto field's range
        raise InvalidArgument(f"{field}: {value!r} is out of range ({exc})") from None


def to_generate_request(body: Mapping[str, Any], api: Api, *, prompt: str,
                        default_max_tokens: int | None) -> inference_pb2.GenerateRequest:
    """The sampling part of the gRPC request of a checked and typed body (``model``, the
    request class and key are the caller's: they also come from headers)."""
    req = inference_pb2.GenerateRequest(adapter=body.get("model") or "", prompt=prompt,
                                        base_model=body.get("base_model") or "")
    max_tokens = body.get("max_completion_tokens") if api == CHAT else None
    field = "max_completion_tokens"
    if max_tokens is None:
        max_tokens, field = body.get("max_tokens"), "max_tokens"
    if max_tokens is None:
        max_tokens = default_max_tokens
    if max_tokens is not None:
        _set(req, "max_tokens", max_tokens, field)
    for name in ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "n"):
        if body.get(name) is not None:
            _set(req, name, body[name], name)
    stop = body.get("stop")
    if stop:
        req.stop.extend([stop] if isinstance(stop, str) else stop)
    for token, bias in (body.get("logit_bias") or {}).items():
        try:
            req.logit_bias[int(token)] = bias
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"logit_bias: {token!r}: {bias!r} is out of range ({exc})"
                                  ) from None
    if api == COMPLETIONS:
        if body.get("logprobs") is not None:
            _set(req, "logprobs", body["logprobs"], "logprobs")
        req.echo = bool(body.get("echo"))
    elif body.get("logprobs"):
        _set(req, "logprobs", body.get("top_logprobs") or 0, "top_logprobs")
    return req


def _token_bytes(token: str) -> list[int]:
    return list(token.encode("utf-8"))


def completion_logprobs(entries: Iterable[inference_pb2.TokenLogprob], k: int,
                        offset: int = 0) -> dict[str, Any]:
    """``choices[].logprobs`` of the completions API for these tokens (``offset``: where
    the first token starts in the choice's text)."""
    tokens, values, tops, offsets = [], [], [], []
    for e in entries:
        tokens.append(e.token)
        values.append(e.logprob)
        tops.append({t.token: t.logprob for t in list(e.top)[:k]})
        offsets.append(offset)
        offset += len(e.token)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
            "text_offset": offsets}


def chat_logprobs(entries: Iterable[inference_pb2.TokenLogprob], k: int) -> dict[str, Any]:
    """``choices[].logprobs`` of the chat API for these tokens."""
    content = [
        {"token": e.token, "logprob": e.logprob, "bytes": _token_bytes(e.token),
         "top_logprobs": [{"token": t.token, "logprob": t.logprob,
                           "bytes": _token_bytes(t.token)} for t in list(e.top)[:k]]}
        for e in entries
    ]
    return {"content": content, "refusal": None}


def markdown_table() -> str:
    """The gateway README's field table."""
    lines = ["| field | API | supported | gRPC `GenerateRequest` mapping / why refused |",
             "|---|---|---|---|"]
    for r in FIELDS:
        api = "both" if r.apis == BOTH else r.apis[0]
        lines.append(f"| `{r.name}` | {api} | {'yes' if r.honoured else 'refused'} | "
                     f"{r.grpc} |")
    return "\n".join(lines) + "\n"
