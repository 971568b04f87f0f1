"""``loraplane generate``: a tenant's call through the gateway (gRPC), streamed to stdout.

Connection and credentials come from the environment (``set -a; . .loraplane/demo.env``):
``LORAPLANE_GATEWAY_GRPC`` (host:port) and ``LORAPLANE_API_KEY`` (else
``LORAPLANE_DEMO_API_KEY``). The resolution (version, tier, worker, canary, degraded)
is printed to stderr, the generated text to stdout.
"""

from __future__ import annotations

import os
import sys

import grpc
import typer

from loraplane.gateway.budget import TIER_NAMES
from loraplane.gateway.grpc_api import REQUEST_ID_METADATA
from loraplane.shared.grpcutil import RETRY_AFTER_METADATA
from loraplane.v1 import common_pb2, inference_pb2, inference_pb2_grpc

CLASSES = {
    "interactive": common_pb2.REQUEST_CLASS_INTERACTIVE,
    "background": common_pb2.REQUEST_CLASS_BACKGROUND,
    "canary": common_pb2.REQUEST_CLASS_CANARY,
}


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
    )
    if temperature is not None:
        req.temperature = temperature
    if top_p is not None:
        req.top_p = top_p
    if seed is not None:
        req.seed = seed
    metadata = [("authorization", f"Bearer {_api_key(api_key)}")]
    if request_id:
        metadata.append((REQUEST_ID_METADATA, request_id))
    with grpc.insecure_channel(gateway) as channel:
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
                if msg.text:
                    sys.stdout.write(msg.text)
                    sys.stdout.flush()
                if msg.finished:
                    sys.stdout.write("\n")
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
