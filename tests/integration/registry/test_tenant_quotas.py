"""Tenant quotas in the registry (real PostgreSQL and broker): set, list, clear, bad input
with exact statuses, audit, and the TenantQuotaSet events the gateways apply."""

from __future__ import annotations

import json

import grpc

from loraplane.gateway.quotas import Quota, TenantPolicies
from loraplane.shared.topics import TENANT_EVENTS
from loraplane.v1 import registry_pb2
from tests.support.registry import Registry

Code = grpc.StatusCode
R = registry_pb2


async def test_set_list_clear_quotas_audited_and_published(registry: Registry,
                                                           unique: str) -> None:
    tid = await registry.tenant(unique)
    q = (await registry.call("SetTenantQuota", R.SetTenantQuotaRequest(
        tenant_id=tid, max_in_flight=24))).quota
    assert (q.tenant_id, q.adapter_name, q.max_in_flight, q.tokens_per_s) == (tid, "", 24, 0.0)
    await registry.call("SetTenantQuota", R.SetTenantQuotaRequest(
        tenant_id=tid, adapter_name="support", max_in_flight=4, tokens_per_s=500))
    await registry.call("SetTenantQuota", R.SetTenantQuotaRequest(
        tenant_id=tid, max_in_flight=16))  # changes the tenant-wide one in place
    listed = (await registry.call("ListTenantQuotas", R.ListTenantQuotasRequest(
        tenant_id=tid))).quotas
    assert [(x.adapter_name, x.max_in_flight, x.tokens_per_s) for x in listed] == [
        ("", 16, 0.0), ("support", 4, 500.0)]
    cleared = await registry.call("SetTenantQuota", R.SetTenantQuotaRequest(
        tenant_id=tid, adapter_name="support", clear=True))
    assert not cleared.HasField("quota")
    assert [x.adapter_name for x in (await registry.call("ListTenantQuotas",
            R.ListTenantQuotasRequest(tenant_id=tid))).quotas] == [""]

    audit = await registry.call("ListAudit", R.ListAuditRequest(subject_prefix=tid,
                                                                action="tenant.set_quota"))
    by_subject = [(e.subject, json.loads(e.after_json) if e.after_json else None)
                  for e in audit.entries]
    assert (f"{tid}/support", None) in by_subject
    assert (tid, {"max_in_flight": 16, "tokens_per_s": 0.0}) in by_subject

    # the gateways' view, fed by the same events, ends where the registry is
    events = await registry.read(TENANT_EVENTS, lambda evs: sum(
        1 for e in evs if e.tenant_quota_set.tenant_id == tid) >= 4)
    policies = TenantPolicies(Quota(max_in_flight=32))
    for key, e, _ in events:
        if e.tenant_quota_set.tenant_id == tid:
            assert key == tid.encode()
            policies.apply(e)
    assert policies.quotas_of(tid, "support") == [(tid, Quota(16, 0.0))]


async def test_bad_quotas_are_refused_naming_the_problem(registry: Registry,
                                                         unique: str) -> None:
    tid = await registry.tenant(unique)
    for req, code, words in (
        (R.SetTenantQuotaRequest(tenant_id=tid, max_in_flight=-1), Code.INVALID_ARGUMENT,
         "max_in_flight"),
        (R.SetTenantQuotaRequest(tenant_id=tid, tokens_per_s=float("nan")),
         Code.INVALID_ARGUMENT, "tokens_per_s"),
        (R.SetTenantQuotaRequest(tenant_id=tid, adapter_name="../x", max_in_flight=1),
         Code.INVALID_ARGUMENT, "adapter_name"),
        (R.SetTenantQuotaRequest(tenant_id=f"nobody-{unique}", max_in_flight=1),
         Code.NOT_FOUND, "does not exist"),
    ):
        try:
            await registry.call("SetTenantQuota", req)
        except grpc.aio.AioRpcError as err:
            assert err.code() == code and words in (err.details() or ""), (req, err.details())
        else:
            raise AssertionError(f"accepted {req}")
    assert await registry.status_of("ListTenantQuotas", R.ListTenantQuotasRequest(
        tenant_id=f"nobody-{unique}")) == Code.NOT_FOUND
