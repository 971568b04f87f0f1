"""A worker's failed call becomes a classified error; retriable ones always carry a hint."""

from __future__ import annotations

import grpc

from loraplane.gateway.errors import DEFAULT_RETRY_AFTER_S, from_rpc_error


def _err(code: grpc.StatusCode, trailing: tuple[tuple[str, str], ...] = ()) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing),
                                details="Cancelling all calls")


def test_unavailable_without_a_hint_gets_the_default_hint() -> None:
    exc = from_rpc_error(_err(grpc.StatusCode.UNAVAILABLE), "w1")
    assert exc.grpc_code == grpc.StatusCode.UNAVAILABLE
    assert exc.retry_after_s == DEFAULT_RETRY_AFTER_S
    assert "worker w1" in exc.message


def test_the_workers_own_hint_is_kept_and_final_errors_get_none() -> None:
    exc = from_rpc_error(_err(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              (("retry-after-ms", "2500"),)), "w1")
    assert exc.retry_after_s == 2.5
    assert from_rpc_error(_err(grpc.StatusCode.INVALID_ARGUMENT), "w1").retry_after_s is None
