"""The public gRPC API: ``loraplane.v1.Inference/Generate`` (server streaming).

``adapter`` is an adapter name, or a base model: the alias ``"base"`` or its served name
(``loraplane/tiny-llama``); empty is INVALID_ARGUMENT naming ``adapter``.

Authentication: ``authorization: Bearer <api key>`` metadata. Errors are classified
:class:`~loraplane.shared.errors.LoraplaneError` subclasses, turned into status codes
(with ``retry-after-ms`` trailing metadata for retry hints) by the shared
interceptor of :func:`loraplane.shared.grpcutil.build_server`, which also adds
health checking and server reflection.

Besides ``resolved`` in the first message, the resolution travels back as trailing
metadata: ``x-loraplane-request-id``, ``x-loraplane-adapter-version``,
``x-loraplane-canary``, ``x-loraplane-tier``, ``x-loraplane-degraded``,
``x-loraplane-worker``. (Trailing, not initial: a separate initial-metadata send costs
an extra core operation per stream, about a tenth of a proxied stream's CPU, and the
first message already carries the same facts.) A caller may set ``x-request-id`` to
choose the request id.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from loraplane.gateway.budget import TIER_NAMES
from loraplane.gateway.models import served_base_models
from loraplane.gateway.names import route_base_model_name
from loraplane.gateway.request_path import Gateway
from loraplane.shared.grpcutil import GrpcServer, Service, bearer_token, build_server
from loraplane.v1 import inference_pb2, inference_pb2_grpc

SERVICE_NAME = "loraplane.v1.Inference"
"""Full name of the public service (health, reflection)."""
REQUEST_ID_METADATA = "x-request-id"
"""Metadata a caller may set to choose the request id."""

SERVER_OPTIONS = (
    ("grpc.max_concurrent_streams", 1000),
    ("grpc.so_reuseport", 0),
)
"""Options of the public server (``so_reuseport`` on with ``build_grpc_server(reuse_port=True)``)."""


def resolution_metadata(resolved: inference_pb2.ResolvedAdapter) -> tuple[tuple[str, str], ...]:
    """Response metadata (and HTTP headers) describing a resolution."""
    return (
        ("x-loraplane-request-id", resolved.request_id),
        ("x-loraplane-adapter-version", resolved.adapter.version),
        ("x-loraplane-canary", "true" if resolved.canary else "false"),
        ("x-loraplane-tier", TIER_NAMES.get(resolved.tier_at_arrival, "unspecified")),
        ("x-loraplane-degraded", "base-model" if resolved.degraded_to_base else "false"),
        ("x-loraplane-worker", resolved.worker_id),
    )


class InferenceServicer(inference_pb2_grpc.InferenceServicer):
    """``Inference`` over a :class:`~loraplane.gateway.request_path.Gateway`."""

    def __init__(self, gateway: Gateway) -> None:
        """Serve through ``gateway``."""
        self.gateway = gateway

    def Generate(
        self, request: inference_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        """Authenticate, then hand gRPC the gateway's own stream (no relaying generator of
        its own: each layer costs every message an extra ``asend``); the resolution goes into
        the trailing metadata at the first message. A refusal raises here, at the call,
        inside the shared interceptor's error mapping all the same."""
        metadata = context.invocation_metadata() or ()
        principal = self.gateway.authenticate(bearer_token(metadata))
        gw = self.gateway
        name = request.adapter
        # only a served base model's own name is rewritten: the served ones are worked out
        # (every worker's liveness, sorted) only for a name that can be one
        if name and (name == gw.default_base_model or gw.placement.names_base_model(name)):
            route_base_model_name(request,
                                  served_base_models(gw.placement, gw.default_base_model))
        request_id = None
        for key, value in metadata:
            if key == REQUEST_ID_METADATA and isinstance(value, str) and 0 < len(value) <= 128:
                request_id = value

        def on_first(msg: inference_pb2.GenerateResponse) -> None:
            context.set_trailing_metadata(resolution_metadata(msg.resolved))

        return self.gateway.generate(principal, request, request_id=request_id,
                                     timeout_s=context.time_remaining(), on_first=on_first)


def build_grpc_server(gateway: Gateway, *, port: int, host: str = "127.0.0.1",
                      credentials: grpc.ServerCredentials | None = None,
                      reuse_port: bool = False) -> GrpcServer:
    """The public gRPC server (not started): Inference + health + reflection; TLS with
    ``credentials`` (``shared.tls.edge_server_credentials``), else plaintext.
    ``reuse_port``: ``grpc.so_reuseport`` on, so several gateway processes serve one port
    (off by default: a port another process holds is an error, not shared)."""
    return build_server(
        [
            Service(
                inference_pb2_grpc.add_InferenceServicer_to_server,
                InferenceServicer(gateway),
                SERVICE_NAME,
            )
        ],
        port=port,
        host=host,
        options=[*(o for o in SERVER_OPTIONS if o[0] != "grpc.so_reuseport"),
                 ("grpc.so_reuseport", int(reuse_port))],
        credentials=credentials,
    )
