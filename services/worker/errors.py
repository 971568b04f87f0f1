"""Classified errors of the inference worker.

Each error carries its gRPC status (for ``Generate``) and its ``LoadErrorCode`` (for the
``LoadFailed`` report answering a cache command), so neither path matches message text.
"""

from __future__ import annotations

from typing import ClassVar

from loraplane.shared import errors
from loraplane.v1 import events_pb2

LoadErrorCode = events_pb2.LoadErrorCode


class WorkerError(errors.LoraplaneError):
    """Base of the worker's errors; ``load_error_code`` classifies a failed command."""

    load_error_code: ClassVar[LoadErrorCode] = events_pb2.LOAD_ERROR_CODE_INTERNAL
    reason: ClassVar[str] = "internal"
    """Short label for metrics (``load_failures_total{reason=...}``)."""


class RankTooLarge(WorkerError, errors.FailedPrecondition):
    """The adapter's LoRA rank exceeds the engine's ``max_lora_rank`` (refused before the
    engine sees it: on vLLM's generate path such a request kills the engine)."""

    load_error_code = events_pb2.LOAD_ERROR_CODE_RANK_TOO_LARGE
    reason = "rank_too_large"


class PinLimit(WorkerError, errors.FailedPrecondition):
    """Pinning would leave no unpinned engine slot (vLLM dies on the next new adapter)."""

    load_error_code = events_pb2.LOAD_ERROR_CODE_NO_CAPACITY
    reason = "pin_limit"


class NoCapacity(WorkerError, errors.ResourceExhausted):
    """No free engine registration or host bytes for the adapter; retriable after an evict."""

    load_error_code = events_pb2.LOAD_ERROR_CODE_NO_CAPACITY
    reason = "no_capacity"


class NoSlot(WorkerError, errors.ResourceExhausted):
    """A request waited for a HOT slot until its budget was spent: every HOT version was
    busy (in flight, reserved for another waiting request), pinned or protected."""

    load_error_code = events_pb2.LOAD_ERROR_CODE_NO_CAPACITY
    reason = "no_slot"


class SlotQueueFull(WorkerError, errors.ResourceExhausted):
    """The worker's queue of requests waiting for a HOT slot is full."""

    load_error_code = events_pb2.LOAD_ERROR_CODE_NO_CAPACITY
    reason = "queue_full"


class DownloadFailed(WorkerError, errors.Unavailable):
    """The object store read failed (retriable)."""

    load_error_code = events_pb2.LOAD_ERROR_CODE_DOWNLOAD_FAILED
    reason = "download_failed"


class SourceNotAllowed(WorkerError, errors.FailedPrecondition):
    """The artifact location is outside the allow-listed bucket / tenant prefix."""

    load_error_code = events_pb2.LOAD_ERROR_CODE_DOWNLOAD_FAILED
    reason = "source_not_allowed"


class DigestMismatch(WorkerError, errors.FailedPrecondition):
    """The files on the host do not match the signed manifest or the admitted sha256."""

    load_error_code = events_pb2.LOAD_ERROR_CODE_DIGEST_MISMATCH
    reason = "digest_mismatch"


class BaseModelNotServed(WorkerError, errors.FailedPrecondition):
    """The adapter's base model is not the one this worker's engine serves."""

    load_error_code = events_pb2.LOAD_ERROR_CODE_BASE_MODEL_NOT_SERVED
    reason = "base_model_not_served"


class NotPresent(WorkerError, errors.NotFound):
    """Pin / unpin / use of an adapter version the worker does not hold (in that tier)."""

    load_error_code = events_pb2.LOAD_ERROR_CODE_NOT_PRESENT
    reason = "not_present"


class InUse(WorkerError, errors.Unavailable):
    """The version still has requests in flight after the drain timeout (retriable)."""

    load_error_code = events_pb2.LOAD_ERROR_CODE_IN_USE
    reason = "in_use"


class Draining(WorkerError, errors.Unavailable):
    """The version is being evicted: no new request may start on it (retriable elsewhere)."""

    load_error_code = events_pb2.LOAD_ERROR_CODE_IN_USE
    reason = "draining"


class AdapterCold(WorkerError, errors.Unavailable):
    """The version is not on this worker and the request may not wait for a cold load."""

    load_error_code = events_pb2.LOAD_ERROR_CODE_NOT_PRESENT
    reason = "cold"


class CommandExpired(WorkerError, errors.DeadlineExceeded):
    """The command's deadline passed before it could run."""

    load_error_code = events_pb2.LOAD_ERROR_CODE_DEADLINE_EXCEEDED
    reason = "deadline_exceeded"


class EngineFailure(WorkerError, errors.Unavailable):
    """The engine refused or failed an operation (it is still alive)."""

    load_error_code = events_pb2.LOAD_ERROR_CODE_ENGINE_ERROR
    reason = "engine_error"


class EngineDead(WorkerError, errors.Unavailable):
    """The engine process died; the worker must be restarted."""

    load_error_code = events_pb2.LOAD_ERROR_CODE_ENGINE_ERROR
    reason = "engine_dead"


class EngineBusy(WorkerError, errors.ResourceExhausted):
    """The engine's request queue is full (retriable, preferably on another worker)."""

    load_error_code = events_pb2.LOAD_ERROR_CODE_ENGINE_ERROR
    reason = "engine_busy"


class BadRequest(WorkerError, errors.InvalidArgument):
    """A malformed request or command (missing id, empty prompt, unknown tier...)."""

    load_error_code = events_pb2.LOAD_ERROR_CODE_INTERNAL
    reason = "bad_request"


def load_error_code(exc: BaseException) -> LoadErrorCode:
    """The ``LoadErrorCode`` of any exception (``INTERNAL`` for unclassified ones)."""
    if isinstance(exc, WorkerError):
        return exc.load_error_code
    return events_pb2.LOAD_ERROR_CODE_INTERNAL


def failure_reason(exc: BaseException) -> str:
    """Metric label of a failure."""
    if isinstance(exc, WorkerError):
        return exc.reason
    return "internal"
