"""``loraplane release`` names the component it cannot reach (the registry, the object
store) with its address, and exits 5; a refusal by a reachable object store stays an error
(exit 1) with its S3 code. No stack: a closed local port and a fake object store."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import grpc
import pytest
import urllib3
from minio.error import S3Error, ServerError
from typer.testing import CliRunner

from loraplane.registry import release_cli
from loraplane.registry.client import (
    ComponentUnavailable,
    LocalFile,
    RegistryClient,
    ReleaseError,
    connection_cause,
    upload_file,
)
from loraplane.v1 import registry_pb2


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FailingStore:
    """An object store whose every upload fails with ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def fput_object(self, *args: Any, **kwargs: Any) -> None:
        raise self.error


def refused() -> urllib3.exceptions.MaxRetryError:
    """What minio raises when nothing listens: MaxRetryError(NewConnectionError(ConnectionRefused))."""
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except ConnectionRefusedError as os_error:
            raise urllib3.exceptions.NewConnectionError(
                None, "HTTPConnection(host='127.0.0.1', port=9): Failed to establish a new "
                "connection: [Errno 111] Connection refused") from os_error
    except urllib3.exceptions.NewConnectionError as reason:
        return urllib3.exceptions.MaxRetryError(None, "/bucket/key", reason)  # type: ignore[arg-type]


FILE = LocalFile("adapter_config.json", 10, "a" * 64, Path("/dev/null"))


def test_connection_cause_is_the_innermost_os_reason() -> None:
    assert connection_cause(refused()) == "Connection refused"
    assert connection_cause(RuntimeError("plain")) == "plain"


def test_an_unreachable_object_store_is_named_with_its_endpoint() -> None:
    with pytest.raises(ComponentUnavailable) as info:
        upload_file(FailingStore(refused()), "bkt", "k", FILE, None,  # type: ignore[arg-type]
                    "127.0.0.1:9")
    exc = info.value
    assert (exc.component, exc.endpoint, exc.reached) == ("object store", "127.0.0.1:9", False)
    assert str(exc) == ("cannot reach the object store at 127.0.0.1:9 (LORAPLANE_S3_ENDPOINT): "
                        "Connection refused")


def test_an_object_store_answering_5xx_is_unavailable() -> None:
    with pytest.raises(ComponentUnavailable, match="object store at s3:9 is unavailable.*HTTP 503"):
        upload_file(FailingStore(ServerError("busy", 503)), "bkt", "k", FILE, None,  # type: ignore[arg-type]
                    "s3:9")


def test_an_object_store_refusing_the_upload_is_an_error_with_its_code() -> None:
    error = S3Error(None, "NoSuchBucket", "The bucket does not exist", "bkt", "r1", "h1")  # type: ignore[arg-type]
    with pytest.raises(ReleaseError) as info:
        upload_file(FailingStore(error), "bkt", "k", FILE, None, "s3:9")  # type: ignore[arg-type]
    assert not isinstance(info.value, ComponentUnavailable)
    assert "refused adapter_config.json (s3://bkt/k): NoSuchBucket" in str(info.value)


def test_a_registry_that_does_not_listen_is_named_with_its_address() -> None:
    addr = f"127.0.0.1:{closed_port()}"
    with RegistryClient(addr, "t" * 16, timeout_s=5) as reg:
        with pytest.raises(grpc.RpcError) as info:
            reg.call("ListTenants", registry_pb2.ListTenantsRequest())
        down = reg.unavailable(info.value)  # type: ignore[arg-type]
    assert down is not None and not down.reached
    assert str(down).startswith(f"cannot reach the registry at {addr} (LORAPLANE_REGISTRY_ADDR)")


def test_other_registry_errors_are_not_unavailability() -> None:
    class Denied(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.PERMISSION_DENIED

        def details(self) -> str:
            return "not the operator token"

    with RegistryClient("127.0.0.1:1", "t" * 16) as reg:
        assert reg.unavailable(Denied()) is None


def test_cli_exits_5_naming_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    addr = f"127.0.0.1:{closed_port()}"
    monkeypatch.setenv("LORAPLANE_REGISTRY_ADDR", addr)
    monkeypatch.setenv("LORAPLANE_REGISTRY_OPERATOR_TOKEN", "operator-token-0123456789")
    result = CliRunner().invoke(release_cli.app, ["tenants", "list"])
    assert result.exit_code == release_cli.EXIT_UNAVAILABLE == 5, result.output
    assert f"cannot reach the registry at {addr}" in result.output
    assert "Traceback" not in result.output
