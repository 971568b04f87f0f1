"""Event builders of the gateway's integration tests (what the registry, admission and
workers would publish)."""

from __future__ import annotations

import time

from loraplane.shared.topics import new_meta
from loraplane.v1 import common_pb2, events_pb2
from tests.support.echo_worker import EchoWorker


def ref(tenant: str, name: str, version: str, base: str) -> common_pb2.AdapterRef:
    return common_pb2.AdapterRef(tenant_id=tenant, adapter_name=name, version=version,
                                 base_model=base)


def key_created(tenant: str, key_id: str, key_hash: str) -> events_pb2.TenantEvent:
    return events_pb2.TenantEvent(
        meta=new_meta("registry/itest"),
        api_key_created=events_pb2.ApiKeyCreated(tenant_id=tenant, key_id=key_id,
                                                 prefix=key_id[:6], key_hash=key_hash))


def key_revoked(tenant: str, key_id: str) -> events_pb2.TenantEvent:
    return events_pb2.TenantEvent(
        meta=new_meta("registry/itest"),
        api_key_revoked=events_pb2.ApiKeyRevoked(tenant_id=tenant, key_id=key_id))


def admitted(tenant: str, name: str, version: str, engine_id: int,
             base: str) -> events_pb2.AdmissionEvent:
    return events_pb2.AdmissionEvent(admitted=events_pb2.AdapterAdmitted(
        meta=new_meta("admission/itest", ref(tenant, name, version, base)),
        engine_id=engine_id, sha256=f"{engine_id:064x}", rank=8, size_bytes=100,
        artifact_uri=f"s3://loraplane-artifacts/adapters/{tenant}/{name}/{version}/x/"))


def promoted(tenant: str, name: str, version: str, engine_id: int,
             base: str) -> events_pb2.LifecycleEvent:
    return events_pb2.LifecycleEvent(promoted=events_pb2.AdapterPromoted(
        meta=new_meta("registry/itest", ref(tenant, name, version, base)), engine_id=engine_id))


def worker_state(worker: EchoWorker, base: str) -> events_pb2.WorkerReport:
    st = worker.state(int(time.time() * 1000))
    del st.base_models[:]
    st.base_models.append(base)
    st.started_at.FromNanoseconds(time.time_ns())
    return events_pb2.WorkerReport(meta=new_meta(f"worker/{worker.worker_id}"),
                                   worker_id=worker.worker_id, state=st)
