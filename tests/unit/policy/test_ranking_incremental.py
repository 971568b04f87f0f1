"""The incremental :meth:`AdaptiveRanking.ranks` gives exactly the ranks of its definition.

:meth:`~loraplane.policy.ranking.AdaptiveRanking.ranks` keeps the last call's order and ranks
again only the versions whose inputs changed since;
:meth:`~loraplane.policy.ranking.AdaptiveRanking.ranks_from_scratch` ranks every version
again (the definition). Every round of every run here asks both and requires equal
:class:`~loraplane.policy.snapshot.Ranks`. Each invalidation case has a test of its own: a run
in which the case happens and changes the rank or WARM key of a version nothing else touched
in that round (so a kept value would be wrong there), then the long random runs.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from dataclasses import replace

from loraplane.policy.config import PolicyConfig
from loraplane.policy.model import Priority, RequestClass
from loraplane.policy.ranking import AdaptiveRanking, RankedVersion, RankedWorker
from loraplane.policy.snapshot import Ranks

MB = 1_000_000
BMS = ("bm0", "bm1")
SLOTS = 2


def _versions(n: int, per_adapter: int = 1) -> list[RankedVersion]:
    """``per_adapter`` versions per adapter (one adapter's share a tenant and a base model;
    stable traffic of one supersedes the others)."""
    out = []
    for k in range(n):
        a = k // per_adapter
        adapter = f"t{a % 4}/a{a:03d}"
        out.append(RankedVersion(f"{adapter}@{k % per_adapter}", (1 + k % 5) * 10 * MB, adapter,
                                 f"t{a % 4}", BMS[a % 2]))
    return out


def _config(**adaptive: float) -> PolicyConfig:
    cfg = PolicyConfig()
    return replace(cfg, adaptive=replace(cfg.adaptive, **adaptive))


Pairs = list[tuple[str, str]]


class _Run:
    """One ranking fed requests and residency; :meth:`round` asks both orders and compares."""

    def __init__(self, cfg: PolicyConfig, versions: list[RankedVersion], workers: int,
                 warm_bytes: int = 150 * MB) -> None:
        self.ranking = AdaptiveRanking(cfg)
        self.versions = versions
        self.wids = [f"w{i}" for i in range(workers)]
        self.warm_bytes = warm_bytes
        self.resident: dict[str, set[str]] = {w: set() for w in self.wids}
        self.touched: set[str] = set()
        """Versions requested since the last round."""
        self.rounds = 0
        self.sync()

    def sync(self) -> None:
        self.ranking.update(self.versions, [
            RankedWorker(w, dict.fromkeys(BMS, SLOTS), self.warm_bytes,
                         frozenset(self.resident[w])) for w in self.wids])

    def request(self, vid: str, wid: str, *, canary: bool = False,
                priority: Priority = Priority.SILVER,
                request_class: RequestClass = RequestClass.INTERACTIVE, at: float = 0.0,
                served: bool = True) -> None:
        self.ranking.arrived(vid, wid, request_class, priority, canary, at)
        if served:
            self.ranking.served()
        self.touched.add(vid)

    def pairs(self) -> Pairs:
        return [(w, v) for w in self.wids for v in sorted(self.resident[w])]

    def round(self, pairs: Pairs | None = None) -> Ranks | None:
        asked = self.pairs() if pairs is None else pairs
        got = self.ranking.ranks(asked)
        want = self.ranking.ranks_from_scratch(asked)
        assert got == want, _diff(got, want)
        self.touched = set()
        self.rounds += 1
        return got

    # -- what the experts say now (the inputs of the ranks, to see what a round changed)

    def hot_ranks(self) -> dict[str, tuple[int, tuple[float, float]]]:
        """Every version's group and rank in it."""
        r = self.ranking
        online = r._online
        assert online is not None
        out = {}
        for vi, vid in enumerate(r._vids):
            g = online.home_group(vi)
            g = g if g >= 0 else r._first_groups[vi]
            out[vid] = (g, online.hot_rank(g, vi))
        return out

    def warm_keys(self, pairs: Pairs) -> dict[tuple[str, str], float]:
        r = self.ranking
        online = r._online
        assert online is not None
        return {(w, v): online.warm_rank(r._windex[w], r._vindex[v]) for w, v in pairs}


def _diff(got: Ranks | None, want: Ranks | None) -> str:
    if got is None or want is None:
        return f"{got!r} != {want!r}"
    hot = sorted(v for v in {*got.hot, *want.hot} if got.hot.get(v) != want.hot.get(v))
    warm = sorted(p for p in {*got.warm, *want.warm} if got.warm.get(p) != want.warm.get(p))
    return (f"hot differs for {hot[:5]} ({len(hot)}), warm for {warm[:5]} ({len(warm)}); "
            f"experts {got.hot_experts == want.hot_experts} {got.warm_experts == want.warm_experts}")


def _untouched_hot_changes(run: _Run, before: dict[str, tuple[int, tuple[float, float]]]
                           ) -> list[str]:
    """Versions whose rank changed in the round just fed though none of their requests came."""
    after = run.hot_ranks()
    return [v for v, r in after.items() if v not in run.touched and before[v] != r]


def test_a_request_ranks_its_version_again() -> None:
    run = _Run(_config(), _versions(9), 1)
    vids = [v.version_id for v in run.versions]
    for i in range(120):
        run.request(vids[i % 3], "w0", at=float(i))
    first = run.round()
    run.request(vids[4], "w0", at=121.0, served=False)  # counted, not served yet
    again = run.round()
    run.ranking.served()
    assert first is not None and again is not None
    # above the base model's versions never requested now
    assert first.hot_key(vids[4]) < again.hot_key(vids[4])


def test_a_release_ranks_the_superseded_version_again() -> None:
    """Stable traffic of an adapter's new version supersedes its previous stable one, which
    goes first everywhere although none of its own requests came."""
    run = _Run(_config(), _versions(6, per_adapter=3), 1)
    old, new, other = "t0/a000@0", "t0/a000@1", "t1/a001@0"
    for i in range(120):
        run.request(old if i % 2 else other, "w0", at=float(i))
    run.resident["w0"] = {old, other}
    run.sync()
    first = run.round()
    before = run.hot_ranks()
    run.request(new, "w0", at=121.0)
    assert old in _untouched_hot_changes(run, before)
    assert run.ranking._online is not None
    assert run.ranking._online.stream_end(run.ranking._vindex[old]) == -float("inf")
    again = run.round()
    assert first is not None and again is not None
    assert again.hot_key(old) < first.hot_key(old)
    assert again.warm_key("w0", old) < first.warm_key("w0", old)


def test_the_first_serve_moves_a_version_to_its_home_group() -> None:
    """Arrived, not served yet: the version ranks in the first worker's group; served on
    another worker, it ranks in that worker's group."""
    run = _Run(_config(), _versions(6), 2)
    vids = [v.version_id for v in run.versions]
    for i in range(220):
        run.request(vids[i % 2], "w0", at=float(i))
    run.request(vids[3], "w1", at=221.0, served=False)
    run.round()
    groups = run.hot_ranks()
    run.ranking.served()
    assert run.hot_ranks()[vids[3]][0] != groups[vids[3]][0]
    run.round()


def test_a_stream_end_reached_by_the_request_clock_ranks_it_with_the_ended_ones() -> None:
    """A stream idle for more of its own gaps than the liveness allows has ended: its rank
    changes with the request clock alone, requests of other versions."""
    run = _Run(_config(), _versions(9), 1)
    vids = [v.version_id for v in run.versions]
    stream, others = vids[1], vids[2:]
    for i in range(140):  # the others until ready, then the stream back to back
        run.request(others[i % len(others)] if i < 120 else stream, "w0", at=float(i))
    run.round()
    ended = []
    for i in range(140, 400):
        before = run.hot_ranks()
        run.request(others[i % len(others)], "w0", at=float(i))
        if stream in _untouched_hot_changes(run, before):
            ended.append(run.hot_ranks()[stream][1][0])
        run.round()
    assert ended == [0.0]  # once, from alive (1.0) to ended


@functools.cache
def _switching_run(seed: int, n: int) -> Counter[str]:
    """A drifting working set over 2 workers with evictions: both tiers' experts switch now
    and then. Counts the rounds in which something but a request changed the rank (HOT) or
    WARM key of a version not requested in that round: a switch of its group's HOT expert
    (``hot``), of its worker's WARM expert (``warm``), a request of its tenant (``tenant``)."""
    rng = random.Random(seed)
    run = _Run(_config(), _versions(30), 2, warm_bytes=60 * MB)
    vids = [v.version_id for v in run.versions]
    tenant = {r.version_id: r.tenant_id for r in run.versions}
    seen: Counter[str] = Counter()
    last = run.round()
    for i in range(n):
        base = (i // 150) * 4
        vid = vids[(base + min(int(rng.paretovariate(1.1)) - 1, 12)) % len(vids)]
        wid = run.wids[run.ranking._vindex[vid] % 2]
        run.resident[wid].add(vid)
        if len(run.resident[wid]) > 5:  # an eviction: the worker's L rises
            run.resident[wid].discard(rng.choice(sorted(run.resident[wid] - {vid})))
        run.sync()
        before = run.hot_ranks()
        pairs = run.pairs()
        keys = run.warm_keys(pairs)
        run.request(vid, wid, at=float(i))
        ranks = run.round(pairs)
        if last is None or ranks is None:
            last = ranks
            continue
        if ranks.hot_experts != last.hot_experts and _untouched_hot_changes(run, before):
            seen["hot"] += 1
        for (w, v), k in keys.items():
            if v in run.touched or ranks.warm[(w, v)] == k:
                continue
            if ranks.warm_experts[w] != last.warm_experts[w]:
                seen["warm"] += 1
            elif tenant[v] == tenant[vid]:
                seen["tenant"] += 1
        last = ranks
    return seen


def test_a_switch_of_a_groups_leading_hot_expert_ranks_its_members_again() -> None:
    seen = _switching_run(5, 3000)
    assert seen["hot"] > 0, seen


def test_a_switch_of_a_workers_leading_warm_expert_keys_its_pairs_again() -> None:
    seen = _switching_run(5, 3000)
    assert seen["warm"] > 0, seen


def test_a_tenants_request_refreshes_the_warm_keys_of_its_other_versions() -> None:
    """The reuse expert's tenant refresh: a request of one version raises the WARM keys of its
    tenant's other versions on a worker whose L rose since their tenant's last request."""
    seen = _switching_run(5, 3000)
    assert seen["tenant"] > 0, seen


def test_a_pair_asked_again_after_a_residency_change_gets_its_key_now() -> None:
    """A version that left a worker and came back: its WARM key there is read again, not the
    one given while it was there before (its requests came while it was away)."""
    run = _Run(_config(), _versions(6), 1)
    vids = [v.version_id for v in run.versions]
    for i in range(120):
        run.request(vids[i % 3], "w0", at=float(i))
    pair = ("w0", vids[0])
    first = run.round([pair])
    run.request(vids[0], "w0", at=121.0)
    run.request(vids[0], "w0", at=122.0)
    run.round([])  # away: not asked
    again = run.round([pair])
    assert first is not None and again is not None
    assert again.warm[pair] != first.warm[pair]


def test_a_rebase_that_turns_distinct_heat_keys_into_ties_ranks_everything_again() -> None:
    """A rebase rescales every heat key; with a time constant this short the factor
    underflows to 0, so the versions not requested tie at 0 and rank by id, where they had
    distinct keys: their order changes though none of them was requested."""
    tiny = _config(hot_tau_per_slot=0.0002)
    run = _Run(tiny, _versions(6), 1)
    vids = [v.version_id for v in run.versions if v.base_model == "bm0"]
    online = run.ranking._online
    assert online is not None
    run.request(vids[0], "w0", at=0.0)
    run.request(vids[1], "w0", at=1.0)
    run.round()
    before = run.hot_ranks()
    base = online.time_base()
    run.request(vids[2], "w0", at=2.0)
    assert online.time_base() != base  # rebased
    after = run.hot_ranks()
    assert before[vids[0]] != before[vids[1]] and after[vids[0]] == after[vids[1]]
    got = run.round()
    assert got is not None
    # vids[1] was above vids[0]; tied now, the lower id ranks above (lower goes first)
    assert got.hot_key(vids[0]) < got.hot_key(vids[1])


def test_random_runs_give_the_definitions_ranks_at_every_round() -> None:
    """Long random runs over 3 workers × 2 base models: requests (canary and stable traffic
    of adapters with several versions, every priority and class, arrivals served later),
    residency changes, rebases, admissions; both orders compared at every round."""
    cases: Counter[str] = Counter()
    for seed in range(3):
        rng = random.Random(seed)
        cfg = _config(hot_tau_per_slot=0.1)  # a rebase every 600 requests
        versions = _versions(45, per_adapter=3)
        run = _Run(cfg, versions[:40], 3, warm_bytes=80 * MB)
        online = run.ranking._online
        base = 0.0
        last: Ranks | None = None
        for i in range(2500):
            vid = run.versions[min(int(rng.paretovariate(0.9)) - 1 + (i // 400) * 3,
                                   len(run.versions) - 1)].version_id
            served = rng.random() > 0.1
            run.request(vid, rng.choice(run.wids) if rng.random() < 0.2 else "w1",
                        canary=rng.random() < 0.1, priority=rng.choice(list(Priority)),
                        request_class=rng.choice(list(RequestClass)), at=i * 0.5,
                        served=served)
            if not served and rng.random() < 0.5:
                run.round()  # between the arrival and the serve
            if not served:
                run.ranking.served()
            if rng.random() < 0.3:
                w = rng.choice(run.wids)
                if rng.random() < 0.5 and run.resident[w]:
                    run.resident[w].discard(rng.choice(sorted(run.resident[w])))
                else:
                    run.resident[w].add(rng.choice(run.versions).version_id)
                run.sync()
            if i == 1800 and len(run.versions) == 40:
                run.versions = versions  # admitted: rebuilt, the kept requests replayed
                run.sync()
                cases["rebuild"] += 1
                online = run.ranking._online
                base = 0.0
            if rng.random() < 0.4:
                pairs = run.pairs()
                if rng.random() < 0.1:
                    pairs.append(("w9", vid))  # not a worker of the universe
                ranks = run.round(pairs)
                assert online is not None
                if online.time_base() != base:
                    base = online.time_base()
                    cases["rebase"] += 1
                if ranks is not None and last is not None:
                    cases["hot switch"] += ranks.hot_experts != last.hot_experts
                    cases["warm switch"] += ranks.warm_experts != last.warm_experts
                last = ranks
        cases["rounds"] += run.rounds
    assert all(cases[k] for k in ("rebase", "hot switch", "warm switch", "rebuild")), cases
    assert cases["rounds"] > 2500, cases
