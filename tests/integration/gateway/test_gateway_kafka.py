"""The gateway on the real test stack's Kafka: views built from the topics (keys,
releases, worker placement), revocation within seconds, heat batches and prewarm
requests published, and views rebuilt by replay after a gateway restart."""

from __future__ import annotations

import time

import grpc

from loraplane.gateway.auth import key_hash
from loraplane.shared import topics
from loraplane.stack.stack import Stack
from loraplane.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from tests.support.echo_worker import EchoWorker, serve_echo_worker
from tests.support.tls import tenant_channel, tenant_http, tenant_url

from .conftest import eventually, gateway_app, publisher, read_topic, worker_tls
from .events import admitted, key_created, key_revoked, promoted, worker_state


async def test_views_from_kafka_revocation_heat_prewarm_and_replay(
    stack: Stack, unique: str
) -> None:
    tenant = f"t-{unique}"
    base = f"base-{unique}"
    secret = f"lp_{unique}_secret"
    worker = EchoWorker(worker_id=f"w-{unique}", base_models=(base,), hot={901})
    server = await serve_echo_worker(worker, tls=worker_tls(stack))
    try:
        async with publisher(stack) as pub:
            await pub.publish(topics.TENANT_EVENTS, key_created(tenant, f"k-{unique}",
                                                                key_hash(secret)))
            for version, eid in (("v1", 901), ("v2", 902)):
                await pub.publish(topics.ADAPTER_ADMISSIONS,
                                  admitted(tenant, "chat", version, eid, base))
            await pub.publish(topics.ADAPTER_LIFECYCLE, promoted(tenant, "chat", "v1", 901, base))
            await pub.publish(topics.CACHE_STATE, worker_state(worker, base))

            async with gateway_app(stack) as app:
                auth = (("authorization", f"Bearer {secret}"),)
                async with tenant_channel(stack, f"127.0.0.1:{app.grpc_port}") as ch:
                    stub = inference_pb2_grpc.InferenceStub(ch)

                    async def generate(adapter: str = "chat") -> list[inference_pb2.GenerateResponse]:
                        req = inference_pb2.GenerateRequest(adapter=adapter, prompt="hi",
                                                            max_tokens=2)
                        return [m async for m in stub.Generate(req, metadata=auth, timeout=10)]

                    async def works() -> bool:
                        try:
                            msgs = await generate()
                        except grpc.aio.AioRpcError:
                            return False
                        return msgs[0].resolved.adapter.version == "v1"

                    await eventually(works)
                    first = (await generate())[0].resolved
                    assert (first.worker_id, first.tier_at_arrival) == (worker.worker_id,
                                                                      common_pb2.TIER_HOT)

                    # the HTTP API answers from the same views
                    async with tenant_http(
                            stack, base_url=tenant_url(stack, app.http_port)) as http:
                        r = await http.get("/v1/models",
                                           headers={"authorization": f"Bearer {secret}"})
                        data = r.json()["data"]
                        assert [m["id"] for m in data if m["owned_by"] == tenant] == ["chat"]
                        assert base in {m["id"] for m in data if m["owned_by"] == "loraplane"}

                    # promote v2 (cold everywhere): interactive degrades and asks for a prewarm
                    await pub.publish(topics.ADAPTER_LIFECYCLE,
                                      promoted(tenant, "chat", "v2", 902, base))

                    async def on_v2() -> inference_pb2.ResolvedAdapter | None:
                        r = (await generate())[0].resolved
                        return r if r.adapter.version == "v2" else None

                    degraded = await eventually(on_v2)
                    assert degraded.degraded_to_base

                    prewarms = await read_topic(
                        stack, topics.ADAPTER_PREWARM,
                        lambda m: m.meta.adapter.tenant_id == tenant)
                    assert any(p.meta.adapter.version == "v2" and p.engine_id == 902
                               and p.reason == "cold_miss" for p in prewarms)

                    batches = await read_topic(
                        stack, topics.ADAPTER_HEAT, lambda m: m.meta.adapter.tenant_id == tenant)
                    items = [c for b in batches for c in b.completions]
                    assert {c.meta.adapter.version for c in items} >= {"v1", "v2"}
                    assert any(c.degraded_to_base for c in items)
                    assert all(b.source_id == app.settings.producer_id for b in batches)

                    # revocation reaches the gateway within seconds
                    await pub.publish(topics.TENANT_EVENTS, key_revoked(tenant, f"k-{unique}"))
                    t0 = time.monotonic()

                    async def refused() -> bool:
                        try:
                            await generate()
                        except grpc.aio.AioRpcError as err:
                            return err.code() == grpc.StatusCode.UNAUTHENTICATED
                        return False

                    await eventually(refused, timeout_s=5, every_s=0.05)
                    assert time.monotonic() - t0 < 5

            # a restarted gateway rebuilds its views by replaying the topics
            async with gateway_app(stack) as app2:
                secret2 = f"lp_{unique}_second"
                await pub.publish(topics.TENANT_EVENTS,
                                  key_created(tenant, f"k2-{unique}", key_hash(secret2)))
                assert app2.gateway.catalog.lookup(tenant, "chat").release.stable == "v2"
                w = app2.gateway.placement.worker(worker.worker_id)
                assert w is not None and w.address == worker.address
                async with tenant_channel(stack, f"127.0.0.1:{app2.grpc_port}") as ch:
                    stub = inference_pb2_grpc.InferenceStub(ch)
                    req = inference_pb2.GenerateRequest(adapter="chat", prompt="x", max_tokens=1)

                    async def status_with(key: str) -> grpc.StatusCode:
                        try:
                            async for _ in stub.Generate(
                                    req, metadata=(("authorization", f"Bearer {key}"),),
                                    timeout=10):
                                pass
                        except grpc.aio.AioRpcError as err:
                            return err.code()
                        return grpc.StatusCode.OK

                    async def new_key_ok() -> bool:
                        return await status_with(secret2) == grpc.StatusCode.OK

                    await eventually(new_key_ok)
                    assert await status_with(secret) == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await server.stop(0)


async def test_malformed_records_do_not_stop_the_views(stack: Stack, unique: str) -> None:
    from aiokafka import AIOKafkaProducer

    tenant = f"t-{unique}"
    producer = AIOKafkaProducer(bootstrap_servers=stack.settings.kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topics.TENANT_EVENTS, b"\xff\x00garbage", key=b"x",
                                     headers=[("x-proto-type", b"loraplane.v1.TenantEvent")])
        await producer.send_and_wait(topics.TENANT_EVENTS, b"nope", key=b"x")
    finally:
        await producer.stop()
    async with publisher(stack) as pub:
        await pub.publish(topics.TENANT_EVENTS, key_created(tenant, f"k-{unique}", key_hash("s")))
        async with gateway_app(stack) as app:
            async def known() -> bool:
                return tenant in app.gateway.auth.tenants

            await eventually(known)
            assert app.feeder is not None and app.feeder.malformed >= 1


