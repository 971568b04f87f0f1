"""RegistryAdmin.PauseCanary (issue 16): pause / resume the canary analysis, audited,
refused without a canary, reset when the canary changes."""

from __future__ import annotations

import json

import grpc

from loraplane.v1 import registry_pb2 as R
from tests.support.registry import Registry

Code = grpc.StatusCode


async def test_pause_resume_audited_refused_without_canary_reset_on_change(
    registry: Registry, stable_v1: tuple[str, str]
) -> None:
    tid, name = stable_v1

    def pause(paused: bool) -> R.PauseCanaryRequest:
        return R.PauseCanaryRequest(tenant_id=tid, adapter_name=name, paused=paused,
                                    reason="test")

    assert await registry.status_of("PauseCanary", pause(True)) == Code.FAILED_PRECONDITION
    assert await registry.status_of("PauseCanary", R.PauseCanaryRequest(
        tenant_id=tid, adapter_name="nothing", paused=True)) == Code.NOT_FOUND
    await registry.call("SetCanary", R.SetCanaryRequest(tenant_id=tid, adapter_name=name,
                                                        version="v2", percent=10))
    r = (await registry.call("PauseCanary", pause(True))).release
    assert (r.canary_version, r.canary_paused) == ("v2", True)
    r = (await registry.call("PauseCanary", pause(True))).release  # idempotent
    assert r.canary_paused
    got = (await registry.call("GetRelease", R.GetReleaseRequest(
        tenant_id=tid, adapter_name=name))).release
    assert got.canary_paused
    # the same canary at another share stays paused; another canary is not
    r = (await registry.call("SetCanary", R.SetCanaryRequest(
        tenant_id=tid, adapter_name=name, version="v2", percent=50))).release
    assert r.canary_paused
    r = (await registry.call("SetCanary", R.SetCanaryRequest(
        tenant_id=tid, adapter_name=name, version="v3", percent=10))).release
    assert (r.canary_version, r.canary_paused) == ("v3", False)
    await registry.call("PauseCanary", pause(True))
    r = (await registry.call("PauseCanary", pause(False))).release
    assert not r.canary_paused

    entries = (await registry.call("ListAudit", R.ListAuditRequest(
        subject_prefix=f"{tid}/{name}", page_size=50))).entries
    pauses = [(e.action, json.loads(e.after_json)["canary_version"]) for e in entries
              if e.action.startswith("release.canary_")]
    assert pauses[::-1] == [("release.canary_pause", "v2"), ("release.canary_pause", "v3"),
                            ("release.canary_resume", "v3")]
