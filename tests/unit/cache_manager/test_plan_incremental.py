"""The heat plan's steady-round shortcuts decide what its definition decides, round by round.

:meth:`HeatPolicy.plan` keeps what a snapshot's versions alone decide while they stay equal
(a never-requested version's figures, the undemoted ones, the prefetch candidates) and looks
at a few hosts per replica (:class:`~loraplane.policy.heat._HostIndex`). Here every round of
a bench-like fleet (power-law heat, a few bursts per round, every command answered) is also
planned by the definition — every version's figures computed for the clock, every target
looked at for every replica — on the same snapshot, and the two plans must be the same
actions. The runs change versions, canaries and workers on the way, so the kept facts are
dropped and rebuilt too.
"""

from __future__ import annotations

import random

import pytest

from loraplane.cache_manager.core import CacheCore
from loraplane.cache_manager.messages import build_command
from loraplane.cache_manager.rules import RulesConfig
from loraplane.policy.config import load_config
from loraplane.policy.heat import HeatPolicy, _HostIndex, _Scores, _Target
from loraplane.policy.plan import Reason
from loraplane.policy.predicates import Protection
from loraplane.policy.snapshot import Snapshot, VersionMeta
from loraplane.v1 import common_pb2
from tests.support import eventgen as ev


class _Definition(HeatPolicy):
    """The plan as written before the shortcuts: no kept facts, every target looked at."""

    def _scores(self, snapshot: Snapshot, now: float) -> _Scores:
        versions = snapshot.versions
        ids = sorted(versions)
        figs = {v: self._figures(versions[v], snapshot.stats_of(v), now, snapshot.bandwidths)
                for v in ids}
        prewarm = [(v, Reason.CANARY_PREWARM if figs[v].kind is Protection.CANARY
                    else Reason.SCHEDULED_WARMUP) for v in ids
                   if not versions[v].superseded
                   and (figs[v].kind is Protection.CANARY or versions[v].warmup > 0.0)]
        return _Scores(kind={v: f.kind for v, f in figs.items()},
                       rate={v: f.rate for v, f in figs.items()},
                       heat={v: f.heat for v, f in figs.items()},
                       value={v: f.value for v, f in figs.items()},
                       demote={v: f.demote for v, f in figs.items()},
                       requested=ids, prewarm=prewarm,
                       undemoted=[v for v in ids if figs[v].demote is None])

    looked = 0
    """Replicas placed by this definition (the overrides run, the policy compiled or not)."""

    def _host_candidates(self, hosts: _HostIndex, vid: str, meta: VersionMeta) -> list[_Target]:
        self.looked += 1
        return hosts.targets


def _fleet(n_workers: int, n_versions: int, slots: int, now: float) -> tuple[CacheCore, list]:
    """The bench's fleet (``benchmarks/cache.py``), smaller."""
    rng = random.Random(7)
    cfg = load_config()
    core = CacheCore(policy=HeatPolicy(cfg), policy_config=cfg, rules=RulesConfig(),
                     worker_timeout_s=3600.0)
    refs = [ev.ref(f"a{i:05d}", tenant=f"t{i % 50:02d}") for i in range(n_versions)]
    prios = [common_pb2.PRIORITY_GOLD, common_pb2.PRIORITY_SILVER, common_pb2.PRIORITY_BRONZE]
    for i, r in enumerate(refs, start=1):
        p = common_pb2.PRIORITY_PLATINUM if i % 97 == 0 else prios[i % 3]
        core.apply(ev.admitted(r, i, now, size=rng.randint(100_000, 50_000_000), priority=p),
                   now)
    for w in range(n_workers):
        core.apply(ev.snapshot(ev.WorkerSpec(f"w{w:03d}", slots=slots,
                                             warm_bytes=slots * 4 * 50_000_000), 1, now), now)
    for i, r in enumerate(refs):
        n = int(200 / (i + 1) ** 0.9)
        if n:
            core.apply(ev.heat(r, n, now - rng.uniform(0, 300)), now)
    return core, refs


@pytest.mark.parametrize(("workers", "versions", "slots", "extra_heat", "ranked"), [
    (4, 200, 8, 2000, True),  # the adaptive ranking has seen enough requests: its order
    (12, 600, 4, 0, True),  # few slots: replicas compete for them
    (16, 1200, 16, 0, False),  # too few requests for the ranking: the plain heat score
])
def test_steady_rounds_plan_as_the_definition(workers: int, versions: int, slots: int,
                                              extra_heat: int, ranked: bool) -> None:
    now = 1_790_000_000.0
    core, refs = _fleet(workers, versions, slots, now)
    rng = random.Random(11)
    for _ in range(extra_heat):
        r = refs[min(int(rng.paretovariate(0.8)) - 1, len(refs) - 1)]
        core.apply(ev.heat(r, rng.randint(1, 20), now - rng.uniform(0, 200)), now)
    policy = core.planner.policy
    assert isinstance(policy, HeatPolicy)
    compared = 0
    looked = 0
    rounds_ranked = 0
    t = now
    for k in range(16):
        t += 1.0
        if k >= 3:
            for r in rng.sample(refs, 3):
                core.apply(ev.heat(r, rng.randint(5, 50), t), t)
        if k == 6:  # a new version: the versions change, the kept facts go
            new = ev.ref("late", tenant="t00")
            core.apply(ev.admitted(new, versions + 1, t, size=2_000_000), t)
            core.apply(ev.heat(new, 30, t), t)
        if k == 9:  # an active canary never requested yet (prefetched, protected)
            i = versions - 1
            canary = ev.ref(f"a{i:05d}", version="v2", tenant=f"t{i % 50:02d}")
            core.apply(ev.admitted(canary, versions + 2, t, size=3_000_000), t)
            core.apply(ev.canary(canary, 10, t), t)
        if k == 11:  # a worker joins
            core.apply(ev.snapshot(ev.WorkerSpec("w999", slots=slots,
                                                 warm_bytes=slots * 4 * 50_000_000), 1, t), t)
        res = core.round(t)
        snapshot = res.round.snapshot
        definition = _Definition(policy.config)
        expected = definition.plan(snapshot, t)
        assert list(res.round.plan) == list(expected), f"round {k}"
        compared += len(expected)
        looked += definition.looked
        rounds_ranked += snapshot.ranks is not None
        for i in res.issued:
            core.apply(ev.answer(build_command(i, "test"), t), t)
    assert compared > 0 and looked > 0
    assert (rounds_ranked > 0) == ranked  # both orders are compared
