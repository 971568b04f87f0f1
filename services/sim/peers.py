"""HOT-tier baselines from an independent simulator: libCacheSim (PyPI ``libcachesim==0.3.5``).

libCacheSim is a dev/test dependency (``pip install -e .[test]``), imported only
here. :func:`peer_hot_hit_ratios` replays the same per-slot-group request
sequences the simulator routes (``crc32(adapter_id) % workers`` and base model:
:func:`~loraplane.sim.simulator.affinity`) through libCacheSim caches of
``gpu_slots`` unit-size objects, one cache per group, and returns the HOT hit
ratio (hits / all requests) of each policy.

It is the HOT tier alone: no WARM tier, no in-flight rule (a libCacheSim cache
may evict an object with requests in flight, which :func:`simulate` forbids),
no business rules. On unit slots without in-flight conflicts our LRU, FIFO and
Belady give exactly libCacheSim's ratios (``tests/unit/sim/test_peers.py``).

Parameters for tiny caches (tens of slots): libCacheSim's defaults size
S3-FIFO's small queue at 10 % and W-TinyLFU's window at 1 % of the cache, which
rounds to zero objects at 16 slots (hit ratio 0.0, FACTS.md). Here S3-FIFO gets a
25 % small queue and promotes after one re-reference, W-TinyLFU a 25 % window
(measured on GenTD26 at 16/32 slots: S3-FIFO 0.503 → 0.556 with a 12.5 → 25 %
small queue; W-TinyLFU 0.21 → 0.43 with a 1/16 → 1/4 window).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from loraplane.sim.simulator import Capacities, affinity
from loraplane.sim.trace import Trace

PEER_ONLINE = ("ARC", "S3FIFO", "WTinyLFU", "LeCaR", "Cacheus", "Sieve", "TwoQ", "LIRS", "Clock")
"""libCacheSim's online policies reported as HOT baselines (``lcs:NAME`` in the bench)."""
PEER_EXACT = ("LRU", "FIFO", "Belady")
"""Policies both simulators implement (the equality test)."""


def available() -> bool:
    """True when libCacheSim can be imported."""
    try:
        import libcachesim  # noqa: F401
    except ImportError:
        return False
    return True


def _factory(name: str) -> Callable[[int], Any]:
    import libcachesim as lcs

    if name == "S3FIFO":
        return lambda size: lcs.S3FIFO(size, small_size_ratio=0.25, move_to_main_threshold=1)
    if name == "WTinyLFU":
        return lambda size: lcs.WTinyLFU(size, window_size=0.25)
    cls = getattr(lcs, name)
    return lambda size: cls(size)


def group_sequences(trace: Trace, caps: Capacities) -> list[list[int]]:
    """The version sequence each (worker, base model) slot group sees, as :func:`simulate` routes."""
    n_bm = max(1, len(trace.base_models))
    home = affinity(trace.version_ids, caps.workers)
    group_of = [home[v] * n_bm + trace.version_base_model[v] for v in range(trace.n_versions)]
    groups: list[list[int]] = [[] for _ in range(caps.workers * n_bm)]
    for v in trace.version:
        groups[group_of[v]].append(v)
    return groups


def hits(name: str, sequence: Sequence[int], slots: int) -> int:
    """HOT hits of libCacheSim's ``name`` on one group's sequence with ``slots`` unit objects."""
    import libcachesim as lcs

    cache = _factory(name)(slots)
    n = len(sequence)
    nxt: list[int] = []
    if name == "Belady":
        nxt = [0] * n
        last: dict[int, int] = {}
        for i in range(n - 1, -1, -1):
            nxt[i] = last.get(sequence[i], 2**62)
            last[sequence[i]] = i
    count = 0
    req = lcs.Request()
    req.obj_size = 1
    get = cache.get
    for i, v in enumerate(sequence):
        req.obj_id = v
        req.clock_time = i
        if nxt:
            req.next_access_vtime = nxt[i]
        if get(req):
            count += 1
    return count


def peer_hot_hit_ratios(
    trace: Trace, caps: Capacities, names: Sequence[str] = PEER_ONLINE
) -> dict[str, float]:
    """HOT hit ratio of each libCacheSim policy on ``trace`` at ``caps`` (HOT tier only)."""
    groups = [g for g in group_sequences(trace, caps) if g]
    total = len(trace)
    return {
        name: sum(hits(name, g, caps.gpu_slots) for g in groups) / total if total else 0.0
        for name in names
    }
