"""Tenant quotas at the gateway (pure, clock passed in) and the view fed by tenant.events."""

from __future__ import annotations

import pytest

from loraplane.gateway.quotas import Quota, QuotaBook, QuotaExceeded, TenantPolicies
from loraplane.v1 import common_pb2, events_pb2


def _quota_event(tenant: str, adapter: str = "", *, max_in_flight: int = 0,
                 tokens_per_s: float = 0.0, cleared: bool = False) -> events_pb2.TenantEvent:
    ev = events_pb2.TenantEvent()
    ev.tenant_quota_set.CopyFrom(events_pb2.TenantQuotaSet(
        tenant_id=tenant, adapter_name=adapter, max_in_flight=max_in_flight,
        tokens_per_s=tokens_per_s, cleared=cleared))
    return ev


def test_default_in_flight_quota_refuses_with_the_quota_named() -> None:
    book = QuotaBook(TenantPolicies(Quota(max_in_flight=2)))
    leases = [book.acquire("globex", "support", 64, 0.0) for _ in range(2)]
    with pytest.raises(QuotaExceeded) as e:
        book.acquire("globex", "support", 64, 0.0)
    assert e.value.quota == "max_in_flight" and e.value.http_status == 429
    assert "tenant globex is over its max_in_flight quota (2 requests in flight)" in e.value.message
    assert e.value.retry_after_s == 1.0
    book.acquire("acme", "support", 64, 0.0)  # other tenants are not affected
    book.release(leases[0], 64, 0.1)
    book.release(leases[0], 64, 0.1)  # idempotent
    book.acquire("globex", "support", 64, 0.1)
    assert book.in_flight("globex") == 2


def test_tokens_per_s_bucket_refills_and_refunds_unused() -> None:
    policies = TenantPolicies(Quota())
    policies.apply(_quota_event("globex", tokens_per_s=100))
    book = QuotaBook(policies, burst_s=2.0)  # capacity 200 tokens
    a = book.acquire("globex", "", 100, 0.0)
    book.acquire("globex", "", 100, 0.0)
    with pytest.raises(QuotaExceeded, match=r"tokens_per_s quota \(100 output tokens/s; this "
                                            r"request may take 64\); retry in 1 s") as e:
        book.acquire("globex", "", 64, 0.0)
    assert e.value.quota == "tokens_per_s"
    book.release(a, used_tokens=36, now=0.0)  # 64 unused tokens come back
    book.acquire("globex", "", 64, 0.0)
    with pytest.raises(QuotaExceeded):
        book.acquire("globex", "", 50, 0.0)
    book.acquire("globex", "", 50, 0.5)  # 0.5 s refills 50 tokens


def test_a_request_larger_than_the_burst_is_not_refused_forever() -> None:
    policies = TenantPolicies(Quota(tokens_per_s=10))
    book = QuotaBook(policies, burst_s=1.0)
    book.acquire("t", "", 500, 0.0)  # capacity is at least one request's max_tokens
    with pytest.raises(QuotaExceeded, match="retry in 50 s"):
        book.acquire("t", "", 500, 0.0)
    book.acquire("t", "", 500, 50.0)


def test_adapter_quota_counts_beside_the_tenant_one_and_clears() -> None:
    policies = TenantPolicies(Quota(max_in_flight=10))
    policies.apply(_quota_event("acme", "support", max_in_flight=1))
    book = QuotaBook(policies)
    book.acquire("acme", "support", 8, 0.0)
    with pytest.raises(QuotaExceeded, match="adapter acme/support is over its max_in_flight"):
        book.acquire("acme", "support", 8, 0.0)
    book.acquire("acme", "other", 8, 0.0)  # another adapter only counts against the tenant
    assert book.in_flight("acme") == 2
    policies.apply(_quota_event("acme", "support", cleared=True))
    book.acquire("acme", "support", 8, 0.0)


def test_refused_request_counts_nothing() -> None:
    policies = TenantPolicies(Quota(max_in_flight=5))
    policies.apply(_quota_event("acme", "support", max_in_flight=1))
    book = QuotaBook(policies)
    book.acquire("acme", "support", 8, 0.0)
    with pytest.raises(QuotaExceeded):
        book.acquire("acme", "support", 8, 0.0)
    assert book.in_flight("acme") == 1


def test_tenant_quota_overrides_default_and_tier_from_events() -> None:
    policies = TenantPolicies(Quota(max_in_flight=32))
    assert policies.priority("acme") == common_pb2.PRIORITY_BRONZE
    up = events_pb2.TenantEvent()
    up.tenant_upserted.CopyFrom(events_pb2.TenantUpserted(
        tenant_id="acme", default_priority=common_pb2.PRIORITY_GOLD))
    policies.apply(up)
    policies.apply(_quota_event("acme", max_in_flight=0, tokens_per_s=0))  # unlimited
    assert policies.priority("acme") == common_pb2.PRIORITY_GOLD
    assert policies.quotas_of("acme", "x") == [("acme", Quota(0, 0.0))]
    policies.apply(_quota_event("acme", cleared=True))
    assert policies.quotas_of("acme", "") == [("acme", Quota(32, 0.0))]
