"""The generated gRPC stubs work with the pinned grpcio (in-process server on loopback)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from loraplane.v1 import (
    common_pb2,
    events_pb2,
    inference_pb2,
    worker_pb2,
    worker_pb2_grpc,
)


class _Worker(worker_pb2_grpc.WorkerInternalServicer):
    async def Generate(
        self, request: worker_pb2.WorkerGenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        yield inference_pb2.GenerateResponse(
            resolved=inference_pb2.ResolvedAdapter(
                adapter=request.adapter, tier_at_arrival=common_pb2.TIER_HOT
            )
        )
        for word in request.params.prompt.split():
            yield inference_pb2.GenerateResponse(text=word.upper())
        yield inference_pb2.GenerateResponse(
            finished=True,
            finish_reason="stop",
            usage=inference_pb2.Usage(prompt_tokens=3, output_tokens=2),
        )

    async def GetState(
        self, request: worker_pb2.GetStateRequest, context: grpc.aio.ServicerContext
    ) -> events_pb2.WorkerState:
        return events_pb2.WorkerState(worker_id="w1", seq=9)


async def test_worker_internal_round_trip() -> None:
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerInternalServicer_to_server(_Worker(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = worker_pb2_grpc.WorkerInternalStub(channel)
            state = await stub.GetState(worker_pb2.GetStateRequest(), timeout=5)
            assert (state.worker_id, state.seq) == ("w1", 9)

            ref = common_pb2.AdapterRef(tenant_id="acme", adapter_name="bot", version="v1")
            request = worker_pb2.WorkerGenerateRequest(
                request_id="r-1",
                adapter=ref,
                params=inference_pb2.GenerateRequest(adapter="bot", prompt="hi there"),
            )
            chunks = [c async for c in stub.Generate(request, timeout=5)]
    finally:
        await server.stop(None)

    assert chunks[0].resolved.adapter == ref
    assert [c.text for c in chunks[1:-1]] == ["HI", "THERE"]
    assert chunks[-1].finished and chunks[-1].usage.output_tokens == 2
