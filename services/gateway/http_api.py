"""The OpenAI-compatible HTTP API (FastAPI), served by uvicorn in the gateway's loop.

* ``POST /v1/completions`` and ``POST /v1/chat/completions``; ``"stream": true``
  answers with server-sent events (``data: {chunk}`` … ``data: [DONE]``);
* ``GET /v1/models``: the served base models (``owned_by`` the platform) and the calling
  tenant's adapters (own and shared) with a stable version, each with the version(s) it
  resolves to; ``GET /v1/models/{id}`` one of them (ids may contain ``/``);
* ``GET /healthz`` (the process answers) and ``GET /readyz`` (503 until the key view
  has replayed ``tenant.events``).

``model`` is an adapter name, or a base model: its served name (``loraplane/tiny-llama``)
or the alias ``"base"`` (the default base model). Missing or empty is a 400 naming
``model``, never base-model text.

Authentication: ``Authorization: Bearer <api key>``. Errors: OpenAI-style bodies
``{"error": {"message", "type", "code"}}`` with the HTTP equivalent of the gRPC
status and a ``Retry-After`` header when there is a retry hint. The resolution
comes back in ``x-loraplane-*`` headers and in a ``loraplane`` object of the body.
Extensions: ``request_class`` (``interactive`` / ``background`` / ``canary``) and
``request_key`` (sticky canary split; default: the OpenAI ``user`` field), also as
headers ``x-loraplane-request-class`` / ``x-loraplane-request-key``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

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
from loraplane.gateway.service import Gateway, Limits, new_request_id, validate_params
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


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(description="adapter name, or a base model: its served name or 'base'")
    max_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    user: str | None = None
    request_class: Literal["interactive", "background", "canary"] | None = None
    request_key: str | None = None
    base_model: str | None = None


class CompletionRequest(_Common):
    """Body of ``POST /v1/completions``."""

    prompt: str | list[str]


class ChatMessage(BaseModel):
    """One chat message."""

    model_config = ConfigDict(extra="ignore")

    role: str
    content: str | list[dict[str, Any]] | None = ""


class ChatRequest(_Common):
    """Body of ``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=0)


def chat_prompt(messages: list[ChatMessage]) -> str:
    """Plain-text prompt of a chat (``role: content`` lines, then ``assistant:``)."""
    lines = []
    for m in messages:
        if isinstance(m.content, list):
            text = "".join(str(part.get("text", "")) for part in m.content)
        else:
            text = m.content or ""
        lines.append(f"{m.role}: {text}")
    lines.append("assistant:")
    return "\n".join(lines)


def _error(exc: LoraplaneError) -> JSONResponse:
    headers = {}
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    return JSONResponse(openai_error_body(exc), status_code=http_status_of(exc), headers=headers)


def _to_grpc(
    body: _Common, request: Request, prompt: str, max_tokens: int | None, served: list[str],
    limits: Limits,
) -> Any:
    model_problem = None
    if base_model_named(body.model, served) is None:
        try:
            check_adapter_name(body.model, field="model")  # missing, path-like: named `model`
        except InvalidAdapterName as exc:
            model_problem = exc
    req = inference_pb2.GenerateRequest(
        adapter=body.model,
        prompt=prompt,
        max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        base_model=body.base_model or "",
    )
    if body.temperature is not None:
        req.temperature = body.temperature
    if body.top_p is not None:
        req.top_p = body.top_p
    if body.seed is not None:
        req.seed = body.seed
    if body.stop:
        req.stop.extend([body.stop] if isinstance(body.stop, str) else body.stop)
    klass = body.request_class or request.headers.get("x-loraplane-request-class")
    if klass:
        if klass not in CLASSES:
            raise InvalidArgument(f"request_class must be one of {sorted(CLASSES)}")
        req.request_class = CLASSES[klass]
    req.request_key = (
        body.request_key or request.headers.get("x-loraplane-request-key") or body.user or ""
    )
    if model_problem is not None:  # with every other problem of the request
        others = validate_params(req, limits)
        if others:
            raise InvalidArgument("; ".join([model_problem.message, *others]))
        raise model_problem
    route_base_model_name(req, served, field="model")
    return req


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

    async def serve(
        request: Request, body: _Common, prompt: str, max_tokens: int | None, chat: bool
    ) -> Any:
        principal = principal_of(request)
        req = _to_grpc(body, request, prompt, max_tokens, served(), gateway.limits)
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
            return StreamingResponse(
                _sse(first, stream, ident, created, body.model, chat, extra),
                media_type="text/event-stream",
                headers={**headers, "Cache-Control": "no-cache"},
            )
        parts = [first.text]
        last = first
        async for msg in stream:
            parts.append(msg.text)
            last = msg
        text = "".join(parts)
        usage = {
            "prompt_tokens": last.usage.prompt_tokens,
            "completion_tokens": last.usage.output_tokens,
            "total_tokens": last.usage.prompt_tokens + last.usage.output_tokens,
        }
        reason = last.finish_reason or "stop"
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        payload = {
            "id": ident,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": body.model,
            "system_fingerprint": f"{resolved.adapter.adapter_name}@{resolved.adapter.version}",
            "choices": [choice],
            "usage": usage,
            "loraplane": extra,
        }
        return JSONResponse(payload, headers=headers)

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest) -> Any:
        prompt = body.prompt if isinstance(body.prompt, str) else "".join(body.prompt[:1])
        if isinstance(body.prompt, list) and len(body.prompt) != 1:
            raise InvalidArgument("prompt must be a string or a list of exactly one string")
        return await serve(request, body, prompt, body.max_tokens, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatRequest) -> Any:
        max_tokens = body.max_completion_tokens or body.max_tokens
        return await serve(request, body, chat_prompt(body.messages), max_tokens, chat=True)

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
) -> AsyncIterator[bytes]:
    """Server-sent events of one stream (OpenAI chunk shapes)."""
    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(msg: inference_pb2.GenerateResponse, index: int) -> bytes:
        finish = msg.finish_reason or ("stop" if msg.finished else None)
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if chat:
            delta: dict[str, Any] = {"content": msg.text}
            if index == 0:
                delta["role"] = "assistant"
            choice["delta"] = delta
        else:
            choice["text"] = msg.text
        payload: dict[str, Any] = {
            "id": ident, "object": kind, "created": created, "model": model, "choices": [choice],
        }
        if index == 0:
            payload["loraplane"] = extra
        if msg.finished:
            payload["usage"] = {
                "prompt_tokens": msg.usage.prompt_tokens,
                "completion_tokens": msg.usage.output_tokens,
                "total_tokens": msg.usage.prompt_tokens + msg.usage.output_tokens,
            }
        return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()

    index = 0
    try:
        yield chunk(first, index)
        async for msg in rest:
            index += 1
            yield chunk(msg, index)
    except LoraplaneError as exc:
        # headers are gone: report the failure in-band, as OpenAI does
        yield f"data: {json.dumps(openai_error_body(exc))}\n\n".encode()
    finally:
        await rest.aclose()  # type: ignore[attr-defined]
    yield b"data: [DONE]\n\n"
