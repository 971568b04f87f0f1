"""RegistryAdmin.ClearCanary (issue 16): a new canary is not cleared for tenant traffic
until the canary analysis clears it; audited, ``CanaryChanged`` with ``cleared``; kept at
another share of the same canary, reset for another canary; refused for a version that is
no longer the canary."""

from __future__ import annotations

import json

import grpc

from loraplane.v1 import registry_pb2 as R
from tests.support.registry import Registry

Code = grpc.StatusCode


async def test_clear_canary_audited_kept_per_canary_refused_for_another_version(
    registry: Registry, stable_v1: tuple[str, str]
) -> None:
    tid, name = stable_v1

    def share(version: str, percent: int) -> R.SetCanaryRequest:
        return R.SetCanaryRequest(tenant_id=tid, adapter_name=name, version=version,
                                  percent=percent, reason="test")

    def clear(version: str) -> R.ClearCanaryRequest:
        return R.ClearCanaryRequest(tenant_id=tid, adapter_name=name, version=version,
                                    reason="golden set passed")

    r = (await registry.call("SetCanary", share("v2", 10))).release
    assert (r.canary_version, r.canary_cleared) == ("v2", False)
    assert await registry.status_of("ClearCanary", clear("v3")) == Code.FAILED_PRECONDITION
    assert await registry.status_of("ClearCanary", clear("")) == Code.INVALID_ARGUMENT
    r = (await registry.call("ClearCanary", clear("v2"))).release
    assert r.canary_cleared
    await registry.call("ClearCanary", clear("v2"))  # idempotent: no second entry
    got = (await registry.call("GetRelease", R.GetReleaseRequest(
        tenant_id=tid, adapter_name=name))).release
    assert got.canary_cleared
    r = (await registry.call("SetCanary", share("v2", 50))).release  # same canary: kept
    assert r.canary_cleared
    r = (await registry.call("SetCanary", share("v3", 10))).release  # another: not cleared
    assert (r.canary_version, r.canary_cleared) == ("v3", False)

    entries = (await registry.call("ListAudit", R.ListAuditRequest(
        subject_prefix=f"{tid}/{name}", page_size=50))).entries
    clears = [json.loads(e.after_json) for e in entries if e.action == "release.canary_clear"]
    assert [(c["canary_version"], c["reason"]) for c in clears] == [("v2", "golden set passed")]

    events = await registry.read("adapter.lifecycle", lambda evs: sum(
        e.WhichOneof("event") == "canary_changed"
        and e.canary_changed.meta.adapter.tenant_id == tid for e in evs) >= 4)
    mine = [e.canary_changed for _, e, _ in events if e.WhichOneof("event") == "canary_changed"
            and e.canary_changed.meta.adapter.tenant_id == tid]
    assert [(c.canary_version, c.percent, c.cleared) for c in mine] == [
        ("v2", 10, False), ("v2", 10, True), ("v2", 50, True), ("v3", 10, False)]
