"""``loraplane golden record``: golden answers recorded from the stable version only; bad
input refused naming the problem (issue 16)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import yaml
from typer.testing import CliRunner

from loraplane.cli.golden import (
    Answer,
    GoldenError,
    input_problems,
    merge_into_rules,
    record,
)
from loraplane.cli.main import app
from loraplane.stack.certs import ensure_dev_pki
from loraplane.v1 import common_pb2, inference_pb2, inference_pb2_grpc


def stable(text: str = " fine") -> Answer:
    return Answer(text, "v1", "acme", canary=False, degraded=False)


def test_input_problems_name_every_problem() -> None:
    assert input_problems("acme/code", ["Hi"], 6) == []
    problems = input_problems("code", ["Hi", " ", "Hi"], 0)
    assert problems == ["adapter 'code': expected TENANT/NAME", "prompt 2 is empty",
                        "prompt 'Hi' is given twice", "--max-tokens 0 must be at least 1"]
    assert input_problems("acme/code", [], 6) == ["at least one --prompt is required"]


def test_record_keeps_only_the_stable_versions_answers() -> None:
    calls: list[tuple[str, str, int]] = []

    def ask(prompt: str, key: str, max_tokens: int) -> Answer:
        calls.append((prompt, key, max_tokens))
        # the first key falls into the canary's share: another key is tried
        if key.endswith("-0"):
            return Answer(" wrong", "v2", "acme", canary=True, degraded=False)
        return stable(f" answer to {prompt}")

    out = record("acme/code", ["Hello", "2+2?"], 6, ask)
    assert out == [{"prompt": "Hello", "expect": " answer to Hello"},
                   {"prompt": "2+2?", "expect": " answer to 2+2?"}]
    assert {m for _, _, m in calls} == {6}


@pytest.mark.parametrize(("answer", "message"), [
    (Answer("x", "v2", "acme", canary=True, degraded=False), "routed to the canary v2"),
    (Answer("x", "v1", "acme", canary=False, degraded=True), "answered by the base model"),
    (Answer("x", "v1", "globex", canary=False, degraded=False), "not acme/code: use acme's key"),
])
def test_record_refuses_answers_not_from_the_stable_version(answer: Answer, message: str) -> None:
    with pytest.raises(GoldenError, match=message):
        record("acme/code", ["Hello"], 6, lambda _p, _k, _m: answer)


def test_record_refuses_a_stable_version_that_changed_meanwhile() -> None:
    versions = iter(["v1", "v2"])

    def ask(prompt: str, key: str, max_tokens: int) -> Answer:
        return Answer("x", next(versions), "acme", canary=False, degraded=False)

    with pytest.raises(GoldenError, match="changed while recording"):
        record("acme/code", ["a", "b"], 6, ask)


def test_merge_into_rules_keeps_the_rest_and_is_validated() -> None:
    rules = {"canary": {"warm_replicas": 1, "golden_sets": {"acme/other": ["Hi"]}},
             "limits": {"max_removals_per_round": 4}}
    entries = [{"prompt": "Hello", "expect": " there"}]
    out = merge_into_rules(rules, "acme/code", entries, 6)
    assert out["canary"]["golden_sets"] == {"acme/other": ["Hi"], "acme/code": entries}
    assert out["canary"]["golden_max_tokens"] == 6 and out["limits"] == rules["limits"]
    with pytest.raises(GoldenError, match="golden_max_tokens is 8: record with --max-tokens 8"):
        merge_into_rules({"canary": {"golden_max_tokens": 8}}, "acme/code", entries, 6)
    with pytest.raises(GoldenError, match="would be refused by the cache manager"):
        merge_into_rules({"canary": {"no_such_key": 1}}, "acme/code", entries, 6)


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["golden", "record", *args], env=env)
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes else "")


def test_cli_refuses_bad_input_before_any_request(tmp_path: Path) -> None:
    env = {"LORAPLANE_GATEWAY_GRPC": "127.0.0.1:1", "LORAPLANE_API_KEY": "k"}
    code, out = run("code", "--prompt", "", env=env)
    assert code == 2
    assert "expected TENANT/NAME" in out and "prompt 1 is empty" in out
    code, out = run("acme/code", env=env)
    assert code == 2 and "at least one --prompt is required" in out
    bad = tmp_path / "rules.yaml"
    bad.write_text("canary: [unclosed\n")
    code, out = run("acme/code", "-p", "Hi", "--rules", str(bad), env=env)
    assert code == 2 and f"--rules {bad}: not YAML" in out
    code, out = run("acme/code", "-p", "Hi", env={"LORAPLANE_GATEWAY_GRPC": ""})
    assert code == 2 and "no gateway address" in out


class _Gateway(inference_pb2_grpc.InferenceServicer):
    """A gateway that answers from stable v1, prompt reversed (the test's 'model')."""

    def Generate(self, request: inference_pb2.GenerateRequest,
                 context: grpc.ServicerContext) -> Iterator[inference_pb2.GenerateResponse]:
        assert request.temperature == 0.0 and request.max_tokens == 6
        first = inference_pb2.GenerateResponse(text=request.prompt[::-1][:3])
        first.resolved.adapter.CopyFrom(common_pb2.AdapterRef(
            tenant_id="acme", adapter_name=request.adapter, version="v1"))
        yield first
        yield inference_pb2.GenerateResponse(text="!", finished=True)


@pytest.fixture
def gateway() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    inference_pb2_grpc.add_InferenceServicer_to_server(_Gateway(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)


def test_cli_records_into_the_rules_file(gateway: str, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"canary": {"golden_max_tokens": 6, "warm_replicas": 1}}))
    env = {"LORAPLANE_GATEWAY_GRPC": gateway, "LORAPLANE_API_KEY": "k"}
    code, out = run("acme/code", "-p", "Hello", "-p", "abc", "--rules", str(rules), env=env)
    assert code == 0, out
    assert "wrote 2 golden answers of acme/code" in out
    written = yaml.safe_load(rules.read_text())
    assert written["canary"]["warm_replicas"] == 1
    assert written["canary"]["golden_sets"]["acme/code"] == [
        {"prompt": "Hello", "expect": "oll!"}, {"prompt": "abc", "expect": "cba!"}]
    # printed as a snippet without --rules
    code, out = run("acme/code", "-p", "Hello", "--max-tokens", "6", env=env)
    assert code == 0 and yaml.safe_load(out) == {"canary": {
        "golden_max_tokens": 6, "golden_sets": {"acme/code": [
            {"prompt": "Hello", "expect": "oll!"}]}}}


def test_cli_records_over_tls_trusting_the_gateway_ca(tmp_path: Path) -> None:
    # what demo.env says when the stack's edge TLS is on (the make run default)
    pki = ensure_dev_pki(tmp_path / "pki")["gateway"]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    inference_pb2_grpc.add_InferenceServicer_to_server(_Gateway(), server)
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(
        [(pki.key.read_bytes(), pki.cert.read_bytes())]))
    server.start()
    try:
        env = {"LORAPLANE_GATEWAY_GRPC": f"127.0.0.1:{port}", "LORAPLANE_API_KEY": "k",
               "LORAPLANE_GATEWAY_CA_FILE": str(pki.ca)}
        code, out = run("acme/code", "-p", "Hello", "--max-tokens", "6", env=env)
        assert code == 0, out
        assert yaml.safe_load(out)["canary"]["golden_sets"]["acme/code"] == [
            {"prompt": "Hello", "expect": "oll!"}]
        # without the CA the TLS port refuses the plaintext channel
        code, out = run("acme/code", "-p", "Hello", "--max-tokens", "6", "--timeout", "3",
                        env={**env, "LORAPLANE_GATEWAY_CA_FILE": ""})
        assert code == 1 and "UNAVAILABLE" in out, out
        # an unreadable CA file is named before any request
        missing = tmp_path / "missing.pem"
        code, out = run("acme/code", "-p", "Hello",
                        env={**env, "LORAPLANE_GATEWAY_CA_FILE": str(missing)})
        assert code == 2 and f"LORAPLANE_GATEWAY_CA_FILE={missing}" in out, out
    finally:
        server.stop(0)
