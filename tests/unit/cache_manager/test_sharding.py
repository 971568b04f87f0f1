"""Decisions sharded by base model: the selection setting, shard keys, and what a shard plans.

The side-by-side test runs the real heat policy: two shards, each fed every event, decide
exactly what one unsharded core decides when no worker is shared between base models.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from loraplane.cache_manager.core import CacheCore
from loraplane.cache_manager.messages import build_command
from loraplane.cache_manager.model import Ref, Status
from loraplane.cache_manager.planner import project
from loraplane.cache_manager.rules import rules_from_mapping
from loraplane.cache_manager.settings import CacheManagerSettings
from loraplane.cache_manager.sharding import (
    ShardSelection,
    parse_shards,
    shard_group,
    shard_lock_key,
)
from loraplane.policy.config import load_config
from loraplane.policy.factory import make_policy
from tests.support import eventgen as ev

REPO = Path(__file__).resolve().parents[3]
T0 = 1_800_000_000.0
BM_A, BM_B = "base/alpha", "base/beta"


# --------------------------------------------------------------------------- settings


def test_empty_means_unsharded_star_means_every_base_model_and_lists_are_sets() -> None:
    assert parse_shards("") is None and parse_shards("  ") is None
    every = parse_shards("*")
    assert every == ShardSelection(every=True)
    assert every.wanted(["b", "a", "", "a"]) == ["a", "b"]
    listed = parse_shards(" b , a ")
    assert listed == ShardSelection(every=False, names=frozenset({"a", "b"}))
    assert listed.wanted(["c"]) == ["a", "b"]  # listed shards do not wait for discovery


def test_bad_selection_names_every_problem_once() -> None:
    with pytest.raises(ValueError) as exc:
        parse_shards("a,,*,a,b c")
    text = str(exc.value)
    for part in ("empty name between commas", "'*' stands alone", "listed twice: ['a']",
                 "with spaces: ['b c']"):
        assert part in text, text
    with pytest.raises(ValueError, match="LORAPLANE_CACHE_MANAGER_SHARDS"):
        CacheManagerSettings(cache_manager_shards="x,")
    assert CacheManagerSettings(cache_manager_shards="*").shard_selection == ShardSelection(True)


def test_shard_keys_follow_the_documented_formula_and_differ() -> None:
    deployment = 0x6C6F_7261_0007
    digest = hashlib.sha256(f"{deployment}/{BM_A}".encode()).digest()
    assert shard_lock_key(deployment, BM_A) == int.from_bytes(digest[:8], "big") >> 2
    keys = {shard_lock_key(deployment, f"model-{i}") for i in range(1000)}
    assert len(keys) == 1000 and all(0 < k < 2**62 for k in keys)
    assert shard_lock_key(deployment, BM_A) != shard_lock_key(deployment + 1, BM_A)
    assert deployment not in keys
    with pytest.raises(ValueError, match="base model"):
        shard_lock_key(deployment, "")
    assert shard_group("cm", BM_A) == "cm.shard.base/alpha" != shard_group("cm", BM_B)


# --------------------------------------------------------------------------- what a shard plans


def heat_core(base_models: frozenset[str] | None = None) -> CacheCore:
    cfg = load_config(REPO / "config" / "policy.yaml")
    counter = iter(range(1, 1_000_000))
    return CacheCore(policy=make_policy("heat", cfg), policy_config=cfg,
                     rules=rules_from_mapping({"demand": {"enabled": False}}),
                     worker_timeout_s=3600, base_models=base_models,
                     id_factory=lambda: f"c{next(counter)}")


def fleet() -> tuple[list[ev.WorkerSpec], list[Ref]]:
    workers = [ev.WorkerSpec(f"wa{i}", slots=2, base_models=(BM_A,)) for i in range(3)] + [
        ev.WorkerSpec(f"wb{i}", slots=2, base_models=(BM_B,)) for i in range(2)]
    refs = [ev.ref(f"a{i}", bm=BM_A) for i in range(8)] + [
        ev.ref(f"b{i}", bm=BM_B) for i in range(6)]
    return workers, refs


def feed(cores: list[CacheCore], rounds: int, only: str = ""
         ) -> set[tuple[str, str, str, str]]:
    """One deployment (its cores see the same events, each shard's commands answered to all
    of them, as reports on ``cache.state`` are): every command issued, with its round.
    ``only``: a fleet of that base model alone (its versions, workers and heat)."""
    workers, refs = fleet()
    if only:
        workers = [w for w in workers if only in w.base_models]
    events = [ev.admitted(r, i, T0, size=5_000_000) for i, r in enumerate(refs, start=1)
              if not only or r.base_model == only]
    events += [ev.snapshot(w, 1, T0) for w in workers]
    for m in events:
        for core in cores:
            core.apply(m, T0)
    out: set[tuple[int, str, str, str]] = set()
    for n in range(rounds):
        t = T0 + 1 + n
        # a few versions of each base model get hot, in turn
        hot = [refs[n % 8], refs[(3 * n) % 8], refs[8 + n % 6], refs[8 + (5 * n) % 6]]
        for r in hot:
            if only and r.base_model != only:
                continue
            batch = ev.heat(r, 5 + n, t)
            for core in cores:
                core.apply(batch, t)
        answers = []
        for i, core in enumerate(cores):
            res = core.round(t)
            for issued in res.issued:
                spec = issued.pending.spec
                out.add((n, spec.kind.value, spec.worker_id, spec.version_id))
                answers.append(ev.answer(build_command(issued, f"core-{i}"), t))
        for a in answers:
            for core in cores:
                core.apply(a, t)
    return {(str(n), k, w, v) for n, k, w, v in out}


def test_a_shard_decides_what_a_fleet_of_its_base_model_alone_would() -> None:
    """Isolation: another base model's versions, workers and heat change nothing of a shard's
    decisions (round by round, command by command), and two shards of one deployment
    decide each what it decides alone."""
    shard_a = feed([heat_core(frozenset({BM_A}))], rounds=12)
    shard_b = feed([heat_core(frozenset({BM_B}))], rounds=12)
    assert len(shard_a) > 5 and len(shard_b) > 5, "the scenario must make decisions"
    assert feed([heat_core()], rounds=12, only=BM_A) == shard_a
    assert feed([heat_core()], rounds=12, only=BM_B) == shard_b
    both = feed([heat_core(frozenset({BM_A})), heat_core(frozenset({BM_B}))], rounds=12)
    assert both == shard_a | shard_b and not shard_a & shard_b


def test_a_shard_keeps_other_base_models_foreign_and_their_workers_out() -> None:
    core = heat_core(frozenset({BM_A}))
    a, b = ev.ref("a", bm=BM_A), ev.ref("b", bm=BM_B)
    core.apply(ev.admitted(a, 1, T0), T0)
    core.apply(ev.admitted(b, 2, T0), T0)
    shared = ev.WorkerSpec("w-both", slots=2, base_models=(BM_A, BM_B), warm_bytes=10_000_000,
                           held=[ev.Held(b, engine_id=2, size=4_000_000)])
    only_b = ev.WorkerSpec("w-b", slots=2, base_models=(BM_B,))
    for w in (shared, only_b):
        core.apply(ev.snapshot(w, 1, T0), T0)
    assert core.state.versions[a.version_id].status is Status.ADMITTED
    assert core.state.versions[b.version_id].status is Status.FOREIGN
    # heat of another base model is not this shard's
    assert "burst" not in core.apply(ev.heat(b, 10, T0 + 1), T0 + 1).applied.triggers
    assert b.version_id not in core.state.stats
    # every worker is followed; only those serving the shard's base model are planned
    assert set(core.state.workers) == {"w-both", "w-b"}
    assert set(project(core.state, core.tracker)) == {"w-both"}
    snap = core.planner.build_snapshot(core.state, project(core.state, core.tracker), T0 + 1)
    [w] = snap.workers
    assert dict(w.hot_slots) == {BM_A: 2}  # b's HOT slot is in its own base model's engine
    assert w.warm_bytes == 6_000_000  # b's bytes are taken
    assert set(snap.versions) == {a.version_id}
    # a registry record of another base model (a late lookup) stays foreign
    core.state.resolve(b.version_id, core.state.versions[b.version_id].with_status(
        Status.ACTIVE))
    assert core.state.versions[b.version_id].status is Status.FOREIGN
    res = core.round(T0 + 2)
    assert all(i.pending.spec.version_id == a.version_id for i in res.issued)
