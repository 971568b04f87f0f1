"""The one way a checking interceptor wraps a gRPC handler (``shared/grpcutil.py``
``wrap_handler`` / ``GuardInterceptor``), as the registry's token interceptor
(``MetadataAuthInterceptor``) and the internal APIs' authorization
(``shared/tls.py`` ``AuthzInterceptor``) use it: the check runs before the handler for
every kind of method, a refusal keeps the handler from being reached, and methods the
interceptor leaves out pass through untouched."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from loraplane.shared.errors import LoraplaneError, PermissionDenied, Unauthenticated
from loraplane.shared.grpcutil import MetadataAuthInterceptor, wrap_handler
from loraplane.shared.tls import GATEWAY, AuthzInterceptor, allow

METHOD = "/loraplane.v1.WorkerInternal/Generate"


class Context:
    """What the checks read of a ServicerContext: metadata and (no) peer certificate."""

    def __init__(self, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self.metadata = metadata

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}


class Details:
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


def _ser(x: Any) -> bytes:
    return b"s"


def _de(b: bytes) -> Any:
    return "d"


def handlers(reached: list[str]) -> dict[str, grpc.RpcMethodHandler]:
    """One handler of each kind; each notes its kind in ``reached`` when it runs."""

    async def unary(request: Any, context: Any) -> str:
        reached.append("unary_unary")
        return "one"

    async def stream_in(requests: Any, context: Any) -> str:
        reached.append("stream_unary")
        return "one"

    async def stream_out(request: Any, context: Any) -> AsyncIterator[str]:
        reached.append("unary_stream")
        for item in ("a", "b"):
            yield item

    async def both(requests: Any, context: Any) -> AsyncIterator[str]:
        reached.append("stream_stream")
        for item in ("a", "b"):
            yield item

    kw: dict[str, Any] = {"request_deserializer": _de, "response_serializer": _ser}
    return {
        "unary_unary": grpc.unary_unary_rpc_method_handler(unary, **kw),
        "stream_unary": grpc.stream_unary_rpc_method_handler(stream_in, **kw),
        "unary_stream": grpc.unary_stream_rpc_method_handler(stream_out, **kw),
        "stream_stream": grpc.stream_stream_rpc_method_handler(both, **kw),
    }


async def call(handler: grpc.RpcMethodHandler, kind: str, context: Any) -> Any:
    behaviour = getattr(handler, kind)
    if kind.endswith("_stream"):
        return [item async for item in behaviour(None, context)]
    return await behaviour(None, context)


KINDS = ("unary_unary", "stream_unary", "unary_stream", "stream_stream")
EXPECTED = {"unary_unary": "one", "stream_unary": "one",
            "unary_stream": ["a", "b"], "stream_stream": ["a", "b"]}


@pytest.mark.parametrize("kind", KINDS)
async def test_the_check_runs_before_the_handler_of_every_kind(kind: str) -> None:
    reached: list[str] = []
    seen: list[tuple[Any, list[str]]] = []
    original = handlers(reached)[kind]
    wrapped = wrap_handler(original, lambda ctx: seen.append((ctx, list(reached))))
    assert wrapped is not original
    for other in KINDS:  # the same kind of method, with the same (de)serializers
        assert (getattr(wrapped, other) is None) == (other != kind)
    assert wrapped.request_deserializer is _de and wrapped.response_serializer is _ser
    ctx = Context()
    assert await call(wrapped, kind, ctx) == EXPECTED[kind]
    assert seen == [(ctx, [])]  # checked once, with this call's context, before the handler
    assert reached == [kind]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_refusal_never_reaches_the_handler(kind: str) -> None:
    reached: list[str] = []

    def refuse(ctx: Any) -> None:
        raise PermissionDenied("not you")

    wrapped = wrap_handler(handlers(reached)[kind], refuse)
    with pytest.raises(PermissionDenied, match="not you"):
        await call(wrapped, kind, Context())
    assert reached == []


async def intercept(icpt: grpc.aio.ServerInterceptor, method: str,
                    handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler | None:
    async def continuation(details: Any) -> grpc.RpcMethodHandler | None:
        return handler

    return await icpt.intercept_service(continuation, Details(method))  # type: ignore[arg-type]


async def test_the_token_interceptor_checks_metadata_of_the_methods_it_applies_to() -> None:
    checked: list[tuple[tuple[tuple[str, str], ...], str]] = []

    def check(metadata: Any, method: str) -> None:
        checked.append((metadata, method))
        if ("authorization", "Bearer good") not in metadata:
            raise Unauthenticated("a bearer token is required")

    icpt = MetadataAuthInterceptor(check, applies_to=lambda m: m == METHOD)
    reached: list[str] = []
    original = handlers(reached)["unary_stream"]
    other = "/grpc.health.v1.Health/Check"
    assert await intercept(icpt, other, original) is original  # left out: untouched
    assert await intercept(icpt, METHOD, None) is None  # not served: passes through
    wrapped = await intercept(icpt, METHOD, original)
    assert wrapped is not None and wrapped is not original
    good = (("authorization", "Bearer good"),)
    assert await call(wrapped, "unary_stream", Context(good)) == ["a", "b"]
    with pytest.raises(Unauthenticated):
        await call(wrapped, "unary_stream", Context())
    assert checked == [(good, METHOD), ((), METHOD)]
    assert reached == ["unary_stream"]


def _refusals(registry: CollectorRegistry, reason: str) -> float:
    return registry.get_sample_value(
        "loraplane_grpc_auth_refusals_total",
        {"service": "loraplane.v1.WorkerInternal", "rpc": "Generate", "reason": reason}) or 0.0


@pytest.mark.parametrize("kind", KINDS)
async def test_authorization_refuses_and_counts_every_kind(kind: str) -> None:
    registry = CollectorRegistry()
    icpt = AuthzInterceptor({METHOD: allow(GATEWAY)}, registry=registry)
    reached: list[str] = []
    original = handlers(reached)[kind]
    for open_method in ("/grpc.health.v1.Health/Check",
                        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"):
        assert await intercept(icpt, open_method, original) is original  # any caller
    wrapped = await intercept(icpt, METHOD, original)
    assert wrapped is not None and wrapped is not original
    with pytest.raises(LoraplaneError, match="without a client certificate") as refused:
        await call(wrapped, kind, Context())
    assert refused.value.grpc_code is grpc.StatusCode.UNAUTHENTICATED
    assert reached == []
    assert _refusals(registry, "no_identity") == 1

