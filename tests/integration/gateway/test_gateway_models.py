"""Model names on the running gateway (views fed by the test stack's Kafka, an echo worker):
the base model by its served name (with a ``/``) on HTTP and gRPC, ``/v1/models`` and
``GET /v1/models/{id}`` with the versions each model resolves to, and a missing or empty
model refused naming the field instead of being served by the base model."""

from __future__ import annotations

import grpc

from loraplane.gateway.auth import key_hash
from loraplane.shared import topics
from loraplane.stack.stack import Stack
from loraplane.v1 import inference_pb2, inference_pb2_grpc
from tests.support.echo_worker import EchoWorker, serve_echo_worker
from tests.support.tls import tenant_channel, tenant_http, tenant_url

from .conftest import eventually, gateway_app, publisher, worker_tls
from .events import admitted, key_created, promoted, worker_state


async def test_base_model_by_served_name_models_and_empty_model(
    stack: Stack, unique: str
) -> None:
    tenant = f"t-{unique}"
    base = f"org-{unique}/tiny"  # a served name is "org/name", as vLLM serves it
    secret = f"lp_{unique}_secret"
    worker = EchoWorker(worker_id=f"w-{unique}", base_models=(base,), hot={911})
    server = await serve_echo_worker(worker, tls=worker_tls(stack))
    try:
        async with publisher(stack) as pub:
            await pub.publish(topics.TENANT_EVENTS, key_created(tenant, f"k-{unique}",
                                                                key_hash(secret)))
            await pub.publish(topics.ADAPTER_ADMISSIONS, admitted(tenant, "chat", "v1", 911, base))
            await pub.publish(topics.ADAPTER_LIFECYCLE, promoted(tenant, "chat", "v1", 911, base))
            await pub.publish(topics.CACHE_STATE, worker_state(worker, base))
            async with gateway_app(stack) as app:
                auth = {"authorization": f"Bearer {secret}"}
                async with tenant_http(stack, base_url=tenant_url(stack, app.http_port),
                                       headers=auth, timeout=10) as http:

                    async def listed() -> dict[str, dict[str, object]] | None:
                        r = await http.get("/v1/models")
                        data = {m["id"]: m for m in r.json()["data"]}
                        return data if {base, "chat"} <= data.keys() else None

                    models = await eventually(listed)
                    assert models[base]["owned_by"] == "loraplane"
                    assert models[base]["versions"] == [
                        {"version": base, "role": "base", "percent": 100}]
                    assert models["chat"]["owned_by"] == tenant
                    assert models["chat"]["versions"] == [
                        {"version": "v1", "role": "stable", "percent": 100}]

                    one = await http.get(f"/v1/models/{base}")
                    assert one.status_code == 200 and one.json()["id"] == base
                    assert (await http.get("/v1/models/chat")).json()["parent"] == base
                    missing = await http.get(f"/v1/models/org-{unique}/nope")
                    assert missing.status_code == 404
                    assert missing.json()["error"]["type"] == "not_found_error"

                    r = await http.post("/v1/completions",
                                        json={"model": base, "prompt": "hi", "max_tokens": 2})
                    assert r.status_code == 200, r.text
                    body = r.json()
                    assert body["model"] == base and body["choices"][0]["text"]
                    assert (body["loraplane"]["adapter"], body["loraplane"]["base_model"]) == (
                        "", base)
                    assert r.headers["x-loraplane-worker"] == worker.worker_id

                    served = len(worker.requests)
                    for bad in ({"model": "", "prompt": "hi"}, {"prompt": "hi"}):
                        r = await http.post("/v1/completions", json=bad)
                        assert r.status_code == 400, r.text
                        err = r.json()["error"]
                        assert err["type"] == "invalid_request_error" and "model" in err["message"]
                    assert len(worker.requests) == served  # nothing reached a worker

                md = (("authorization", f"Bearer {secret}"),)
                async with tenant_channel(stack, f"127.0.0.1:{app.grpc_port}") as ch:
                    stub = inference_pb2_grpc.InferenceStub(ch)

                    async def generate(adapter: str) -> list[inference_pb2.GenerateResponse]:
                        req = inference_pb2.GenerateRequest(adapter=adapter, prompt="hi",
                                                            max_tokens=2)
                        return [m async for m in stub.Generate(req, metadata=md, timeout=10)]

                    first = (await generate(base))[0].resolved
                    assert (first.adapter.adapter_name, first.adapter.base_model) == ("", base)
                    try:
                        await generate("")
                    except grpc.aio.AioRpcError as err:
                        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
                        assert "adapter is required" in (err.details() or "")
                    else:
                        raise AssertionError("an empty adapter was served")
                    assert len(worker.requests) == served + 1
    finally:
        await server.stop(0)
