"""Name, version and file-path grammar; the content-addressed artifact layout."""

from __future__ import annotations

import pytest

from loraplane.registry import grammar
from loraplane.registry.versions import check_record
from loraplane.shared.errors import InvalidArgument
from loraplane.shared.signing import digest_of_files
from loraplane.v1 import events_pb2, registry_pb2

D1, D2 = "a" * 64, "b" * 64


@pytest.mark.parametrize(
    ("value", "ok"),
    [("acme", True), ("a1", True), ("acme-corp-2", True), ("a" * 63, True),
     ("a", False), ("Acme", False), ("-acme", False), ("acme_corp", False), ("a" * 64, False),
     ("", False), ("acme/x", False), ("ac me", False)],
)
def test_tenant_id(value: str, ok: bool) -> None:
    assert (grammar.check_tenant_id(value) == []) is ok


@pytest.mark.parametrize(
    ("value", "ok"),
    [("support-bot", True), ("s", True), ("sql.v2_x", True), ("a" * 63, True),
     ("Support", False), (".hidden", False), ("a/b", False), ("a" * 64, False), ("", False),
     ("..", False)],
)
def test_adapter_name(value: str, ok: bool) -> None:
    assert (grammar.check_adapter_name(value) == []) is ok


@pytest.mark.parametrize(
    ("value", "ok"),
    [("v1", True), ("2026-11-29.1", True), ("V3_rc1", True), ("1", True), ("a" * 64, True),
     ("", False), ("-v1", False), (".v1", False), ("v1/2", False), ("v 1", False),
     ("a" * 65, False), ("v1+build", False)],
)
def test_version(value: str, ok: bool) -> None:
    assert (grammar.check_version(value) == []) is ok


@pytest.mark.parametrize(
    ("value", "ok"),
    [("loraplane/tiny-llama", True), ("tiny-llama-v1", True), ("Qwen2.5-0.5B", True),
     ("a/b/c", False), ("/abs", False), ("org/", False), ("../x", False), ("", False),
     ("x" * 129, False)],
)
def test_base_model(value: str, ok: bool) -> None:
    assert (grammar.check_base_model(value) == []) is ok


@pytest.mark.parametrize(
    ("path", "ok"),
    [("adapter_config.json", True), ("sub/adapter_model.safetensors", True), ("model.sig", True),
     ("../etc/passwd", False), ("/abs", False), ("a/../b", False), (".hidden", False),
     ("a\\b", False), ("", False), ("a//b", False)],
)
def test_file_path(path: str, ok: bool) -> None:
    assert (grammar.check_file_path(path, "f") == []) is ok


def test_require_names_every_field() -> None:
    problems = [*grammar.check_tenant_id("X"), *grammar.check_version(""),
                *grammar.check_sha256("abc")]
    with pytest.raises(InvalidArgument) as err:
        grammar.require(problems)
    for field in ("tenant_id", "version", "sha256"):
        assert field in err.value.message


def test_content_digest_ignores_signature_and_matches_manifest_formula() -> None:
    files = [("adapter_config.json", D1), ("adapter_model.safetensors", D2)]
    digest = grammar.content_digest([*files, ("model.sig", "c" * 64)])
    assert digest == digest_of_files(dict(files))
    assert digest != grammar.content_digest([("adapter_config.json", D2),
                                             ("adapter_model.safetensors", D1)])


def test_artifact_prefix_is_registry_chosen() -> None:
    prefix = grammar.artifact_prefix("acme", "bot", "v1", D1)
    assert prefix == f"adapters/acme/bot/v1/{D1}/"
    assert grammar.artifact_uri("bkt", prefix) == f"s3://bkt/{prefix}"
    assert grammar.signature_uri(f"s3://bkt/{prefix}") == f"s3://bkt/{prefix}model.sig"
    with pytest.raises(InvalidArgument):
        grammar.artifact_prefix("acme", "../x", "v1", D1)


def _record(**over: object) -> registry_pb2.AdapterVersion:
    files = [events_pb2.ArtifactFile(path="adapter_config.json", size_bytes=10, sha256=D1),
             events_pb2.ArtifactFile(path="adapter_model.safetensors", size_bytes=90, sha256=D2)]
    digest = grammar.content_digest([(f.path, f.sha256) for f in files])
    rec = registry_pb2.AdapterVersion(
        tenant_id="acme", name="bot", version="v1", base_model="loraplane/tiny-llama", rank=8,
        format="peft", target_modules=["q_proj", "v_proj"], sha256=digest, size_bytes=100,
        files=files,
        artifact_uri=grammar.artifact_uri("bkt", grammar.artifact_prefix("acme", "bot", "v1",
                                                                          digest)),
    )
    for k, v in over.items():
        if isinstance(v, list):
            rec.ClearField(k)  # type: ignore[arg-type]
            getattr(rec, k).extend(v)
        else:
            setattr(rec, k, v)
    return rec


@pytest.mark.parametrize(
    ("name", "base_model", "problem"),
    [
        ("base", "loraplane/tiny-llama", "'base' is reserved: it names the base model"),
        ("gpt2", "gpt2", "'gpt2' is the name of its base model"),
        ("support", "gpt2", None),
        ("tiny-llama", "loraplane/tiny-llama", None),  # org/name never equals an adapter name
    ],
)
def test_reserved_adapter_names(name: str, base_model: str, problem: str | None) -> None:
    found = grammar.check_adapter_name_free(name, base_model, "adapter_name")
    if problem is None:
        assert found == []
    else:
        assert [p.field for p in found] == ["adapter_name"] and problem in found[0].message


def test_check_record_accepts_a_complete_record() -> None:
    assert check_record(_record(), bucket="bkt") == []


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"rank": 0}, "version.rank"),
        ({"format": "gguf"}, "version.format"),
        ({"target_modules": []}, "version.target_modules"),
        ({"target_modules": ["q_proj", "1bad"]}, "version.target_modules[1]"),
        ({"size_bytes": 7}, "version.size_bytes"),
        ({"sha256": "ABC"}, "version.sha256"),
        ({"artifact_uri": "s3://bkt/elsewhere/"}, "version.artifact_uri"),
        ({"artifact_uri": "s3://other-bucket/x/"}, "version.artifact_uri"),
        ({"signature_uri": "s3://bkt/x/model.sig"}, "version.signature_uri"),
        ({"priority": 9}, "version.priority"),
        ({"name": "Bad Name"}, "version.name"),
        ({"name": "base"}, "version.name"),
    ],
)
def test_check_record_names_the_bad_field(over: dict[str, object], field: str) -> None:
    problems = check_record(_record(**over), bucket="bkt")
    assert field in {p.field for p in problems}, problems


def test_check_record_reports_every_problem_at_once() -> None:
    problems = check_record(_record(rank=0, format="x", tenant_id="X"), bucket="bkt")
    assert {"version.rank", "version.format", "version.tenant_id"} <= {p.field for p in problems}


def test_check_record_refuses_traversal_in_files() -> None:
    bad = events_pb2.ArtifactFile(path="../../etc/passwd", size_bytes=100, sha256=D1)
    problems = check_record(_record(files=[bad]), bucket="bkt")
    assert "version.files[0].path" in {p.field for p in problems}
