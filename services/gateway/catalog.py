"""The adapter view: adapter names → release pointers and immutable versions.

Fed by ``adapter.lifecycle`` (promote / canary / rollback / retire) and
``adapter.admissions`` (the version's engine id, digest, rank and artifact
location), bootstrapped from the registry's admin API at start
(:mod:`loraplane.gateway.bootstrap`). Pointer changes are last-writer-wins on the
event time, so replaying old events after a bootstrap never moves a pointer back.

Access rules (:meth:`AdapterCatalog.lookup`): a tenant may use its own adapters and
the adapters explicitly shared with it; a name that exists only under another
tenant is PERMISSION_DENIED, a name that exists nowhere NOT_FOUND.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from loraplane.gateway.resolution import ReleaseView
from loraplane.shared.errors import InvalidArgument, NotFound, PermissionDenied
from loraplane.v1 import common_pb2, events_pb2

_STATUS_RANK: dict[int, int] = {
    common_pb2.VERSION_STATUS_UNSPECIFIED: 0,
    common_pb2.VERSION_STATUS_PENDING: 1,
    common_pb2.VERSION_STATUS_ADMITTED: 2,
    common_pb2.VERSION_STATUS_ACTIVE: 3,
    common_pb2.VERSION_STATUS_CANARY: 3,
    common_pb2.VERSION_STATUS_REJECTED: 9,
    common_pb2.VERSION_STATUS_RETIRED: 9,
}


class AdapterNotFound(NotFound):
    """No adapter of that name is visible to the tenant (or it has no released version)."""

    code = "adapter_not_found"


class AdapterForbidden(PermissionDenied):
    """The adapter belongs to another tenant and is not shared with the caller."""

    code = "adapter_forbidden"


@dataclass(frozen=True, slots=True)
class VersionInfo:
    """What the gateway needs to route one immutable adapter version."""

    tenant_id: str
    """Owning tenant."""
    name: str
    """Adapter name."""
    version: str
    """Version label."""
    base_model: str = ""
    """Base model."""
    engine_id: int = 0
    """Registry's stable integer id (engine lora_int_id)."""
    sha256: str = ""
    """Manifest digest the worker checks."""
    rank: int = 0
    """LoRA rank r."""
    artifact_uri: str = ""
    """Artifact root in object storage (for a cold load on the worker)."""
    size_bytes: int = 0
    """Artifact size."""
    status: int = common_pb2.VERSION_STATUS_UNSPECIFIED
    """Registry status as last seen."""
    withdrawn: str = ""
    """Why the canary analysis withdrew it ("" = not withdrawn): its requests are refused."""

    @property
    def complete(self) -> bool:
        """Whether a worker can load it (digest, location, rank and engine id known)."""
        return bool(self.sha256 and self.artifact_uri and self.rank and self.engine_id)

    @property
    def retired(self) -> bool:
        """Retired or rejected versions never receive traffic."""
        return self.status in (common_pb2.VERSION_STATUS_RETIRED, common_pb2.VERSION_STATUS_REJECTED)

    def ref(self) -> common_pb2.AdapterRef:
        """The protobuf reference of this version."""
        return common_pb2.AdapterRef(
            tenant_id=self.tenant_id,
            adapter_name=self.name,
            version=self.version,
            base_model=self.base_model,
        )

    def merged(self, other: VersionInfo) -> VersionInfo:
        """This record completed with the fields ``other`` knows (status only moves on)."""
        status = self.status
        if _STATUS_RANK.get(other.status, 0) >= _STATUS_RANK.get(status, 0):
            status = other.status
        return replace(
            self,
            base_model=other.base_model or self.base_model,
            engine_id=other.engine_id or self.engine_id,
            sha256=other.sha256 or self.sha256,
            rank=other.rank or self.rank,
            artifact_uri=other.artifact_uri or self.artifact_uri,
            size_bytes=other.size_bytes or self.size_bytes,
            status=status,
            withdrawn=other.withdrawn or self.withdrawn,
        )


@dataclass(slots=True)
class _Adapter:
    release: ReleaseView
    base_model: str = ""
    updated_at: float = 0.0
    versions: dict[str, VersionInfo] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AdapterEntry:
    """A visible adapter: its pointers, versions and base model."""

    release: ReleaseView
    """Release pointers."""
    versions: Mapping[str, VersionInfo]
    """Known versions by label."""
    base_model: str
    """Base model of the stable version."""


def _ts(meta: common_pb2.EventMeta) -> float:
    return float(meta.occurred_at.seconds) + float(meta.occurred_at.nanos) / 1e9


class AdapterCatalog:
    """Adapter names of every tenant, with release pointers, versions and shares."""

    def __init__(self, shares: Mapping[str, Iterable[str]] | None = None) -> None:
        """``shares``: tenant → adapter ids ``owner/name`` shared with it."""
        self._adapters: dict[tuple[str, str], _Adapter] = {}
        self._owners: dict[str, set[str]] = {}
        self._shares: dict[str, dict[str, list[tuple[str, str]]]] = {}
        self._static: set[tuple[str, str, str]] = set()
        """(owner, name, tenant) from settings: a registry unshare does not remove them."""
        for tenant, ids in (shares or {}).items():
            for adapter_id in ids:
                owner, _, name = adapter_id.partition("/")
                self.share(owner, name, tenant)
                self._static.add((owner, name, tenant))
        self.events_applied = 0
        """Events applied (readiness, tests)."""

    # ------------------------------------------------------------------ updates

    def share(self, owner: str, name: str, with_tenant: str) -> None:
        """Let ``with_tenant`` use ``owner``'s adapter ``name`` (by that name)."""
        by_name = self._shares.setdefault(with_tenant, {})
        pairs = by_name.setdefault(name, [])
        if (owner, name) not in pairs:
            pairs.append((owner, name))

    def unshare(self, owner: str, name: str, with_tenant: str) -> None:
        """End a share (idempotent; static shares from settings stay)."""
        if (owner, name, with_tenant) in self._static:
            return
        by_name = self._shares.get(with_tenant, {})
        pairs = by_name.get(name, [])
        if (owner, name) in pairs:
            pairs.remove((owner, name))
            if not pairs:
                del by_name[name]

    def apply_tenant_event(self, event: events_pb2.TenantEvent) -> None:
        """Apply the share changes of ``tenant.events`` (other arms are the auth view's)."""
        if event.WhichOneof("event") != "adapter_share_changed":
            return
        c = event.adapter_share_changed
        if c.shared:
            self.share(c.tenant_id, c.adapter_name, c.grantee_tenant_id)
        else:
            self.unshare(c.tenant_id, c.adapter_name, c.grantee_tenant_id)
        self.events_applied += 1

    def _adapter(self, tenant_id: str, name: str) -> _Adapter:
        key = (tenant_id, name)
        adapter = self._adapters.get(key)
        if adapter is None:
            adapter = _Adapter(ReleaseView(tenant_id, name, ""))
            self._adapters[key] = adapter
            self._owners.setdefault(name, set()).add(tenant_id)
        return adapter

    def upsert_version(self, info: VersionInfo) -> None:
        """Know (or complete) a version record."""
        adapter = self._adapter(info.tenant_id, info.name)
        old = adapter.versions.get(info.version)
        adapter.versions[info.version] = info if old is None else old.merged(info)
        if not adapter.base_model and info.base_model:
            adapter.base_model = info.base_model

    def set_release(
        self,
        tenant_id: str,
        name: str,
        *,
        stable: str,
        canary: str = "",
        canary_percent: int = 0,
        canary_cleared: bool = True,
        base_model: str = "",
        at: float = 0.0,
    ) -> bool:
        """Set the pointers unless newer ones are known (``at``: seconds since the epoch).

        Returns whether the pointers were applied.
        """
        adapter = self._adapter(tenant_id, name)
        if at < adapter.updated_at:
            return False
        adapter.release = ReleaseView(tenant_id, name, stable, canary, canary_percent,
                                      canary_cleared)
        adapter.updated_at = at
        if base_model:
            adapter.base_model = base_model
        return True

    def _pointers(self, tenant_id: str, name: str, at: float, **changes: object) -> None:
        adapter = self._adapter(tenant_id, name)
        if at < adapter.updated_at:
            return
        adapter.release = replace(adapter.release, **changes)  # type: ignore[arg-type]
        adapter.updated_at = at

    def set_withdrawn(self, tenant_id: str, name: str, version: str, reason: str) -> None:
        """Mark a version withdrawn by the canary analysis (``reason`` "" ends it)."""
        adapter = self._adapter(tenant_id, name)
        info = adapter.versions.get(version)
        if info is not None:
            adapter.versions[version] = replace(info, withdrawn=reason)
        elif reason:
            adapter.versions[version] = VersionInfo(tenant_id, name, version, withdrawn=reason)

    def apply_lifecycle(self, event: events_pb2.LifecycleEvent) -> None:
        """Apply one ``adapter.lifecycle`` event."""
        arm = event.WhichOneof("event")
        self.events_applied += 1
        if arm is None:
            return
        inner = getattr(event, arm)
        ref = inner.meta.adapter
        at = _ts(inner.meta)
        t, n = ref.tenant_id, ref.adapter_name
        if arm == "promoted":
            self.upsert_version(
                VersionInfo(t, n, ref.version, ref.base_model, inner.engine_id,
                            status=common_pb2.VERSION_STATUS_ACTIVE)
            )
            release = self._adapter(t, n).release
            canary = "" if release.canary == ref.version else release.canary
            percent = 0 if not canary else release.canary_percent
            self._pointers(t, n, at, stable=ref.version, canary=canary, canary_percent=percent)
            self.set_withdrawn(t, n, ref.version, "")  # a person made it stable again
            if ref.base_model:
                self._adapter(t, n).base_model = ref.base_model
        elif arm == "canary_changed":
            if inner.canary_version:
                self.upsert_version(
                    VersionInfo(t, n, inner.canary_version, ref.base_model, inner.engine_id)
                )
            self._pointers(
                t, n, at, canary=inner.canary_version,
                canary_percent=int(inner.percent) if inner.canary_version else 0,
                canary_cleared=inner.cleared or not inner.canary_version,
            )
            if inner.canary_version and inner.previous != inner.canary_version:
                self.set_withdrawn(t, n, inner.canary_version, "")
        elif arm == "rolled_back":
            self.upsert_version(VersionInfo(t, n, inner.to_version, ref.base_model, inner.engine_id))
            self._pointers(t, n, at, stable=inner.to_version)
            self.set_withdrawn(t, n, inner.to_version, "")
        elif arm == "withdrawn":
            self.set_withdrawn(t, n, ref.version, inner.reason or "withdrawn")
        elif arm == "retired":
            self.upsert_version(
                VersionInfo(t, n, ref.version, ref.base_model, inner.engine_id,
                            status=common_pb2.VERSION_STATUS_RETIRED)
            )
            if self._adapter(t, n).release.canary == ref.version:
                self._pointers(t, n, at, canary="", canary_percent=0)

    def apply_admission(self, event: events_pb2.AdmissionEvent) -> None:
        """Apply one ``adapter.admissions`` verdict (an admitted version becomes routable)."""
        arm = event.WhichOneof("verdict")
        self.events_applied += 1
        if arm == "admitted":
            a = event.admitted
            ref = a.meta.adapter
            self.upsert_version(
                VersionInfo(
                    ref.tenant_id, ref.adapter_name, ref.version, ref.base_model,
                    engine_id=a.engine_id, sha256=a.sha256, rank=a.rank,
                    artifact_uri=a.artifact_uri, size_bytes=a.size_bytes,
                    status=common_pb2.VERSION_STATUS_ADMITTED,
                )
            )
        elif arm == "rejected":
            r = event.rejected
            ref = r.meta.adapter
            self.upsert_version(
                VersionInfo(ref.tenant_id, ref.adapter_name, ref.version, ref.base_model,
                            engine_id=r.engine_id, status=common_pb2.VERSION_STATUS_REJECTED)
            )

    # ------------------------------------------------------------------ reads

    def lookup(self, tenant_id: str, name: str) -> AdapterEntry:
        """The adapter ``name`` as seen by ``tenant_id``; raises NotFound / PermissionDenied.

        The tenant's own adapter of that name wins once it is released (stable or canary);
        until then a share of that name keeps working (an upload of the same name must not
        break a working share)."""
        own = self._adapters.get((tenant_id, name))
        if own is not None and (own.release.stable or own.release.canary):
            return AdapterEntry(own.release, own.versions, own.base_model)
        candidates = self._shares.get(tenant_id, {}).get(name, [])
        visible = [self._adapters[k] for k in candidates if k in self._adapters]
        if len(visible) > 1:
            owners = sorted(a.release.tenant_id for a in visible)
            raise InvalidArgument(f"adapter name {name!r} is shared by several owners {owners}")
        adapter = visible[0] if visible else own
        if adapter is None:
            if self._owners.get(name):
                raise AdapterForbidden(f"adapter {name!r} is not available to tenant {tenant_id}")
            raise AdapterNotFound(f"adapter {name!r} not found")
        return AdapterEntry(adapter.release, adapter.versions, adapter.base_model)

    def version(self, tenant_id: str, name: str, version: str) -> VersionInfo | None:
        """One known version record."""
        adapter = self._adapters.get((tenant_id, name))
        return None if adapter is None else adapter.versions.get(version)

    def visible_to(self, tenant_id: str) -> list[AdapterEntry]:
        """Adapters ``tenant_id`` may call that have a stable version, own first, by name."""
        own = [a for (t, _), a in self._adapters.items() if t == tenant_id]
        shared = [
            self._adapters[k]
            for pairs in self._shares.get(tenant_id, {}).values()
            for k in pairs
            if k in self._adapters
        ]
        own_names = {a.release.name for a in own if a.release.stable}
        shared = [a for a in shared if a.release.name not in own_names]  # own wins
        out = [a for a in own + shared if a.release.stable]
        return [
            AdapterEntry(a.release, a.versions, a.base_model)
            for a in sorted(out, key=lambda a: (a.release.tenant_id != tenant_id, a.release.name))
        ]

    def incomplete(self) -> list[tuple[str, str, str]]:
        """Versions referenced by a pointer whose routing details are unknown (to repair)."""
        out = []
        for (t, n), a in self._adapters.items():
            for v in {a.release.stable, a.release.canary} - {""}:
                info = a.versions.get(v)
                if info is None or not info.complete:
                    out.append((t, n, v))
        return sorted(out)


def timestamp_seconds(value: datetime | None) -> float:
    """Seconds since the epoch of an aware datetime (0 for ``None``)."""
    return 0.0 if value is None else value.timestamp()
