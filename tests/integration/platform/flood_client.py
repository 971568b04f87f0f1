"""A flooding tenant in its own process: the isolation tests' load (``test_isolation``).

``python flood_client.py TARGET STREAMS CLASS TOKENS`` (the tenant's API key on the first
line of stdin; ``LORAPLANE_GATEWAY_CA_FILE``, as ``loraplane generate`` reads it: TLS
trusting that CA, the server checked to be ``gateway``; empty or unset: plaintext): ``STREAMS`` loops, each sending one ``Generate`` of ``TOKENS`` tokens of
request class ``CLASS`` (an ``inference.RequestClass`` value) back to back, a refused
request retried after its ``retry-after-ms`` hint. Prints ``ready`` once every loop has
sent its first request; any further line on stdin (or its end) stops the loops, and the
outcomes are printed as one JSON object: ``latencies`` and ``durations`` (seconds) and
``refusals`` (``[status code name, details]``).

In its own process the flood's client work (64 streams, hundreds of refusals a second at
its quota) does not run on the event loop of the gateway and worker under test, as a real
tenant's clients never do; on that loop it delayed the quiet tenant's requests before they
reached the engine (p99 1,050 ms of a platinum p99 request, 2026-12-01).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time

import grpc

from loraplane.v1 import inference_pb2, inference_pb2_grpc
from tests.support.tls import GATEWAY_CA_ENV, tenant_channel_to


async def flood(target: str, key: str, streams: int, klass: int, tokens: int) -> dict[str, list]:
    latencies: list[float] = []
    durations: list[float] = []
    refusals: list[list[str]] = []
    stop = asyncio.Event()
    started = 0
    all_started = asyncio.Event()
    req = inference_pb2.GenerateRequest(
        adapter="base", prompt="Hello, how are you?", max_tokens=tokens, request_class=klass
    )  # type: ignore[arg-type]
    metadata = (("authorization", f"Bearer {key}"),)
    ca_file = os.environ.get(GATEWAY_CA_ENV, "")
    async with tenant_channel_to(target, ca_file) as channel:
        await asyncio.wait_for(channel.channel_ready(), 60)
        stub = inference_pb2_grpc.InferenceStub(channel)

        async def one() -> float:
            nonlocal started
            t0 = time.monotonic()
            call = stub.Generate(req, metadata=metadata, timeout=120)
            started += 1
            if started == streams:
                all_started.set()
            try:
                async for _ in call:
                    pass
            except grpc.aio.AioRpcError as err:
                durations.append(time.monotonic() - t0)
                refusals.append([err.code().name, err.details() or ""])
                retry = dict(err.trailing_metadata() or ()).get("retry-after-ms", "1000")
                return int(retry) / 1000.0
            latencies.append(time.monotonic() - t0)
            durations.append(latencies[-1])
            return 0.0

        async def loop() -> None:
            while not stop.is_set():
                retry = await one()
                if retry:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), retry)

        tasks = [asyncio.create_task(loop()) for _ in range(streams)]
        await all_started.wait()
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        stop.set()
        await asyncio.gather(*tasks)
    return {"latencies": latencies, "durations": durations, "refusals": refusals}


def main() -> None:
    target, streams, klass, tokens = sys.argv[1:5]
    key = sys.stdin.readline().strip()
    out = asyncio.run(flood(target, key, int(streams), int(klass), int(tokens)))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
