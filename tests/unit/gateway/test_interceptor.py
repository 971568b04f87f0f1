"""The shared error/metrics interceptor as the gateway's streaming path uses it: the wrapped
handler is built once per method and reused, errors keep their mapping (status, retry hint,
reason) and every call is counted under its method and final code."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from loraplane.gateway.errors import AdapterCold
from loraplane.shared.errors import NotFound
from loraplane.shared.grpcutil import RETRY_AFTER_METADATA, ServiceInterceptor
from loraplane.shared.metrics import RpcMetrics

METHOD = "/loraplane.v1.Inference/Generate"
UNARY = "/loraplane.v1.Inference/Other"


class Details:
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


class Context:
    """What the interceptor touches on a ServicerContext."""

    def __init__(self) -> None:
        self.aborted: tuple[grpc.StatusCode, str] | None = None
        self.trailing: tuple[tuple[str, str], ...] = ()

    def set_trailing_metadata(self, md: tuple[tuple[str, str], ...]) -> None:
        self.trailing = md

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise grpc.aio.AbortError()


async def stream_ok(request: Any, context: Any) -> AsyncIterator[int]:
    for i in range(3):
        yield i


async def stream_cold(request: Any, context: Any) -> AsyncIterator[int]:
    yield 1
    raise AdapterCold("not loaded", retry_after_s=1.5)


async def stream_bug(request: Any, context: Any) -> AsyncIterator[int]:
    raise RuntimeError("bug")
    yield 0  # pragma: no cover


async def unary_missing(request: Any, context: Any) -> int:
    raise NotFound("no such thing")


def setup(handlers: dict[str, grpc.RpcMethodHandler]) -> tuple[ServiceInterceptor, CollectorRegistry,
                                                                list[str]]:
    registry = CollectorRegistry()
    icpt = ServiceInterceptor(RpcMetrics(registry))
    looked_up: list[str] = []

    async def continuation(details: Any) -> grpc.RpcMethodHandler | None:
        looked_up.append(details.method)
        return handlers.get(details.method)

    icpt._continuation = continuation  # type: ignore[attr-defined]
    return icpt, registry, looked_up


async def intercept(icpt: ServiceInterceptor, method: str) -> grpc.RpcMethodHandler:
    return await icpt.intercept_service(icpt._continuation, Details(method))  # type: ignore[attr-defined]


def count(registry: CollectorRegistry, method: str, code: str) -> float:
    service, name = method.strip("/").split("/")
    return registry.get_sample_value(
        "loraplane_rpc_requests_total", {"service": service, "method": name, "code": code}
    ) or 0.0


async def test_wrapped_handler_is_built_once_per_method_and_counts_every_call() -> None:
    handler = grpc.unary_stream_rpc_method_handler(stream_ok)
    icpt, registry, looked_up = setup({METHOD: handler})
    first = await intercept(icpt, METHOD)
    second = await intercept(icpt, METHOD)
    assert first is second and first is not handler
    assert looked_up == [METHOD, METHOD]  # the server's handler is still asked for every call
    for _ in range(3):
        assert [i async for i in first.unary_stream(None, Context())] == [0, 1, 2]
    assert count(registry, METHOD, "OK") == 3
    service, name = METHOD.strip("/").split("/")
    assert registry.get_sample_value(
        "loraplane_rpc_duration_seconds_count", {"service": service, "method": name}) == 3


async def test_a_new_handler_for_the_method_is_wrapped_again() -> None:
    handlers = {METHOD: grpc.unary_stream_rpc_method_handler(stream_ok)}
    icpt, _, _ = setup(handlers)
    first = await intercept(icpt, METHOD)
    handlers[METHOD] = grpc.unary_stream_rpc_method_handler(stream_cold)
    second = await intercept(icpt, METHOD)
    assert second is not first
    with pytest.raises(grpc.aio.AbortError):
        _ = [i async for i in second.unary_stream(None, Context())]


async def test_unknown_method_passes_through() -> None:
    icpt, _, _ = setup({})
    assert await intercept(icpt, METHOD) is None


async def test_classified_error_in_a_stream_keeps_status_and_retry_hint() -> None:
    icpt, registry, _ = setup({METHOD: grpc.unary_stream_rpc_method_handler(stream_cold)})
    wrapped = await intercept(icpt, METHOD)
    ctx = Context()
    got = []
    with pytest.raises(grpc.aio.AbortError):
        async for i in wrapped.unary_stream(None, ctx):
            got.append(i)
    assert got == [1]
    assert ctx.aborted == (grpc.StatusCode.UNAVAILABLE, "not loaded")
    trailing = dict(ctx.trailing)
    assert trailing[RETRY_AFTER_METADATA] == "1500"
    assert count(registry, METHOD, "UNAVAILABLE") == 1 and count(registry, METHOD, "OK") == 0


async def test_unexpected_error_is_internal_and_unary_errors_are_mapped() -> None:
    icpt, registry, _ = setup({
        METHOD: grpc.unary_stream_rpc_method_handler(stream_bug),
        UNARY: grpc.unary_unary_rpc_method_handler(unary_missing),
    })
    ctx = Context()
    with pytest.raises(grpc.aio.AbortError):
        _ = [i async for i in (await intercept(icpt, METHOD)).unary_stream(None, ctx)]
    assert ctx.aborted == (grpc.StatusCode.INTERNAL, "internal error")
    ctx = Context()
    with pytest.raises(grpc.aio.AbortError):
        await (await intercept(icpt, UNARY)).unary_unary(None, ctx)
    assert ctx.aborted == (grpc.StatusCode.NOT_FOUND, "no such thing")
    assert count(registry, METHOD, "INTERNAL") == 1 and count(registry, UNARY, "NOT_FOUND") == 1


class RecordingContext(Context):
    """A context whose ``abort`` (the moment the status leaves for the caller) notes what
    the metrics said then."""

    def __init__(self, registry: CollectorRegistry, method: str, code: str) -> None:
        super().__init__()
        self.counted_at_abort: float | None = None
        self._probe = (registry, method, code)

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.counted_at_abort = count(*self._probe)
        await super().abort(code, details)


async def test_a_refusal_is_counted_before_its_status_is_sent() -> None:
    """The caller may read the metric as soon as it has the status (the registry's
    refused-token test read 1 of 2 refusals when the count came after the abort)."""
    icpt, registry, _ = setup({
        METHOD: grpc.unary_stream_rpc_method_handler(stream_cold),
        UNARY: grpc.unary_unary_rpc_method_handler(unary_missing),
    })
    for method, code, call in (
        (UNARY, "NOT_FOUND", lambda h, ctx: h.unary_unary(None, ctx)),
        (METHOD, "UNAVAILABLE", lambda h, ctx: _drain(h.unary_stream(None, ctx))),
    ):
        ctx = RecordingContext(registry, method, code)
        with pytest.raises(grpc.aio.AbortError):
            await call(await intercept(icpt, method), ctx)
        assert ctx.counted_at_abort == 1
        assert count(registry, method, code) == 1  # counted once, not again after


async def _drain(stream: AsyncIterator[Any]) -> list[Any]:
    return [i async for i in stream]


async def test_a_stream_closed_by_the_caller_is_counted_cancelled() -> None:
    icpt, registry, _ = setup({METHOD: grpc.unary_stream_rpc_method_handler(stream_ok)})
    stream = (await intercept(icpt, METHOD)).unary_stream(None, Context())
    assert await anext(stream) == 0
    await stream.aclose()  # type: ignore[attr-defined]
    assert count(registry, METHOD, "CANCELLED") == 1 and count(registry, METHOD, "OK") == 0
