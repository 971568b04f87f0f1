"""Errors of the gateway and their gRPC / HTTP / OpenAI classification.

Errors a worker returns keep their gRPC status (a worker's RESOURCE_EXHAUSTED stays
RESOURCE_EXHAUSTED for the tenant), with the worker's retry hint.
"""

from __future__ import annotations

import grpc

from loraplane.shared.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    LoraplaneError,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from loraplane.shared.grpcutil import RETRY_AFTER_METADATA

HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
"""gRPC status → HTTP status of the OpenAI-compatible API."""

OPENAI_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    429: "rate_limit_error",
}
"""HTTP status → OpenAI error ``type`` (anything else: ``server_error``)."""

_CLASSES: dict[grpc.StatusCode, type[LoraplaneError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}


class UpstreamError(LoraplaneError):
    """A worker failed the call with a status that has no dedicated class here."""

    def __init__(
        self, code: grpc.StatusCode, message: str, *, retry_after_s: float | None = None
    ) -> None:
        """Carry ``code`` as this error's gRPC status."""
        super().__init__(message, retry_after_s=retry_after_s)
        self.grpc_code = code
        self.http_status = HTTP_STATUS.get(code, 502)
        self.retriable = code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED)


class VersionNotReady(Unavailable):
    """The resolved version's routing details (digest, location) are not known yet."""

    code = "version_not_ready"


class VersionWithdrawn(FailedPrecondition):
    """The canary analysis withdrew the resolved (stable) version: its requests failed
    after load and there is no version to fall back to. Not retriable until its owner
    promotes a version (``loraplane promote`` / ``rollback``)."""

    code = "version_withdrawn"


def withdrawal_detail(reason: str) -> str:
    """The short account of a withdrawal: the ``detail`` of the analysis' figures (the
    reason is ``canary-analysis {json}``), else the reason itself (at most 300 chars)."""
    import json

    start = reason.find("{")
    if start >= 0:
        try:
            detail = json.loads(reason[start:]).get("detail")
        except (ValueError, AttributeError):
            detail = None
        if isinstance(detail, str) and detail:
            return detail[:300]
    return reason[:300]


class NoReleasedVersion(NotFound):
    """The adapter exists but has no stable version yet."""

    code = "no_released_version"


class AdapterCold(Unavailable):
    """The adapter is not loaded and the policy says fail fast."""

    code = "adapter_cold"


class ColdStartBudgetExceeded(ResourceExhausted):
    """The cold-start budget was spent waiting for a cold-load slot."""

    code = "cold_start_budget_exceeded"


class NoWorker(Unavailable):
    """No ready worker serves the base model."""

    code = "no_worker"


def retry_after_of(err: grpc.aio.AioRpcError) -> float | None:
    """The ``retry-after-ms`` trailing metadata of a failed call, in seconds."""
    for key, value in err.trailing_metadata() or ():
        if key == RETRY_AFTER_METADATA:
            try:
                return int(value) / 1000.0
            except (TypeError, ValueError):
                return None
    return None


DEFAULT_RETRY_AFTER_S = 1.0
"""Retry hint of a worker's UNAVAILABLE / RESOURCE_EXHAUSTED that carried none (a worker
gone mid-stream, a version leaving it)."""


def from_rpc_error(err: grpc.aio.AioRpcError, worker_id: str) -> LoraplaneError:
    """A classified error for a worker's failed call (status kept, retry hint kept)."""
    code = err.code()
    message = f"worker {worker_id}: {err.details() or code.name}"
    retry = retry_after_of(err)
    if retry is None and code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED):
        retry = DEFAULT_RETRY_AFTER_S  # a retriable refusal always says when to retry
    cls = _CLASSES.get(code)
    if cls is not None:
        return cls(message, retry_after_s=retry)
    return UpstreamError(code, message, retry_after_s=retry)


def http_status_of(exc: LoraplaneError) -> int:
    """HTTP status of a classified error."""
    return HTTP_STATUS.get(exc.grpc_code, exc.http_status)


def openai_error_body(exc: LoraplaneError) -> dict[str, dict[str, str | None]]:
    """``{"error": {"message", "type", "code"}}`` for a classified error."""
    status = http_status_of(exc)
    code = getattr(exc, "code", None)
    return {
        "error": {
            "message": exc.message,
            "type": OPENAI_TYPES.get(status, "server_error"),
            "code": code if isinstance(code, str) else exc.grpc_code.name.lower(),
        }
    }
