"""``loraplane generate``: a tenant's call through the gateway (gRPC), streamed to stdout.

Connection and credentials come from the environment (``set -a; . .loraplane/demo.env``):
``LORAPLANE_GATEWAY_GRPC`` (host:port), ``LORAPLANE_API_KEY`` (else
``LORAPLANE_DEMO_API_KEY``) and, when the gateway serves TLS, ``LORAPLANE_GATEWAY_CA_FILE``
(the CA bundle to trust: the stack's dev CA). The resolution (version, tier, worker, canary, degraded)
is printed to stderr, the generated text to stdout: with ``--n`` > 1 each choice on its
own line as ``[index] text``; with ``--logprobs K`` every token's log probability and its
top K alternatives go to stderr.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import grpc
import typer

from loraplane.gateway.budget import TIER_NAMES
from loraplane.gateway.grpc_api import REQUEST_ID_METADATA
from loraplane.shared.grpcutil import RETRY_AFTER_METADATA
from loraplane.shared.tls import edge_channel
from loraplane.v1 import common_pb2, inference_pb2, inference_pb2_grpc

CLASSES = {
    "interactive": common_pb2.REQUEST_CLASS_INTERACTIVE,
    "background": common_pb2.REQUEST_CLASS_BACKGROUND,
    "canary": common_pb2.REQUEST_CLASS_CANARY,
}

STOP_OPTION = typer.Option(None, "--stop", help="stop string (repeatable)")
LOGIT_BIAS_OPTION = typer.Option(None, "--logit-bias", help="TOKEN_ID=BIAS (repeatable)")


def _api_key(explicit: str | None) -> str:
    key = explicit or os.environ.get("LORAPLANE_API_KEY") or os.environ.get(
        "LORAPLANE_DEMO_API_KEY"
    )
    if not key:
        typer.echo("error: no API key: set LORAPLANE_API_KEY (or LORAPLANE_DEMO_API_KEY)",
                   err=True)
        raise typer.Exit(2)
    return key


def generate(
    adapter: str = typer.Option(..., "--adapter", "-a", help="adapter ('base' = base model)"),
    prompt: str = typer.Option(..., "--prompt", "-p", help="prompt text"),
    max_tokens: int = typer.Option(32, "--max-tokens", help="tokens to generate"),
    temperature: float | None = typer.Option(None, "--temperature", help="0 = greedy"),
    top_p: float | None = typer.Option(None, "--top-p"),
    seed: int | None = typer.Option(None, "--seed"),
    request_class: str = typer.Option("interactive", "--class",
                                      help="interactive | background | canary"),
    request_key: str = typer.Option("", "--key", help="sticky canary key (user/session id)"),
    base_model: str = typer.Option("", "--base-model"),
    n: int = typer.Option(1, "--n", help="choices (n > 1 needs --temperature > 0)"),
    logprobs: int | None = typer.Option(None, "--logprobs",
                                        help="log probability of each token and its top k"),
    echo: bool = typer.Option(False, "--echo", help="each choice starts with the prompt"),
    stop: list[str] | None = STOP_OPTION,
    presence_penalty: float | None = typer.Option(None, "--presence-penalty"),
    frequency_penalty: float | None = typer.Option(None, "--frequency-penalty"),
    logit_bias: list[str] | None = LOGIT_BIAS_OPTION,
    gateway: str | None = typer.Option(None, "--gateway", envvar="LORAPLANE_GATEWAY_GRPC",
                                       help="gateway host:port"),
    api_key: str | None = typer.Option(None, "--api-key", help="default: $LORAPLANE_API_KEY"),
    request_id: str = typer.Option("", "--request-id"),
    timeout_s: float = typer.Option(120.0, "--timeout"),
) -> None:
    """Generate text with one of your adapters through the gateway."""
    if request_class not in CLASSES:
        typer.echo(f"error: --class must be one of {sorted(CLASSES)}", err=True)
        raise typer.Exit(2)
    if not gateway:
        typer.echo("error: no gateway address: set LORAPLANE_GATEWAY_GRPC", err=True)
        raise typer.Exit(2)
    req = inference_pb2.GenerateRequest(
        adapter=adapter, prompt=prompt, max_tokens=max_tokens,
        request_class=CLASSES[request_class], request_key=request_key, base_model=base_model,
        n=n, echo=echo, stop=stop or [],
    )
    for name, value in (("temperature", temperature), ("top_p", top_p), ("seed", seed),
                        ("logprobs", logprobs), ("presence_penalty", presence_penalty),
                        ("frequency_penalty", frequency_penalty)):
        if value is not None:
            setattr(req, name, value)
    for item in logit_bias or []:
        token, _, bias = item.partition("=")
        try:
            req.logit_bias[int(token)] = float(bias)
        except ValueError:
            typer.echo(f"error: --logit-bias {item!r} is not TOKEN_ID=BIAS", err=True)
            raise typer.Exit(2) from None
    texts: dict[int, list[str]] = {}
    metadata = [("authorization", f"Bearer {_api_key(api_key)}")]
    if request_id:
        metadata.append((REQUEST_ID_METADATA, request_id))
    ca_file = os.environ.get("LORAPLANE_GATEWAY_CA_FILE", "")
    try:
        channel = edge_channel(gateway, Path(ca_file).read_bytes() if ca_file else None)
    except OSError as exc:
        typer.echo(f"error: LORAPLANE_GATEWAY_CA_FILE={ca_file}: {exc.strerror}", err=True)
        raise typer.Exit(2) from None
    with channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        try:
            for msg in stub.Generate(req, metadata=metadata, timeout=timeout_s):
                if msg.HasField("resolved"):
                    r = msg.resolved
                    name = r.adapter.adapter_name or "base model"
                    typer.echo(
                        f"[{r.adapter.tenant_id}/{name}@{r.adapter.version or r.adapter.base_model}"
                        f" tier={TIER_NAMES.get(r.tier_at_arrival, '?')} worker={r.worker_id}"
                        f" canary={'yes' if r.canary else 'no'}"
                        f"{' DEGRADED to base model' if r.degraded_to_base else ''}"
                        f" request={r.request_id}]",
                        err=True,
                    )
                if n > 1:  # choices interleave: printed whole, one by one, at the end
                    texts.setdefault(msg.index, []).append(msg.text)
                elif msg.text:
                    sys.stdout.write(msg.text)
                    sys.stdout.flush()
                for lp in msg.logprobs:
                    top = " ".join(f"{t.token!r}:{t.logprob:.3f}" for t in lp.top)
                    typer.echo(f"[logprob choice={msg.index} {lp.token!r} {lp.logprob:.3f}"
                               f"{' top ' + top if top else ''}]", err=True)
                if msg.finish_reason and n > 1:
                    typer.echo(f"[choice {msg.index}: {msg.finish_reason}]", err=True)
                if msg.finished:
                    for index in sorted(texts):
                        sys.stdout.write(f"[{index}] {''.join(texts[index])}\n")
                    sys.stdout.write("\n" if n == 1 else "")
                    u = msg.usage
                    typer.echo(
                        f"[{msg.finish_reason}; {u.prompt_tokens} prompt + {u.output_tokens} "
                        f"output tokens; ttft {u.ttft_ms:.0f} ms; total {u.duration_ms:.0f} ms]",
                        err=True,
                    )
        except grpc.RpcError as err:
            code = err.code()
            hint = ""
            for key, value in err.trailing_metadata() or ():
                if key == RETRY_AFTER_METADATA:
                    hint = f" (retry after {int(value) / 1000:.0f}s)"
            typer.echo(f"error: {code.name}: {err.details()}{hint}", err=True)
            raise typer.Exit(1) from None
