"""Quotas and flow control through the gateway's request path (echo workers, HTTP API):
429 + Retry-After naming the quota, quotas from tenant.events, the tenant's tier carried
to the worker, the admission limit queueing above it in band order."""

from __future__ import annotations

import asyncio

import httpx

from loraplane.gateway.flow import FlowConfig
from loraplane.gateway.http_api import create_app
from loraplane.v1 import common_pb2, events_pb2

from .harness import ACME_KEY, GLOBEX_KEY, harness

ACME = {"authorization": f"Bearer {ACME_KEY}"}
GLOBEX = {"authorization": f"Bearer {GLOBEX_KEY}"}


def _tenant(tenant: str, priority: int) -> events_pb2.TenantEvent:
    ev = events_pb2.TenantEvent()
    ev.tenant_upserted.CopyFrom(events_pb2.TenantUpserted(tenant_id=tenant,
                                                          default_priority=priority))
    return ev


def _quota(tenant: str, adapter: str = "", **kw: object) -> events_pb2.TenantEvent:
    ev = events_pb2.TenantEvent()
    ev.tenant_quota_set.CopyFrom(events_pb2.TenantQuotaSet(tenant_id=tenant,
                                                           adapter_name=adapter, **kw))
    return ev


async def test_quota_refusal_is_429_with_retry_after_naming_the_quota() -> None:
    async with harness() as h:
        h.workers["w0"].hot.add(31)
        h.workers["w1"].hot.add(31)
        for w in ("w0", "w1"):
            h.workers[w].token_delay_s = 0.2
            h.report(w)
        assert h.gateway.quotas is not None
        h.gateway.quotas.policies.apply(_quota("globex", max_in_flight=1))
        transport = httpx.ASGITransport(app=create_app(h.gateway))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            body = {"model": "legal", "prompt": "hi", "max_tokens": 3}
            first = asyncio.create_task(c.post("/v1/completions", headers=GLOBEX, json=body))
            await asyncio.sleep(0.1)
            r = await c.post("/v1/completions", headers=GLOBEX, json=body)
            assert r.status_code == 429, r.text
            assert r.headers["Retry-After"] == "1"
            err = r.json()["error"]
            assert err["code"] == "quota_exceeded" and err["type"] == "rate_limit_error"
            assert "tenant globex is over its max_in_flight quota (1 requests in flight)" in (
                err["message"])
            assert (await first).status_code == 200  # the one within the quota is served
            r = await c.post("/v1/completions", headers=GLOBEX, json=body)
            assert r.status_code == 200  # its slot came back
        assert h.metric("loraplane_gateway_quota_refused_total",
                        {"tenant": "globex", "quota": "max_in_flight"}) == 1


async def test_tier_travels_to_the_worker_and_orders_the_queue_above_the_limit() -> None:
    # one worker, two slots for this gateway: background may take none of the reserves
    flow = FlowConfig(max_in_flight_per_worker=3, platinum_reserve=1, interactive_reserve=1)
    async with harness(n_workers=1, flow=flow) as h:
        w = h.workers["w0"]
        w.hot.update({11, 31})
        w.token_delay_s = 0.05
        h.report("w0")
        h.gateway.quotas.policies.apply(_tenant("acme", common_pb2.PRIORITY_GOLD))  # type: ignore[union-attr]
        h.gateway.quotas.policies.apply(_tenant("globex", common_pb2.PRIORITY_SILVER))  # type: ignore[union-attr]
        transport = httpx.ASGITransport(app=create_app(h.gateway))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            def post(headers: dict[str, str], model: str, klass: str) -> object:
                return c.post("/v1/completions", headers={**headers, "x-loraplane-request-class":
                                                          klass},
                              json={"model": model, "prompt": "hi", "max_tokens": 4})

            bg = [asyncio.create_task(post(GLOBEX, "legal", "background")) for _ in range(4)]
            await asyncio.sleep(0.02)
            flow_ctl = h.gateway.flow
            assert flow_ctl is not None
            assert flow_ctl.in_flight("w0") == 1 and flow_ctl.waiting("w0") == 3
            acme = await post(ACME, "support", "interactive")  # passes the 3 waiting ones
            assert acme.status_code == 200  # type: ignore[attr-defined]
            assert flow_ctl.waiting("w0") >= 2
            for t in bg:
                assert (await t).status_code == 200
        prios = {(r.adapter.tenant_id, r.priority) for r in w.requests}
        assert prios == {("acme", common_pb2.PRIORITY_GOLD),
                         ("globex", common_pb2.PRIORITY_SILVER)}
        waited = h.metric("loraplane_gateway_queue_wait_seconds_count",
                          {"tenant": "globex", "class": "background"})
        assert waited == 4



async def test_the_slot_is_free_when_the_client_has_the_last_message() -> None:
    # A client sending its next request the moment it read the last one must find the slot
    # free: the permit is given back before the finished message is handed on, not when
    # the request's generator resumes after the client read it.
    from loraplane.gateway.auth import Principal
    from loraplane.v1 import inference_pb2

    flow = FlowConfig(max_in_flight_per_worker=1, platinum_reserve=0, interactive_reserve=0)
    async with harness(n_workers=1, flow=flow) as h:
        h.workers["w0"].hot.add(11)
        h.report("w0")
        flow_ctl = h.gateway.flow
        assert flow_ctl is not None
        req = inference_pb2.GenerateRequest(adapter="support", prompt="hi", max_tokens=3,
                                            request_class=common_pb2.REQUEST_CLASS_INTERACTIVE)
        stream = h.gateway.generate(Principal("acme", "ka"), req)
        seen = 0
        async for msg in stream:
            seen += 1
            if msg.finished:
                assert flow_ctl.in_flight("w0") == 0  # before the generator resumes
            else:
                assert flow_ctl.in_flight("w0") == 1
        assert seen >= 2
