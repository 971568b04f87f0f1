"""A failing stable version taken out of routing through the real registry (issue 16).

The cache manager's canary runner judges stable versions (``tick_stable``): its figures come
from completed-request events run through ``observe`` (as the leader consumes them from
``adapter.heat``), its steps go through the real registry's admin API with the operator
token (``GrpcRegistryActions``) and its runs through ``canary_runs`` on the registry's
PostgreSQL. Shown: the rollback is one audited ``release.rollback`` step by
``system/canary-analysis`` carrying the figures, the release's stable pointer returns to
the previous version, the failing version is demoted (the service's callback), and a second
tick takes no second step.
"""

from __future__ import annotations

import json
import time

from loraplane.cache_manager import store
from loraplane.cache_manager.canary_analysis import AnalysisRules, Reason, StableAction
from loraplane.cache_manager.canary_runner import (
    ACTOR,
    REASON_PREFIX,
    CanaryRunner,
    GrpcRegistryActions,
    PgRunStore,
    observe,
)
from loraplane.cache_manager.canary_window import CanaryWindow
from loraplane.cache_manager.core import ABORTED, WITHDRAWN, ApplyResult, CacheCore
from loraplane.cache_manager.model import Pointers, TakenOut
from loraplane.cache_manager.rules import RulesConfig
from loraplane.cache_manager.state import Applied, State
from loraplane.policy.config import load_config
from loraplane.policy.factory import make_policy
from loraplane.shared.tls import CACHE_MANAGER
from loraplane.shared.topics import new_meta
from loraplane.stack.stack import Stack
from loraplane.v1 import common_pb2, events_pb2
from loraplane.v1 import registry_pb2 as R
from tests.support.registry import TOKEN, Registry
from tests.support.tls import tls_files

RULES = AnalysisRules(min_requests=10, window_s=600, dwell_s=60)


def completions(tid: str, name: str, version: str, n: int, *, failed: int = 0,
                tag: str = "") -> events_pb2.HeatBatch:
    ref = common_pb2.AdapterRef(tenant_id=tid, adapter_name=name, version=version,
                                base_model="loraplane/tiny-llama")
    return events_pb2.HeatBatch(completions=[
        events_pb2.RequestCompleted(
            meta=new_meta("gw/test", ref), request_id=f"{name}-{version}-{tag}-{i}",
            request_class=common_pb2.REQUEST_CLASS_INTERACTIVE,
            tier_at_arrival=common_pb2.TIER_HOT,
            status_code=13 if i < failed else 0, ttft_ms=20.0)  # 13: INTERNAL
        for i in range(n)])


async def pointers(registry: Registry, tid: str, name: str) -> Pointers:
    rel = (await registry.call("GetRelease", R.GetReleaseRequest(
        tenant_id=tid, adapter_name=name))).release  # type: ignore[attr-defined]
    return Pointers(stable=rel.stable_version, canary=rel.canary_version,
                    canary_percent=rel.canary_percent, rollback_to=rel.rollback_to)


async def taken_out(registry: Registry, tid: str) -> list[TakenOut]:
    """What a new leader reads at takeover (``store.taken_out``, the last 120 s): this
    tenant's entries."""
    assert registry.app.pool is not None
    async with registry.app.pool.acquire() as conn:
        return [t for t in await store.taken_out(conn, 120.0)
                if t.version_id.startswith(f"{tid}/")]


async def new_leader_blocks(registry: Registry, tid: str, now: float) -> list[str]:
    """The blocks a new leader of this tenant rebuilds at takeover (``leader._lead``)."""
    assert registry.app.pool is not None
    cfg = load_config()
    core = CacheCore(policy=make_policy("heat", cfg), policy_config=cfg, rules=RulesConfig(),
                     worker_timeout_s=30, tenants=frozenset({tid}))
    async with registry.app.pool.acquire() as conn:
        core.state.load_registry(*await store.read_registry(conn, frozenset({tid})))
        taken = await store.taken_out(conn, 120.0)
        withdrawn = await store.withdrawn(conn)
    return core.restore_blocks(taken, withdrawn, now)


async def test_an_abort_is_rebuilt_by_a_new_leader_from_the_registrys_audit_entry(
    stack: Stack, registry: Registry, unique: str
) -> None:
    """The analysis' abort (``SetCanary("", 0)`` by ``system/canary-analysis``, the figures
    in the reason) is what a new leader reads back from the registry's audit log and blocks;
    an operator's abort is not; once a person makes the version the canary again, nothing
    is blocked."""
    tid = await registry.tenant(unique)
    name = "bot"
    for v in ("v1", "v2", "v3"):
        await registry.admitted(tid, name, v)
    await registry.call("Promote", R.PromoteRequest(tenant_id=tid, adapter_name=name,
                                                    version="v1", reason="test"))
    actions = GrpcRegistryActions(registry.app.address, TOKEN,
                                  tls=tls_files(stack, CACHE_MANAGER))  # the cache-manager's
    try:
        # v3: aborted by an operator (not the analysis' block)
        await registry.call("SetCanary", R.SetCanaryRequest(
            tenant_id=tid, adapter_name=name, version="v3", percent=10, reason="test"))
        await registry.call("SetCanary", R.SetCanaryRequest(
            tenant_id=tid, adapter_name=name, version="", percent=0, reason="by hand"))
        # v2: advanced, then aborted by the analysis
        await registry.call("SetCanary", R.SetCanaryRequest(
            tenant_id=tid, adapter_name=name, version="v2", percent=10, reason="test"))
        await actions.set_share(tid, name, "v2", 50, REASON_PREFIX + json.dumps(
            {"action": "advance", "reason": "passed"}))
        before = time.time()
        await actions.set_share(tid, name, "", 0, REASON_PREFIX + json.dumps(
            {"action": "abort", "reason": "error_rate", "detail": "3 of 10 failed"}))
        after = time.time()
    finally:
        await actions.close()
    vid = f"{tid}/{name}@v2"
    taken = await taken_out(registry, tid)
    assert [(t.version_id, t.reason) for t in taken] == [(vid, ABORTED)], taken
    assert before - 5 <= taken[0].at <= after + 5, (before, taken[0].at, after)
    assert await new_leader_blocks(registry, tid, time.time()) == [vid]
    # a person makes it the canary again: the abort is superseded
    await registry.call("SetCanary", R.SetCanaryRequest(
        tenant_id=tid, adapter_name=name, version="v2", percent=10, reason="fixed"))
    assert await new_leader_blocks(registry, tid, time.time()) == []
    print(f"[measure] abort read back from the audit log, {taken[0].at - before:+.3f}s from "
          "the call; superseded by a new canary")


async def test_failing_stable_is_rolled_back_once_through_the_registry_audited(
    stack: Stack, registry: Registry, unique: str
) -> None:
    tid = await registry.tenant(unique)
    name, other = "bot", "faq"
    for v in ("v1", "v2"):
        await registry.admitted(tid, name, v)
    await registry.admitted(tid, other, "v1")
    for adapter, v in ((name, "v1"), (name, "v2"), (other, "v1")):
        await registry.call("Promote", R.PromoteRequest(tenant_id=tid, adapter_name=adapter,
                                                        version=v, reason="test"))
    state = State()
    for adapter in (name, other):
        state.set_pointers(f"{tid}/{adapter}", await pointers(registry, tid, adapter))
    assert state.pointers[f"{tid}/{name}"].rollback_target == "v1"

    assert registry.app.pool is not None
    actions = GrpcRegistryActions(registry.app.address, TOKEN,
                                  tls=tls_files(stack, CACHE_MANAGER))  # the cache-manager's
    runner = CanaryRunner(lambda _t, _a: RULES, actions,
                          PgRunStore(registry.app.pool, f"cm-test-{unique}"), CanaryWindow())
    withdrawn: list[str] = []
    runner.on_withdraw = lambda vid, _now, _detail: withdrawn.append(vid)
    await runner.start()
    now = time.time()
    # the other adapter's stable traffic is healthy; bot@v2 fails 12 of 30 after load
    for batch in (completions(tid, other, "v1", 200), completions(tid, name, "v2", 30,
                                                                   failed=12)):
        observe(runner.window, batch, ApplyResult(Applied()), now)
    try:
        taken = await runner.tick_stable(state, now + 1)
        assert [(d.action, d.reason, d.to_version) for d in taken] == [
            (StableAction.ROLLBACK, Reason.STABLE_ERROR_RATE, "v1")]
        assert withdrawn == [f"{tid}/{name}@v2"]
        assert (await pointers(registry, tid, name)).stable == "v1"
        # the lifecycle event has not reached this state yet: no second step
        assert await runner.tick_stable(state, now + 2) == []
    finally:
        await actions.close()
    entries = (await registry.call("ListAudit", R.ListAuditRequest(
        subject_prefix=f"{tid}/{name}", page_size=50))).entries  # type: ignore[attr-defined]
    steps = [e for e in entries if e.actor == ACTOR]
    assert [e.action for e in steps] == ["release.rollback"]
    reason = json.loads(steps[0].after_json)["reason"]
    assert reason.startswith(REASON_PREFIX)
    fig = json.loads(reason[len(REASON_PREFIX):])
    assert (fig["action"], fig["reason"], fig["to_version"]) == (
        "rollback", "stable_error_rate", "v1")
    assert fig["stable"]["version"] == "v2" and fig["stable"]["errors"] == 12
    assert fig["reference"]["requests"] == 200
    print(f"[measure] stable rollback: {fig['detail']}")
    # a new leader keeps the version rolled back from out (the registry withdrew it)
    assert [(t.version_id, t.reason) for t in await taken_out(registry, tid)] == [
        (f"{tid}/{name}@v2", WITHDRAWN)]
    assert await new_leader_blocks(registry, tid, time.time()) == [f"{tid}/{name}@v2"]


async def test_a_withdrawal_is_audited_kept_by_the_registry_across_a_leader_change(
    stack: Stack, registry: Registry, unique: str
) -> None:
    """A failing stable version with no version to fall back to is withdrawn through the
    registry (``version.withdraw`` by ``system/canary-analysis`` with the figures, the
    version's ``withdrawn_reason``, a ``VersionWithdrawn`` event). A new leader (a fresh
    runner on the same database, its window empty, the same failures replayed) neither
    forgets the withdrawal (the version stays out) nor takes the step again; a person who
    promotes the version again ends it."""
    tid = await registry.tenant(unique)
    name, other = "solo", "faq"
    await registry.admitted(tid, name, "v1")
    await registry.admitted(tid, other, "v1")
    for adapter in (name, other):
        await registry.call("Promote", R.PromoteRequest(tenant_id=tid, adapter_name=adapter,
                                                        version="v1", reason="test"))
    state = State()
    for adapter in (name, other):
        state.set_pointers(f"{tid}/{adapter}", await pointers(registry, tid, adapter))
    assert state.pointers[f"{tid}/{name}"].rollback_target == ""
    assert registry.app.pool is not None
    deployment = f"cm-test-{unique}"
    vid = f"{tid}/{name}@v1"

    def leader(actions: GrpcRegistryActions) -> tuple[CanaryRunner, list[str]]:
        assert registry.app.pool is not None
        runner = CanaryRunner(lambda _t, _a: RULES, actions,
                              PgRunStore(registry.app.pool, deployment), CanaryWindow())
        held: list[str] = []
        runner.on_withdraw = lambda v, _now, _detail: held.append(v)
        return runner, held

    def failing(runner: CanaryRunner, now: float, tag: str) -> None:
        for batch in (completions(tid, other, "v1", 200, tag=tag),
                      completions(tid, name, "v1", 30, failed=12, tag=tag)):
            observe(runner.window, batch, ApplyResult(Applied()), now)

    actions = GrpcRegistryActions(registry.app.address, TOKEN,
                                  tls=tls_files(stack, CACHE_MANAGER))  # the cache-manager's
    try:
        first, held = leader(actions)
        await first.start()
        now = time.time()
        failing(first, now, "a")
        taken = await first.tick_stable(state, now + 1)
        assert [(d.action, d.reason) for d in taken] == [
            (StableAction.WITHDRAW, Reason.STABLE_ERROR_RATE)]
        assert held == [vid]
        # the leader changes: the first one is gone, a new one takes over
        second, held2 = leader(actions)
        await second.start()
        assert vid in second.withdrawn
        failing(second, now + 2, "b")  # the consumed events replayed to the new leader
        assert await second.tick_stable(state, now + 3) == []
        assert held2 == [vid]  # kept out of HOT, no second step
    finally:
        await actions.close()
    # ... and a new cache-manager leader starts with it blocked (before its first round)
    assert [(t.version_id, t.reason) for t in await taken_out(registry, tid)] == [
        (vid, WITHDRAWN)]
    assert await new_leader_blocks(registry, tid, time.time()) == [vid]
    version = (await registry.call("GetVersion", R.GetVersionRequest(
        tenant_id=tid, adapter_name=name, version="v1"))).version  # type: ignore[attr-defined]
    assert "no version to roll back to" in version.withdrawn_reason
    entries = (await registry.call("ListAudit", R.ListAuditRequest(
        subject_prefix=f"{tid}/{name}", page_size=50))).entries  # type: ignore[attr-defined]
    steps = [e for e in entries if e.actor == ACTOR]
    assert [e.action for e in steps] == ["version.withdraw"]
    reason = json.loads(steps[0].after_json)["reason"]
    fig = json.loads(reason[len(REASON_PREFIX):])
    assert (fig["action"], fig["reason"]) == ("withdraw", "stable_error_rate")
    assert fig["stable"]["errors"] == 12 and fig["reference"]["requests"] == 200
    events = await registry.read("adapter.lifecycle", lambda evs: any(
        e.WhichOneof("event") == "withdrawn" and e.withdrawn.meta.adapter.tenant_id == tid
        for e in evs))
    withdrawn = [e.withdrawn for _, e, _ in events if e.WhichOneof("event") == "withdrawn"
                 and e.withdrawn.meta.adapter.tenant_id == tid]
    assert [(w.meta.adapter.version, w.reason.startswith(REASON_PREFIX)) for w in withdrawn] \
        == [("v1", True)]
    # a person promotes it again (the stable pointer does not move): the withdrawal ends
    await registry.call("Promote", R.PromoteRequest(tenant_id=tid, adapter_name=name,
                                                    version="v1", reason="fixed upstream"))
    version = (await registry.call("GetVersion", R.GetVersionRequest(
        tenant_id=tid, adapter_name=name, version="v1"))).version  # type: ignore[attr-defined]
    assert version.withdrawn_reason == ""
    assert vid not in await PgRunStore(registry.app.pool, deployment).withdrawn()
    assert await new_leader_blocks(registry, tid, time.time()) == []  # released again
    print(f"[measure] withdraw: {fig['detail']}; one version.withdraw entry across the "
          "leader change; promoted again by a person: withdrawal ended")
