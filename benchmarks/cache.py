"""Cache-manager benchmark: decision latency and heat-event throughput.

``python -m benchmarks.cache [--quick] [--no-stack] [--rounds N] [--out FILE]``

In process (pure decision core, no I/O):

* ``round``: time of one planning round of one shard (projection + snapshot + heat policy +
  business rules + guards), the curve over 4 / 16 / 64 workers × 200 / 2,000 / 10,000
  versions per shard, plus one shard of two base models at 64 × 10,000 (the other's
  versions and workers present, foreign to it), and 64 × 10,000 again with the adaptive
  ranking ready (fed one and a half HOT time constants of requests first: the order a leader
  plans by once it has seen that much traffic; the other fleets have seen too few requests
  for it at 16 and 64 workers and plan by the plain heat score), in steady state (every command
  answered before the next round, a few new bursts per round), with the ``HotOrder``
  commands a round sends per round; checked against the issue-18 target (p99 ≤ 50 ms at 64
  workers × 10,000 versions per shard); beside the wall times, the round's own CPU time
  (``time.thread_time``: p50 and max), without the time it waits for a CPU on a loaded machine;
* ``apply``: heat batches decoded from their Kafka bytes and applied to the state
  (completions/s and batches/s one process absorbs).

Over the broker (``LORAPLANE_KAFKA_BOOTSTRAP`` / ``LORAPLANE_POSTGRES_DSN``; ``make
bench-cache`` starts a private stack), with a real ``python -m loraplane.cache_manager``:

* ``e2e_decision``: a burst published on ``adapter.heat`` → the load command read back
  from ``cache.commands`` (what a worker would observe), per burst;
* ``e2e_heat``: a backlog of heat batches on ``adapter.heat`` consumed by the manager
  (its ``loraplane_cache_events_total`` counter), batches/s and completions/s.

Prints a table and writes JSON (default ``.loraplane/bench/cache.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from loraplane.cache_manager.core import CacheCore
from loraplane.cache_manager.kafka_io import EventSource
from loraplane.cache_manager.leader import freeze_state, thaw_state
from loraplane.cache_manager.messages import build_command
from loraplane.cache_manager.model import Ref
from loraplane.cache_manager.rules import RulesConfig
from loraplane.policy.config import load_config
from loraplane.policy.factory import make_policy
from loraplane.shared import topics
from loraplane.shared.codec import decode, encode
from loraplane.shared.settings import CommonSettings
from loraplane.stack.settings import StackSettings
from loraplane.stack.stack import Stack
from loraplane.v1 import common_pb2
from tests.support import eventgen as ev

OUT = Path(".loraplane/bench/cache.json")
TARGET_P99_MS = 50.0
"""Issue 18: a shard's round at 64 workers × 10,000 versions."""


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _summary(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "p50_ms": _pct(xs, 0.5) * 1e3, "p90_ms": _pct(xs, 0.9) * 1e3,
            "p99_ms": _pct(xs, 0.99) * 1e3, "max_ms": max(xs) * 1e3,
            "mean_ms": statistics.fmean(xs) * 1e3}


# --------------------------------------------------------------------------- in process


def _fleet(n_workers: int, n_versions: int, slots: int, seed: int = 7, shards: int = 1,
           ranked: bool = False) -> tuple[CacheCore, list[Ref], float]:
    """A core with ``n_workers`` synced workers and ``n_versions`` admitted versions.

    ``shards`` > 1: that many base models, each with its own ``n_workers`` and
    ``n_versions``; the core is the first base model's shard (``base_models``), fed every
    event of every shard as a shard leader is (the others' are foreign to it).
    ``ranked``: 1.5 × the requests the adaptive ranking waits for (one HOT time constant,
    ``adaptive.hot_tau_per_slot`` × slots × workers) are fed first, power-law over the
    versions, so the plan ranks by the adaptive experts from the first round, as a leader
    does once it has seen that much traffic; otherwise it ranks by the plain heat score."""
    rng = random.Random(seed)
    core = CacheCore(policy=make_policy("heat", load_config()), policy_config=load_config(),
                     rules=RulesConfig(), worker_timeout_s=3600.0,
                     base_models=frozenset({ev.BM}) if shards > 1 else None)
    now = time.time()
    models = [ev.BM] + [f"{ev.BM}-{k}" for k in range(1, shards)]
    refs = [ev.ref(f"a{i:05d}", tenant=f"t{i % 50:02d}") for i in range(n_versions)]
    prios = [common_pb2.PRIORITY_PLATINUM, common_pb2.PRIORITY_GOLD, common_pb2.PRIORITY_SILVER,
             common_pb2.PRIORITY_BRONZE]
    for k, bm in enumerate(models):
        mine = refs if k == 0 else [
            ev.ref(f"a{i:05d}", tenant=f"t{i % 50:02d}-{k}", bm=bm) for i in range(n_versions)]
        for i, r in enumerate(mine, start=1):
            p = prios[0] if i % 97 == 0 else prios[1 + (i % 3)]
            core.apply(ev.admitted(r, k * n_versions + i, now,
                                   size=rng.randint(100_000, 50_000_000), priority=p), now)
        for w in range(n_workers):
            core.apply(ev.snapshot(ev.WorkerSpec(
                f"w{w:03d}" if k == 0 else f"w{w:03d}-{k}", slots=slots,
                warm_bytes=slots * 4 * 50_000_000, base_models=(bm,)), 1, now), now)
        # Power-law popularity: the first versions are requested most.
        for i, r in enumerate(mine):
            n = int(200 / (i + 1) ** 0.9)
            if n:
                core.apply(ev.heat(r, n, now - rng.uniform(0, 300)), now)
    if ranked:
        need = int(1.5 * load_config().adaptive.hot_tau_per_slot * slots * n_workers)
        for _ in range(need // 20 + 1):
            r = refs[min(int(rng.paretovariate(0.8)) - 1, n_versions - 1)]
            core.apply(ev.heat(r, 20, now - rng.uniform(0, 300)), now)
    return core, refs, now


def _answer_all(core: CacheCore, issued: list[Any], t: float) -> None:
    for i in issued:
        core.apply(ev.answer(build_command(i, "bench"), t), t)


def bench_rounds(n_workers: int, n_versions: int, slots: int, rounds: int, shards: int = 1,
                 ranked: bool = False) -> dict[str, Any]:
    """Steady-state planning rounds (of one shard when ``shards`` > 1); latency figures and
    the ``HotOrder`` commands a round sends (each taken as published, as the leader marks
    them: :meth:`Planner.hot_order_sent`)."""
    core, refs, now = _fleet(n_workers, n_versions, slots, shards=shards, ranked=ranked)
    rng = random.Random(11)
    t = now
    first = time.perf_counter()
    res = core.round(t)
    first_s = time.perf_counter() - first
    commands = len(res.issued)
    freeze_state()  # what the leader does after its first round on the rebuilt state

    def sent(res: Any) -> int:
        for wid, order in res.round.hot_orders.items():
            core.planner.hot_order_sent(wid, order)
        return len(res.round.hot_orders)

    sent(res)
    _answer_all(core, res.issued, t)
    for _ in range(5):  # converge
        t += 1.0
        res = core.round(t)
        sent(res)
        _answer_all(core, res.issued, t)
    times: list[float] = []
    cpu: list[float] = []
    hot_orders = 0
    for _ in range(rounds):
        t += 1.0
        for r in rng.sample(refs, 3):  # a few bursts per round
            core.apply(ev.heat(r, rng.randint(5, 50), t), t)
        start, start_cpu = time.perf_counter(), time.thread_time()
        res = core.round(t)
        times.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
        commands += len(res.issued)
        hot_orders += sent(res)
        _answer_all(core, res.issued, t)
    thaw_state(False)  # this fleet's leadership ends: the next one is built unfrozen
    return {"workers": n_workers, "versions": n_versions, "slots": slots, "shards": shards,
            "ranked": res.round.snapshot.ranks is not None, "first_round_ms": first_s * 1e3,
            "commands": commands, "hot_orders_per_round": hot_orders / rounds,
            **_summary(times), "cpu_p50_ms": _pct(cpu, 0.5) * 1e3, "cpu_max_ms": max(cpu) * 1e3}


def bench_apply(n_batches: int, per_batch: int, n_versions: int) -> dict[str, Any]:
    """Decode + apply of heat batches from their wire bytes."""
    core, refs, now = _fleet(4, n_versions, 8)
    rng = random.Random(3)
    wire = []
    for _ in range(n_batches):
        body, headers = encode(ev.heat(rng.choice(refs), per_batch, now))
        wire.append((body, headers))
    start = time.perf_counter()
    for body, headers in wire:
        core.apply(decode(topics.ADAPTER_HEAT, body, headers), now)
    elapsed = time.perf_counter() - start
    return {"batches": n_batches, "completions_per_batch": per_batch,
            "batches_per_s": n_batches / elapsed,
            "completions_per_s": n_batches * per_batch / elapsed}


# --------------------------------------------------------------------------- over the broker


def _events(m: Any, topic: str) -> float:
    """Events of ``topic`` the manager process has applied or found duplicate."""
    total = 0.0
    try:
        lines = m.metric_lines("loraplane_cache_events_total")
    except OSError:
        return 0.0
    for line in lines:
        if f'topic="{topic}"' in line:
            total += float(line.split()[-1])
    return total


async def _caught_up(m: Any, quiet_s: float = 1.5, timeout_s: float = 600.0) -> dict[str, float]:
    """Wait until no more retained heat is being replayed; returns how much and how fast."""
    start = time.perf_counter()
    last, last_change = -1.0, time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        n = _events(m, topics.ADAPTER_HEAT)
        if n != last:
            last, last_change = n, time.perf_counter()
        elif time.perf_counter() - last_change > quiet_s:
            break
        await asyncio.sleep(0.1)
    span = max(last_change - start, 1e-9)
    return {"replayed_heat_batches": last, "replay_s": span,
            "replay_batches_per_s": last / span if last > 0 else 0.0}


async def bench_e2e(settings: CommonSettings, bursts: int, backlog: int, per_batch: int
                    ) -> dict[str, Any]:
    """A real manager process on the stack: decision latency and heat throughput."""
    from tests.support.cache_manager import Bus, Heartbeat, Launcher, Registry, Responder

    tag = uuid.uuid4().hex[:8]
    tenant = f"bench-{tag}"
    registry = Registry(settings.postgres_dsn, tenant)
    await registry.tenant_row()
    refs = [await registry.version(f"b{i:03d}") for i in range(bursts)]
    hot_refs = [await registry.version(f"h{i:03d}") for i in range(20)]
    env = {"LORAPLANE_POSTGRES_DSN": settings.postgres_dsn,
           "LORAPLANE_KAFKA_BOOTSTRAP": settings.kafka_bootstrap}
    bus = Bus(settings.kafka_bootstrap)
    await bus.start()
    workdir = Path(tempfile.mkdtemp(prefix="cm-bench-"))
    # the stack scripts/with_stack.sh started (its LORAPLANE_STACK_* in the environment):
    # the manager serves and dials with mutual TLS as that stack's dev CA's cache-manager
    stack = Stack(StackSettings(profile="run"))
    launcher = Launcher(env, workdir, tag, tenants=tenant, stack=stack)
    worker = ev.WorkerSpec(f"bench-w-{tag}", slots=bursts + 30, warm_bytes=10**12)
    hb = await Heartbeat(bus, worker).start()
    responder = Responder(bus, worker).start()
    out: dict[str, Any] = {}
    try:
        slow_broker = {"LORAPLANE_CACHE_MANAGER_TICK_S": "2",
                       "LORAPLANE_CACHE_MANAGER_WORKER_TIMEOUT_S": "30"}
        m = launcher.start(**slow_broker)
        await m.wait_planning(timeout=60)
        # A new deployment reads the retained history first: wait until it caught up.
        caught_up = await _caught_up(m)
        out["catch_up"] = caught_up
        # Decision latency: burst published -> load command read back.
        lat: list[float] = []
        for r in refs:
            n0 = len(bus.commands)
            t0 = time.perf_counter()
            await bus.publish(ev.heat(r, 20, time.time()))
            while True:
                got = [i for i in range(n0, len(bus.commands))
                       if bus.commands[i].meta.adapter.adapter_name == r.adapter_name
                       and bus.commands[i].WhichOneof("command") == "load"]
                if got:
                    lat.append(bus.arrivals[got[0]] - t0)
                    break
                if time.perf_counter() - t0 > 10:
                    raise RuntimeError(f"no load command for {r.version_id} in 10 s")
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.05)
        out["e2e_decision"] = _summary(lat)
        # Heat throughput: the manager is stopped, a backlog is published, a new manager
        # (same group: it resumes at the committed offsets) absorbs it.
        m.stop()
        rng = random.Random(5)
        batches = [ev.heat(rng.choice(hot_refs), per_batch, time.time()) for _ in range(backlog)]
        t_pub = time.perf_counter()
        await bus.publish(*batches)
        pub_s = time.perf_counter() - t_pub
        m2 = launcher.start(**slow_broker)

        def applied() -> float:
            return _events(m2, topics.ADAPTER_HEAT)

        t_first = t_end = None
        deadline = time.perf_counter() + 300
        while time.perf_counter() < deadline:
            n = applied()
            if n > 0 and t_first is None:
                t_first = time.perf_counter()
            if n >= backlog:
                t_end = time.perf_counter()
                break
            await asyncio.sleep(0.01)
        total = applied()
        if t_first is None or t_end is None:
            raise RuntimeError(f"backlog not absorbed: {total} of {backlog}")
        span = t_end - t_first
        # The broker's own read rate of that backlog (a bare consumer, nothing applied).
        src = EventSource(settings.kafka(), f"bench-raw-{tag}",
                          topics_=(topics.ADAPTER_HEAT,))
        await src.start()
        n = 0
        t_raw: float | None = None
        while n < backlog:
            recs = await src.poll(500)
            if recs and t_raw is None:
                t_raw = time.perf_counter()
            n += len(recs)
        raw_span = time.perf_counter() - (t_raw or time.perf_counter())
        await src.stop()
        out["e2e_heat"] = {
            "batches": int(total), "completions_per_batch": per_batch,
            "publish_s": pub_s, "consume_span_s": span,
            "batches_per_s": total / span, "completions_per_s": total * per_batch / span,
            "broker_read_batches_per_s": n / raw_span if raw_span > 0 else 0.0,
        }
    finally:
        await responder.stop()
        await hb.stop()
        launcher.stop_all()
        await bus.stop()
    return out


# --------------------------------------------------------------------------- main


def main() -> None:
    """Run the benchmark, print the table, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="Small sizes (smoke run).")
    ap.add_argument("--no-stack", action="store_true", help="In-process measures only.")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--rounds", type=int, default=0,
                    help="Steady-state rounds per fleet (default 100, --quick 10).")
    args = ap.parse_args()
    # The curve: workers × versions per shard, then one shard of two (the other base model's
    # versions and workers present, foreign to it) at the largest size.
    # Last, the largest with the adaptive ranking ready (a leader that has seen one HOT time
    # constant of traffic plans by it; the others plan by the plain heat score).
    fleets = [(4, 200, 8, 1, False), (16, 2000, 16, 1, False)] if args.quick else [
        (w, v, 8 if w == 4 else 16, 1, False) for w in (4, 16, 64) for v in (200, 2000, 10000)
    ] + [(64, 10000, 16, 2, False), (64, 10000, 16, 1, True)]
    rounds = args.rounds or (10 if args.quick else 100)
    result: dict[str, Any] = {"rounds": [], "apply": None,
                              "target": {"workers": 64, "versions": 10000, "p99_ms": TARGET_P99_MS}}
    print("planning round per shard (pure core, heat policy, steady state):")
    print(f"  {'workers':>7} {'versions':>8} {'slots':>5} {'shards':>6} {'ranked':>6} "
          f"{'first ms':>9} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'cpu p50':>8} {'cpu max':>8} "
          f"{'orders/rnd':>10}")
    for w, v, s, k, ranked in fleets:
        r = bench_rounds(w, v, s, rounds, shards=k, ranked=ranked)
        result["rounds"].append(r)
        print(f"  {w:>7} {v:>8} {s:>5} {k:>6} {'yes' if r['ranked'] else 'no':>6} "
              f"{r['first_round_ms']:>9.1f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} "
              f"{r['max_ms']:>8.2f} {r['cpu_p50_ms']:>8.2f} {r['cpu_max_ms']:>8.2f} "
              f"{r['hot_orders_per_round']:>10.1f}")
    at_target = [r for r in result["rounds"] if (r["workers"], r["versions"]) == (64, 10000)]
    if at_target:
        worst = max(r["p99_ms"] for r in at_target)
        result["target"]["met"] = worst <= TARGET_P99_MS
        print(f"target p99 <= {TARGET_P99_MS:.0f} ms at 64 workers x 10,000 versions per shard: "
              f"{'met' if worst <= TARGET_P99_MS else 'MISSED'} (p99 {worst:.1f} ms)")
    a = bench_apply(2000 if args.quick else 20000, 20, 2000)
    result["apply"] = a
    print(f"heat apply (decode + state, in process): {a['batches_per_s']:,.0f} batches/s, "
          f"{a['completions_per_s']:,.0f} completions/s ({a['completions_per_batch']}/batch)")
    if not args.no_stack:
        settings = CommonSettings()
        e2e = asyncio.run(bench_e2e(settings, bursts=10 if args.quick else 30,
                                    backlog=2000 if args.quick else 10000, per_batch=20))
        result.update(e2e)
        d, h = e2e["e2e_decision"], e2e["e2e_heat"]
        print(f"burst published -> load command read back (real manager, Tansu): "
              f"p50 {d['p50_ms']:.1f} ms, p90 {d['p90_ms']:.1f} ms, max {d['max_ms']:.1f} ms "
              f"(n={d['n']})")
        print(f"heat backlog absorbed by one manager: {h['batches_per_s']:,.0f} batches/s, "
              f"{h['completions_per_s']:,.0f} completions/s ({h['batches']} batches of "
              f"{h['completions_per_batch']}); the broker alone serves that backlog at "
              f"{h['broker_read_batches_per_s']:,.0f} batches/s (bare consumer)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
