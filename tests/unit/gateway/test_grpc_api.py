"""The public gRPC API on a real server: auth metadata, status codes with retry hints,
resolution metadata, health checking and reflection."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from loraplane.gateway.budget import BudgetConfig
from loraplane.v1 import common_pb2, inference_pb2

from . import events as ev
from .harness import ACME_KEY, GLOBEX_KEY, harness


def bearer(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


async def call(stub, adapter: str, md, **kw):  # type: ignore[no-untyped-def]
    c = stub.Generate(inference_pb2.GenerateRequest(adapter=adapter, prompt="hi", max_tokens=2,
                                                    **kw), metadata=md, timeout=10)
    msgs = [m async for m in c]
    return c, msgs


async def status_of(stub, adapter: str, md, **kw) -> tuple[grpc.StatusCode, object]:  # type: ignore[no-untyped-def]
    try:
        await call(stub, adapter, md, **kw)
    except grpc.aio.AioRpcError as err:
        return err.code(), err
    return grpc.StatusCode.OK, None


async def test_generate_returns_resolution_in_metadata_and_first_message() -> None:
    async with harness(grpc_server=True) as h:
        h.workers["w0"].hot.add(11)
        h.report("w0")
        stub = h.stub()
        c, msgs = await call(stub, "support", bearer(ACME_KEY) + (("x-request-id", "abc"),))
        md = dict(await c.trailing_metadata())
        assert md["x-loraplane-adapter-version"] == "v1"
        assert md["x-loraplane-request-id"] == "abc"
        assert md["x-loraplane-tier"] == "hot" and md["x-loraplane-degraded"] == "false"
        assert md["x-loraplane-worker"] == "w0" and md["x-loraplane-canary"] == "false"
        assert msgs[0].resolved.adapter.version == "v1" and msgs[-1].finished
        assert await c.code() == grpc.StatusCode.OK


async def test_status_codes() -> None:
    budgets = BudgetConfig.model_validate(
        {"overrides": {"acme/code": {"interactive": {"on_cold": "fail_fast"}}}})
    async with harness(grpc_server=True, budgets=budgets) as h:
        stub = h.stub()
        acme = bearer(ACME_KEY)
        assert (await status_of(stub, "support", ()))[0] == grpc.StatusCode.UNAUTHENTICATED
        assert (await status_of(stub, "support", bearer("nope")))[0] == (
            grpc.StatusCode.UNAUTHENTICATED)
        assert (await status_of(stub, "legal", acme))[0] == grpc.StatusCode.PERMISSION_DENIED
        assert (await status_of(stub, "missing", acme))[0] == grpc.StatusCode.NOT_FOUND
        for bad in ("../legal", "s3://bucket/x", "file:x", "acme/support"):
            assert (await status_of(stub, bad, acme))[0] == grpc.StatusCode.INVALID_ARGUMENT
        code, err = await status_of(stub, "code", acme)
        assert code == grpc.StatusCode.UNAVAILABLE
        trailing = dict(err.trailing_metadata())  # type: ignore[attr-defined]
        assert int(trailing["retry-after-ms"]) >= 1000
        # revoked key stops working at once once the event is applied
        h.gateway.auth.apply(ev.key_revoked("globex", "kg"))
        assert (await status_of(stub, "legal", bearer(GLOBEX_KEY)))[0] == (
            grpc.StatusCode.UNAUTHENTICATED)


async def test_background_request_over_budget_is_resource_exhausted() -> None:
    budgets = BudgetConfig.model_validate({"background": {"budget_ms": 50, "on_cold": "wait"}})
    async with harness(grpc_server=True, budgets=budgets, n_workers=1,
                       max_cold_loads_per_worker=1) as h:
        h.gateway.local.start_load("w0", 99)  # the only slot is taken by another load
        code, err = await status_of(h.stub(), "support", bearer(ACME_KEY),
                                    request_class=common_pb2.REQUEST_CLASS_BACKGROUND)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "retry-after-ms" in dict(err.trailing_metadata())  # type: ignore[attr-defined]


async def test_health_and_reflection() -> None:
    async with harness(grpc_server=True) as h:
        assert h.server is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{h.server.port}") as ch:
            health = health_pb2_grpc.HealthStub(ch)
            resp = await health.Check(health_pb2.HealthCheckRequest(
                service="loraplane.v1.Inference"), timeout=5)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
            refl = reflection_pb2_grpc.ServerReflectionStub(ch)
            call = refl.ServerReflectionInfo(timeout=5)
            await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
            answer = await call.read()
            await call.done_writing()
            names = {s.name for s in answer.list_services_response.service}
            assert "loraplane.v1.Inference" in names


async def test_an_empty_adapter_is_invalid_argument_naming_the_field() -> None:
    async with harness(grpc_server=True) as h:
        code, err = await status_of(h.stub(), "", bearer(ACME_KEY))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "adapter is required" in err.details()  # type: ignore[attr-defined]
        assert not any(w.requests for w in h.workers.values())


async def test_the_base_model_is_callable_by_its_served_name_and_the_alias() -> None:
    async with harness(grpc_server=True) as h:
        # an adapter of the same name never shadows the base model
        h.gateway.catalog.apply_admission(ev.admitted("acme", "tiny", "t1", 41))
        h.gateway.catalog.apply_lifecycle(ev.promoted("acme", "tiny", "t1", 41, at=1.0))
        stub, acme = h.stub(), bearer(ACME_KEY)
        for name in ("tiny", "base"):
            _, msgs = await call(stub, name, acme)
            r = msgs[0].resolved.adapter
            assert (r.adapter_name, r.version, r.base_model) == ("", "", "tiny"), name
        sent = [x for w in h.workers.values() for x in w.requests]
        assert len(sent) == 2 and all(x.use_base and x.engine_id == 0 for x in sent)
        code, err = await status_of(stub, "tiny", acme, base_model="other")
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "base_model" in err.details()  # type: ignore[attr-defined]
