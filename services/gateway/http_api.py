"""The OpenAI-compatible HTTP API (FastAPI), served by uvicorn in the gateway's loop.

* ``POST /v1/completions`` and ``POST /v1/chat/completions``; ``"stream": true``
  answers with server-sent events (``data: {chunk}`` … ``data: [DONE]``);
* ``GET /v1/models``: the served base models (``owned_by`` the platform) and the calling
  tenant's adapters (own and shared) with a stable version, each with the version(s) it
  resolves to; ``GET /v1/models/{id}`` one of them (ids may contain ``/``);
* ``GET /healthz`` (the process answers) and ``GET /readyz`` (503 until the key view
  has replayed ``tenant.events``).

Request fields: every field of both OpenAI APIs is honoured (mapped onto
``GenerateRequest``) or refused with a 400 naming it, and unknown fields are refused:
nothing is accepted and dropped (the table is :data:`.openai_fields.FIELDS`, rendered in
the README). ``n`` choices, ``logprobs`` / ``top_logprobs`` and ``echo`` come back in the
OpenAI shapes, streamed (one chunk per worker message, with its choice ``index``) and not.

``model`` is an adapter name, or a base model: its served name (``loraplane/tiny-llama``)
or the alias ``"base"`` (the default base model). Missing or empty is a 400 naming
``model``, never base-model text.

Authentication: ``Authorization: Bearer <api key>``. Errors: OpenAI-style bodies
``{"error": {"message", "type", "code"}}`` with the HTTP equivalent of the gRPC
status and a ``Retry-After`` header when there is a retry hint. The resolution
comes back in ``x-loraplane-*`` headers and in a ``loraplane`` object of the body.
Extensions: ``request_class`` (``interactive`` / ``background`` / ``canary``) and
``request_key`` (sticky canary split; default: the OpenAI ``user`` field, then
``safety_identifier``), also as headers ``x-loraplane-request-class`` /
``x-loraplane-request-key``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loraplane.gateway.auth import Principal
from loraplane.gateway.budget import TIER_NAMES
from loraplane.gateway.errors import UpstreamError, http_status_of, openai_error_body
from loraplane.gateway.grpc_api import resolution_metadata
from loraplane.gateway.models import list_models, retrieve_model, served_base_models
from loraplane.gateway.names import (
    InvalidAdapterName,
    base_model_named,
    check_adapter_name,
    route_base_model_name,
)
from loraplane.gateway.openai_fields import (
    CHAT,
    COMPLETIONS,
    Api,
    chat_logprobs,
    chat_prompt,
    check_fields,
    completion_logprobs,
    to_generate_request,
)
from loraplane.gateway.request_path import Gateway, Limits, new_request_id, validate_params
from loraplane.shared.errors import InvalidArgument, LoraplaneError
from loraplane.shared.grpcutil import bearer_token
from loraplane.v1 import common_pb2, inference_pb2

DEFAULT_MAX_TOKENS = 16
"""OpenAI's default ``max_tokens`` for completions."""
CLASSES = {
    "interactive": common_pb2.REQUEST_CLASS_INTERACTIVE,
    "background": common_pb2.REQUEST_CLASS_BACKGROUND,
    "canary": common_pb2.REQUEST_CLASS_CANARY,
}
"""Request class names accepted by the HTTP API."""


class StreamOptions(BaseModel):
    """``stream_options`` (``include_obfuscation`` accepted only false: no padding)."""

    model_config = ConfigDict(extra="ignore")

    include_usage: bool | None = None


class _Common(BaseModel):
    """Types of the fields both APIs share (which fields exist and which are refused is
    :mod:`.openai_fields`' table, checked before these models see the body)."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(description="adapter name, or a base model: its served name or 'base'")
    max_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = Field(default=None, ge=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[int, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    request_class: Literal["interactive", "background", "canary"] | None = None
    request_key: str | None = None
    base_model: str | None = None


class CompletionRequest(_Common):
    """Body of ``POST /v1/completions``."""

    prompt: str | list[str]
    logprobs: int | None = Field(default=None, ge=0)
    echo: bool | None = None
    best_of: int | None = Field(default=None, ge=1)


class ChatMessage(BaseModel):
    """One chat message."""

    model_config = ConfigDict(extra="ignore")

    role: str
    content: str | list[dict[str, Any]] | None = ""
    name: str | None = None


class ChatRequest(_Common):
    """Body of ``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0)
    safety_identifier: str | None = None


SCHEMAS: dict[Api, type[_Common]] = {COMPLETIONS: CompletionRequest, CHAT: ChatRequest}


async def _checked_body(request: Request, api: Api) -> tuple[dict[str, Any], _Common]:
    """The typed body (as a dict of the set fields, and as its model); every problem of its
    fields at once (400)."""
    try:
        data = await request.json()
    except ValueError:
        raise InvalidArgument("the request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise InvalidArgument("the request body must be a JSON object")
    problems = check_fields(data, api)
    try:
        body = SCHEMAS[api].model_validate(data)
    except ValidationError as exc:
        problems.extend(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()
        )
        raise InvalidArgument("; ".join(problems)) from None
    if problems:
        raise InvalidArgument("; ".join(problems))
    return body.model_dump(exclude_unset=True), body


def _error(exc: LoraplaneError) -> JSONResponse:
    headers = {}
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    return JSONResponse(openai_error_body(exc), status_code=http_status_of(exc), headers=headers)


def _to_grpc(
    data: dict[str, Any], body: _Common, api: Api, request: Request, prompt: str,
    served: list[str], limits: Limits,
) -> Any:
    model_problem = None
    if base_model_named(body.model, served) is None:
        try:
            check_adapter_name(body.model, field="model")  # missing, path-like: named `model`
        except InvalidAdapterName as exc:
            model_problem = exc
    req = to_generate_request(
        data, api, prompt=prompt,
        default_max_tokens=DEFAULT_MAX_TOKENS if api == COMPLETIONS else None,
    )
    klass = body.request_class or request.headers.get("x-loraplane-request-class")
    if klass:
        if klass not in CLASSES:
            raise InvalidArgument(f"request_class must be one of {sorted(CLASSES)}")
        req.request_class = CLASSES[klass]
    req.request_key = (
        body.request_key or request.headers.get("x-loraplane-request-key") or body.user
        or getattr(body, "safety_identifier", None) or ""
    )
    if model_problem is not None:  # with every other problem of the request
        others = validate_params(req, limits)
        if others:
            raise InvalidArgument("; ".join([model_problem.message, *others]))
        raise model_problem
    route_base_model_name(req, served, field="model")
    return req


@dataclass(slots=True)
class _Choice:
    """One choice being assembled from the stream."""

    parts: list[str] = field(default_factory=list)
    logprobs: list[inference_pb2.TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None


def _usage(msg: inference_pb2.GenerateResponse) -> dict[str, int]:
    return {
        "prompt_tokens": msg.usage.prompt_tokens,
        "completion_tokens": msg.usage.output_tokens,
        "total_tokens": msg.usage.prompt_tokens + msg.usage.output_tokens,
    }


def _logprobs_of(req: inference_pb2.GenerateRequest, chat: bool,
                 entries: list[inference_pb2.TokenLogprob], offset: int = 0) -> Any:
    if not req.HasField("logprobs"):
        return None
    if chat:
        return chat_logprobs(entries, req.logprobs)
    return completion_logprobs(entries, req.logprobs, offset)


def _resolution_body(resolved: inference_pb2.ResolvedAdapter) -> dict[str, Any]:
    return {
        "request_id": resolved.request_id,
        "tenant": resolved.adapter.tenant_id,
        "adapter": resolved.adapter.adapter_name,
        "version": resolved.adapter.version,
        "base_model": resolved.adapter.base_model,
        "canary": resolved.canary,
        "degraded_to_base": resolved.degraded_to_base,
        "tier_at_arrival": TIER_NAMES.get(resolved.tier_at_arrival, "unspecified"),
        "worker_id": resolved.worker_id,
    }


def create_app(gateway: Gateway) -> FastAPI:
    """The HTTP application over ``gateway``."""
    app = FastAPI(title="loraplane gateway", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(LoraplaneError)
    async def _classified(_: Request, exc: LoraplaneError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body')}: {e.get('msg')}"
            for e in exc.errors()
        ]
        return _error(InvalidArgument("; ".join(problems)))

    def served() -> list[str]:
        return served_base_models(gateway.placement, gateway.default_base_model)

    def principal_of(request: Request) -> Principal:
        header = request.headers.get("authorization")
        return gateway.authenticate(bearer_token([("authorization", header)] if header else []))

    async def serve(request: Request, api: Api) -> Any:
        data, body = await _checked_body(request, api)
        chat = api == CHAT
        if isinstance(body, ChatRequest):
            prompt = chat_prompt(data["messages"])
        else:
            assert isinstance(body, CompletionRequest)
            if isinstance(body.prompt, list) and len(body.prompt) != 1:
                raise InvalidArgument("prompt must be a string or a list of exactly one string")
            prompt = body.prompt if isinstance(body.prompt, str) else body.prompt[0]
        principal = principal_of(request)
        req = _to_grpc(data, body, api, request, prompt, served(), gateway.limits)
        rid = request.headers.get("x-request-id") or new_request_id()
        stream = gateway.generate(principal, req, request_id=rid)
        try:
            first = await anext(stream)  # errors before the first token become HTTP errors
        except StopAsyncIteration:
            raise UpstreamError(grpc.StatusCode.INTERNAL, "worker sent an empty stream") from None
        resolved = inference_pb2.ResolvedAdapter()
        resolved.CopyFrom(first.resolved)
        headers = dict(resolution_metadata(resolved))
        created = int(time.time())
        ident = ("chatcmpl-" if chat else "cmpl-") + resolved.request_id
        extra = _resolution_body(resolved)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(
                _sse(first, stream, ident, created, body.model, chat, extra, req, include_usage),
                media_type="text/event-stream",
                headers={**headers, "Cache-Control": "no-cache"},
            )
        choices: dict[int, _Choice] = {i: _Choice() for i in range(req.n or 1)}
        last = first
        msg = first
        while True:
            c = choices.setdefault(msg.index, _Choice())
            c.parts.append(msg.text)
            c.logprobs.extend(msg.logprobs)
            if msg.finish_reason:
                c.finish_reason = msg.finish_reason
            last = msg
            try:
                msg = await anext(stream)
            except StopAsyncIteration:
                break
        out = []
        for index in sorted(choices):
            c = choices[index]
            text = "".join(c.parts)
            choice: dict[str, Any] = {
                "index": index, "finish_reason": c.finish_reason or "stop",
                "logprobs": _logprobs_of(req, chat, c.logprobs),
            }
            if chat:
                choice["message"] = {"role": "assistant", "content": text, "refusal": None}
            else:
                choice["text"] = text
            out.append(choice)
        payload = {
            "id": ident,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": body.model,
            "system_fingerprint": f"{resolved.adapter.adapter_name}@{resolved.adapter.version}",
            "choices": out,
            "usage": _usage(last),
            "loraplane": extra,
        }
        return JSONResponse(payload, headers=headers)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await serve(request, COMPLETIONS)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await serve(request, CHAT)

    @app.get("/v1/models")
    async def models(request: Request) -> Any:
        principal = principal_of(request)
        return {"object": "list",
                "data": list_models(gateway.catalog, principal.tenant_id, served())}

    @app.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str) -> Any:
        principal = principal_of(request)
        return retrieve_model(gateway.catalog, principal.tenant_id, served(), model_id,
                              default=gateway.default_base_model)

    @app.get("/healthz")
    async def healthz() -> Any:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> Any:
        # ready once the key view has replayed tenant.events: before that an unknown key
        # is answered 503 (retry), not 401 (see :class:`~loraplane.gateway.auth.KeysLoading`)
        if gateway.auth.loaded:
            return {"status": "ready"}
        return JSONResponse({"status": "loading", "waiting_for": "tenant.events"},
                            status_code=503)

    return app


async def _sse(
    first: inference_pb2.GenerateResponse,
    rest: AsyncIterator[inference_pb2.GenerateResponse],
    ident: str,
    created: int,
    model: str,
    chat: bool,
    extra: dict[str, Any],
    req: inference_pb2.GenerateRequest,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    """Server-sent events of one stream (OpenAI chunk shapes): one chunk per worker
    message, for its choice (``index``); with ``include_usage`` a last chunk with
    ``usage`` and no choices (``usage: null`` on the others), as OpenAI sends."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    started: set[int] = set()
    offsets: dict[int, int] = {}

    def encode(payload: dict[str, Any]) -> bytes:
        return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()

    def chunk(msg: inference_pb2.GenerateResponse) -> bytes:
        offset = offsets.get(msg.index, 0)
        offsets[msg.index] = offset + len(msg.text)
        choice: dict[str, Any] = {
            "index": msg.index, "finish_reason": msg.finish_reason or None,
            "logprobs": _logprobs_of(req, chat, list(msg.logprobs), offset),
        }
        if chat:
            delta: dict[str, Any] = {"content": msg.text}
            if msg.index not in started:
                delta["role"] = "assistant"
            choice["delta"] = delta
        else:
            choice["text"] = msg.text
        started.add(msg.index)
        payload: dict[str, Any] = {
            "id": ident, "object": kind, "created": created, "model": model, "choices": [choice],
        }
        if msg is first:
            payload["loraplane"] = extra
        if include_usage:
            payload["usage"] = None
        return encode(payload)

    last = first
    try:
        yield chunk(first)
        async for msg in rest:
            last = msg
            yield chunk(msg)
        if include_usage:
            yield encode({"id": ident, "object": kind, "created": created, "model": model,
                          "choices": [], "usage": _usage(last)})
    except LoraplaneError as exc:
        # headers are gone: report the failure in-band, as OpenAI does
        yield f"data: {json.dumps(openai_error_body(exc))}\n\n".encode()
    finally:
        await rest.aclose()  # type: ignore[attr-defined]
    yield b"data: [DONE]\n\n"
