"""``loraplane cache status`` stays readable in an 80-column terminal: no line is wider,
every version id is printed whole on one line, every decision keeps its reason."""

from __future__ import annotations

import io

from rich.console import Console

from loraplane.cache_manager.cli import status_tables
from loraplane.v1 import cache_pb2, common_pb2, events_pb2

VERSIONS = [("acme", "support-bot", "v3"), ("acme", "support-bot", "v4-canary"),
            ("acme", "legal-summariser", "2026-11-30"), ("globex", "sql-writer", "v12"),
            ("globex", "translator-de-en", "v1"), ("acme", "code-review", "v7")]


def ref(i: int) -> common_pb2.AdapterRef:
    t, n, v = VERSIONS[i]
    return common_pb2.AdapterRef(tenant_id=t, adapter_name=n, version=v, base_model="tiny-llama")


def fixture() -> tuple[list[cache_pb2.WorkerInfo], list[cache_pb2.Decision]]:
    workers = []
    for w, held in (("worker-0", [0, 1, 2]), ("worker-1", [3, 4, 5, 0])):
        placements = [events_pb2.AdapterPlacement(
            adapter=ref(i), tier=common_pb2.TIER_HOT if k < 2 else common_pb2.TIER_WARM,
            pinned=k == 0, in_flight=k, slot_resident=k == 0) for k, i in enumerate(held)]
        state = events_pb2.WorkerState(
            worker_id=w, warm_bytes_capacity=8 * 1024**3, warm_bytes_used=3 * 1024**3 + 12345,
            placements=placements, capacities=[events_pb2.BaseModelCapacity(
                base_model="tiny-llama", hot_slots_capacity=4, hot_slots_used=2,
                hot_slots_pinned=1, gpu_slots=2, gpu_slots_used=1)])
        workers.append(cache_pb2.WorkerInfo(state=state, alive=w == "worker-0"))
    decisions = []
    for k in range(6):
        d = cache_pb2.Decision(
            id=100 + k, action=cache_pb2.DECISION_ACTION_LOAD_HOT if k % 2 else
            cache_pb2.DECISION_ACTION_DEMOTE, adapter=ref(k), worker_id=f"worker-{k % 2}",
            from_tier=common_pb2.TIER_WARM, to_tier=common_pb2.TIER_HOT,
            reason=f"heat rank {k} above the coldest HOT version [protected={k % 2 == 0}]",
            heat_score=1.5 + k, policy="heat")
        d.at.FromSeconds(1_800_000_000 + k)
        decisions.append(d)
    return workers, decisions


def render(width: int) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False)
    for table in status_tables(*fixture()):
        console.print(table)
    return buf.getvalue()


def test_status_fits_80_columns_and_keeps_every_version_and_reason() -> None:
    out = render(80)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    for t, n, v in VERSIONS:
        vid = f"{t}/{n}@{v}"
        assert any(vid in line for line in lines), f"{vid} cut or missing:\n{out}"
    text = " ".join(out.split())
    for k in range(6):
        assert f"heat rank {k} above" in text  # reasons kept (the [..] is not markup)
    assert "[protected=True]" in text and "[protected=False]" in text
    assert "load_hot" in out and "WARM→HOT" in out
    assert "worker-0" in out and "worker-1" in out and "GONE" in out
    assert "3.0 GiB / 8.0 GiB" in out
    assert "GPU slot" in out and "2/4 (1) · 1/2" in text  # both HOT levels


def test_placements_list_hot_before_warm_per_worker() -> None:
    out = render(80)
    placements = out[out.index("placements"):out.index("recent decisions")]
    rows = [line for line in placements.splitlines() if "worker-1" in line]
    tiers = ["HOT" if "HOT" in r else "WARM" for r in rows]
    assert tiers == sorted(tiers, key=lambda t: t != "HOT") and "WARM" in tiers and "HOT" in tiers
