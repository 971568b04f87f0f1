"""The cache manager's heat statistics survive a restart in PostgreSQL, every field."""

from __future__ import annotations

import asyncpg
from prometheus_client import CollectorRegistry

from loraplane.cache_manager import store
from loraplane.cache_manager.core import CacheCore
from loraplane.cache_manager.leader import CacheManagerService
from loraplane.cache_manager.rules import RulesConfig
from loraplane.cache_manager.settings import CacheManagerSettings
from loraplane.policy.config import load_config
from loraplane.policy.factory import make_policy
from loraplane.policy.model import RequestClass
from loraplane.policy.stats import VersionStats
from loraplane.shared.db import create_pool
from loraplane.shared.tls import CACHE_MANAGER
from loraplane.stack.stack import Stack
from tests.support import eventgen as ev
from tests.support.cache_manager import Registry
from tests.support.tls import tls_settings


async def test_stats_round_trip_keeps_warm_rate_and_gap(stack: Stack, unique: str) -> None:
    st = VersionStats(300.0, 3600.0)
    for t in (1000.0, 1002.0, 1003.0, 1010.0):
        st.record_request(t, RequestClass.INTERACTIVE)
    st.record_request(1011.0, RequestClass.BACKGROUND)
    before = st.view()
    assert before.mean_gap_s > 0 and before.decayed_count_warm > 0
    deployment = f"test-{unique}"
    conn = await asyncpg.connect(stack.settings.postgres_dsn)
    try:
        assert await store.save_stats(conn, deployment, {"acme/bot@v1": st}) == 1
        st.record_request(1020.0, RequestClass.CANARY)  # upsert: the newer row wins
        assert await store.save_stats(conn, deployment, {"acme/bot@v1": st}) == 1
        loaded = await store.load_stats(conn, deployment, 300.0, 3600.0)
    finally:
        await conn.close()
    assert list(loaded) == ["acme/bot@v1"]
    restored = loaded["acme/bot@v1"]
    assert restored.view() == st.view()  # every statistic, the WARM count and the gap included
    assert (restored.tau_s, restored.tau_warm_s) == (300.0, 3600.0)
    assert restored.view().rate_warm(1100.0, 3600.0) == st.view().rate_warm(1100.0, 3600.0) > 0



async def test_a_shard_flushes_its_own_versions_statistics_only(stack: Stack, unique: str) -> None:
    """Shards share the deployment's statistics rows: a shard's flush must not overwrite
    another base model's version (a worker's snapshot seeds its last use in every shard)."""
    deployment = f"test-{unique}"
    settings = CacheManagerSettings(postgres_dsn=stack.settings.postgres_dsn,
                                    cache_manager_consumer_group=deployment,
                                    **tls_settings(stack, CACHE_MANAGER))
    cfg = load_config()
    svc = CacheManagerService(settings, RulesConfig(), cfg, registry=CollectorRegistry(),
                              shard="base/a")
    core = CacheCore(policy=make_policy("heat", cfg), policy_config=cfg, rules=RulesConfig(),
                     worker_timeout_s=30, base_models=frozenset({"base/a"}))
    mine, other = ev.ref("mine", bm="base/a"), ev.ref("other", bm="base/b")
    t = 1_800_000_000.0
    core.apply(ev.admitted(mine, 1, t), t)
    core.apply(ev.admitted(other, 2, t), t)
    core.apply(ev.heat(mine, 3, t), t)
    w = ev.WorkerSpec("w1", base_models=("base/a", "base/b"),
                      held=[ev.Held(other, engine_id=2, last_used=t - 5)])
    core.apply(ev.snapshot(w, 1, t), t)
    assert set(core.state.stats) == {mine.version_id, other.version_id}
    pool = await create_pool(stack.settings.postgres_dsn, min_size=1, max_size=1)
    try:
        await svc._flush(core, pool)
        async with pool.acquire() as conn:
            saved = await store.load_stats(conn, deployment, 300.0, 3600.0)
    finally:
        await pool.close()
    assert list(saved) == [mine.version_id]
    assert saved[mine.version_id].requests == 3


async def test_a_shard_reads_its_base_models_versions_and_their_adapters_pointers(
    stack: Stack, unique: str
) -> None:
    reg = Registry(stack.settings.postgres_dsn, f"sh-{unique}")
    await reg.tenant_row()
    bm_a, bm_b = f"base-a-{unique}", f"base-b-{unique}"
    a = await reg.version("alpha", base_model=bm_a)
    b = await reg.version("beta", base_model=bm_b)
    await reg.version("beta", "v2", status="canary", base_model=bm_b)
    tenants = frozenset({reg.tenant})
    conn = await asyncpg.connect(stack.settings.postgres_dsn)
    try:
        assert await store.base_models(conn, tenants) == [bm_a, bm_b]
        records, pointers = await store.read_registry(conn, tenants, frozenset({bm_a}))
        everything, all_pointers = await store.read_registry(conn, tenants)
    finally:
        await conn.close()
    assert [r.version_id for r in records] == [a.version_id]
    assert list(pointers) == [a.adapter_id]  # beta's canary is shard b's to analyse
    assert {r.version_id for r in everything} == {a.version_id, b.version_id,
                                                 f"{b.adapter_id}@v2"}
    assert set(all_pointers) == {a.adapter_id, b.adapter_id}
    assert all_pointers[b.adapter_id].canary == "v2"
