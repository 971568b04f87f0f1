"""The heat plan's kept figures are its definition's, bit for bit.

:meth:`HeatPolicy._figures_kept` keeps, per requested version, the parts of its figures that
do not depend on the clock (the penalties of its request mix, its priority value, size factor
and protection) while its metadata, request mix and the bandwidths stay equal.
:meth:`HeatPolicy._figures` computes everything from scratch; over a long random run that
changes each of those inputs now and then, the two must give equal figures at every step.
"""

from __future__ import annotations

import dataclasses
import random

from loraplane.policy.config import load_config
from loraplane.policy.cost import Bandwidths
from loraplane.policy.heat import HeatPolicy
from loraplane.policy.model import PRIORITIES
from loraplane.policy.snapshot import VersionMeta
from loraplane.policy.stats import StatsView


def _meta(rng: random.Random, vid: str) -> VersionMeta:
    return VersionMeta(
        version_id=vid, tenant_id="t", base_model="bm", priority=rng.choice(PRIORITIES),
        size_bytes=rng.choice([100_000, 5_000_000, 50_000_000, 2_000_000_000]),
        canary=rng.random() < 0.2, warmup=rng.choice([0.0, 0.0, 0.5, 1.0]),
        superseded=rng.random() < 0.1)


def _stats(rng: random.Random, now: float) -> StatsView:
    return StatsView(
        decayed_count=rng.uniform(0.0, 500.0), decayed_count_warm=rng.uniform(0.0, 800.0),
        as_of=now - rng.uniform(0.0, 100.0),
        last_access=None if rng.random() < 0.05 else now - rng.uniform(0.0, 7200.0),
        requests=rng.randint(0, 1000), mean_gap_s=rng.choice([0.0, rng.uniform(0.1, 60.0)]),
        interactive=rng.randint(0, 3), background=rng.randint(0, 3), canary=rng.randint(0, 3),
        requests_after_load=rng.randint(0, 50), errors_after_load=rng.randint(0, 10))


def test_kept_figures_equal_the_definition_over_a_random_run() -> None:
    rng = random.Random(18)
    policy = HeatPolicy(load_config())
    bandwidths = [Bandwidths(), Bandwidths(s3_bytes_per_s=50e6, register_s=0.2)]
    bw = bandwidths[0]
    vids = [f"v{i}" for i in range(12)]
    metas = {v: _meta(rng, v) for v in vids}
    stats = {v: _stats(rng, 1000.0) for v in vids}
    now = 1000.0
    recomputed = 0
    for _ in range(3000):
        now += rng.uniform(0.0, 30.0)
        vid = rng.choice(vids)
        r = rng.random()
        if r < 0.05:
            metas[vid] = _meta(rng, vid)  # new metadata (canary, priority, size, ...)
        elif r < 0.08:
            metas[vid] = dataclasses.replace(metas[vid])  # equal, another object
        elif r < 0.10:
            bw = rng.choice(bandwidths)
        elif r < 0.40:
            stats[vid] = _stats(rng, now)  # a request: new counts and maybe a new mix
        elif r < 0.55:  # the same request mix, the clock and the counts moved on
            stats[vid] = dataclasses.replace(stats[vid], as_of=now,
                                             decayed_count=rng.uniform(0.0, 500.0))
        before = dict(policy._kept)
        for v in vids:
            kept = policy._figures_kept(v, metas[v], stats[v], now, bw)
            assert kept == policy._figures(metas[v], stats[v], now, bw), (v, now)
        recomputed += sum(1 for v, k in policy._kept.items() if before.get(v) is not k)
    # both paths ran: figures kept across steps, and kept parts computed again on a change
    assert 0 < recomputed < 3000 * len(vids) // 4
