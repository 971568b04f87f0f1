"""Every RegistryAdmin RPC against the real stack, including bad input with exact statuses."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta

import asyncpg
import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc

from loraplane.shared.tls import GATEWAY, OPERATOR, REGISTRY_ID, WORKER
from loraplane.shared.topics import ADAPTER_LIFECYCLE, ADAPTER_RELEASES, TENANT_EVENTS
from loraplane.stack.stack import Stack
from loraplane.v1 import common_pb2, events_pb2, registry_pb2, registry_pb2_grpc
from tests.support.registry import BASE, Registry, record
from tests.support.tls import internal_channel, tls_files

Code = grpc.StatusCode
R = registry_pb2


# --------------------------------------------------------------------------- auth


async def test_operator_token_is_required(stack: Stack, registry: Registry, unique: str) -> None:
    """A caller whose certificate is not the operator's (the gateway's bootstrap, with
    mutual TLS on) administers with the operator token only; the operator's certificate
    is enough by itself. Without TLS nobody has a certificate: no token is
    UNAUTHENTICATED."""
    req = R.ListTenantsRequest()
    missing = Code.PERMISSION_DENIED if tls_files(stack, GATEWAY) else Code.UNAUTHENTICATED
    async with internal_channel(stack, registry.app.address, caller=GATEWAY,
                                server=REGISTRY_ID) as ch:
        gateway = registry_pb2_grpc.RegistryAdminStub(ch)
        assert await registry.status_of("ListTenants", req, md=(), stub=gateway) == missing
        assert await registry.status_of(
            "ListTenants", req, md=(("authorization", "Basic abc"),), stub=gateway) == missing
        assert await registry.status_of(
            "ListTenants", req, md=(("authorization", "Bearer wrong-token-xxxxxxxx"),),
            stub=gateway) == Code.PERMISSION_DENIED
        assert await registry.status_of("ListTenants", req, stub=gateway) == Code.OK
        # A tenant's API key is never accepted by the registry.
        tenant = await registry.tenant(unique)
        key = await registry.call("CreateApiKey", R.CreateApiKeyRequest(tenant_id=tenant))
        assert await registry.status_of(
            "ListTenants", req, md=(("authorization", f"Bearer {key.secret}"),), stub=gateway
        ) == Code.PERMISSION_DENIED
    # Refused calls are counted by code.
    assert registry.metric("loraplane_rpc_requests_total", {
        "service": "loraplane.v1.RegistryAdmin", "method": "ListTenants",
        "code": "PERMISSION_DENIED"}) >= 2
    if tls_files(stack, OPERATOR):
        assert await registry.status_of("ListTenants", req, md=()) == Code.OK


async def test_health_and_reflection_need_no_token(stack: Stack, registry: Registry) -> None:
    # any caller with a certificate of the platform's CA (here: a worker's)
    async with internal_channel(stack, registry.app.address, caller=WORKER,
                                server=REGISTRY_ID) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        resp = await health.Check(health_pb2.HealthCheckRequest(
            service="loraplane.v1.RegistryAdmin"))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING


# --------------------------------------------------------------------------- tenants


async def test_tenants(registry: Registry, unique: str) -> None:
    tid = f"t-{unique}"
    created = await registry.call("CreateTenant", R.CreateTenantRequest(
        tenant_id=tid, display_name="Acme"))
    assert created.tenant.default_priority == common_pb2.PRIORITY_BRONZE  # unspecified → bronze
    assert await registry.status_of("CreateTenant", R.CreateTenantRequest(
        tenant_id=tid)) == Code.ALREADY_EXISTS
    got = await registry.call("GetTenant", R.GetTenantRequest(tenant_id=tid))
    assert got.tenant.display_name == "Acme"
    assert await registry.status_of("GetTenant", R.GetTenantRequest(
        tenant_id=f"nobody-{unique}")) == Code.NOT_FOUND
    for bad in ("Acme", "a", "a_b", "-x", ""):
        assert await registry.status_of("CreateTenant", R.CreateTenantRequest(
            tenant_id=bad)) == Code.INVALID_ARGUMENT, bad
    updated = await registry.call("SetTenantPriority", R.SetTenantPriorityRequest(
        tenant_id=tid, priority=common_pb2.PRIORITY_PLATINUM))
    assert updated.tenant.default_priority == common_pb2.PRIORITY_PLATINUM
    assert await registry.status_of("SetTenantPriority", R.SetTenantPriorityRequest(
        tenant_id=tid, priority=common_pb2.PRIORITY_UNSPECIFIED)) == Code.INVALID_ARGUMENT
    assert await registry.status_of("SetTenantPriority", R.SetTenantPriorityRequest(
        tenant_id=f"nobody-{unique}", priority=common_pb2.PRIORITY_GOLD)) == Code.NOT_FOUND

    # Paging walks every tenant exactly once, ordered by id.
    for i in range(3):
        await registry.tenant(unique, f"-p{i}")
    seen: list[str] = []
    token = ""
    while True:
        page = await registry.call("ListTenants", R.ListTenantsRequest(page_size=2,
                                                                        page_token=token))
        assert len(page.tenants) <= 2
        seen += [t.tenant_id for t in page.tenants]
        token = page.next_page_token
        if not token:
            break
    assert seen == sorted(seen) and len(seen) == len(set(seen))
    assert {tid, f"t-{unique}-p0", f"t-{unique}-p2"} <= set(seen)
    assert await registry.status_of("ListTenants", R.ListTenantsRequest(
        page_token="%%%garbage")) == Code.INVALID_ARGUMENT

    # Changes are audited (actor from metadata, before/after) and published.
    audit = await registry.call("ListAudit", R.ListAuditRequest(subject_prefix=tid))
    own = [e for e in audit.entries if e.subject == tid]
    assert [e.action for e in own] == ["tenant.set_priority", "tenant.create"]
    change = own[0]
    assert change.actor == "tests/registry"
    assert json.loads(change.before_json)["default_priority"] == "bronze"
    assert json.loads(change.after_json)["default_priority"] == "platinum"
    later = Timestamp()
    later.FromDatetime(datetime.now(UTC) + timedelta(hours=1))
    assert list((await registry.call("ListAudit", R.ListAuditRequest(
        subject_prefix=tid, since=later))).entries) == []
    until = await registry.call("ListAudit", R.ListAuditRequest(
        subject_prefix=tid, until=later, actor="tests/registry", action="tenant.create"))
    assert tid in [e.subject for e in until.entries]
    events = await registry.read(TENANT_EVENTS, lambda evs: sum(
        1 for e in evs if e.tenant_upserted.tenant_id == tid) >= 2)
    mine = [(k, e) for k, e, _ in events if e.tenant_upserted.tenant_id == tid]
    assert [e.tenant_upserted.default_priority for _, e in mine] == [
        common_pb2.PRIORITY_BRONZE, common_pb2.PRIORITY_PLATINUM]
    assert all(k == tid.encode() for k, _ in mine)


# --------------------------------------------------------------------------- API keys


async def test_api_keys(registry: Registry, stack: Stack, unique: str) -> None:
    tid = await registry.tenant(unique)
    created = await registry.call("CreateApiKey", R.CreateApiKeyRequest(
        tenant_id=tid, description="ci"))
    secret, info = created.secret, created.key
    assert secret.startswith("lp_") and len(secret) > 30
    assert secret.startswith(info.prefix) and len(info.prefix) < len(secret)
    # Only the hash is stored.
    conn = await asyncpg.connect(stack.settings.postgres_dsn)
    try:
        row = await conn.fetchrow("SELECT * FROM api_keys WHERE key_id = $1", info.key_id)
        dump = json.dumps({k: str(v) for k, v in dict(row).items()})
    finally:
        await conn.close()
    assert row["key_hash"] == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in dump
    listed = await registry.call("ListApiKeys", R.ListApiKeysRequest(tenant_id=tid))
    assert [k.key_id for k in listed.keys] == [info.key_id]
    assert secret not in str(listed)
    revoked = await registry.call("RevokeApiKey", R.RevokeApiKeyRequest(
        tenant_id=tid, key_id=info.key_id))
    assert revoked.key.HasField("revoked_at")
    assert (await registry.call("ListApiKeys", R.ListApiKeysRequest(tenant_id=tid))).keys == []
    with_revoked = await registry.call("ListApiKeys", R.ListApiKeysRequest(
        tenant_id=tid, include_revoked=True))
    assert [k.key_id for k in with_revoked.keys] == [info.key_id]
    assert await registry.status_of("RevokeApiKey", R.RevokeApiKeyRequest(
        tenant_id=tid, key_id="key_nope")) == Code.NOT_FOUND
    assert await registry.status_of("CreateApiKey", R.CreateApiKeyRequest(
        tenant_id=f"nobody-{unique}")) == Code.NOT_FOUND
    assert await registry.status_of("ListApiKeys", R.ListApiKeysRequest(
        tenant_id=f"nobody-{unique}")) == Code.NOT_FOUND
    # The gateway learns the hash, never the secret.
    events = await registry.read(TENANT_EVENTS, lambda evs: any(
        e.api_key_revoked.key_id == info.key_id for e in evs))
    created_ev = [e for _, e, _ in events if e.api_key_created.key_id == info.key_id]
    assert created_ev[0].api_key_created.key_hash == row["key_hash"]
    assert all(secret.encode() not in e.SerializeToString() for _, e, _ in events)


# --------------------------------------------------------------------------- shares


async def test_adapter_shares(registry: Registry, unique: str) -> None:
    owner = await registry.tenant(unique)
    other = await registry.tenant(f"{unique}-b")
    third = await registry.tenant(f"{unique}-c")
    await registry.register(owner, "bot", "v1")
    share = R.ShareAdapterRequest(tenant_id=owner, adapter_name="bot", grantee_tenant_id=other)
    first = await registry.call("ShareAdapter", share)
    assert first.changed and list(first.grantee_tenant_ids) == [other]
    again = await registry.call("ShareAdapter", share)  # idempotent: no change, no event
    assert not again.changed and list(again.grantee_tenant_ids) == [other]
    await registry.call("ShareAdapter", R.ShareAdapterRequest(
        tenant_id=owner, adapter_name="bot", grantee_tenant_id=third))
    listed = await registry.call("ListShares", R.ListSharesRequest(tenant_id=owner))
    assert [(x.adapter_name, x.grantee_tenant_id) for x in listed.shares] == [
        ("bot", other), ("bot", third)]
    assert all(x.HasField("created_at") for x in listed.shares)
    unshare = R.UnshareAdapterRequest(tenant_id=owner, adapter_name="bot",
                                      grantee_tenant_id=other)
    ended = await registry.call("UnshareAdapter", unshare)
    assert ended.changed and list(ended.grantee_tenant_ids) == [third]
    assert not (await registry.call("UnshareAdapter", unshare)).changed
    one = await registry.call("ListShares", R.ListSharesRequest(tenant_id=owner,
                                                                 adapter_name="bot"))
    assert [x.grantee_tenant_id for x in one.shares] == [third]

    # Bad input: the right status, naming the problem; nothing is written.
    bad = [
        (R.ShareAdapterRequest(tenant_id=owner, adapter_name="bot", grantee_tenant_id=owner),
         Code.INVALID_ARGUMENT, "owner itself"),
        (R.ShareAdapterRequest(tenant_id=owner, adapter_name="../bot", grantee_tenant_id=other),
         Code.INVALID_ARGUMENT, "adapter_name"),
        (R.ShareAdapterRequest(tenant_id=owner, adapter_name="bot", grantee_tenant_id="X Y"),
         Code.INVALID_ARGUMENT, "grantee_tenant_id"),
        (R.ShareAdapterRequest(tenant_id=owner, adapter_name="nope", grantee_tenant_id=other),
         Code.NOT_FOUND, "nope"),
        (R.ShareAdapterRequest(tenant_id=owner, adapter_name="bot",
                               grantee_tenant_id=f"nobody-{unique}"),
         Code.NOT_FOUND, f"nobody-{unique}"),
    ]
    for req, code, words in bad:
        try:
            await registry.call("ShareAdapter", req)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == code, (req, exc)
            assert words in (exc.details() or ""), (req, exc.details())
        else:
            raise AssertionError(f"{req} accepted")
    after = await registry.call("ListShares", R.ListSharesRequest(tenant_id=owner))
    assert [x.grantee_tenant_id for x in after.shares] == [third]

    # Names the grantee could not resolve to this adapter: FAILED_PRECONDITION, nothing kept.
    await registry.register(other, "bot", "o1")  # other now owns a "bot" of its own
    await registry.register(other, "helper", "h1")
    await registry.register(owner, "helper", "v1")
    await registry.call("ShareAdapter", R.ShareAdapterRequest(
        tenant_id=other, adapter_name="helper", grantee_tenant_id=third))
    conflicts = [
        (R.ShareAdapterRequest(tenant_id=owner, adapter_name="bot", grantee_tenant_id=other),
         "its own adapter 'bot'"),
        (R.ShareAdapterRequest(tenant_id=owner, adapter_name="helper", grantee_tenant_id=third),
         f"already has '{other}/helper' shared"),
    ]
    for req, words in conflicts:
        try:
            await registry.call("ShareAdapter", req)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == Code.FAILED_PRECONDITION, (req, exc)
            assert words in (exc.details() or ""), exc.details()
        else:
            raise AssertionError(f"{req} accepted")
    helper = await registry.call("ListShares", R.ListSharesRequest(tenant_id=owner,
                                                                    adapter_name="helper"))
    assert list(helper.shares) == []
    # Unshare names an unknown grantee or adapter as such; ListShares too.
    for method, req, words in (
        ("UnshareAdapter", R.UnshareAdapterRequest(
            tenant_id=owner, adapter_name="bot", grantee_tenant_id=f"nobody-{unique}"),
         f"nobody-{unique}"),
        ("ListShares", R.ListSharesRequest(tenant_id=owner, adapter_name="nope"),
         f"'{owner}/nope'"),
    ):
        try:
            await registry.call(method, req)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == Code.NOT_FOUND, (req, exc)
            assert words in (exc.details() or ""), exc.details()
        else:
            raise AssertionError(f"{req} accepted")

    # The gateway learns every change, in order, keyed by the owner.
    events = await registry.read(TENANT_EVENTS, lambda evs: any(
        e.adapter_share_changed.grantee_tenant_id == other
        and not e.adapter_share_changed.shared for e in evs))
    changes = [(e.adapter_share_changed.grantee_tenant_id, e.adapter_share_changed.shared)
               for _, e, _ in events
               if e.WhichOneof("event") == "adapter_share_changed"
               and e.adapter_share_changed.tenant_id == owner]
    assert changes == [(other, True), (third, True), (other, False)]
    keys = {k for k, e, _ in events if e.WhichOneof("event") == "adapter_share_changed"
            and e.adapter_share_changed.tenant_id == owner}
    assert keys == {owner.encode()}


# --------------------------------------------------------------------------- versions


async def test_request_upload_chooses_a_content_addressed_key(
    registry: Registry, unique: str
) -> None:
    tid = await registry.tenant(unique)
    files = [R.UploadFile(path="adapter_config.json", size_bytes=10, sha256="a" * 64),
             R.UploadFile(path="adapter_model.safetensors", size_bytes=20, sha256="b" * 64),
             R.UploadFile(path="model.sig", size_bytes=5, sha256="c" * 64)]
    req = R.RequestUploadRequest(tenant_id=tid, adapter_name="bot", version="v1",
                                 base_model=BASE, files=files)
    plan = await registry.call("RequestUpload", req)
    assert plan.bucket == registry.bucket
    assert plan.key_prefix.startswith(f"adapters/{tid}/bot/v1/") and plan.key_prefix.endswith("/")
    assert plan.artifact_uri == f"s3://{registry.bucket}/{plan.key_prefix}"
    assert {t.path: t.key for t in plan.targets} == {
        f.path: plan.key_prefix + f.path for f in files}
    # Same content → same key; other content → other key.
    assert (await registry.call("RequestUpload", req)).key_prefix == plan.key_prefix
    other = R.RequestUploadRequest(tenant_id=tid, adapter_name="bot", version="v1",
                                   base_model=BASE, files=[files[0], R.UploadFile(
                                       path="adapter_model.safetensors", size_bytes=20,
                                       sha256="d" * 64), files[2]])
    assert (await registry.call("RequestUpload", other)).key_prefix != plan.key_prefix
    # Caller paths never leave the prefix.
    for bad in ("../../etc/passwd", "/abs", "a/../../b"):
        evil = R.RequestUploadRequest(tenant_id=tid, adapter_name="bot", version="v1",
                                      base_model=BASE, files=[*files, R.UploadFile(
                                          path=bad, size_bytes=1, sha256="e" * 64)])
        assert await registry.status_of("RequestUpload", evil) == Code.INVALID_ARGUMENT
    no_sig = R.RequestUploadRequest(tenant_id=tid, adapter_name="bot", version="v1",
                                    base_model=BASE, files=files[:2])
    assert await registry.status_of("RequestUpload", no_sig) == Code.INVALID_ARGUMENT
    assert await registry.status_of("RequestUpload", R.RequestUploadRequest(
        tenant_id=f"nobody-{unique}", adapter_name="bot", version="v1", base_model=BASE,
        files=files)) == Code.NOT_FOUND


async def test_an_adapter_cannot_be_released_under_a_base_model_name(
    registry: Registry, unique: str
) -> None:
    """``base`` and the base model's own name call the base model on the inference APIs."""
    tid = await registry.tenant(unique)
    files = [R.UploadFile(path="adapter_config.json", size_bytes=10, sha256="a" * 64),
             R.UploadFile(path="model.sig", size_bytes=5, sha256="c" * 64)]
    for name, base in (("base", BASE), ("gpt2", "gpt2")):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await registry.call("RequestUpload", R.RequestUploadRequest(
                tenant_id=tid, adapter_name=name, version="v1", base_model=base, files=files))
        assert info.value.code() == Code.INVALID_ARGUMENT
        assert f"adapter_name: {name!r} is" in (info.value.details() or "")


async def test_register_version(registry: Registry, unique: str) -> None:
    tid = await registry.tenant(unique)
    v1 = await registry.register(tid, "bot", "v1")
    assert v1.status == common_pb2.VERSION_STATUS_PENDING
    assert v1.engine_id > 0 and v1.adapter_id == f"{tid}/bot"
    assert v1.effective_priority == common_pb2.PRIORITY_SILVER  # tenant default
    assert v1.signature_uri == v1.artifact_uri + "model.sig"
    v2 = await registry.register(tid, "bot", "v2", priority=common_pb2.PRIORITY_GOLD)
    assert v2.engine_id > v1.engine_id  # from the sequence, increasing
    assert v2.effective_priority == common_pb2.PRIORITY_GOLD

    # Same (adapter, version) and digest: idempotent success, same record, no new event.
    again = await registry.register(tid, "bot", "v1")
    assert again.engine_id == v1.engine_id and again.created_at == v1.created_at
    # Same version, other digest: immutable.
    assert await registry.status_of("RegisterVersion", R.RegisterVersionRequest(
        version=record(tid, "bot", "v1", registry.bucket, seed="other"))) == Code.ALREADY_EXISTS
    # Unknown tenant.
    assert await registry.status_of("RegisterVersion", R.RegisterVersionRequest(
        version=record(f"nobody-{unique}", "bot", "v1", registry.bucket))) == Code.NOT_FOUND

    # Malformed names or versions: INVALID_ARGUMENT naming the field.
    for field, value in (("name", "Bad Name"), ("version", "v1/../x"), ("version", ""),
                         ("tenant_id", "UPPER")):
        rec = record(tid, "bot", "v9", registry.bucket)
        setattr(rec, field, value)
        try:
            await registry.call("RegisterVersion", R.RegisterVersionRequest(version=rec))
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == Code.INVALID_ARGUMENT
            assert f"version.{field}" in (exc.details() or "")
        else:
            raise AssertionError(f"{field}={value!r} accepted")
    # A caller-chosen location is refused.
    rec = record(tid, "bot", "v9", registry.bucket)
    rec.artifact_uri = "s3://somewhere-else/mine/"
    assert await registry.status_of("RegisterVersion", R.RegisterVersionRequest(
        version=rec)) == Code.INVALID_ARGUMENT

    # GetVersion / ListVersions with filters and paging.
    got = await registry.call("GetVersion", R.GetVersionRequest(
        tenant_id=tid, adapter_name="bot", version="v2"))
    assert got.version.sha256 == v2.sha256 and list(got.version.files) == list(v2.files)
    assert await registry.status_of("GetVersion", R.GetVersionRequest(
        tenant_id=tid, adapter_name="bot", version="v404")) == Code.NOT_FOUND
    assert await registry.status_of("GetVersion", R.GetVersionRequest(
        tenant_id=tid, adapter_name="BAD", version="v1")) == Code.INVALID_ARGUMENT
    await registry.register(tid, "other", "v1")
    listed = await registry.call("ListVersions", R.ListVersionsRequest(tenant_id=tid))
    assert [(v.name, v.version) for v in listed.versions] == [
        ("other", "v1"), ("bot", "v2"), ("bot", "v1")]  # newest first
    by_name = await registry.call("ListVersions", R.ListVersionsRequest(
        tenant_id=tid, adapter_name="bot", status=common_pb2.VERSION_STATUS_PENDING,
        base_model=BASE, page_size=1))
    assert [v.version for v in by_name.versions] == ["v2"] and by_name.next_page_token
    page2 = await registry.call("ListVersions", R.ListVersionsRequest(
        tenant_id=tid, adapter_name="bot", page_size=1, page_token=by_name.next_page_token))
    assert [v.version for v in page2.versions] == ["v1"]
    none = await registry.call("ListVersions", R.ListVersionsRequest(
        tenant_id=tid, status=common_pb2.VERSION_STATUS_ADMITTED))
    assert list(none.versions) == []

    # Exactly one AdapterReleased per registration (not for the idempotent repeat).
    events = await registry.read(ADAPTER_RELEASES, lambda evs: sum(
        1 for e in evs if e.meta.adapter.tenant_id == tid) >= 3)
    mine = [(k, e) for k, e, _ in events if e.meta.adapter.tenant_id == tid]
    assert sorted((e.meta.adapter.adapter_name, e.meta.adapter.version) for _, e in mine) == [
        ("bot", "v1"), ("bot", "v2"), ("other", "v1")]
    rel = next(e for _, e in mine if e.meta.adapter.version == "v2")
    assert rel.engine_id == v2.engine_id and rel.sha256 == v2.sha256
    assert rel.priority == common_pb2.PRIORITY_GOLD and rel.artifact_uri == v2.artifact_uri
    assert [f.path for f in rel.files] == ["adapter_config.json", "adapter_model.safetensors"]
    assert all(k == f"{tid}/{e.meta.adapter.adapter_name}".encode() for k, e in mine)
    assert registry.metric("loraplane_registry_registrations_total",
                           {"tenant": tid, "base_model": BASE}) == 3


# --------------------------------------------------------------------------- releases


async def test_release_pointers_and_status_machine(registry: Registry, unique: str) -> None:
    tid = await registry.tenant(unique)
    name = "bot"
    pending = await registry.register(tid, name, "v0")
    v1 = await registry.admitted(tid, name, "v1")
    v2 = await registry.admitted(tid, name, "v2")
    v3 = await registry.admitted(tid, name, "v3")
    rejected = await registry.register(tid, name, "bad")
    assert await registry.verdict(rejected, admit=False) == "applied"

    def promote(v: str) -> R.PromoteRequest:
        return R.PromoteRequest(tenant_id=tid, adapter_name=name, version=v, reason="test")

    def canary(v: str, pct: int) -> R.SetCanaryRequest:
        return R.SetCanaryRequest(tenant_id=tid, adapter_name=name, version=v, percent=pct)

    def rollback(to: str = "") -> R.RollbackRequest:
        return R.RollbackRequest(tenant_id=tid, adapter_name=name, to_version=to)

    def retire(v: str) -> R.RetireRequest:
        return R.RetireRequest(tenant_id=tid, adapter_name=name, version=v)

    # Invalid transitions and inputs, with their exact statuses.
    assert await registry.status_of("Promote", promote("v0")) == Code.FAILED_PRECONDITION
    assert await registry.status_of("Promote", promote("bad")) == Code.FAILED_PRECONDITION
    assert await registry.status_of("Promote", promote("v404")) == Code.NOT_FOUND
    assert await registry.status_of("Rollback", rollback()) == Code.FAILED_PRECONDITION
    assert await registry.status_of("SetCanary", canary("v0", 10)) == Code.FAILED_PRECONDITION
    assert await registry.status_of("SetCanary", canary("v2", 101)) == Code.INVALID_ARGUMENT
    assert await registry.status_of("SetCanary", canary("", 5)) == Code.INVALID_ARGUMENT
    assert await registry.status_of("Promote", R.PromoteRequest(
        tenant_id=tid, adapter_name="nothing", version="v1")) == Code.NOT_FOUND
    assert await registry.status_of("Promote", R.PromoteRequest(
        tenant_id=f"nobody-{unique}", adapter_name=name, version="v1")) == Code.NOT_FOUND

    r = (await registry.call("Promote", promote("v1"))).release
    assert (r.stable_version, r.rollback_to) == ("v1", "")
    # Rollback with no target: only one version has ever been stable.
    assert await registry.status_of("Rollback", rollback()) == Code.FAILED_PRECONDITION
    r = (await registry.call("Promote", promote("v2"))).release
    assert (r.stable_version, r.rollback_to, r.base_model) == ("v2", "v1", BASE)
    r = (await registry.call("SetCanary", canary("v3", 10))).release
    assert (r.canary_version, r.canary_percent) == ("v3", 10)
    assert await registry.status_of("SetCanary", canary("v2", 10)) == Code.FAILED_PRECONDITION
    assert await registry.status_of("Retire", retire("v2")) == Code.FAILED_PRECONDITION
    # Rollback to a rejected or pending version is refused.
    assert await registry.status_of("Rollback", rollback("bad")) == Code.FAILED_PRECONDITION
    assert await registry.status_of("Rollback", rollback("v0")) == Code.FAILED_PRECONDITION
    r = (await registry.call("Rollback", rollback())).release
    assert (r.stable_version, r.rollback_to, r.canary_version) == ("v1", "", "v3")
    # Retiring the canary clears the canary pointer; a retired version never serves again.
    retired = (await registry.call("Retire", retire("v3"))).version
    assert retired.status == common_pb2.VERSION_STATUS_RETIRED
    r = (await registry.call("GetRelease", R.GetReleaseRequest(
        tenant_id=tid, adapter_name=name))).release
    assert (r.stable_version, r.canary_version, r.canary_percent) == ("v1", "", 0)
    assert await registry.status_of("Promote", promote("v3")) == Code.FAILED_PRECONDITION
    assert await registry.status_of("SetCanary", canary("v3", 1)) == Code.FAILED_PRECONDITION
    assert await registry.status_of("Rollback", rollback("v3")) == Code.FAILED_PRECONDITION
    assert await registry.status_of("Retire", retire("v404")) == Code.NOT_FOUND
    # A pending version can be withdrawn; its late verdict changes nothing.
    await registry.call("Retire", retire("v0"))
    assert await registry.verdict(pending) == "not_pending"

    statuses = {v.version: v.status for v in (await registry.call(
        "ListVersions", R.ListVersionsRequest(tenant_id=tid))).versions}
    S = common_pb2
    assert statuses == {"v0": S.VERSION_STATUS_RETIRED, "v1": S.VERSION_STATUS_ACTIVE,
                        "v2": S.VERSION_STATUS_ADMITTED, "v3": S.VERSION_STATUS_RETIRED,
                        "bad": S.VERSION_STATUS_REJECTED}

    # Audit: every change, with actor and before/after, newest first.
    audit = await registry.call("ListAudit", R.ListAuditRequest(subject_prefix=f"{tid}/"))
    actions = [e.action for e in reversed(audit.entries)]
    assert actions[:5] == ["version.register", "version.register", "version.admit",
                           "version.register", "version.admit"]
    assert actions[-6:] == ["release.promote", "release.promote", "release.canary",
                            "release.rollback", "version.retire", "version.retire"]
    rb = next(e for e in audit.entries if e.action == "release.rollback")
    assert json.loads(rb.before_json)["stable_version"] == "v2"
    assert json.loads(rb.after_json)["stable_version"] == "v1"
    only = await registry.call("ListAudit", R.ListAuditRequest(
        subject_prefix=f"{tid}/", action="version.reject"))
    assert [e.subject for e in only.entries] == [f"{tid}/{name}@bad"]
    assert json.loads(only.entries[0].after_json)["reasons"][0]["code"] == \
        "REJECTION_CODE_RANK_TOO_LARGE"

    # Lifecycle events, in order, keyed by the adapter id.
    adapter_id = f"{tid}/{name}".encode()
    events = await registry.read(ADAPTER_LIFECYCLE, lambda evs: sum(
        1 for e in evs if getattr(e, e.WhichOneof("event")).meta.adapter.tenant_id == tid) >= 7)
    mine = [(k, e) for k, e, _ in events
            if getattr(e, e.WhichOneof("event")).meta.adapter.tenant_id == tid]
    assert all(k == adapter_id for k, _ in mine)
    kinds = [e.WhichOneof("event") for _, e in mine]
    assert kinds == ["promoted", "promoted", "canary_changed", "rolled_back", "canary_changed",
                     "retired", "retired"]
    promoted2: events_pb2.AdapterPromoted = mine[1][1].promoted
    assert (promoted2.meta.adapter.version, promoted2.previous_stable_version,
            promoted2.engine_id) == ("v2", "v1", v2.engine_id)
    rolled: events_pb2.RolledBack = mine[3][1].rolled_back
    assert (rolled.from_version, rolled.to_version, rolled.engine_id) == ("v2", "v1",
                                                                          v1.engine_id)
    cleared: events_pb2.CanaryChanged = mine[4][1].canary_changed
    assert (cleared.canary_version, cleared.previous, cleared.previous_percent) == ("", "v3", 10)
    assert mine[5][1].retired.engine_id == v3.engine_id
    assert registry.metric("loraplane_registry_state_changes_total", {
        "action": "release.promote", "tenant": tid, "base_model": BASE}) == 2
