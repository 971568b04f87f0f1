"""Adapter names: the registry grammar, path-like names refused before any lookup."""

from __future__ import annotations

import pytest

from loraplane.gateway.names import (
    InvalidAdapterName,
    MissingAdapterName,
    base_model_named,
    check_adapter_name,
    is_base_model,
    route_base_model_name,
)
from loraplane.shared.errors import InvalidArgument
from loraplane.v1 import inference_pb2


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


def test_base_model_alias() -> None:
    assert is_base_model("base")
    assert not is_base_model("") and not is_base_model("support")


@pytest.mark.parametrize("field", ["adapter", "model"])
def test_an_empty_name_is_refused_naming_the_field(field: str) -> None:
    with pytest.raises(MissingAdapterName, match=f"^{field} is required") as info:
        check_adapter_name("", field)
    assert info.value.http_status == 400


def test_the_field_is_named_in_every_refusal() -> None:
    with pytest.raises(InvalidAdapterName, match="^model must be a name, not a path"):
        check_adapter_name("org/x", "model")
    with pytest.raises(InvalidAdapterName, match="^invalid model name"):
        check_adapter_name("Upper", "model")


SERVED = ("loraplane/tiny-llama", "gpt2")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("base", ""),  # the alias: the deployment's default
        ("loraplane/tiny-llama", "loraplane/tiny-llama"),
        ("gpt2", "gpt2"),  # a served name inside the adapter grammar is still the base model
        ("support", None),
        ("", None),
        ("loraplane/other", None),
    ],
)
def test_base_model_named(name: str, expected: str | None) -> None:
    assert base_model_named(name, SERVED) == expected


def test_a_served_name_is_routed_as_the_base_model() -> None:
    req = inference_pb2.GenerateRequest(adapter="loraplane/tiny-llama", prompt="x")
    route_base_model_name(req, SERVED)
    assert (req.adapter, req.base_model) == ("base", "loraplane/tiny-llama")
    same = inference_pb2.GenerateRequest(adapter="gpt2", base_model="gpt2")
    route_base_model_name(same, SERVED)
    assert (same.adapter, same.base_model) == ("base", "gpt2")
    for untouched in ("support", "base", "", "loraplane/other"):
        req = inference_pb2.GenerateRequest(adapter=untouched)
        route_base_model_name(req, SERVED)
        assert (req.adapter, req.base_model) == (untouched, "")


def test_a_served_name_with_another_base_model_is_refused() -> None:
    req = inference_pb2.GenerateRequest(adapter="gpt2", base_model="loraplane/tiny-llama")
    with pytest.raises(InvalidArgument, match="model 'gpt2' is a base model, but base_model"):
        route_base_model_name(req, SERVED, field="model")
