"""``build_server`` wraps each method's handler once, at registration, not per call:
the handler interceptors' ``wrap`` runs once per registered method (not again for later
calls), their checks still run on every call in order (``ServiceInterceptor`` outermost, so
a guard's refusal becomes its status and is counted), health and reflection are served by
their asyncio servicers, and an interceptor that is not a ``HandlerInterceptor`` still runs
per call."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import CollectorRegistry

from loraplane.shared.errors import PermissionDenied
from loraplane.shared.grpcutil import CallCheck, GuardInterceptor, build_server
from loraplane.shared.metrics import RpcMetrics

CHECK = "/grpc.health.v1.Health/Check"


class CountingGuard(GuardInterceptor):
    """Refuses health checks of the service named ``refused``; counts wraps and checks."""

    def __init__(self) -> None:
        self.wrapped: Counter[str] = Counter()
        self.checked: Counter[str] = Counter()

    def guard(self, method: str) -> CallCheck | None:
        self.wrapped[method] += 1
        if method != CHECK:
            return None

        def check(context: grpc.aio.ServicerContext) -> None:
            self.checked[method] += 1
            if dict(context.invocation_metadata() or ()).get("x-refuse") == "1":
                raise PermissionDenied("refused by the test guard")

        return check


class PerCall(grpc.aio.ServerInterceptor):
    """A plain grpc.aio interceptor: runs on every call."""

    def __init__(self) -> None:
        self.calls = 0

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        self.calls += 1
        return await continuation(handler_call_details)


@pytest.mark.asyncio
async def test_handlers_are_wrapped_once_and_checked_on_every_call() -> None:
    guard, per_call = CountingGuard(), PerCall()
    registry = CollectorRegistry()
    server = build_server([], port=0, interceptors=[guard, per_call],
                          metrics=RpcMetrics(registry))
    assert guard.wrapped[CHECK] == 1  # at registration
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for _ in range(3):
                resp = await health.Check(health_pb2.HealthCheckRequest())
                assert resp.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await health.Check(health_pb2.HealthCheckRequest(),
                                   metadata=(("x-refuse", "1"),))
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert refused.value.details() == "refused by the test guard"
            # reflection is served by its asyncio servicer (a stream of answers)
            reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
            answers = [a async for a in reflect.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]))]
            names = {s.name for s in answers[0].list_services_response.service}
            assert "grpc.health.v1.Health" in names
    finally:
        await server.stop(0)
    assert guard.wrapped[CHECK] == 1  # not again per call
    assert guard.checked[CHECK] == 4
    assert per_call.calls == 5  # four checks and one reflection stream
    ok = registry.get_sample_value("loraplane_rpc_requests_total", {
        "service": "grpc.health.v1.Health", "method": "Check", "code": "OK"})
    denied = registry.get_sample_value("loraplane_rpc_requests_total", {
        "service": "grpc.health.v1.Health", "method": "Check", "code": "PERMISSION_DENIED"})
    assert (ok, denied) == (3.0, 1.0)
