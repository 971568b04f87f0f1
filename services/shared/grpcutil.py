"""gRPC server plumbing shared by every service (``grpc.aio``).

:func:`build_server` returns an asyncio server with

* :class:`ServiceInterceptor` (outermost): maps :class:`~loraplane.shared.errors.LoraplaneError`
  subclasses to their status code and message (``retry-after-ms`` trailing metadata when
  the error carries ``retry_after_s``), turns any other exception into INTERNAL with a
  generic message (logged with its traceback), and records per-RPC metrics
  (:class:`~loraplane.shared.metrics.RpcMetrics`) *before* the status is sent, so a
  caller that has its answer also finds it counted (a handler that calls
  ``context.abort`` itself has sent its status before the interceptor sees it);
* the caller's interceptors (e.g. :class:`MetadataAuthInterceptor`, or
  :class:`~loraplane.shared.tls.AuthzInterceptor`), inside it, so the errors they raise
  are mapped too; a checking interceptor is a :class:`GuardInterceptor` (its ``guard``
  names each method's check, :func:`wrap_handler` runs it before the handler, whatever
  the method's kind);
* the standard health service (``grpc.health.v1.Health``; every registered service is
  SERVING once started, NOT_SERVING from :meth:`GrpcServer.stop` on);
* server reflection (``grpcurl`` / ``grpc_cli`` work without proto files).

The interceptors that are :class:`HandlerInterceptor` s wrap each method's handler once, when
it is registered, not per call: grpc.aio runs its interceptors as a chain of coroutines
before every call's handler (measured on the gateway's streamed ``Generate``: about 2 % of
the call's CPU); any other ``grpc.aio.ServerInterceptor`` (and every one after it) still runs
per call.

Example::

    server = build_server(
        [Service(registry_pb2_grpc.add_RegistryAdminServicer_to_server, servicer,
                 "loraplane.v1.RegistryAdmin")],
        port=settings.registry_grpc_port,
        interceptors=[MetadataAuthInterceptor(check_token, applies_to=is_admin_method)],
    )
    await server.start()
    ...
    await server.stop(grace_s=5)
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from loraplane.shared.errors import LoraplaneError
from loraplane.shared.metrics import RpcMetrics, split_method

log = logging.getLogger(__name__)

RETRY_AFTER_METADATA = "retry-after-ms"
REASON_METADATA = "loraplane-reason"
"""Trailing metadata naming the error's short reason (e.g. ``draining``, ``cold``), so a
caller can tell a version-level refusal from a worker that is down."""
"""Trailing metadata key carrying a retry hint in milliseconds."""

Metadata = Sequence[tuple[str, str | bytes]]
AuthCheck = Callable[[Metadata, str], None]
"""``check(invocation_metadata, full_method)``: returns, or raises a LoraplaneError."""


# --------------------------------------------------------------------------- wrapping


def _rewrap(
    handler: grpc.RpcMethodHandler,
    unary: Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]],
    streaming: Callable[[Callable[..., AsyncIterator[Any]]], Callable[..., AsyncIterator[Any]]],
) -> grpc.RpcMethodHandler:
    """A copy of ``handler`` whose behaviour is wrapped (unary or streaming response)."""
    ser = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(unary(handler.unary_unary), **ser)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(unary(handler.stream_unary), **ser)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(streaming(handler.unary_stream), **ser)
    if handler.stream_stream is not None:
        return grpc.stream_stream_rpc_method_handler(streaming(handler.stream_stream), **ser)
    return handler


async def _abort_for(context: grpc.aio.ServicerContext, exc: LoraplaneError) -> None:
    trailing: list[tuple[str, str]] = []
    if exc.retry_after_s is not None:
        trailing.append((RETRY_AFTER_METADATA, str(int(exc.retry_after_s * 1000))))
    reason = getattr(exc, "reason", None)
    if isinstance(reason, str) and reason:
        trailing.append((REASON_METADATA, reason))
    if trailing:
        context.set_trailing_metadata(tuple(trailing))
    await context.abort(exc.grpc_code, exc.message)


def _code_name(context: grpc.aio.ServicerContext, default: grpc.StatusCode) -> str:
    code = context.code() if hasattr(context, "code") else None
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(code, int):  # some grpc versions return the raw integer
        for status in grpc.StatusCode:
            if status.value[0] == code:
                return status.name
    return default.name


class _MethodMetrics:
    """The label children of one method, bound once (a ``labels()`` lookup costs a lock and a
    dict lookup per call)."""

    __slots__ = ("_codes", "_duration", "_method", "_requests", "_service")

    def __init__(self, metrics: RpcMetrics, full_method: str) -> None:
        self._service, self._method = split_method(full_method)
        self._requests = metrics.requests
        self._codes: dict[str, Any] = {}
        self._duration = metrics.duration.labels(self._service, self._method)

    def observe(self, code: str, seconds: float) -> None:
        counter = self._codes.get(code)
        if counter is None:
            counter = self._requests.labels(self._service, self._method, code)
            self._codes[code] = counter
        counter.inc()
        self._duration.observe(seconds)


def _code_of(exc: Exception, context: grpc.aio.ServicerContext) -> str:
    """The status name a failed call ends with (for the metrics)."""
    if isinstance(exc, LoraplaneError):
        return exc.grpc_code.name
    if isinstance(exc, grpc.aio.AbortError):
        return _code_name(context, grpc.StatusCode.UNKNOWN)
    return grpc.StatusCode.INTERNAL.name


async def _end_call(exc: Exception, context: grpc.aio.ServicerContext, method: str) -> None:
    """End a failed call: classified errors keep their status, an abort stays as it was,
    anything else is INTERNAL (logged). Always raises."""
    if isinstance(exc, LoraplaneError):
        await _abort_for(context, exc)
    if isinstance(exc, grpc.aio.AbortError):
        raise exc
    log.exception("unhandled error in %s", method, exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL, "internal error")


def _wrap_unary(
    inner: Callable[..., Awaitable[Any]], method: str, metrics: _MethodMetrics
) -> Callable[..., Awaitable[Any]]:
    async def behaviour(request: Any, context: grpc.aio.ServicerContext) -> Any:
        started = time.perf_counter()
        try:
            result = await inner(request, context)
        except Exception as exc:  # noqa: BLE001 - every error ends as a status (logged)
            # counted before the status is sent: a caller that got it sees it counted
            metrics.observe(_code_of(exc, context), time.perf_counter() - started)
            await _end_call(exc, context, method)
        except BaseException:  # cancelled
            metrics.observe(grpc.StatusCode.CANCELLED.name, time.perf_counter() - started)
            raise
        metrics.observe("OK", time.perf_counter() - started)  # the response is sent after
        return result

    return behaviour


def _wrap_streaming(
    inner: Callable[..., AsyncIterator[Any]], method: str, metrics: _MethodMetrics
) -> Callable[..., AsyncIterator[Any]]:
    async def behaviour(request: Any, context: grpc.aio.ServicerContext) -> Any:
        started = time.perf_counter()
        try:
            async for item in inner(request, context):
                yield item
        except Exception as exc:  # noqa: BLE001 - every error ends as a status (logged)
            # counted before the status is sent: a caller that got it sees it counted
            metrics.observe(_code_of(exc, context), time.perf_counter() - started)
            await _end_call(exc, context, method)
        except BaseException:  # cancelled, or the caller went away (generator closed)
            metrics.observe(grpc.StatusCode.CANCELLED.name, time.perf_counter() - started)
            raise
        metrics.observe("OK", time.perf_counter() - started)  # the status is sent after

    return behaviour


class HandlerInterceptor(grpc.aio.ServerInterceptor):
    """An interceptor that hands the server's handler of each call to :meth:`wrap` (a
    method the server does not serve passes through as ``None``)."""

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """The handler to run for a call of ``method`` (a full method name)."""
        raise NotImplementedError

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        return self.wrap(handler_call_details.method, handler)


class ServiceInterceptor(HandlerInterceptor):
    """Classified errors → status codes, unexpected errors → INTERNAL, per-RPC metrics.

    The wrapped handler of a method is built once and reused while the server hands out
    the same handler for it (building it, and looking up its metric children, on every
    call was a measurable part of a short streaming call's CPU).
    """

    def __init__(self, metrics: RpcMetrics | None = None) -> None:
        """``metrics``: where to record calls (``None``: the default registry's)."""
        self.metrics = metrics or RpcMetrics.for_registry()
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        metrics = _MethodMetrics(self.metrics, method)
        wrapped = _rewrap(
            handler,
            lambda inner: _wrap_unary(inner, method, metrics),
            lambda inner: _wrap_streaming(inner, method, metrics),
        )
        self._wrapped[method] = (handler, wrapped)
        return wrapped


CallCheck = Callable[[grpc.aio.ServicerContext], None]
"""``check(context)`` before a call reaches its handler: returns, or raises a
LoraplaneError (the refusal)."""


def wrap_handler(handler: grpc.RpcMethodHandler, check: CallCheck) -> grpc.RpcMethodHandler:
    """A copy of ``handler`` that runs ``check(context)`` before its behaviour, for every
    kind of method (unary or streaming request and response); what ``check`` raises ends
    the call before the handler is reached (a streaming response: at its first item)."""

    def unary(inner: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def behaviour(request: Any, context: grpc.aio.ServicerContext) -> Any:
            check(context)
            return await inner(request, context)

        return behaviour

    def streaming(
        inner: Callable[..., AsyncIterator[Any]],
    ) -> Callable[..., AsyncIterator[Any]]:
        async def behaviour(request: Any, context: grpc.aio.ServicerContext) -> Any:
            check(context)
            async for item in inner(request, context):
                yield item

        return behaviour

    return _rewrap(handler, unary, streaming)


class GuardInterceptor(HandlerInterceptor):
    """An interceptor that checks calls before they reach their handler: :meth:`guard`
    names the check of a method (``None``: the method passes unchecked) and
    :func:`wrap_handler` runs it. Place it after :class:`ServiceInterceptor`
    (``build_server`` does) so a refusal becomes its status."""

    def guard(self, method: str) -> CallCheck | None:
        """The check of ``method`` (a full method name), or ``None``."""
        raise NotImplementedError

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        check = self.guard(method)
        return handler if check is None else wrap_handler(handler, check)


class MetadataAuthInterceptor(GuardInterceptor):
    """Runs ``check(metadata, method)`` before every call it ``applies_to``.

    ``check`` raises a :class:`LoraplaneError` (``Unauthenticated``,
    ``PermissionDenied``) to refuse; place this interceptor after
    :class:`ServiceInterceptor` so the refusal becomes the right status. Health and
    reflection calls are normally left out through ``applies_to``.
    """

    def __init__(self, check: AuthCheck, *, applies_to: Callable[[str], bool]) -> None:
        """``check`` authenticates; ``applies_to(full_method)`` selects guarded methods."""
        self.check = check
        self.applies_to = applies_to

    def guard(self, method: str) -> CallCheck | None:
        if not self.applies_to(method):
            return None
        check = self.check

        def verify(context: grpc.aio.ServicerContext) -> None:
            check(tuple(context.invocation_metadata() or ()), method)

        return verify


def bearer_token(metadata: Metadata) -> str | None:
    """The token of an ``authorization: Bearer <token>`` metadata entry, if any."""
    for key, value in metadata:
        if key.lower() != "authorization":
            continue
        text = value.decode() if isinstance(value, bytes) else value
        scheme, _, token = text.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return None


def metadata_value(metadata: Metadata, key: str) -> str | None:
    """The first value of metadata ``key`` (case-insensitive), as text."""
    for k, v in metadata:
        if k.lower() == key.lower():
            return v.decode() if isinstance(v, bytes) else v
    return None


# --------------------------------------------------------------------------- server


class _WrappedGeneric(grpc.GenericRpcHandler):
    """A generic handler whose method handlers come out wrapped (each built once)."""

    def __init__(self, inner: grpc.GenericRpcHandler,
                 wrap: Callable[[str, grpc.RpcMethodHandler], grpc.RpcMethodHandler]) -> None:
        self._inner = inner
        self._wrap = wrap
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = self._inner.service(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is None or cached[0] is not handler:
            cached = (handler, self._wrap(method, handler))
            self._wrapped[method] = cached
        return cached[1]


class _WrappingRegistrar:
    """What the generated ``add_*_to_server`` functions register on, standing in for the
    server: every method handler is wrapped by the handler interceptors once, here, instead
    of by grpc.aio interceptors on every call (which run a chain of coroutines per call
    before the handler: a measurable part of a short streaming call's CPU)."""

    def __init__(self, server: grpc.aio.Server, interceptors: Sequence[HandlerInterceptor]):
        self._server = server
        self._interceptors = tuple(reversed(interceptors))  # the first is the outermost

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """``handler`` of ``method`` (a full name) inside every interceptor."""
        for icpt in self._interceptors:
            handler = icpt.wrap(method, handler)
        return handler

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(
            tuple(_WrappedGeneric(h, self.wrap) for h in handlers))

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        self._server.add_registered_method_handlers(service_name, {
            name: self.wrap(f"/{service_name}/{name}", handler)
            for name, handler in method_handlers.items()})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


@dataclass(frozen=True)
class Service:
    """One servicer to register: the generated ``add_*_to_server`` function, the
    servicer instance and the full service name (for health and reflection)."""

    add_to_server: Callable[[Any, grpc.aio.Server], None]
    servicer: Any
    name: str


@dataclass
class GrpcServer:
    """A built server: start it, stop it gracefully; ``port`` is the bound port."""

    server: grpc.aio.Server
    port: int
    health: HealthServicer
    service_names: list[str] = field(default_factory=list)

    async def start(self) -> None:
        """Start serving and mark every service SERVING."""
        await self.server.start()
        for name in ["", *self.service_names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Mark NOT_SERVING, refuse new calls, let running calls finish for ``grace_s``."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)

    async def wait(self) -> None:
        """Block until the server terminates."""
        await self.server.wait_for_termination()


def build_server(
    services: Sequence[Service],
    *,
    port: int,
    host: str = "127.0.0.1",
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    metrics: RpcMetrics | None = None,
    options: Sequence[tuple[str, Any]] = (),
    credentials: grpc.ServerCredentials | None = None,
) -> GrpcServer:
    """Build (not start) an asyncio gRPC server on ``host:port`` (``port=0``: any free port).

    ``credentials``: TLS server credentials (``TlsFiles.server_credentials`` of
    :mod:`loraplane.shared.tls`: mutual TLS); ``None``: plaintext.
    Raises ``OSError`` if the port cannot be bound.
    """
    wrapping: list[HandlerInterceptor] = [ServiceInterceptor(metrics)]
    per_call: list[grpc.aio.ServerInterceptor] = []
    for icpt in interceptors:
        # a handler interceptor after one that grpc must run per call would run before it
        (wrapping if isinstance(icpt, HandlerInterceptor) and not per_call
         else per_call).append(icpt)
    server = grpc.aio.server(interceptors=per_call or None, options=list(options))
    registrar = _WrappingRegistrar(server, wrapping)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, registrar)  # type: ignore[arg-type]
    names = [s.name for s in services]
    for svc in services:
        svc.add_to_server(svc.servicer, registrar)  # type: ignore[arg-type]
    # the asyncio servicer, named (reflection picks it only for a grpc.aio.Server itself)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
        reflection.aio.ReflectionServicer(
            [*names, "grpc.health.v1.Health", reflection.SERVICE_NAME]),
        registrar,  # type: ignore[arg-type]
    )
    bound = (server.add_insecure_port(f"{host}:{port}") if credentials is None
             else server.add_secure_port(f"{host}:{port}", credentials))
    if bound == 0:
        raise OSError(f"cannot bind gRPC server to {host}:{port}")
    return GrpcServer(server=server, port=bound, health=health, service_names=names)
