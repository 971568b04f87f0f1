"""Snapshot builders, a plan executor that checks every step, and hypothesis strategies."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType

from hypothesis import strategies as st

from loraplane.policy.model import Priority, RequestClass
from loraplane.policy.plan import ActionKind, Plan
from loraplane.policy.snapshot import Snapshot, VersionMeta, WorkerState
from loraplane.policy.stats import StatsView, VersionStats

MB = 1_000_000


def meta(
    vid: str,
    *,
    size_mb: int = 50,
    priority: Priority = Priority.BRONZE,
    canary: bool = False,
    base_model: str = "bm",
    warmup: float = 0.0,
    superseded: bool = False,
) -> VersionMeta:
    """A version with sensible defaults (tenant = the part before the slash)."""
    return VersionMeta(
        version_id=vid,
        tenant_id=vid.split("/", 1)[0],
        base_model=base_model,
        priority=priority,
        size_bytes=size_mb * MB,
        canary=canary,
        warmup=warmup,
        superseded=superseded,
    )


def requested(
    times: list[float],
    cls: RequestClass = RequestClass.INTERACTIVE,
    *,
    errors: int = 0,
    finished: int = 0,
) -> StatsView:
    """Statistics of a version requested at ``times``."""
    s = VersionStats()
    for t in times:
        s.record_request(t, cls)
    s.record_load()
    for k in range(finished):
        s.finish_request(error=k < errors)
    return s.view()


def worker(
    wid: str,
    *,
    slots: int | dict[str, int] = 2,
    warm_mb: int = 1000,
    hot: set[str] | None = None,
    warm: set[str] | None = None,
    pinned: set[str] | None = None,
    in_flight: dict[str, int] | None = None,
) -> WorkerState:
    """A worker serving base model ``bm`` (or the given slots per base model)."""
    return WorkerState(
        worker_id=wid,
        hot_slots=MappingProxyType({"bm": slots} if isinstance(slots, int) else dict(slots)),
        warm_bytes=warm_mb * MB,
        hot=frozenset(hot or ()),
        warm=frozenset(warm or ()),
        pinned=frozenset(pinned or ()),
        in_flight=MappingProxyType(dict(in_flight or {})),
    )


@dataclass
class Placement:
    """Mutable placement of one worker while a plan is applied."""

    hot: set[str]
    warm: set[str]
    pinned: set[str]
    log: list[str] = field(default_factory=list)


def apply_plan(snapshot: Snapshot, plan: Plan, *, check_capacity: bool = True) -> dict[str, Placement]:
    """Execute ``plan`` on the snapshot's placement, asserting every precondition and, after
    every step, every capacity (HOT slots per base model, host bytes, pins < slots)."""
    state = {
        w.worker_id: Placement(set(w.hot), set(w.warm | w.hot), set(w.pinned))
        for w in snapshot.workers
    }
    workers = {w.worker_id: w for w in snapshot.workers}
    for a in plan:
        w = workers[a.worker_id]
        p = state[a.worker_id]
        v = a.version_id
        busy = w.busy(v)
        if a.kind is ActionKind.UNPIN:
            assert v in p.pinned, a
            p.pinned.discard(v)
        elif a.kind is ActionKind.DEMOTE:
            assert v in p.hot and v not in p.pinned and not busy, a
            p.hot.discard(v)
        elif a.kind is ActionKind.EVICT:
            assert v in p.warm and v not in p.hot and not busy, a
            p.warm.discard(v)
        elif a.kind is ActionKind.PREFETCH:
            assert v not in p.warm, a
            p.warm.add(v)
        elif a.kind is ActionKind.PROMOTE:
            assert v not in p.hot, a
            assert snapshot.versions[v].base_model in w.hot_slots, a
            p.hot.add(v)
            p.warm.add(v)
        elif a.kind is ActionKind.PIN:
            assert v in p.hot and v not in p.pinned, a
            p.pinned.add(v)
        p.log.append(f"{a.kind.value} {v}")
        if check_capacity:
            assert_capacity(snapshot, w, p)
    return state


def assert_capacity(snapshot: Snapshot, w: WorkerState, p: Placement) -> None:
    """HOT slots per base model, pins < slots, host bytes."""
    for bm, slots in w.hot_slots.items():
        hot = [v for v in p.hot if snapshot.versions[v].base_model == bm]
        pins = [v for v in p.pinned if snapshot.versions[v].base_model == bm]
        assert len(hot) <= slots, (w.worker_id, bm, sorted(hot), slots, p.log)
        assert len(pins) <= max(slots - 1, 0), (w.worker_id, bm, sorted(pins), p.log)
    used = sum(snapshot.versions[v].size_bytes for v in p.warm)
    assert used <= w.warm_bytes, (w.worker_id, used, w.warm_bytes, p.log)


def within_capacity(snapshot: Snapshot) -> bool:
    """True when the snapshot itself respects every capacity."""
    for w in snapshot.workers:
        try:
            assert_capacity(snapshot, w, Placement(set(w.hot), set(w.warm | w.hot), set(w.pinned)))
        except AssertionError:
            return False
    return True


@st.composite
def snapshots(draw: st.DrawFn) -> tuple[Snapshot, float]:
    """A consistent snapshot within its capacities, and a clock."""
    now = draw(st.floats(min_value=0.0, max_value=20_000.0, allow_nan=False))
    n = draw(st.integers(min_value=1, max_value=12))
    bms = ["bm1", "bm2"]
    metas = []
    for i in range(n):
        metas.append(
            VersionMeta(
                version_id=f"t{i % 4}/a{i}@v1",
                tenant_id=f"t{i % 4}",
                base_model=draw(st.sampled_from(bms)),
                priority=draw(st.sampled_from(list(Priority))),
                size_bytes=draw(st.integers(min_value=1, max_value=6)) * 10 * MB,
                canary=draw(st.booleans()),
                warmup=draw(st.sampled_from([0.0, 0.0, 0.0, 1.0])),
                superseded=draw(st.sampled_from([False, False, False, True])),
            )
        )
    stats: dict[str, StatsView] = {}
    for m in metas:
        if draw(st.booleans()):
            times = sorted(
                draw(st.lists(st.floats(min_value=0.0, max_value=now), min_size=1, max_size=8))
            )
            cls = draw(st.sampled_from(list(RequestClass)))
            finished = draw(st.integers(min_value=0, max_value=40))
            errors = draw(st.integers(min_value=0, max_value=finished))
            stats[m.version_id] = requested(times, cls, errors=errors, finished=finished)
    workers = []
    n_workers = draw(st.integers(min_value=1, max_value=3))
    for k in range(n_workers):
        slots = {"bm1": draw(st.integers(min_value=1, max_value=4))}
        if draw(st.booleans()):
            slots["bm2"] = draw(st.integers(min_value=1, max_value=3))
        warm_bytes = draw(st.integers(min_value=2, max_value=30)) * 10 * MB
        order = draw(st.permutations(metas))
        hot: set[str] = set()
        warm: set[str] = set()
        hot_by_bm: dict[str, list[str]] = {bm: [] for bm in slots}
        used = 0
        for m in order:
            choice = draw(st.sampled_from(["hot", "warm", "none", "none"]))
            if choice == "none" or used + m.size_bytes > warm_bytes:
                continue
            if choice == "hot":
                members = hot_by_bm.get(m.base_model)
                if members is None or len(members) >= slots[m.base_model]:
                    continue
                members.append(m.version_id)
                hot.add(m.version_id)
            else:
                warm.add(m.version_id)
            used += m.size_bytes
        pinned: set[str] = set()
        for bm, members in hot_by_bm.items():
            most = max(0, min(len(members), slots[bm] - 1))
            pinned.update(sorted(members)[: draw(st.integers(min_value=0, max_value=most))])
        in_flight = {
            v: draw(st.integers(min_value=1, max_value=3))
            for v in sorted(hot)
            if draw(st.booleans())
        }
        workers.append(
            WorkerState(
                worker_id=f"w{k}",
                hot_slots=MappingProxyType(slots),
                warm_bytes=warm_bytes,
                hot=frozenset(hot),
                warm=frozenset(warm),
                pinned=frozenset(pinned),
                in_flight=MappingProxyType(in_flight),
            )
        )
    return Snapshot.build(metas, workers, stats), now
