"""Connections to the workers' ``WorkerInternal`` servers: one channel per address."""

from __future__ import annotations

from typing import Any

import grpc

from loraplane.shared.tls import WORKER, TlsFiles, secure_or_insecure_aio_channel
from loraplane.v1 import worker_pb2_grpc

CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
)
"""Options of the gateway → worker channels (keepalive detects dead workers)."""


class WorkerPool:
    """Lazily opened, cached stubs for worker addresses."""

    def __init__(self, options: tuple[tuple[str, Any], ...] = CHANNEL_OPTIONS, *,
                 tls: TlsFiles | None = None) -> None:
        """``options``: gRPC channel options; ``tls``: the gateway's certificate (mutual
        TLS, the worker's certificate must name ``worker``), ``None``: plaintext."""
        self._options = list(options)
        self._tls = tls
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, worker_pb2_grpc.WorkerInternalStub] = {}

    def stub(self, address: str) -> worker_pb2_grpc.WorkerInternalStub:
        """The stub for ``address`` (``host:port``), opening the channel on first use."""
        stub = self._stubs.get(address)
        if stub is None:
            channel = secure_or_insecure_aio_channel(
                address, self._tls, server=WORKER, options=self._options)
            self._channels[address] = channel
            stub = worker_pb2_grpc.WorkerInternalStub(channel)
            self._stubs[address] = stub
        return stub

    async def close(self) -> None:
        """Close every channel."""
        channels, self._channels, self._stubs = self._channels, {}, {}
        for channel in channels.values():
            await channel.close()
