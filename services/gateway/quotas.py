"""Tenant quotas at the gateway: requests in flight and tokens per second.

A quota is set per tenant, or per adapter of a tenant (``tenant/adapter``), in the
registry (``loraplane tenants set-quota``), and reaches the gateway as a
``TenantQuotaSet`` on ``tenant.events``. A tenant without one gets the gateway's default
(``LORAPLANE_GATEWAY_DEFAULT_MAX_IN_FLIGHT``, ``..._DEFAULT_TOKENS_PER_S``), which keeps
one tenant from filling the workers: what it sends beyond its quota is refused at once,
not queued.

* ``max_in_flight``: the caller's requests queued or running at this gateway;
* ``tokens_per_s``: a token bucket of output tokens (capacity ``tokens_per_s * burst_s``,
  at least one request's ``max_tokens``); a request takes its ``max_tokens`` when it
  starts and gives back what it did not use when it ends.

A request over a quota is refused with RESOURCE_EXHAUSTED (HTTP 429), a ``Retry-After``
and a message naming the quota, e.g. ``tenant globex is over its max_in_flight quota
(32 requests in flight); retry in 1 s``. 0 means unlimited.

Pure code with the clock passed in: :class:`QuotaBook` decides and counts, the gateway
calls it. :class:`TenantPolicies` is the view of tenant tiers and quotas fed by
``tenant.events``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from loraplane.shared.errors import ResourceExhausted
from loraplane.v1 import common_pb2, events_pb2


@dataclass(frozen=True, slots=True)
class Quota:
    """Limits of one tenant or one adapter (0 = unlimited)."""

    max_in_flight: int = 0
    """Requests queued or running at once."""
    tokens_per_s: float = 0.0
    """Output tokens per second (token bucket)."""


class QuotaExceeded(ResourceExhausted):
    """The caller is over one of its quotas."""

    code = "quota_exceeded"

    def __init__(self, message: str, *, quota: str, retry_after_s: float) -> None:
        """``quota``: ``max_in_flight`` or ``tokens_per_s``."""
        super().__init__(message, retry_after_s=retry_after_s)
        self.quota = quota


@dataclass(slots=True)
class _Bucket:
    level: float
    at: float


@dataclass(slots=True)
class QuotaLease:
    """What one admitted request holds; give it back with :meth:`QuotaBook.release`."""

    keys: tuple[str, ...]
    tokens: int
    done: bool = False


@dataclass(slots=True)
class _Counters:
    in_flight: dict[str, int] = field(default_factory=dict)
    buckets: dict[str, _Bucket] = field(default_factory=dict)


class TenantPolicies:
    """Tenant tiers and quotas (from ``tenant.events``), with the gateway's default quota."""

    def __init__(self, default: Quota = Quota(max_in_flight=32)) -> None:
        """``default``: the quota of a tenant that has none of its own."""
        self.default = default
        self._priority: dict[str, int] = {}
        self._quotas: dict[str, Quota] = {}
        self._per_adapter = 0
        """Adapter quotas set (keys ``tenant/adapter``)."""

    def priority(self, tenant_id: str) -> int:
        """The tenant's tier (bronze until the registry said otherwise)."""
        return self._priority.get(tenant_id, common_pb2.PRIORITY_BRONZE)

    def set_priority(self, tenant_id: str, priority: int) -> None:
        """Know a tenant's tier."""
        self._priority[tenant_id] = priority or common_pb2.PRIORITY_BRONZE

    def set_quota(self, tenant_id: str, adapter_name: str, quota: Quota | None) -> None:
        """Set (or with None clear) the quota of a tenant or of one of its adapters."""
        key = f"{tenant_id}/{adapter_name}" if adapter_name else tenant_id
        if quota is None:
            self._quotas.pop(key, None)
        else:
            self._quotas[key] = quota
        if adapter_name:
            self._per_adapter = sum(1 for k in self._quotas if "/" in k)

    def quotas_of(self, tenant_id: str, adapter_name: str) -> list[tuple[str, Quota]]:
        """The quotas a request of ``tenant_id`` on ``adapter_name`` counts against:
        the tenant's (its own or the default) and the adapter's where one is set."""
        out = [(tenant_id, self._quotas.get(tenant_id, self.default))]
        if adapter_name and self._per_adapter:  # no key to build while none is set
            key = f"{tenant_id}/{adapter_name}"
            q = self._quotas.get(key)
            if q is not None:
                out.append((key, q))
        return out

    def apply(self, event: events_pb2.TenantEvent) -> None:
        """Apply one ``tenant.events`` event (other arms are ignored)."""
        arm = event.WhichOneof("event")
        if arm == "tenant_upserted":
            t = event.tenant_upserted
            self.set_priority(t.tenant_id, t.default_priority)
        elif arm == "tenant_quota_set":
            q = event.tenant_quota_set
            quota = None if q.cleared else Quota(q.max_in_flight, q.tokens_per_s)
            self.set_quota(q.tenant_id, q.adapter_name, quota)


def _who(key: str) -> str:
    """How a refusal names the quota's owner."""
    return f"adapter {key}" if "/" in key else f"tenant {key}"


class QuotaBook:
    """Counts requests in flight and token buckets; refuses what is over a quota. Pure."""

    def __init__(self, policies: TenantPolicies, *, burst_s: float = 2.0) -> None:
        """``burst_s``: a token bucket holds this many seconds of its rate."""
        self.policies = policies
        self.burst_s = burst_s
        self._c = _Counters()

    def in_flight(self, key: str) -> int:
        """Requests counted against ``key`` (``tenant`` or ``tenant/adapter``)."""
        return self._c.in_flight.get(key, 0)

    def _level(self, key: str, rate: float, capacity: float, now: float) -> _Bucket:
        b = self._c.buckets.get(key)
        if b is None:
            b = self._c.buckets[key] = _Bucket(capacity, now)
        else:
            b.level = min(capacity, b.level + (now - b.at) * rate)
            b.at = now
        return b

    def acquire(self, tenant_id: str, adapter_name: str, tokens: int, now: float) -> QuotaLease:
        """Count one request of up to ``tokens`` output tokens, or raise :class:`QuotaExceeded`
        naming the first quota it is over (nothing is counted then)."""
        quotas = self.policies.quotas_of(tenant_id, adapter_name)
        tokens = max(1, tokens)
        for key, q in quotas:
            if q.max_in_flight and self.in_flight(key) >= q.max_in_flight:
                who = _who(key)
                raise QuotaExceeded(
                    f"{who} is over its max_in_flight quota ({q.max_in_flight} requests in "
                    f"flight); retry in 1 s", quota="max_in_flight", retry_after_s=1.0,
                )
            if q.tokens_per_s:
                capacity = max(q.tokens_per_s * self.burst_s, float(tokens))
                b = self._level(key, q.tokens_per_s, capacity, now)
                if b.level < tokens:
                    who = _who(key)
                    wait = math.ceil((tokens - b.level) / q.tokens_per_s)
                    raise QuotaExceeded(
                        f"{who} is over its tokens_per_s quota ({q.tokens_per_s:g} output "
                        f"tokens/s; this request may take {tokens}); retry in {wait} s",
                        quota="tokens_per_s", retry_after_s=float(max(1, wait)),
                    )
        for key, q in quotas:
            self._c.in_flight[key] = self.in_flight(key) + 1
            if q.tokens_per_s:
                self._c.buckets[key].level -= tokens
        return QuotaLease(tuple(k for k, _ in quotas), tokens)

    def release(self, lease: QuotaLease, used_tokens: int, now: float) -> None:
        """The request ended having produced ``used_tokens``: unused tokens go back."""
        if lease.done:
            return
        lease.done = True
        unused = max(0, lease.tokens - used_tokens)
        for key in lease.keys:
            n = self.in_flight(key) - 1
            if n > 0:
                self._c.in_flight[key] = n
            else:
                self._c.in_flight.pop(key, None)
            b = self._c.buckets.get(key)
            if b is not None and unused:
                b.level += unused  # capped at the next refill
