"""Errors carry their classification: a gRPC status code and whether a retry may help.

Services raise these; one interceptor (``loraplane.shared.grpcutil``) maps them to
statuses, so no handler matches on message text and nothing becomes INTERNAL by
accident.
"""

from __future__ import annotations

import grpc


class LoraplaneError(Exception):
    """Base class. ``grpc_code`` and ``retriable`` classify the failure."""

    grpc_code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    retriable: bool = False
    http_status: int = 500

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


class InvalidArgument(LoraplaneError):
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    http_status = 400


class NotFound(LoraplaneError):
    grpc_code = grpc.StatusCode.NOT_FOUND
    http_status = 404


class AlreadyExists(LoraplaneError):
    grpc_code = grpc.StatusCode.ALREADY_EXISTS
    http_status = 409


class FailedPrecondition(LoraplaneError):
    grpc_code = grpc.StatusCode.FAILED_PRECONDITION
    http_status = 409


class Unauthenticated(LoraplaneError):
    grpc_code = grpc.StatusCode.UNAUTHENTICATED
    http_status = 401


class PermissionDenied(LoraplaneError):
    grpc_code = grpc.StatusCode.PERMISSION_DENIED
    http_status = 403


class ResourceExhausted(LoraplaneError):
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    retriable = True
    http_status = 429


class Unavailable(LoraplaneError):
    grpc_code = grpc.StatusCode.UNAVAILABLE
    retriable = True
    http_status = 503


class DeadlineExceeded(LoraplaneError):
    grpc_code = grpc.StatusCode.DEADLINE_EXCEEDED
    retriable = True
    http_status = 504
