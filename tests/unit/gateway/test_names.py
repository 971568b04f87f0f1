"""Adapter names: the registry grammar, path-like names refused before any lookup."""

from __future__ import annotations

import pytest

from loraplane.gateway.names import InvalidAdapterName, check_adapter_name, is_base_model


@pytest.mark.parametrize("name", ["support", "code", "a", "chat-v2", "x.y_z", "0abc", "a" * 63])
def test_valid_names_pass(name: str) -> None:
    assert check_adapter_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "../etc/passwd",
        "acme/support",
        "s3://loraplane-artifacts/acme/support",
        "file:///tmp/adapter",
        "file:adapter",
        "a..b",
        "..",
        "~root",
        "C:\\adapters\\x",
        "support%2F..",
        "/abs",
    ],
)
def test_path_like_names_are_refused_as_paths(name: str) -> None:
    with pytest.raises(InvalidAdapterName, match="not a path or URI"):
        check_adapter_name(name)


@pytest.mark.parametrize("name", ["Support", "-lead", "with space", "a" * 64, "é", "a!"])
def test_names_outside_the_grammar_are_refused(name: str) -> None:
    with pytest.raises(InvalidAdapterName, match="invalid adapter name"):
        check_adapter_name(name)


def test_invalid_name_is_invalid_argument() -> None:
    import grpc

    with pytest.raises(InvalidAdapterName) as info:
        check_adapter_name("s3://x")
    assert info.value.grpc_code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.http_status == 400


def test_base_model_names() -> None:
    assert is_base_model("") and is_base_model("base")
    assert not is_base_model("support")
