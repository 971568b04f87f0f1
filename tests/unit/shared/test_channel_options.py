"""Every internal channel reconnects within a second (shared.tls.RECONNECT_OPTIONS)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from loraplane.shared import tls
from loraplane.shared.tls import RECONNECT_OPTIONS, channel_options


def test_defaults_cap_the_reconnect_backoff_at_a_second() -> None:
    got = dict(channel_options())
    assert got["grpc.max_reconnect_backoff_ms"] <= 1000
    assert got["grpc.initial_reconnect_backoff_ms"] <= got["grpc.max_reconnect_backoff_ms"]
    assert got == dict(RECONNECT_OPTIONS)


def test_a_callers_value_replaces_the_default_and_its_other_options_stay() -> None:
    got = channel_options([("grpc.max_reconnect_backoff_ms", 5000),
                           ("grpc.keepalive_time_ms", 30_000)])
    keys = [k for k, _ in got]
    assert len(keys) == len(set(keys))  # one value per key, not two for gRPC to pick from
    assert dict(got)["grpc.max_reconnect_backoff_ms"] == 5000
    assert dict(got)["grpc.keepalive_time_ms"] == 30_000
    assert dict(got)["grpc.initial_reconnect_backoff_ms"] == 200


def test_a_connection_attempt_keeps_grpcs_own_timeout() -> None:
    """gRPC reads ``grpc.min_reconnect_backoff_ms`` as the shortest time one connection
    attempt may take: 200 ms there cut TLS handshakes short on a busy host."""
    assert "grpc.min_reconnect_backoff_ms" not in dict(channel_options())


@pytest.mark.parametrize("aio", [True, False])
def test_plaintext_channels_get_the_reconnect_options(monkeypatch: pytest.MonkeyPatch,
                                                      aio: bool) -> None:
    seen: dict[str, Any] = {}

    def fake(address: str, options: list[tuple[str, Any]]) -> str:
        seen["address"], seen["options"] = address, options
        return "channel"

    if aio:
        monkeypatch.setattr(grpc.aio, "insecure_channel", fake)
        ch = tls.secure_or_insecure_aio_channel("127.0.0.1:1", None, server=tls.WORKER,
                                                options=[("grpc.keepalive_time_ms", 7)])
    else:
        monkeypatch.setattr(grpc, "insecure_channel", fake)
        ch = tls.secure_or_insecure_channel("127.0.0.1:1", None, server=tls.WORKER,
                                            options=[("grpc.keepalive_time_ms", 7)])
    assert ch == "channel" and seen["address"] == "127.0.0.1:1"
    assert dict(seen["options"]) == {**dict(RECONNECT_OPTIONS), "grpc.keepalive_time_ms": 7}
