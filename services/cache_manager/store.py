"""Postgres I/O of the cache manager: registry reads, statistics and worker directory.

The registry is read **read-only through SQL** on the same database (tables
``adapter_versions``, ``adapters``, ``tenants``, ``release_pointers``): the cache
manager needs every version with its status, engine id, artifact and effective
priority at bootstrap and every refresh, which is one indexed query here and
would be many paged RPCs through the registry API. The registry stays the only
writer of those tables.

The cache manager's own tables (migration ``20261129200000_cache_manager.sql``)
are scoped by *deployment* (the consumer group name) and written by the leader only:
``cache_version_stats`` (heat statistics, so a new leader does not see every version
as idle) and ``cache_workers`` (where to ask for each worker's state at takeover).

What the canary analysis took out of HOT is not kept here: the registry keeps it (the audit
entry of each abort and withdrawal, ``adapter_versions.withdrawn_reason``), and a new leader
rebuilds its loading blocks from it (:func:`taken_out`, :func:`withdrawn`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import asyncpg

from loraplane.cache_manager.model import (
    ABORTED,
    ACTOR,
    REASON_PREFIX,
    WITHDRAWN,
    Pointers,
    Ref,
    Status,
    TakenOut,
    VersionRecord,
    priority_from_text,
    version_id,
)
from loraplane.policy.stats import DEFAULT_WARM_TAU_S, VersionStats

_VERSIONS_SQL = """
SELECT a.tenant_id, a.name, v.version, v.base_model, v.engine_id, v.rank, v.artifact_uri,
       v.sha256, v.size_bytes, v.status::text AS status,
       COALESCE(v.priority_override, a.priority_override, t.default_priority)::text AS priority
FROM adapter_versions v
JOIN adapters a ON a.adapter_id = v.adapter_id
JOIN tenants t ON t.tenant_id = a.tenant_id
WHERE v.status <> 'pending'
"""

_POINTERS_SQL = """
SELECT adapter_id, stable_version, canary_version, canary_percent, rollback_to, stable_history
FROM release_pointers
"""


def _status(text: str) -> Status:
    try:
        return Status(text)
    except ValueError:
        return Status.UNKNOWN


def _record(row: Mapping[str, Any]) -> VersionRecord:
    return VersionRecord(
        ref=Ref(row["tenant_id"], row["name"], row["version"], row["base_model"]),
        status=_status(row["status"]),
        engine_id=int(row["engine_id"]),
        artifact_uri=row["artifact_uri"],
        sha256=row["sha256"],
        size_bytes=int(row["size_bytes"]),
        rank=int(row["rank"]),
        priority=priority_from_text(row["priority"]),
    )


def _pointers(row: Mapping[str, Any]) -> Pointers:
    history = list(row["stable_history"] or [])
    return Pointers(
        stable=row["stable_version"] or "",
        canary=row["canary_version"] or "",
        canary_percent=int(row["canary_percent"] or 0),
        rollback_to=row["rollback_to"] or "",
        previous_stable=history[-1] if history else "",
    )


async def read_registry(
    conn: asyncpg.Connection, tenants: frozenset[str] | None = None,
    base_models: frozenset[str] | None = None,
) -> tuple[list[VersionRecord], dict[str, Pointers]]:
    """Every non-pending version and every adapter's release pointers (of ``tenants``; for a
    shard, of ``base_models``: their versions, and the pointers of the adapters having one —
    a shard's canary analysis steps its own canaries only)."""
    sql = _VERSIONS_SQL
    args: list[list[str]] = []
    if tenants is not None:
        args.append(sorted(tenants))
        sql += f" AND a.tenant_id = ANY(${len(args)}::text[])"
    if base_models is not None:
        args.append(sorted(base_models))
        sql += f" AND v.base_model = ANY(${len(args)}::text[])"
    rows = await conn.fetch(sql, *args)
    where: list[str] = []
    pargs: list[list[str]] = []
    if tenants is not None:
        pargs.append(sorted(tenants))
        where.append(f"split_part(adapter_id, '/', 1) = ANY(${len(pargs)}::text[])")
    if base_models is not None:  # a shard: the adapters with a version of its base models
        pargs.append(sorted(base_models))
        where.append("adapter_id IN (SELECT adapter_id FROM adapter_versions "
                     f"WHERE base_model = ANY(${len(pargs)}::text[]))")
    psql = _POINTERS_SQL + (" WHERE " + " AND ".join(where) if where else "")
    prow = await conn.fetch(psql, *pargs)
    return [_record(r) for r in rows], {r["adapter_id"]: _pointers(r) for r in prow}


async def base_models(conn: asyncpg.Connection, tenants: frozenset[str] | None = None
                      ) -> list[str]:
    """The base models the registry has a non-pending version of (of ``tenants``): the
    shards of ``LORAPLANE_CACHE_MANAGER_SHARDS=*``."""
    sql = ("SELECT DISTINCT v.base_model FROM adapter_versions v "
           "JOIN adapters a ON a.adapter_id = v.adapter_id WHERE v.status <> 'pending'")
    if tenants is None:
        rows = await conn.fetch(sql)
    else:
        rows = await conn.fetch(sql + " AND a.tenant_id = ANY($1::text[])", sorted(tenants))
    return sorted(r["base_model"] for r in rows if r["base_model"])


def split_version_id(vid: str) -> tuple[str, str] | None:
    """``tenant/name@version`` → (adapter id, version); None when malformed."""
    adapter_id, sep, version = vid.rpartition("@")
    if not sep or "/" not in adapter_id or not version:
        return None
    return adapter_id, version


async def lookup_versions(
    conn: asyncpg.Connection, version_ids: Iterable[str]
) -> dict[str, VersionRecord | None]:
    """Registry records of the given versions (None: not in the registry, or pending)."""
    wanted = {vid: split_version_id(vid) for vid in version_ids}
    keys = [k for k in wanted.values() if k is not None]
    found: dict[str, VersionRecord] = {}
    if keys:
        rows = await conn.fetch(
            _VERSIONS_SQL + " AND (v.adapter_id, v.version) IN "
            "(SELECT * FROM unnest($1::text[], $2::text[]))",
            [k[0] for k in keys], [k[1] for k in keys],
        )
        for r in rows:
            rec = _record(r)
            found[rec.version_id] = rec
    return {vid: found.get(vid) for vid in wanted}


# --------------------------------------------------------------------------- taken out

_TAKEN_OUT_SQL = """
SELECT EXTRACT(EPOCH FROM at)::float8 AS at, action, subject, before, after FROM audit_log
WHERE at > now() - make_interval(secs => $1) AND actor = $2
  AND action IN ('release.canary', 'release.rollback', 'version.withdraw')
ORDER BY id
"""


def _json(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, dict) else {}


def taken_out_of(row: Mapping[str, Any]) -> TakenOut | None:
    """The version one audit entry of the canary analysis took out of HOT (None: the entry
    is another step — an advance, a promotion, a clearance — or not the analysis')."""
    before, after = _json(row["before"]), _json(row["after"])
    if row["action"] == "version.withdraw":
        version, reason = str(after.get("version") or ""), WITHDRAWN
        why = str(after.get("reason") or "")
    else:
        why = str(after.get("reason") or "")
        if not why.startswith(REASON_PREFIX):
            return None
        try:
            action = json.loads(why[len(REASON_PREFIX):]).get("action")
        except (ValueError, AttributeError):
            return None
        if row["action"] == "release.canary" and action == "abort":
            version, reason = str(before.get("canary_version") or ""), ABORTED
        elif row["action"] == "release.rollback" and action == "rollback":
            version, reason = str(before.get("stable_version") or ""), WITHDRAWN
        else:
            return None
    tenant, sep, name = str(row["subject"]).partition("/")
    if not (version and sep and tenant and name):
        return None
    return TakenOut(version_id(tenant, name, version), float(row["at"]), reason, why[:300])


async def taken_out(conn: asyncpg.Connection, within_s: float) -> list[TakenOut]:
    """The canary analysis' aborts and withdrawals of the last ``within_s`` seconds, oldest
    first, from the registry's audit log (written in the step's own transaction: a leader
    that died right after the step left it there)."""
    rows = await conn.fetch(_TAKEN_OUT_SQL, within_s, ACTOR)
    return [t for t in map(taken_out_of, rows) if t is not None]


async def withdrawn(conn: asyncpg.Connection) -> dict[str, str]:
    """Version id → reason of every version the canary analysis withdrew and no person has
    released again (``adapter_versions.withdrawn_reason``)."""
    rows = await conn.fetch("SELECT adapter_id, version, withdrawn_reason "
                            "FROM adapter_versions WHERE withdrawn_reason <> ''")
    return {f"{r['adapter_id']}@{r['version']}": r["withdrawn_reason"] for r in rows}


# --------------------------------------------------------------------------- statistics


def _restore(row: Mapping[str, Any], tau_s: float, tau_warm_s: float) -> VersionStats:
    st = VersionStats(tau_s, tau_warm_s)
    st.decayed_count = float(row["decayed_count"])
    st.decayed_count_warm = float(row["decayed_count_warm"])
    st.mean_gap_s = float(row["mean_gap_s"])
    st.as_of = float(row["as_of"])
    st.last_access = None if row["last_access"] is None else float(row["last_access"])
    st.requests = int(row["requests"])
    st.class_counts = [int(row["interactive"]), int(row["background"]), int(row["canary"])]
    st.loads = int(row["loads"])
    st.requests_after_load = int(row["requests_after_load"])
    st.errors_after_load = int(row["errors_after_load"])
    return st


async def load_stats(
    conn: asyncpg.Connection, deployment: str, tau_s: float,
    tau_warm_s: float = DEFAULT_WARM_TAU_S,
) -> dict[str, VersionStats]:
    """Every saved statistics row of the deployment."""
    rows = await conn.fetch("SELECT * FROM cache_version_stats WHERE deployment = $1", deployment)
    return {r["version_id"]: _restore(r, tau_s, tau_warm_s) for r in rows}


async def save_stats(
    conn: asyncpg.Connection, deployment: str, stats: Mapping[str, VersionStats]
) -> int:
    """Upsert the given statistics; returns the number of rows written."""
    if not stats:
        return 0
    rows = []
    for vid, st in stats.items():
        v = st.view()
        rows.append((deployment, vid, v.decayed_count, v.as_of, v.last_access, v.requests,
                     v.interactive, v.background, v.canary, v.loads, v.requests_after_load,
                     v.errors_after_load, v.decayed_count_warm, v.mean_gap_s))
    await conn.executemany(
        """
        INSERT INTO cache_version_stats (deployment, version_id, decayed_count, as_of,
            last_access, requests, interactive, background, canary, loads, requests_after_load,
            errors_after_load, decayed_count_warm, mean_gap_s, updated_at)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, now())
        ON CONFLICT (deployment, version_id) DO UPDATE SET decayed_count = EXCLUDED.decayed_count,
            as_of = EXCLUDED.as_of, last_access = EXCLUDED.last_access,
            requests = EXCLUDED.requests, interactive = EXCLUDED.interactive,
            background = EXCLUDED.background, canary = EXCLUDED.canary, loads = EXCLUDED.loads,
            requests_after_load = EXCLUDED.requests_after_load,
            errors_after_load = EXCLUDED.errors_after_load,
            decayed_count_warm = EXCLUDED.decayed_count_warm,
            mean_gap_s = EXCLUDED.mean_gap_s, updated_at = now()
        """,
        rows,
    )
    return len(rows)


# --------------------------------------------------------------------------- workers


async def load_workers(
    conn: asyncpg.Connection, deployment: str, *, max_age_s: float
) -> dict[str, str]:
    """Workers of the deployment seen within ``max_age_s`` → their WorkerInternal address."""
    rows = await conn.fetch(
        "SELECT worker_id, grpc_address FROM cache_workers "
        "WHERE deployment = $1 AND last_seen > now() - make_interval(secs => $2)",
        deployment, max_age_s,
    )
    return {r["worker_id"]: r["grpc_address"] for r in rows}


async def save_workers(
    conn: asyncpg.Connection, deployment: str, workers: Mapping[str, str]
) -> None:
    """Upsert alive workers (id → address) with ``last_seen = now()``."""
    if not workers:
        return
    await conn.executemany(
        """
        INSERT INTO cache_workers (deployment, worker_id, grpc_address, last_seen)
        VALUES ($1, $2, $3, now())
        ON CONFLICT (deployment, worker_id) DO UPDATE SET grpc_address = EXCLUDED.grpc_address,
            last_seen = now()
        """,
        [(deployment, w, a) for w, a in workers.items()],
    )
