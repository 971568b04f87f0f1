"""Bootstrap of the views from the services that own the truth, and repairs.

At start the gateway reads every adapter version and release pointer from the
registry (``ListVersions`` + ``GetRelease``) and every worker's last state from the
cache manager (``ListWorkers``), so a restarted gateway routes correctly even if
the broker lost old events. :class:`VersionRepair` fetches, off the request path,
a version whose routing details the events did not bring (``GetVersion``).
API keys are not bootstrapped here: the registry never hands out key hashes, and
``tenant.events`` is replayed from the beginning instead (see :mod:`.consumers`).
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from loraplane.gateway.catalog import AdapterCatalog, VersionInfo
from loraplane.gateway.placement import PlacementView
from loraplane.v1 import cache_pb2, cache_pb2_grpc, common_pb2, registry_pb2, registry_pb2_grpc

log = logging.getLogger(__name__)

PAGE_SIZE = 500
"""Page size of ``ListVersions``."""
_NEVER_ROUTED = frozenset({
    common_pb2.VERSION_STATUS_UNSPECIFIED,
    common_pb2.VERSION_STATUS_PENDING,
    common_pb2.VERSION_STATUS_REJECTED,
})


def _metadata(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"), ("x-loraplane-actor", "gateway")) if token else ()


def version_info(v: registry_pb2.AdapterVersion) -> VersionInfo:
    """The gateway's record of a registry version."""
    return VersionInfo(
        tenant_id=v.tenant_id,
        name=v.name,
        version=v.version,
        base_model=v.base_model,
        engine_id=v.engine_id,
        sha256=v.sha256,
        rank=v.rank,
        artifact_uri=v.artifact_uri,
        size_bytes=v.size_bytes,
        status=v.status,
        withdrawn=v.withdrawn_reason,
    )


async def bootstrap_catalog(
    channel: grpc.aio.Channel, catalog: AdapterCatalog, *, token: str, timeout_s: float
) -> int:
    """Load every version and release pointer from the registry; returns the adapter count."""
    stub = registry_pb2_grpc.RegistryAdminStub(channel)
    md = _metadata(token)
    names: set[tuple[str, str]] = set()
    page = ""
    while True:
        resp = await stub.ListVersions(
            registry_pb2.ListVersionsRequest(page_size=PAGE_SIZE, page_token=page),
            metadata=md, timeout=timeout_s,
        )
        for v in resp.versions:
            if v.status in _NEVER_ROUTED:
                continue
            catalog.upsert_version(version_info(v))
            names.add((v.tenant_id, v.name))
        page = resp.next_page_token
        if not page:
            break
    for tenant_id, name in sorted(names):
        try:
            rel = (
                await stub.GetRelease(
                    registry_pb2.GetReleaseRequest(tenant_id=tenant_id, adapter_name=name),
                    metadata=md, timeout=timeout_s,
                )
            ).release
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                continue
            raise
        catalog.set_release(
            tenant_id, name,
            stable=rel.stable_version, canary=rel.canary_version,
            canary_percent=int(rel.canary_percent), canary_cleared=rel.canary_cleared,
            base_model=rel.base_model,
            at=rel.updated_at.seconds + rel.updated_at.nanos / 1e9,
        )
    return len(names)


async def bootstrap_placement(
    channel: grpc.aio.Channel, placement: PlacementView, *, timeout_s: float
) -> int:
    """Load every worker's last state from the cache manager; returns the worker count."""
    stub = cache_pb2_grpc.CacheManagerStub(channel)
    resp = await stub.ListWorkers(cache_pb2.ListWorkersRequest(), timeout=timeout_s)
    for info in resp.workers:
        at = info.last_seen.seconds + info.last_seen.nanos / 1e9
        placement.apply_state(info.state, at, alive=info.alive)
    return len(resp.workers)


class VersionRepair:
    """Fetches incomplete versions from the registry in the background (deduplicated)."""

    def __init__(
        self, channel: grpc.aio.Channel, catalog: AdapterCatalog, *, token: str,
        timeout_s: float = 5.0,
    ) -> None:
        """Repairs go through ``channel`` to the registry."""
        self._stub = registry_pb2_grpc.RegistryAdminStub(channel)
        self._catalog = catalog
        self._md = _metadata(token)
        self._timeout = timeout_s
        self._running: set[tuple[str, str, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def __call__(self, tenant_id: str, name: str, version: str) -> None:
        """Schedule a fetch of one version (no-op while one is running)."""
        key = (tenant_id, name, version)
        if key in self._running:
            return
        self._running.add(key)
        task = asyncio.get_running_loop().create_task(self._fetch(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _fetch(self, key: tuple[str, str, str]) -> None:
        try:
            resp = await self._stub.GetVersion(
                registry_pb2.GetVersionRequest(tenant_id=key[0], adapter_name=key[1],
                                               version=key[2]),
                metadata=self._md, timeout=self._timeout,
            )
            self._catalog.upsert_version(version_info(resp.version))
        except grpc.aio.AioRpcError as err:
            log.warning("repair of %s failed: %s", "/".join(key), err.code().name)
        finally:
            self._running.discard(key)
