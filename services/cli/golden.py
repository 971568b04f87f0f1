"""``loraplane golden record``: record an adapter's golden answers from its stable version.

The canary analysis fails a canary whose greedy answers to its adapter's golden set differ
from the ones recorded (``canary.golden_sets`` in the cache-manager rules,
:func:`loraplane.cache_manager.shadow.judge_answer`). This command asks the gateway, with
the tenant's API key, for each prompt's greedy answer (temperature 0, ``--max-tokens``
tokens: the rules' ``golden_max_tokens``) and keeps it only when the adapter's **stable**
version answered it (not its canary, not the base model after a cold degrade). It prints
the ``canary.golden_sets`` entry as YAML, or with ``--rules FILE`` writes it into that
rules file (validated as the cache manager validates it at start; every other key kept).

Connection as ``loraplane generate``: ``LORAPLANE_GATEWAY_GRPC``, ``LORAPLANE_API_KEY``
(else ``LORAPLANE_DEMO_API_KEY``), ``LORAPLANE_GATEWAY_CA_FILE`` (TLS trusting that CA,
as demo.env says when the stack's edge TLS is on). Bad input is refused
before any request, naming the problem (exit 2); a recording that cannot be trusted
(answered by the canary or the base model, the gateway refusing) exits 1.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import grpc
import typer
import yaml

from loraplane.gateway.cli import _api_key
from loraplane.shared.tls import edge_channel
from loraplane.v1 import common_pb2, inference_pb2, inference_pb2_grpc

app = typer.Typer(help="Golden sets of the canary analysis.", no_args_is_help=True,
                  add_completion=False)

DEFAULT_MAX_TOKENS = 8
"""The cache manager's default ``canary.golden_max_tokens``."""
KEY_TRIES = 20
"""Request keys tried before giving up when the canary's share keeps taking the request."""


class GoldenError(Exception):
    """The recording cannot be trusted (the message names why)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """One greedy answer and who gave it."""

    text: str
    version: str
    tenant_id: str
    canary: bool
    degraded: bool


Ask = Callable[[str, str, int], Answer]
"""(prompt, request key, max tokens) → the gateway's answer."""


def input_problems(adapter: str, prompts: Sequence[str], max_tokens: int) -> list[str]:
    """Every problem with the command's input (empty: fine)."""
    problems: list[str] = []
    tenant, _, name = adapter.partition("/")
    if not tenant or not name or "/" in name:
        problems.append(f"adapter {adapter!r}: expected TENANT/NAME")
    if not prompts:
        problems.append("at least one --prompt is required")
    for i, p in enumerate(prompts, start=1):
        if not p.strip():
            problems.append(f"prompt {i} is empty")
    seen: set[str] = set()
    for p in prompts:
        if p in seen:
            problems.append(f"prompt {p[:40]!r} is given twice")
        seen.add(p)
    if max_tokens < 1:
        problems.append(f"--max-tokens {max_tokens} must be at least 1")
    return problems


def record(adapter: str, prompts: Sequence[str], max_tokens: int,
           ask: Ask) -> list[dict[str, str]]:
    """``[{prompt, expect}]`` from the stable version of ``adapter`` (``tenant/name``);
    raises :class:`GoldenError` when an answer did not come from it."""
    tenant, _, name = adapter.partition("/")
    out: list[dict[str, str]] = []
    versions: set[str] = set()
    for prompt in prompts:
        answer: Answer | None = None
        for attempt in range(KEY_TRIES):
            answer = ask(prompt, f"golden-record-{attempt}", max_tokens)
            if not answer.canary:
                break
        assert answer is not None
        if answer.canary:
            raise GoldenError(f"{adapter}: every one of {KEY_TRIES} request keys was routed "
                              f"to the canary {answer.version}: record with the canary at "
                              "0 % (or before setting it)")
        if answer.tenant_id != tenant:
            raise GoldenError(f"the API key's tenant resolved {name!r} to "
                              f"{answer.tenant_id}/{name}, not {adapter}: use {tenant}'s key")
        if answer.degraded:
            raise GoldenError(f"{adapter}: {prompt[:40]!r} was answered by the base model "
                              "(the stable version was cold): retry once it is HOT")
        versions.add(answer.version)
        out.append({"prompt": prompt, "expect": answer.text})
    if len(versions) > 1:
        raise GoldenError(f"{adapter}: the stable version changed while recording "
                          f"({', '.join(sorted(versions))}): record again")
    return out


def merge_into_rules(rules: dict[str, Any], adapter: str, entries: list[dict[str, str]],
                     max_tokens: int) -> dict[str, Any]:
    """``rules`` with ``canary.golden_sets[adapter]`` replaced by ``entries`` and
    ``canary.golden_max_tokens`` set; validated as the cache manager does at start."""
    from loraplane.cache_manager.rules import RulesConfigError, rules_from_mapping

    canary = dict(rules.get("canary") or {})
    current = canary.get("golden_max_tokens")
    if current is not None and current != max_tokens:
        raise GoldenError(f"the rules' canary.golden_max_tokens is {current}: record with "
                          f"--max-tokens {current} (the shadow requests ask for that many)")
    sets = dict(canary.get("golden_sets") or {})
    sets[adapter] = entries
    canary.update(golden_sets=sets, golden_max_tokens=max_tokens)
    out = {**rules, "canary": canary}
    try:
        rules_from_mapping(out)
    except (RulesConfigError, ValueError) as exc:
        raise GoldenError(f"the rules would be refused by the cache manager: {exc}") from None
    return out


def _grpc_ask(gateway: str, key: str, ca: bytes | None, timeout_s: float,
              name: str) -> tuple[Ask, grpc.Channel]:
    """An :data:`Ask` for adapter ``name`` over the gateway's ``Inference.Generate``: TLS
    trusting ``ca`` (PEM) when given, plaintext otherwise."""
    channel = edge_channel(gateway, ca)
    stub = inference_pb2_grpc.InferenceStub(channel)
    metadata = (("authorization", f"Bearer {key}"),)

    def ask(prompt: str, request_key: str, max_tokens: int) -> Answer:
        req = inference_pb2.GenerateRequest(
            adapter=name, prompt=prompt, max_tokens=max_tokens, temperature=0.0,
            request_key=request_key, request_class=common_pb2.REQUEST_CLASS_INTERACTIVE)
        text: list[str] = []
        resolved: inference_pb2.ResolvedAdapter | None = None
        finished = False
        for msg in stub.Generate(req, metadata=metadata, timeout=timeout_s):
            if msg.HasField("resolved") and resolved is None:
                resolved = msg.resolved
            text.append(msg.text)
            finished = finished or msg.finished
        if resolved is None or not finished:
            raise GoldenError(f"{prompt[:40]!r}: the stream ended before a finished answer")
        return Answer("".join(text), resolved.adapter.version, resolved.adapter.tenant_id,
                      resolved.canary, resolved.degraded_to_base)

    return ask, channel


@app.command("record")
def record_cmd(
    adapter: Annotated[str, typer.Argument(metavar="TENANT/NAME")],
    prompt: Annotated[list[str] | None, typer.Option(
        "--prompt", "-p", help="A golden prompt (repeatable).")] = None,
    max_tokens: Annotated[int | None, typer.Option(
        "--max-tokens", help="Tokens per answer: the rules' canary.golden_max_tokens "
        f"(default: the rules file's, else {DEFAULT_MAX_TOKENS}).")] = None,
    rules: Annotated[Path | None, typer.Option(
        "--rules", help="Write the entry into this cache-manager rules YAML.")] = None,
    gateway: Annotated[str | None, typer.Option(
        "--gateway", envvar="LORAPLANE_GATEWAY_GRPC", help="gateway host:port")] = None,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", help="default: $LORAPLANE_API_KEY")] = None,
    timeout_s: Annotated[float, typer.Option("--timeout")] = 60.0,
) -> None:
    """Record TENANT/NAME's golden answers from its stable version (greedy, through the
    gateway) as ``canary.golden_sets`` entries: printed, or written into ``--rules``."""
    prompts = list(prompt or [])
    existing: dict[str, Any] = {}
    if rules is not None and rules.exists():
        try:
            loaded = yaml.safe_load(rules.read_text()) or {}
        except yaml.YAMLError as exc:
            typer.echo(f"error: --rules {rules}: not YAML: {exc}", err=True)
            raise typer.Exit(2) from None
        if not isinstance(loaded, dict):
            typer.echo(f"error: --rules {rules}: expected a mapping at the top", err=True)
            raise typer.Exit(2)
        existing = loaded
    if max_tokens is None:
        max_tokens = int((existing.get("canary") or {}).get("golden_max_tokens")
                         or DEFAULT_MAX_TOKENS)
    problems = input_problems(adapter, prompts, max_tokens)
    if not gateway:
        problems.append("no gateway address: set LORAPLANE_GATEWAY_GRPC or --gateway")
    ca_file = os.environ.get("LORAPLANE_GATEWAY_CA_FILE", "")
    ca: bytes | None = None
    if ca_file:
        try:
            ca = Path(ca_file).read_bytes()
        except OSError as exc:
            problems.append(f"LORAPLANE_GATEWAY_CA_FILE={ca_file}: {exc.strerror}")
    if problems:
        for p in problems:
            typer.echo(f"error: {p}", err=True)
        raise typer.Exit(2)
    assert gateway is not None
    ask, channel = _grpc_ask(gateway, _api_key(api_key), ca, timeout_s,
                             adapter.partition("/")[2])
    try:
        with channel:
            entries = record(adapter, prompts, max_tokens, ask)
        if rules is not None:
            merged = merge_into_rules(existing, adapter, entries, max_tokens)
            rules.write_text(yaml.safe_dump(merged, sort_keys=False, allow_unicode=True))
            typer.echo(f"wrote {len(entries)} golden answers of {adapter} to {rules} "
                       f"(golden_max_tokens {max_tokens})")
            return
    except GoldenError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except grpc.RpcError as err:
        typer.echo(f"error: the gateway refused: {err.code().name}: {err.details()}",
                   err=True)
        raise typer.Exit(1) from None
    snippet = {"canary": {"golden_max_tokens": max_tokens, "golden_sets": {adapter: entries}}}
    typer.echo(yaml.safe_dump(snippet, sort_keys=False, allow_unicode=True), nl=False)
