"""gRPC servicer of ``loraplane.v1.RegistryAdmin``: one transaction per call.

Authentication happens in the interceptor (:mod:`loraplane.registry.auth`); errors
raised by the domain modules are mapped to status codes by
:class:`loraplane.shared.grpcutil.ServiceInterceptor`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC
from typing import Protocol, TypeVar

import asyncpg
import grpc

from loraplane.registry import audit, keys, quotas, releases, shares, tenants, versions
from loraplane.registry.auth import actor_of
from loraplane.registry.context import Ctx
from loraplane.registry.metrics import RegistryMetrics
from loraplane.shared.db import transaction
from loraplane.shared.topics import Clock, utc_now
from loraplane.v1 import registry_pb2, registry_pb2_grpc

T = TypeVar("T")


class _Owned(Protocol):
    """A changed record: it names its tenant (a version or a release also its base model)."""

    @property
    def tenant_id(self) -> str: ...


O = TypeVar("O", bound=_Owned)


class RegistryAdminServicer(registry_pb2_grpc.RegistryAdminServicer):
    """RegistryAdmin over a connection pool."""

    def __init__(
        self,
        *,
        pool: asyncpg.Pool,
        bucket: str,
        producer: str,
        metrics: RegistryMetrics | None = None,
        clock: Clock = utc_now,
        topic_prefix: str = "",
        canary_clearance: bool = True,
    ) -> None:
        """``bucket``: the allow-listed artifact bucket; ``producer``: ``registry/<id>``;
        ``topic_prefix``: namespace of the topics events go to; ``canary_clearance``: a new
        canary waits for the analysis' ``ClearCanary`` before tenant traffic."""
        self.pool = pool
        self.bucket = bucket
        self.producer = producer
        self.metrics = metrics or RegistryMetrics.for_registry()
        self.clock = clock
        self.topic_prefix = topic_prefix
        self.canary_clearance = canary_clearance

    def _ctx(self, context: grpc.aio.ServicerContext) -> Ctx:
        actor = actor_of(tuple(context.invocation_metadata() or ()))
        return Ctx(actor=actor, producer=self.producer, clock=self.clock,
                   topic_prefix=self.topic_prefix, canary_clearance=self.canary_clearance)

    async def _write(
        self, context: grpc.aio.ServicerContext,
        op: Callable[[asyncpg.Connection, Ctx], Awaitable[T]],
    ) -> T:
        """``op`` in one transaction, acting as the caller (a write counts its change itself
        when the count depends on the outcome: :meth:`_change` otherwise)."""
        ctx = self._ctx(context)
        async with transaction(self.pool) as conn:
            return await op(conn, ctx)

    async def _change(
        self, context: grpc.aio.ServicerContext, action: str,
        op: Callable[[asyncpg.Connection, Ctx], Awaitable[O]],
    ) -> O:
        """:meth:`_write`, then one change counted under ``action`` with the changed
        record's tenant and base model (none for a tenant or a key) once committed."""
        done = await self._write(context, op)
        self._changed(action, done.tenant_id, getattr(done, "base_model", ""))
        return done

    async def _read(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        async with transaction(self.pool, readonly=True) as conn:
            return await fn(conn)

    def _changed(self, action: str, tenant: str, base_model: str = "") -> None:
        self.metrics.state_changes.labels(action, tenant, base_model).inc()

    # ------------------------------------------------------------------ tenants

    async def CreateTenant(
        self, request: registry_pb2.CreateTenantRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.CreateTenantResponse:
        tenant = await self._change(context, "tenant.create", lambda c, ctx: tenants.create_tenant(
            c, ctx, tenant_id=request.tenant_id, display_name=request.display_name,
            default_priority=request.default_priority))
        return registry_pb2.CreateTenantResponse(tenant=tenant)

    async def GetTenant(
        self, request: registry_pb2.GetTenantRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.GetTenantResponse:
        tenant = await self._read(lambda c: tenants.get_tenant(c, tenant_id=request.tenant_id))
        return registry_pb2.GetTenantResponse(tenant=tenant)

    async def ListTenants(
        self, request: registry_pb2.ListTenantsRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.ListTenantsResponse:
        found, token = await self._read(lambda c: tenants.list_tenants(
            c, size=request.page_size, token=request.page_token))
        return registry_pb2.ListTenantsResponse(tenants=found, next_page_token=token)

    async def SetTenantPriority(
        self, request: registry_pb2.SetTenantPriorityRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.SetTenantPriorityResponse:
        tenant = await self._change(context, "tenant.set_priority",
            lambda c, ctx: tenants.set_tenant_priority(
                c, ctx, tenant_id=request.tenant_id, priority=request.priority))
        return registry_pb2.SetTenantPriorityResponse(tenant=tenant)

    async def SetTenantQuota(
        self, request: registry_pb2.SetTenantQuotaRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.SetTenantQuotaResponse:
        quota = await self._write(context, lambda c, ctx: quotas.set_tenant_quota(
            c, ctx, tenant_id=request.tenant_id, adapter_name=request.adapter_name,
            max_in_flight=request.max_in_flight, tokens_per_s=request.tokens_per_s,
            clear=request.clear))
        self._changed("tenant.set_quota", request.tenant_id)
        return registry_pb2.SetTenantQuotaResponse(quota=quota)

    async def ListTenantQuotas(
        self, request: registry_pb2.ListTenantQuotasRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.ListTenantQuotasResponse:
        rows = await self._read(lambda c: quotas.list_tenant_quotas(
            c, tenant_id=request.tenant_id))
        return registry_pb2.ListTenantQuotasResponse(quotas=rows)

    # ------------------------------------------------------------------ keys

    async def CreateApiKey(
        self, request: registry_pb2.CreateApiKeyRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.CreateApiKeyResponse:
        info, secret = await self._write(context, lambda c, ctx: keys.create_api_key(
            c, ctx, tenant_id=request.tenant_id, description=request.description))
        self._changed("apikey.create", info.tenant_id)
        return registry_pb2.CreateApiKeyResponse(key=info, secret=secret)

    async def RevokeApiKey(
        self, request: registry_pb2.RevokeApiKeyRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.RevokeApiKeyResponse:
        info = await self._change(context, "apikey.revoke", lambda c, ctx: keys.revoke_api_key(
            c, ctx, tenant_id=request.tenant_id, key_id=request.key_id))
        return registry_pb2.RevokeApiKeyResponse(key=info)

    async def ListApiKeys(
        self, request: registry_pb2.ListApiKeysRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.ListApiKeysResponse:
        found = await self._read(lambda c: keys.list_api_keys(
            c, tenant_id=request.tenant_id, include_revoked=request.include_revoked))
        return registry_pb2.ListApiKeysResponse(keys=found)

    # ------------------------------------------------------------------ shares

    async def ShareAdapter(
        self, request: registry_pb2.ShareAdapterRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.ShareAdapterResponse:
        changed, grantees = await self._write(context, lambda c, ctx: shares.share_adapter(
            c, ctx, tenant_id=request.tenant_id, adapter_name=request.adapter_name,
            grantee_tenant_id=request.grantee_tenant_id))
        if changed:
            self._changed("adapter.share", request.tenant_id)
        return registry_pb2.ShareAdapterResponse(changed=changed, grantee_tenant_ids=grantees)

    async def UnshareAdapter(
        self, request: registry_pb2.UnshareAdapterRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.UnshareAdapterResponse:
        changed, grantees = await self._write(context, lambda c, ctx: shares.unshare_adapter(
            c, ctx, tenant_id=request.tenant_id, adapter_name=request.adapter_name,
            grantee_tenant_id=request.grantee_tenant_id))
        if changed:
            self._changed("adapter.unshare", request.tenant_id)
        return registry_pb2.UnshareAdapterResponse(changed=changed, grantee_tenant_ids=grantees)

    async def ListShares(
        self, request: registry_pb2.ListSharesRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.ListSharesResponse:
        found = await self._read(lambda c: shares.list_shares(
            c, tenant_id=request.tenant_id, adapter_name=request.adapter_name))
        return registry_pb2.ListSharesResponse(shares=found)

    # ------------------------------------------------------------------ versions

    async def RequestUpload(
        self, request: registry_pb2.RequestUploadRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.RequestUploadResponse:
        now = self.clock()
        plan = await self._read(lambda c: versions.request_upload(
            c, bucket=self.bucket, tenant_id=request.tenant_id,
            adapter_name=request.adapter_name, version=request.version,
            base_model=request.base_model,
            files=[(f.path, f.size_bytes, f.sha256) for f in request.files], now=now))
        resp = registry_pb2.RequestUploadResponse(
            bucket=plan.bucket, key_prefix=plan.key_prefix, artifact_uri=plan.artifact_uri,
            targets=[registry_pb2.UploadTarget(path=p, key=k) for p, k in plan.targets],
        )
        resp.expires_at.FromDatetime(plan.expires_at)
        return resp

    async def RegisterVersion(
        self, request: registry_pb2.RegisterVersionRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.RegisterVersionResponse:
        stored, created = await self._write(context, lambda c, ctx: versions.register_version(
            c, ctx, record=request.version, bucket=self.bucket))
        if created:
            self.metrics.registrations.labels(stored.tenant_id, stored.base_model).inc()
            self._changed("version.register", stored.tenant_id, stored.base_model)
        return registry_pb2.RegisterVersionResponse(version=stored)

    async def GetVersion(
        self, request: registry_pb2.GetVersionRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.GetVersionResponse:
        version = await self._read(lambda c: versions.get_version(
            c, tenant_id=request.tenant_id, adapter_name=request.adapter_name,
            version=request.version))
        return registry_pb2.GetVersionResponse(version=version)

    async def ListVersions(
        self, request: registry_pb2.ListVersionsRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.ListVersionsResponse:
        found, token = await self._read(lambda c: versions.list_versions(
            c, tenant_id=request.tenant_id, adapter_name=request.adapter_name,
            base_model=request.base_model, status=request.status, size=request.page_size,
            token=request.page_token))
        return registry_pb2.ListVersionsResponse(versions=found, next_page_token=token)

    # ------------------------------------------------------------------ releases

    async def Promote(
        self, request: registry_pb2.PromoteRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.PromoteResponse:
        release = await self._change(context, "release.promote", lambda c, ctx: releases.promote(
            c, ctx, tenant_id=request.tenant_id, adapter_name=request.adapter_name,
            version=request.version, reason=request.reason))
        return registry_pb2.PromoteResponse(release=release)

    async def SetCanary(
        self, request: registry_pb2.SetCanaryRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.SetCanaryResponse:
        release = await self._change(context, "release.canary", lambda c, ctx: releases.set_canary(
            c, ctx, tenant_id=request.tenant_id, adapter_name=request.adapter_name,
            version=request.version, percent=request.percent, reason=request.reason))
        return registry_pb2.SetCanaryResponse(release=release)

    async def PauseCanary(
        self, request: registry_pb2.PauseCanaryRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.PauseCanaryResponse:
        release = await self._write(context, lambda c, ctx: releases.pause_canary(
            c, ctx, tenant_id=request.tenant_id, adapter_name=request.adapter_name,
            paused=request.paused, reason=request.reason))
        return registry_pb2.PauseCanaryResponse(release=release)

    async def Rollback(
        self, request: registry_pb2.RollbackRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.RollbackResponse:
        release = await self._change(context, "release.rollback", lambda c, ctx: releases.rollback(
            c, ctx, tenant_id=request.tenant_id, adapter_name=request.adapter_name,
            to_version=request.to_version, reason=request.reason, withdraw=request.withdraw))
        return registry_pb2.RollbackResponse(release=release)

    async def ClearCanary(
        self, request: registry_pb2.ClearCanaryRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.ClearCanaryResponse:
        release = await self._change(context, "release.canary_clear",
            lambda c, ctx: releases.clear_canary(
                c, ctx, tenant_id=request.tenant_id, adapter_name=request.adapter_name,
                version=request.version, reason=request.reason))
        return registry_pb2.ClearCanaryResponse(release=release)

    async def WithdrawVersion(
        self, request: registry_pb2.WithdrawVersionRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.WithdrawVersionResponse:
        version = await self._change(context, "version.withdraw",
            lambda c, ctx: releases.withdraw_version(
                c, ctx, tenant_id=request.tenant_id, adapter_name=request.adapter_name,
                version=request.version, reason=request.reason))
        return registry_pb2.WithdrawVersionResponse(version=version)

    async def Retire(
        self, request: registry_pb2.RetireRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.RetireResponse:
        version = await self._change(context, "version.retire", lambda c, ctx: releases.retire(
            c, ctx, tenant_id=request.tenant_id, adapter_name=request.adapter_name,
            version=request.version, reason=request.reason))
        return registry_pb2.RetireResponse(version=version)

    async def GetRelease(
        self, request: registry_pb2.GetReleaseRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.GetReleaseResponse:
        release = await self._read(lambda c: releases.get_release(
            c, tenant_id=request.tenant_id, adapter_name=request.adapter_name))
        return registry_pb2.GetReleaseResponse(release=release)

    # ------------------------------------------------------------------ audit

    async def ListAudit(
        self, request: registry_pb2.ListAuditRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.ListAuditResponse:
        since = request.since.ToDatetime(tzinfo=UTC) if request.HasField("since") else None
        until = request.until.ToDatetime(tzinfo=UTC) if request.HasField("until") else None
        entries, token = await self._read(lambda c: audit.list_entries(
            c, subject_prefix=request.subject_prefix, actor=request.actor,
            action=request.action, since=since, until=until, size=request.page_size,
            token=request.page_token))
        return registry_pb2.ListAuditResponse(entries=entries, next_page_token=token)
