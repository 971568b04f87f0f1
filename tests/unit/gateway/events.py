"""Builders of the events the gateway's views consume (tests only)."""

from __future__ import annotations

from loraplane.shared.topics import new_meta
from loraplane.v1 import common_pb2, events_pb2

BASE = "tiny"


def ref(tenant: str, name: str, version: str = "", base: str = BASE) -> common_pb2.AdapterRef:
    return common_pb2.AdapterRef(tenant_id=tenant, adapter_name=name, version=version,
                                 base_model=base)


def _meta(r: common_pb2.AdapterRef | None, at: float | None) -> common_pb2.EventMeta:
    meta = new_meta("registry/test", r)
    if at is not None:
        meta.occurred_at.FromNanoseconds(int(at * 1e9))
    return meta


def key_created(tenant: str, key_id: str, key_hash: str) -> events_pb2.TenantEvent:
    return events_pb2.TenantEvent(
        meta=_meta(None, None),
        api_key_created=events_pb2.ApiKeyCreated(tenant_id=tenant, key_id=key_id,
                                                 prefix=key_id[:6], key_hash=key_hash),
    )


def key_revoked(tenant: str, key_id: str) -> events_pb2.TenantEvent:
    return events_pb2.TenantEvent(
        meta=_meta(None, None),
        api_key_revoked=events_pb2.ApiKeyRevoked(tenant_id=tenant, key_id=key_id),
    )


def share_changed(owner: str, name: str, grantee: str,
                  shared: bool = True) -> events_pb2.TenantEvent:
    return events_pb2.TenantEvent(
        meta=_meta(None, None),
        adapter_share_changed=events_pb2.AdapterShareChanged(
            tenant_id=owner, adapter_name=name, grantee_tenant_id=grantee, shared=shared),
    )


def tenant(tenant_id: str, disabled: bool = False) -> events_pb2.TenantEvent:
    return events_pb2.TenantEvent(
        meta=_meta(None, None),
        tenant_upserted=events_pb2.TenantUpserted(tenant_id=tenant_id, disabled=disabled),
    )


def admitted(tenant_id: str, name: str, version: str, engine_id: int, rank: int = 8,
             base: str = BASE) -> events_pb2.AdmissionEvent:
    return events_pb2.AdmissionEvent(
        admitted=events_pb2.AdapterAdmitted(
            meta=_meta(ref(tenant_id, name, version, base), None),
            engine_id=engine_id,
            sha256=f"{engine_id:064x}",
            artifact_uri=f"s3://loraplane-artifacts/{tenant_id}/{name}/{version}/",
            size_bytes=1000 * engine_id,
            rank=rank,
        )
    )


def promoted(tenant_id: str, name: str, version: str, engine_id: int, at: float | None = None,
             base: str = BASE) -> events_pb2.LifecycleEvent:
    return events_pb2.LifecycleEvent(
        promoted=events_pb2.AdapterPromoted(
            meta=_meta(ref(tenant_id, name, version, base), at), engine_id=engine_id
        )
    )


def canary(tenant_id: str, name: str, version: str, percent: int, engine_id: int,
           at: float | None = None, *, cleared: bool = False,
           previous: str = "") -> events_pb2.LifecycleEvent:
    return events_pb2.LifecycleEvent(
        canary_changed=events_pb2.CanaryChanged(
            meta=_meta(ref(tenant_id, name, version), at), canary_version=version,
            percent=percent, engine_id=engine_id, cleared=cleared, previous=previous,
        )
    )


def withdrawn(tenant_id: str, name: str, version: str, engine_id: int, reason: str,
              at: float | None = None) -> events_pb2.LifecycleEvent:
    return events_pb2.LifecycleEvent(
        withdrawn=events_pb2.VersionWithdrawn(
            meta=_meta(ref(tenant_id, name, version), at), engine_id=engine_id, reason=reason,
        )
    )


def rolled_back(tenant_id: str, name: str, to_version: str, engine_id: int,
                at: float | None = None) -> events_pb2.LifecycleEvent:
    return events_pb2.LifecycleEvent(
        rolled_back=events_pb2.RolledBack(
            meta=_meta(ref(tenant_id, name, to_version), at), to_version=to_version,
            engine_id=engine_id,
        )
    )


def retired(tenant_id: str, name: str, version: str, engine_id: int,
            at: float | None = None) -> events_pb2.LifecycleEvent:
    return events_pb2.LifecycleEvent(
        retired=events_pb2.AdapterRetired(meta=_meta(ref(tenant_id, name, version), at),
                                          engine_id=engine_id)
    )


def state(worker_id: str, address: str, *, hot: tuple[int, ...] = (), warm: tuple[int, ...] = (),
          seq: int = 1, started: float = 1000.0, at: float = 2000.0, ready: bool = True,
          in_flight: int = 0, base: str = BASE) -> events_pb2.WorkerReport:
    st = events_pb2.WorkerState(worker_id=worker_id, base_models=[base], grpc_address=address,
                                seq=seq, ready=ready)
    st.started_at.FromNanoseconds(int(started * 1e9))
    for e in hot:
        st.placements.add(engine_id=e, tier=common_pb2.TIER_HOT, in_flight=in_flight)
    for e in warm:
        st.placements.add(engine_id=e, tier=common_pb2.TIER_WARM)
    report = events_pb2.WorkerReport(meta=_meta(None, at), worker_id=worker_id, state=st)
    return report


def loaded(worker_id: str, engine_id: int, tier: int, *, at: float, source: int = 0,
           duration_ms: float = 0.0) -> events_pb2.WorkerReport:
    return events_pb2.WorkerReport(
        meta=_meta(None, at), worker_id=worker_id,
        loaded=events_pb2.AdapterLoaded(tier=tier, engine_id=engine_id, source_tier=source,
                                        duration_ms=duration_ms),
    )


def evicted(worker_id: str, engine_id: int, to_tier: int, *, at: float) -> events_pb2.WorkerReport:
    return events_pb2.WorkerReport(
        meta=_meta(None, at), worker_id=worker_id,
        evicted=events_pb2.AdapterEvicted(from_tier=common_pb2.TIER_HOT, to_tier=to_tier,
                                          engine_id=engine_id, reason="test"),
    )
