"""Golden-set shadow requests: exercise a canary on a worker before real traffic meets it.

When a canary version becomes HOT on a worker and ``canary.golden_set`` is
configured, the service sends each prompt through the worker's
``WorkerInternal.Generate`` with request class CANARY (shadow traffic, never shown to
anyone). A prompt fails when its request fails or, for an entry with ``expect``, when the
greedy answer differs from the one the adapter's golden set was recorded with
(:func:`judge_answer`): a version that loads and serves, but answers as another model
would (wrong checkpoint, different weights), fails after load without any request
failing. Beyond ``golden_max_failures`` failures the canary is demoted on that worker and
blocked there, so traffic is not sent to a broken canary; the analysis aborts it
(``golden_set_failed``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Protocol

import grpc

from loraplane.cache_manager.model import VersionRecord
from loraplane.cache_manager.rules import GoldenPrompt
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
        self, address: str, record: VersionRecord, prompts: list[GoldenPrompt], *,
        max_tokens: int, timeout_s: float,
    ) -> ShadowResult:
        """Run every prompt against ``record`` on the worker at ``address``."""


def judge_answer(golden: GoldenPrompt, answer: str) -> str:
    """Why ``answer`` fails ``golden`` ("" when it passes): an entry with ``expect`` needs
    exactly that greedy answer; one without only needs the request to complete."""
    if golden.expect is None or answer == golden.expect:
        return ""
    return (f"answer to {golden.prompt[:40]!r} diverges from the golden expectation: "
            f"got {answer[:60]!r}, expected {golden.expect[:60]!r}")


class GrpcShadowRunner:
    """:class:`ShadowRunner` over ``WorkerInternal.Generate`` (mutual TLS when ``tls``
    is set)."""

    def __init__(self, tls: TlsFiles | None = None) -> None:
        self.tls = tls

    async def run(
        self, address: str, record: VersionRecord, prompts: list[GoldenPrompt], *,
        max_tokens: int, timeout_s: float,
    ) -> ShadowResult:
        ok = failed = 0
        errors: list[str] = []
        async with secure_or_insecure_aio_channel(address, self.tls, server=WORKER) as channel:
            stub = worker_pb2_grpc.WorkerInternalStub(channel)
            for golden in prompts:
                req = worker_pb2.WorkerGenerateRequest(
                    request_id=f"shadow-{uuid.uuid4()}",
                    adapter=record.ref.proto(),
                    engine_id=record.engine_id,
                    sha256=record.sha256,
                    params=inference_pb2.GenerateRequest(
                        prompt=golden.prompt, max_tokens=max_tokens, temperature=0.0,
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
                    text: list[str] = []
                    async for resp in stub.Generate(req, timeout=timeout_s):
                        finished = finished or resp.finished
                        text.append(resp.text)
                    if not finished:
                        raise RuntimeError("stream ended before a finished message")
                    wrong = judge_answer(golden, "".join(text))
                    if wrong:
                        raise RuntimeError(wrong)
                    ok += 1
                except (grpc.aio.AioRpcError, RuntimeError) as exc:
                    failed += 1
                    code = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else ""
                    errors.append(f"{code} {exc}".strip()[:200])
        return ShadowResult(ok, failed, tuple(errors))
