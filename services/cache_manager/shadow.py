"""Golden-set shadow requests: exercise a canary on a worker before real traffic meets it.

When a canary version becomes HOT on a worker and ``canary.golden_set`` is
configured, the service sends each prompt through the worker's
``WorkerInternal.Generate`` with request class CANARY (shadow traffic: the
answers are only checked to complete, never shown to anyone). Beyond
``golden_max_failures`` failures the canary is demoted on that worker and
blocked there, so traffic is not sent to a broken canary.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Protocol

import grpc

from loraplane.cache_manager.model import VersionRecord
from loraplane.shared.tls import WORKER, TlsFiles, secure_or_insecure_aio_channel
from loraplane.v1 import common_pb2, inference_pb2, worker_pb2, worker_pb2_grpc


@dataclass(frozen=True, slots=True)
class ShadowResult:
    """Outcome of the golden set on one worker."""

    ok: int
    failed: int
    errors: tuple[str, ...] = ()


class ShadowRunner(Protocol):
    """Sends the golden set to one worker."""

    async def run(
        self, address: str, record: VersionRecord, prompts: list[str], *, max_tokens: int,
        timeout_s: float,
    ) -> ShadowResult:
        """Run every prompt against ``record`` on the worker at ``address``."""


class GrpcShadowRunner:
    """:class:`ShadowRunner` over ``WorkerInternal.Generate`` (mutual TLS when ``tls``
    is set)."""

    def __init__(self, tls: TlsFiles | None = None) -> None:
        self.tls = tls

    async def run(
        self, address: str, record: VersionRecord, prompts: list[str], *, max_tokens: int,
        timeout_s: float,
    ) -> ShadowResult:
        ok = failed = 0
        errors: list[str] = []
        async with secure_or_insecure_aio_channel(address, self.tls, server=WORKER) as channel:
            stub = worker_pb2_grpc.WorkerInternalStub(channel)
            for prompt in prompts:
                req = worker_pb2.WorkerGenerateRequest(
                    request_id=f"shadow-{uuid.uuid4()}",
                    adapter=record.ref.proto(),
                    engine_id=record.engine_id,
                    sha256=record.sha256,
                    params=inference_pb2.GenerateRequest(
                        prompt=prompt, max_tokens=max_tokens, temperature=0.0,
                        request_class=common_pb2.REQUEST_CLASS_CANARY,
                        base_model=record.ref.base_model,
                    ),
                    request_class=common_pb2.REQUEST_CLASS_CANARY,
                    artifact_uri=record.artifact_uri,
                    rank=record.rank,
                    size_bytes=record.size_bytes,
                    base_model=record.ref.base_model,
                )
                try:
                    finished = False
                    async for resp in stub.Generate(req, timeout=timeout_s):
                        finished = finished or resp.finished
                    if not finished:
                        raise RuntimeError("stream ended before a finished message")
                    ok += 1
                except (grpc.aio.AioRpcError, RuntimeError) as exc:
                    failed += 1
                    code = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else ""
                    errors.append(f"{code} {exc}".strip()[:200])
        return ShadowResult(ok, failed, tuple(errors))
