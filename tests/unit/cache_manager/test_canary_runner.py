"""Canary runner: steps applied through (fake) registry actions, once, across restarts."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from loraplane.cache_manager.canary_analysis import Action, AnalysisRules, Reason, StableAction
from loraplane.cache_manager.canary_runner import REASON_PREFIX, CanaryRunner, Run, observe
from loraplane.cache_manager.canary_window import CanaryWindow
from loraplane.cache_manager.core import ApplyResult
from loraplane.cache_manager.model import (
    CommandKind,
    CommandSpec,
    Pointers,
    Ref,
    Status,
    VersionRecord,
)
from loraplane.cache_manager.state import Applied, Outcome, State
from loraplane.cache_manager.tracker import Pending, Resolution
from loraplane.shared.topics import new_meta
from loraplane.v1 import common_pb2, events_pb2

RULES = AnalysisRules(stages=(10, 50, 100), dwell_s=10, window_s=20, min_requests=3)
T0 = 2_000_000.0
ADAPTER = "acme/code"
CANARY, STABLE = "acme/code@v2", "acme/code@v1"


@dataclass
class FakeRegistry:
    """The registry's pointers and every call made (what the audit log would show)."""

    canary: str = "v2"
    percent: int = 10
    stable: str = "v1"
    calls: list[tuple[str, ...]] = field(default_factory=list)

    async def current(self, tenant_id: str, adapter_name: str) -> tuple[str, int]:
        return self.canary, self.percent

    async def set_share(self, tenant_id: str, adapter_name: str, version: str, percent: int,
                        reason: str) -> None:
        self.calls.append(("set_share", version, str(percent), reason))
        self.canary, self.percent = version, percent

    async def promote(self, tenant_id: str, adapter_name: str, version: str,
                      reason: str) -> None:
        self.calls.append(("promote", version, reason))
        self.previous = self.stable
        self.stable, self.canary, self.percent = version, "", 0

    async def stable_of(self, tenant_id: str, adapter_name: str) -> str:
        return self.stable

    async def rollback(self, tenant_id: str, adapter_name: str, to_version: str,
                       reason: str) -> None:
        self.calls.append(("rollback", to_version, reason))
        self.withdrawn[f"{tenant_id}/{adapter_name}@{self.stable}"] = reason
        self.previous, self.stable = self.stable, to_version

    async def withdraw(self, tenant_id: str, adapter_name: str, version: str,
                       reason: str) -> None:
        self.calls.append(("withdraw", version, reason))
        self.withdrawn[f"{tenant_id}/{adapter_name}@{version}"] = reason

    async def clear(self, tenant_id: str, adapter_name: str, version: str,
                    reason: str) -> None:
        self.calls.append(("clear", version, reason))
        self.uncleared.discard(f"{tenant_id}/{adapter_name}")

    previous: str = ""
    withdrawn: dict[str, str] = field(default_factory=dict)
    """Version id → reason (the registry's ``withdrawn_reason``)."""
    uncleared: set[str] = field(default_factory=set)
    """Adapter ids whose canary is not cleared (the registry's ``canary_cleared``)."""

    def pointers(self) -> Pointers:
        return Pointers(stable=self.stable, canary=self.canary, canary_percent=self.percent,
                        previous_stable=self.previous)


@dataclass
class MemStore:
    rows: dict[str, Run] = field(default_factory=dict)
    paused_ids: set[str] = field(default_factory=set)
    reg: FakeRegistry | None = None
    """The registry whose tables the store reads (withdrawals, clearance)."""

    async def paused(self) -> set[str]:
        return set(self.paused_ids)

    async def uncleared(self) -> set[str]:
        return set(self.reg.uncleared) if self.reg is not None else set()

    async def withdrawn(self) -> dict[str, str]:
        return dict(self.reg.withdrawn) if self.reg is not None else {}

    async def load(self) -> dict[str, Run]:
        return dict(self.rows)

    async def save(self, run: Run) -> None:
        self.rows[run.adapter_id] = run

    async def delete(self, adapter_id: str) -> None:
        self.rows.pop(adapter_id, None)


def make(reg: FakeRegistry, store: MemStore) -> tuple[CanaryRunner, State]:
    state = State()
    state.set_pointers(ADAPTER, reg.pointers())
    return CanaryRunner(lambda _t, _a: RULES, reg, store, CanaryWindow()), state


def serve(runner: CanaryRunner, vid: str, t: float, n: int, *, ok: bool = True,
          tag: str = "") -> None:
    for i in range(n):
        runner.window.request(vid, t, request_id=f"{vid}-{tag}-{t}-{i}", klass="interactive",
                              ok=ok, degraded=False, ttft_ms=20.0)


async def test_healthy_canary_walks_every_stage_then_is_promoted_once() -> None:
    reg, store = FakeRegistry(), MemStore()
    runner, state = make(reg, store)
    await runner.start()
    now = T0
    for _ in range(3):
        await runner.tick(state, now)            # stage starts (or continues)
        serve(runner, CANARY, now + 1, 5)
        serve(runner, STABLE, now + 1, 50)
        assert await runner.tick(state, now + 5) == []  # dwell not over
        taken = await runner.tick(state, now + 11)
        assert len(taken) == 1
        assert await runner.tick(state, now + 11) == []  # the same step is not taken twice
        state.set_pointers(ADAPTER, reg.pointers())      # the lifecycle event arrives
        now += 11
    assert [c[0] for c in reg.calls] == ["set_share", "set_share", "promote"]
    assert [c[2] for c in reg.calls[:2]] == ["50", "100"]
    assert reg.stable == "v2" and reg.calls[-1][2].startswith(REASON_PREFIX)
    await runner.tick(state, now + 1)
    assert store.rows == {}  # the run ended with the canary pointer


async def test_load_failures_abort_through_the_registry_and_demote() -> None:
    reg, store = FakeRegistry(percent=20), MemStore()
    runner, state = make(reg, store)
    aborted: list[str] = []
    runner.on_abort = lambda vid, _now: aborted.append(vid)
    await runner.start()
    await runner.tick(state, T0)
    for i in range(2):
        runner.window.load(CANARY, T0 + 1 + i, ok=False,
                           error="LOAD_ERROR_CODE_DOWNLOAD_FAILED: no objects")
    taken = await runner.tick(state, T0 + 3)
    assert [(d.action, d.reason) for d in taken] == [(Action.ABORT, Reason.LOAD_FAILED)]
    assert reg.calls[0][:3] == ("set_share", "", "0")
    assert "DOWNLOAD_FAILED" in reg.calls[0][3] and '"load_failures":2' in reg.calls[0][3]
    assert aborted == [CANARY] and reg.stable == "v1"
    # a new leader after the registry cleared the pointer demotes it again (the old one may
    # have died before its demotion), then forgets the run
    again: list[str] = []
    second, _ = make(reg, store)
    second.on_abort = lambda vid, _now: again.append(vid)
    await second.start()
    state.set_pointers(ADAPTER, reg.pointers())
    assert await second.tick(state, T0 + 4) == []
    assert again == [CANARY] and store.rows == {}


async def test_a_new_leader_neither_loses_nor_repeats_a_step() -> None:
    reg, store = FakeRegistry(), MemStore()
    first, state = make(reg, store)
    await first.start()
    await first.tick(state, T0)
    serve(first, CANARY, T0 + 1, 5)
    # leader change mid-stage: the stage start is durable, the new leader's figures refill
    second, state2 = make(reg, store)
    await second.start()
    assert second.runs[ADAPTER].stage_started_at == T0
    serve(second, CANARY, T0 + 9, 5, tag="b")
    taken = await second.tick(state2, T0 + 11)
    assert [d.to_percent for d in taken] == [50]
    # a third leader took over before the lifecycle event: its state still says 10 %
    third, stale = make(FakeRegistry(percent=10), store)
    third.actions = reg  # the same registry, now at 50 %
    await third.start()
    serve(third, CANARY, T0 + 12, 5, tag="c")
    assert await third.tick(stale, T0 + 30) == []  # registry has moved on: not re-taken
    assert [c[0] for c in reg.calls] == ["set_share"]


async def test_a_share_changed_by_a_person_starts_a_new_stage_and_pause_holds() -> None:
    reg, store = FakeRegistry(), MemStore(paused_ids={ADAPTER})
    runner, state = make(reg, store)
    await runner.start()
    await runner.tick(state, T0)
    serve(runner, CANARY, T0 + 1, 5)
    assert await runner.tick(state, T0 + 15) == []
    assert runner.last[ADAPTER].reason is Reason.PAUSED and store.rows[ADAPTER].paused
    reg.percent = 20
    state.set_pointers(ADAPTER, reg.pointers())
    await runner.tick(state, T0 + 16)
    run = runner.runs[ADAPTER]
    assert (run.percent, run.stage_started_at) == (20, T0 + 16)
    store.paused_ids.clear()  # resumed: the stage's dwell counts from the share change
    serve(runner, CANARY, T0 + 17, 5, tag="r")
    taken = await runner.tick(state, T0 + 27)
    assert [(d.from_percent, d.to_percent) for d in taken] == [(20, 50)]


# --------------------------------------------------------------------------- observe


def _completion(version: str, request_id: str, *, status: int = 0, degraded: bool = False,
                klass: int = 1, ttft: float = 12.0,
                tier: int = common_pb2.TIER_HOT) -> events_pb2.RequestCompleted:
    ref = common_pb2.AdapterRef(tenant_id="acme", adapter_name="code", version=version,
                                base_model="loraplane/tiny-llama")
    return events_pb2.RequestCompleted(meta=new_meta("gw", ref), request_id=request_id,
                                       request_class=klass, status_code=status,  # type: ignore[arg-type]
                                       degraded_to_base=degraded, ttft_ms=ttft,
                                       tier_at_arrival=tier)  # type: ignore[arg-type]


def test_observe_counts_requests_once_and_leaves_shadow_requests_to_the_golden_set() -> None:
    w = CanaryWindow()
    batch = events_pb2.HeatBatch(completions=[
        _completion("v2", "r1"), _completion("v2", "r1"),           # gateway + worker: once
        _completion("v2", "r2", status=14), _completion("v2", "r3", degraded=True),
        _completion("v2", "s1", klass=common_pb2.REQUEST_CLASS_CANARY),  # shadow
    ])
    observe(w, batch, ApplyResult(Applied()), time.time())
    f = w.figures(CANARY, 0, time.time() + 1)
    assert (f.requests, f.errors, f.degraded, f.refused) == (3, 1, 1, 0)
    assert f.ttft_ms == {"interactive": (12.0,)}


def test_observe_counts_failures_while_cold_as_refusals_not_errors_after_load() -> None:
    w = CanaryWindow()
    batch = events_pb2.HeatBatch(completions=[
        # refused per its cold-start budget (never reached a loaded copy)
        _completion("v1", "c1", status=14, tier=common_pb2.TIER_COLD),
        _completion("v1", "c2", status=14, tier=common_pb2.TIER_COLD),
        _completion("v1", "c3", tier=common_pb2.TIER_COLD),       # cold, then served
        _completion("v1", "c4", status=13, tier=common_pb2.TIER_WARM),  # failed after load
    ])
    observe(w, batch, ApplyResult(Applied()), time.time())
    f = w.figures(STABLE, 0, time.time() + 1)
    assert (f.requests, f.errors, f.refused) == (2, 1, 2)
    assert f.as_dict()["refused"] == 2
    # a transport failure after load is an error, marked as such (the stable analysis
    # leaves it out)
    observe(w, events_pb2.HeatBatch(completions=[
        _completion("v1", "c5", status=14, tier=common_pb2.TIER_HOT)]),
        ApplyResult(Applied()), time.time())
    f = w.figures(STABLE, 0, time.time() + 1)
    assert (f.errors, f.infra_errors) == (2, 1)


def test_observe_takes_load_answers_with_their_message_and_skips_timeouts() -> None:
    w = CanaryWindow()
    now = time.time()

    def res(cid: str, kind: CommandKind, ok: bool, result: str) -> Resolution:
        spec = CommandSpec(kind, "w1", CANARY, "canary_warmup")
        return Resolution(Pending(cid, spec, now, now + 30, 1), ok, result, True,
                          "" if ok else "LOAD_ERROR_CODE_DOWNLOAD_FAILED")

    applied = Applied(outcomes=[Outcome("c1", "w1", CANARY, ok=False,
                                        code="LOAD_ERROR_CODE_DOWNLOAD_FAILED",
                                        message="no objects under s3://b/p/")])
    result = ApplyResult(applied, [res("c1", CommandKind.LOAD_HOT, False, "failed"),
                                   res("c2", CommandKind.LOAD_HOT, False, "timeout"),
                                   res("c3", CommandKind.DEMOTE, False, "failed"),
                                   res("c4", CommandKind.LOAD_WARM, True, "ok")])
    observe(w, events_pb2.WorkerReport(), result, now)
    f = w.figures(CANARY, now - 1, now + 1)
    assert (f.load_attempts, f.load_failures) == (2, 1)
    assert f.last_load_error == "LOAD_ERROR_CODE_DOWNLOAD_FAILED: no objects under s3://b/p/"


def test_collector_exports_each_running_canary_stage_age_and_pause() -> None:
    from prometheus_client import CollectorRegistry

    from loraplane.cache_manager.canary_runner import CanaryCollector

    runner, _ = make(FakeRegistry(), MemStore())
    runner.runs = {ADAPTER: Run(ADAPTER, "v2", 10, T0, paused=True)}
    reg = CollectorRegistry()
    reg.register(CanaryCollector(lambda: runner, lambda: T0 + 30))
    labels = {"tenant": "acme", "adapter": "code", "version": "v2"}
    assert reg.get_sample_value("loraplane_cache_canary_stage_percent", labels) == 10
    assert reg.get_sample_value("loraplane_cache_canary_stage_seconds", labels) == 30
    assert reg.get_sample_value("loraplane_cache_canary_paused", labels) == 1
    runner.runs = {}
    assert reg.get_sample_value("loraplane_cache_canary_stage_percent", labels) is None


# --------------------------------------------------------------------------- stable


OTHER = "acme/chat"  # another adapter on the same base model: the reference traffic


def stable_setup(reg: FakeRegistry) -> tuple[CanaryRunner, State, list[tuple[str, str]]]:
    state = State()
    state.set_pointers(ADAPTER, reg.pointers())
    state.set_pointers(OTHER, Pointers(stable="v9"))
    runner = CanaryRunner(lambda _t, _a: RULES, reg, MemStore(reg=reg), CanaryWindow())
    out: list[tuple[str, str]] = []
    runner.on_withdraw = lambda vid, _now, detail: out.append((vid, detail))
    serve(runner, "acme/chat@v9", T0, 200, tag="ref")
    return runner, state, out


async def test_failing_stable_is_rolled_back_once_through_the_registry_and_demoted() -> None:
    reg = FakeRegistry(canary="", percent=0, stable="v1", previous="v0")
    runner, state, withdrawn = stable_setup(reg)
    serve(runner, STABLE, T0 + 1, 10)
    assert await runner.tick_stable(state, T0 + 2) == []  # healthy
    serve(runner, STABLE, T0 + 3, 4, ok=False)
    taken = await runner.tick_stable(state, T0 + 4)
    assert [(d.action, d.reason, d.to_version) for d in taken] == [
        (StableAction.ROLLBACK, Reason.STABLE_ERROR_RATE, "v0")]
    assert [c[:2] for c in reg.calls] == [("rollback", "v0")]
    reason = reg.calls[0][2]
    assert reason.startswith(REASON_PREFIX) and '"errors":4' in reason
    assert '"reference":{' in reason and '"requests":200' in reason
    assert withdrawn and withdrawn[0][0] == STABLE and "rolled back to v0" in withdrawn[0][1]
    # before the lifecycle event arrives: kept out of HOT, not rolled back twice
    assert await runner.tick_stable(state, T0 + 5) == []
    assert len(reg.calls) == 1 and len(withdrawn) == 2
    # the event arrives: v0 is stable; when v0 fails too, it is never rolled "back" to v1
    state.set_pointers(ADAPTER, reg.pointers())
    assert reg.pointers().rollback_target == "v1"
    serve(runner, "acme/code@v0", T0 + 6, 5, ok=False)
    taken = await runner.tick_stable(state, T0 + 7)
    assert [(d.action, d.stable_version) for d in taken] == [(StableAction.WITHDRAW, "v0")]
    assert [c[:2] for c in reg.calls] == [("rollback", "v0"), ("withdraw", "v0")]
    assert reg.calls[1][2].startswith(REASON_PREFIX) and '"action":"withdraw"' in reg.calls[1][2]
    assert withdrawn[-1][0] == "acme/code@v0"


async def test_failing_stable_without_a_target_is_withdrawn_while_it_stays_stable() -> None:
    reg = FakeRegistry(canary="", percent=0, stable="v1")
    runner, state, withdrawn = stable_setup(reg)
    serve(runner, STABLE, T0 + 1, 6, ok=False)
    taken = await runner.tick_stable(state, T0 + 2)
    assert [d.action for d in taken] == [StableAction.WITHDRAW]
    # audited through the registry with the figures (it keeps the withdrawal)
    assert [c[:2] for c in reg.calls] == [("withdraw", "v1")]
    assert '"errors":6' in reg.calls[0][2] and '"reason":"stable_error_rate"' in reg.calls[0][2]
    assert "no version to roll back to" in withdrawn[0][1]
    for t in (3, 4):  # held out every tick, one step only
        assert await runner.tick_stable(state, T0 + t) == []
    assert [v for v, _ in withdrawn] == [STABLE] * 3
    # a new leader (fresh runner, empty window, the same failures replayed) reads the
    # withdrawal from the registry: it keeps the version out and takes no second step
    second, _, again = stable_setup(reg)
    await second.start()
    assert STABLE in second.withdrawn
    serve(second, STABLE, T0 + 3, 6, ok=False, tag="replayed")
    assert await second.tick_stable(state, T0 + 4) == []
    assert len(reg.calls) == 1 and [v for v, _ in again] == [STABLE]
    # an operator releases another version: the old one is no longer held out
    state.set_pointers(ADAPTER, Pointers(stable="v2", previous_stable="v1"))
    assert await runner.tick_stable(state, T0 + 5) == []
    assert len(withdrawn) == 3


async def test_fleet_wide_failures_roll_nothing_back_and_a_moved_pointer_is_left() -> None:
    reg = FakeRegistry(canary="", percent=0, stable="v1", previous="v0")
    runner, state, _ = stable_setup(reg)
    # a worker outage: the other stable version's requests fail as much (400 of 600)
    serve(runner, "acme/chat@v9", T0 + 1, 400, ok=False, tag="outage")
    serve(runner, STABLE, T0 + 1, 4)
    serve(runner, STABLE, T0 + 1, 6, ok=False, tag="outage")
    assert await runner.tick_stable(state, T0 + 2) == [] and reg.calls == []
    assert runner.stable_last[ADAPTER].action is StableAction.KEEP
    # a clear failure, but the registry's stable moved on (a person promoted v2)
    reg2 = FakeRegistry(canary="", percent=0, stable="v1", previous="v0")
    runner2, state2, withdrawn2 = stable_setup(reg2)
    serve(runner2, STABLE, T0 + 1, 10, ok=False)
    reg2.stable = "v2"
    assert await runner2.tick_stable(state2, T0 + 2) == []
    assert reg2.calls == [] and withdrawn2 == []


# --------------------------------------------------------------------------- clearance


async def uncleared_canary() -> tuple[FakeRegistry, CanaryRunner, State]:
    """A started runner over a 20 % canary not cleared for tenant traffic yet, whose golden
    set is pending until a run of it is in the window."""
    reg, store = FakeRegistry(percent=20), MemStore()
    reg.uncleared.add(ADAPTER)
    store.reg = reg
    runner, state = make(reg, store)
    state.versions[CANARY] = _record(CANARY)
    runner.golden_pending = lambda vid, w=runner.window: not w.golden_seen(vid)
    await runner.start()
    return reg, runner, state


async def test_a_canary_is_cleared_for_tenant_traffic_only_once_its_golden_set_passed() -> None:
    reg, store = FakeRegistry(percent=20), MemStore()
    reg.uncleared.add(ADAPTER)
    store.reg = reg
    runner, state = make(reg, store)
    state.versions[CANARY] = _record(CANARY)
    pending = {CANARY}
    runner.golden_pending = lambda vid: vid in pending
    await runner.start()
    await runner.tick(state, T0)
    assert reg.calls == []  # its golden set has not answered: not cleared
    runner.window.golden(CANARY, T0 + 1, ok=2, failed=0)
    pending.clear()
    await runner.tick(state, T0 + 2)
    assert [c[:2] for c in reg.calls] == [("clear", "v2")]
    assert reg.calls[0][2].startswith(REASON_PREFIX)
    assert '"reason":"golden_set_passed"' in reg.calls[0][2] and '"golden_ok":2' in reg.calls[0][2]
    await runner.tick(state, T0 + 3)
    assert len(reg.calls) == 1 and runner.cleared == [ADAPTER]  # once


async def test_a_golden_set_that_passed_after_the_ticks_clock_read_clears_it_as_passed() -> None:
    """A golden-set run that finished while the tick awaited the registry is stamped later
    than the tick's ``now`` (and one older than the window still passed): the clearance
    names the pass, never ``no_golden_set`` (the CI's (d) case once read it so, at load)."""
    for finished_at in (T0 + 2.5, T0 + 2 - 10_000.0):
        reg, runner, state = await uncleared_canary()
        await runner.tick(state, T0)
        assert reg.calls == []
        runner.window.golden(CANARY, finished_at, ok=1, failed=0)
        await runner.tick(state, T0 + 2)
        assert [c[:2] for c in reg.calls] == [("clear", "v2")], finished_at
        assert '"reason":"golden_set_passed"' in reg.calls[0][2], reg.calls[0][2]
        assert '"golden_ok":1' in reg.calls[0][2]


async def test_a_canary_failing_its_golden_set_is_aborted_never_cleared() -> None:
    reg, runner, state = await uncleared_canary()
    await runner.tick(state, T0)  # the stage starts; golden pending: not cleared
    runner.window.golden(CANARY, T0 + 1, ok=1, failed=1, error="answer diverges")
    taken = await runner.tick(state, T0 + 2)
    assert [(d.action, d.reason) for d in taken] == [(Action.ABORT, Reason.GOLDEN_SET_FAILED)]
    assert [c[0] for c in reg.calls] == ["set_share"] and ADAPTER in reg.uncleared


async def test_a_failed_golden_set_aborts_whenever_it_finished() -> None:
    """The golden set judges the version, not a stage's traffic: a failure that finished
    before a share change (made by someone else) started the present stage, or longer ago
    than the window (the abort's registry call kept failing meanwhile), still aborts. Read
    through the stage's window alone it left the canary neither cleared (its golden set
    failed) nor aborted: the CI's (c) case waited 90 s for an abort that never came."""
    for case in ("share changed after the run", "older than the window"):
        reg, runner, state = await uncleared_canary()
        await runner.tick(state, T0)  # the 20 % stage starts; golden pending
        runner.window.golden(CANARY, T0 + 1, ok=0, failed=2, error="answer diverges")
        if case == "share changed after the run":
            reg.percent = 50  # an operator's step: the runner starts a new stage at its tick
            state.set_pointers(ADAPTER, reg.pointers())
            now = T0 + 2
        else:
            now = T0 + 1 + RULES.window_s + 5
        taken = await runner.tick(state, now)
        assert [(d.action, d.reason) for d in taken] == [
            (Action.ABORT, Reason.GOLDEN_SET_FAILED)], (case, runner.last[ADAPTER])
        assert taken[0].canary.golden_failed == 2, case
        assert [c[:3] for c in reg.calls] == [("set_share", "", "0")], case
        assert ADAPTER in reg.uncleared, case  # never cleared for tenant traffic


async def test_a_canary_without_a_golden_set_is_cleared_at_the_first_tick() -> None:
    reg, store = FakeRegistry(percent=20), MemStore()
    reg.uncleared.add(ADAPTER)
    store.reg = reg
    runner, state = make(reg, store)
    await runner.start()
    await runner.tick(state, T0)
    assert reg.calls == []  # its version record is not known yet: nothing to judge
    state.versions[CANARY] = _record(CANARY)
    await runner.tick(state, T0 + 1)
    assert [c[:2] for c in reg.calls] == [("clear", "v2")]
    assert '"reason":"no_golden_set"' in reg.calls[0][2]


def _record(vid: str) -> VersionRecord:
    tenant, _, rest = vid.partition("/")
    name, _, version = rest.partition("@")
    return VersionRecord(Ref(tenant, name, version, "loraplane/tiny-llama"), Status.CANARY,
                         engine_id=12)
