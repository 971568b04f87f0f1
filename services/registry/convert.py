"""Conversions between database rows, protobuf messages and audit JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from google.protobuf import json_format

from loraplane.registry.status import Status
from loraplane.v1 import common_pb2, events_pb2, registry_pb2

PRIORITY_TO_DB: Mapping[int, str] = {
    common_pb2.PRIORITY_PLATINUM: "platinum",
    common_pb2.PRIORITY_GOLD: "gold",
    common_pb2.PRIORITY_SILVER: "silver",
    common_pb2.PRIORITY_BRONZE: "bronze",
}
"""Proto ``Priority`` → database ``priority`` label."""
PRIORITY_FROM_DB: Mapping[str, common_pb2.Priority] = {
    "platinum": common_pb2.PRIORITY_PLATINUM,
    "gold": common_pb2.PRIORITY_GOLD,
    "silver": common_pb2.PRIORITY_SILVER,
    "bronze": common_pb2.PRIORITY_BRONZE,
}

STATUS_TO_PROTO: Mapping[Status, common_pb2.VersionStatus] = {
    Status.PENDING: common_pb2.VERSION_STATUS_PENDING,
    Status.ADMITTED: common_pb2.VERSION_STATUS_ADMITTED,
    Status.REJECTED: common_pb2.VERSION_STATUS_REJECTED,
    Status.ACTIVE: common_pb2.VERSION_STATUS_ACTIVE,
    Status.CANARY: common_pb2.VERSION_STATUS_CANARY,
    Status.RETIRED: common_pb2.VERSION_STATUS_RETIRED,
}
STATUS_FROM_PROTO: Mapping[int, Status] = {int(v): k for k, v in STATUS_TO_PROTO.items()}

PRIORITY_NAMES: Mapping[str, common_pb2.Priority] = PRIORITY_FROM_DB
"""CLI spelling of priorities (the database labels)."""


def priority_db(value: int) -> str | None:
    """Database label of a proto priority; ``None`` for PRIORITY_UNSPECIFIED."""
    return PRIORITY_TO_DB.get(value)


def priority_proto(label: str | None) -> common_pb2.Priority:
    """Proto priority of a database label (``None`` → PRIORITY_UNSPECIFIED)."""
    return PRIORITY_FROM_DB[label] if label else common_pb2.PRIORITY_UNSPECIFIED


def ts(dt: datetime | None, into: Any) -> None:
    """Copy an aware datetime into a ``Timestamp`` field (no-op for ``None``)."""
    if dt is not None:
        into.FromDatetime(dt)


def tenant_pb(row: Mapping[str, Any]) -> registry_pb2.Tenant:
    """``tenants`` row → ``Tenant``."""
    t = registry_pb2.Tenant(
        tenant_id=row["tenant_id"],
        display_name=row["display_name"],
        default_priority=priority_proto(row["default_priority"]),
    )
    ts(row["created_at"], t.created_at)
    return t


def api_key_pb(row: Mapping[str, Any]) -> registry_pb2.ApiKeyInfo:
    """``api_keys`` row → ``ApiKeyInfo`` (never the hash)."""
    k = registry_pb2.ApiKeyInfo(
        key_id=row["key_id"],
        tenant_id=row["tenant_id"],
        prefix=row["prefix"],
        description=row["description"],
    )
    ts(row["created_at"], k.created_at)
    ts(row["revoked_at"], k.revoked_at)
    return k


def reasons_pb(reasons: Sequence[Mapping[str, Any]]) -> list[events_pb2.RejectionReason]:
    """Stored reasons (JSON) → ``RejectionReason`` messages."""
    out = []
    for r in reasons:
        code = r.get("code", "REJECTION_CODE_UNSPECIFIED")
        if code not in events_pb2.RejectionCode.DESCRIPTOR.values_by_name:  # unknown here
            code = "REJECTION_CODE_UNSPECIFIED"
        out.append(events_pb2.RejectionReason(
            code=code, message=r.get("message", ""), path=r.get("path", "")
        ))
    return out


def reasons_json(reasons: Sequence[events_pb2.RejectionReason]) -> list[dict[str, str]]:
    """``RejectionReason`` messages → JSON stored in ``adapter_versions.reasons``."""
    return [
        {
            "code": events_pb2.RejectionCode.Name(r.code),
            "message": r.message,
            "path": r.path,
        }
        for r in reasons
    ]


def files_json(files: Sequence[events_pb2.ArtifactFile]) -> list[dict[str, Any]]:
    """``ArtifactFile`` messages → JSON, sorted by path."""
    return [
        {"path": f.path, "size_bytes": f.size_bytes, "sha256": f.sha256}
        for f in sorted(files, key=lambda f: f.path)
    ]


def files_pb(files: Sequence[Mapping[str, Any]]) -> list[events_pb2.ArtifactFile]:
    """Stored file JSON → ``ArtifactFile`` messages."""
    return [
        events_pb2.ArtifactFile(
            path=f["path"], size_bytes=int(f["size_bytes"]), sha256=f["sha256"]
        )
        for f in files
    ]


VERSION_COLUMNS = """
    v.adapter_id, a.tenant_id, a.name, v.version, v.base_model, v.rank, v.format,
    v.target_modules, v.artifact_uri, v.sha256, v.size_bytes, v.signature_uri,
    v.signer_identity, v.tokenizer_revision, v.status, v.priority_override,
    v.engine_id, v.created_at, v.admitted_at, v.retired_at, v.reasons, v.files,
    v.lora_alpha, v.created_by, v.withdrawn_reason,
    coalesce(v.priority_override, a.priority_override, t.default_priority) AS effective_priority
"""
"""Columns of a version record; use with :data:`VERSION_FROM`."""
VERSION_FROM = """
    adapter_versions v
    JOIN adapters a ON a.adapter_id = v.adapter_id
    JOIN tenants t ON t.tenant_id = a.tenant_id
"""


def version_pb(row: Mapping[str, Any]) -> registry_pb2.AdapterVersion:
    """Version row (:data:`VERSION_COLUMNS`) → ``AdapterVersion``."""
    v = registry_pb2.AdapterVersion(
        adapter_id=row["adapter_id"],
        tenant_id=row["tenant_id"],
        name=row["name"],
        version=row["version"],
        base_model=row["base_model"],
        rank=row["rank"],
        format=row["format"],
        target_modules=list(row["target_modules"]),
        artifact_uri=row["artifact_uri"],
        sha256=row["sha256"],
        size_bytes=row["size_bytes"],
        signature_uri=row["signature_uri"],
        signer_identity=row["signer_identity"],
        tokenizer_revision=row["tokenizer_revision"],
        status=STATUS_TO_PROTO[Status(row["status"])],
        priority=priority_proto(row["priority_override"]),
        engine_id=row["engine_id"],
        reasons=reasons_pb(row["reasons"] or []),
        files=files_pb(row["files"] or []),
        lora_alpha=float(row["lora_alpha"]),
        effective_priority=priority_proto(row["effective_priority"]),
        withdrawn_reason=row["withdrawn_reason"],
    )
    ts(row["created_at"], v.created_at)
    ts(row["admitted_at"], v.admitted_at)
    return v


def adapter_ref(row: Mapping[str, Any]) -> common_pb2.AdapterRef:
    """Version row → ``AdapterRef``."""
    return common_pb2.AdapterRef(
        tenant_id=row["tenant_id"],
        adapter_name=row["name"],
        version=row["version"],
        base_model=row["base_model"],
    )


def to_json(msg: Any) -> dict[str, Any]:
    """A protobuf message as a JSON object (field names as in the proto)."""
    out: dict[str, Any] = json_format.MessageToDict(msg, preserving_proto_field_name=True)
    return out


def dumps(obj: Any) -> str:
    """Compact JSON text ("" for ``None``)."""
    return "" if obj is None else json.dumps(obj, sort_keys=True, separators=(",", ":"))
