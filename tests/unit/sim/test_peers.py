"""Peer check: our LRU, FIFO and Belady HOT hit ratios equal libCacheSim's (``libcachesim==0.3.5``)
on the same single-worker, unit-slot request sequences."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from loraplane.policy.factory import make_policy
from loraplane.policy.model import Priority, RequestClass
from loraplane.sim import peers
from loraplane.sim.gentd26 import import_gentd26
from loraplane.sim.simulator import Capacities, simulate
from loraplane.sim.trace import Trace, TraceRow, format_rows, parse_rows

SOURCE = Path(__file__).resolve().parents[2] / "data/traces/gentd26/lora_request_trace.csv.gz"
OURS = {"LRU": "lru", "FIFO": "fifo", "Belady": "belady"}


def _trace(versions: list[str]) -> Trace:
    """Requests 10 s apart with no output: nothing is ever in flight at the next request, so the
    simulator's in-flight rule never binds (libCacheSim has none)."""
    import csv
    import io

    rows = [
        TraceRow(ts=10.0 * i, tenant_id="t", adapter_id=v, priority=Priority.BRONZE,
                 request_class=RequestClass.INTERACTIVE, rank=8, size_bytes=1_000_000,
                 canary=False, prompt_tokens=0, output_tokens=0)
        for i, v in enumerate(versions)
    ]
    return parse_rows(csv.DictReader(io.StringIO("".join(format_rows(rows)))), "peer")


def _sequences() -> list[tuple[str, list[str]]]:
    rng = random.Random(5)
    zipf = [f"a{int(rng.paretovariate(0.9))}@1" for _ in range(4_000)]
    uniform = [f"u{rng.randrange(60)}@1" for _ in range(3_000)]
    real = [r.adapter_id for r in import_gentd26(SOURCE)][:6_000]
    return [("zipf", zipf), ("uniform", uniform), ("gentd26", real)]


@pytest.mark.parametrize("slots", [1, 4, 16, 32])
@pytest.mark.parametrize("peer", sorted(OURS))
def test_hot_hit_ratio_equals_libcachesim(peer: str, slots: int) -> None:
    for label, versions in _sequences():
        trace = _trace(versions)
        caps = Capacities(gpu_slots=slots, host_bytes=10**9, workers=1)
        ours = simulate(trace, make_policy(OURS[peer]), caps).gpu_hits
        theirs = peers.hits(peer, trace.version, slots)
        assert ours == theirs, (label, peer, slots)


def test_peer_ratios_route_requests_like_the_simulator() -> None:
    versions = [f"a{i % 37}@1" for i in range(2_000)]
    trace = _trace(versions)
    caps = Capacities(gpu_slots=8, host_bytes=10**9, workers=3)
    groups = peers.group_sequences(trace, caps)
    assert sorted(v for g in groups for v in g) == sorted(trace.version)
    ours = simulate(trace, make_policy("lru"), caps).gpu_hit_ratio
    assert peers.peer_hot_hit_ratios(trace, caps, ("LRU",))["LRU"] == pytest.approx(ours)
    # the tiny-cache parameters keep S3-FIFO and W-TinyLFU working (defaults give 0.0)
    ratios = peers.peer_hot_hit_ratios(trace, caps, ("S3FIFO", "WTinyLFU"))
    assert min(ratios.values()) > 0.0


def test_peer_ratios_are_carried_over_by_the_share_of_the_optimum() -> None:
    from loraplane.sim.bench import peer_adjusted

    figures = [{"policy": "belady", "gpu_hit_ratio": 0.5}, {"policy": "lru", "gpu_hit_ratio": 0.4}]
    peer = {"LRU": 0.45, "Belady": 0.625, "S3FIFO": 0.55}
    assert peer_adjusted(figures, peer) == {"S3FIFO": pytest.approx(0.55 * 0.5 / 0.625)}
