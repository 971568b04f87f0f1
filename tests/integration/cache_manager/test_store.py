"""The cache manager's heat statistics survive a restart in PostgreSQL, every field."""

from __future__ import annotations

import asyncpg

from loraplane.cache_manager import store
from loraplane.policy.model import RequestClass
from loraplane.policy.stats import VersionStats
from loraplane.stack.stack import Stack


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
