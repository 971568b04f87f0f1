"""The round's HOT order reaches the worker: the keep keys the worker's request-path victim
follows (``LoadAdapter.hot_keep``, ``HotOrder``), from the same ranking the heat plan uses."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from loraplane.cache_manager.messages import build_command, build_hot_order
from loraplane.cache_manager.model import CommandKind
from loraplane.policy.snapshot import Ranks
from tests.support import eventgen as ev
from tests.unit.cache_manager.test_with_heat_policy import _three_versions, heat_core


def test_the_round_carries_its_hot_order_and_keep_keys_to_the_worker() -> None:
    """The worker's request-path victim follows the ranking: each round hands the worker the
    keep key of every version HOT there (a HotOrder, sent again only when it changes), and a
    HOT load carries its own; the lowest key is the version the plan demotes."""
    core = heat_core()
    now = _three_versions(core, (40, 3, 10))
    res = core.round(now)
    ranks = res.round.snapshot.ranks
    assert ranks is not None
    orders = res.round.hot_orders
    engine = {vid: rec.engine_id for vid, rec in core.state.versions.items()}
    assert orders == {"w1": tuple(sorted(
        (engine[v], ranks.hot_key(v)) for v in ("acme/a@v1", "acme/b@v1")))}
    lowest = min(orders["w1"], key=lambda e: e[1])[0]
    demoted = [i.pending.spec.version_id for i in res.issued
               if i.pending.spec.kind is CommandKind.DEMOTE]
    assert [engine[v] for v in demoted] == [lowest]
    load = [i for i in res.issued if i.pending.spec.kind is CommandKind.LOAD_HOT]
    assert [i.pending.spec.hot_keep for i in load] == [ranks.hot_key("acme/c@v1")]
    cmd = build_command(load[0], "test")
    assert cmd.load.HasField("hot_keep") and cmd.load.hot_keep == ranks.hot_key("acme/c@v1")
    msg = build_hot_order("w1", orders["w1"], "test", "order-1", now)
    assert msg.WhichOneof("command") == "hot_order" and msg.worker_id == "w1"
    assert [(k.engine_id, k.keep) for k in msg.hot_order.keeps] == list(orders["w1"])
    # sent: not again while it stays the same; again once the worker's HOT set changes
    planner, state, snapshot = core.planner, core.state, res.round.snapshot
    planner.hot_order_sent("w1", orders["w1"])
    assert planner.hot_orders(state, snapshot) == {}
    core.apply(ev.snapshot(ev.WorkerSpec("w1", slots=2, started_at=2000.0, held=[
        ev.Held(ev.ref("a"))]), 1, now), now)  # restarted, one version HOT again
    assert planner.hot_orders(state, snapshot) == {
        "w1": ((engine["acme/a@v1"], ranks.hot_key("acme/a@v1")),)}


def test_a_hot_order_is_sent_again_only_when_its_keys_compare_otherwise() -> None:
    """Under live traffic the keep keys move every round; the worker's victim only compares
    them among its HOT versions, so the order goes again when that comparison changes (the
    order, or a tie), or when a HOT load to that worker carries this round's key."""
    core = heat_core()
    now = _three_versions(core, (40, 3, 10))
    planner, state = core.planner, core.state
    snapshot = core.round(now).round.snapshot
    ea, eb = (state.versions[f"acme/{n}@v1"].engine_id for n in ("a", "b"))

    def orders(a: float, b: float, loading: frozenset[str] = frozenset()) -> dict[str, object]:
        ranks = Ranks(MappingProxyType({"acme/a@v1": a, "acme/b@v1": b}))
        return dict(planner.hot_orders(state, replace(snapshot, ranks=ranks), loading))

    first = orders(-0.5, -1.0)
    assert first == {"w1": ((ea, -0.5), (eb, -1.0))}
    planner.hot_order_sent("w1", ((ea, -0.5), (eb, -1.0)))
    assert orders(-0.25, -2.0) == {}  # values moved, a still above b: nothing to send
    assert orders(-1.0, -0.5) == {"w1": ((ea, -1.0), (eb, -0.5))}  # b above a now
    assert orders(-0.5, -0.5) == {"w1": ((ea, -0.5), (eb, -0.5))}  # a tie is another order
    # a HOT load to w1 carries this round's key: w1 gets this round's keys of the others
    assert orders(-0.25, -2.0, frozenset({"w1"})) == {"w1": ((ea, -0.25), (eb, -2.0))}
    assert orders(-0.5, -1.0, frozenset({"w1"})) == {}  # exactly what w1 holds
    assert orders(-0.25, -2.0, frozenset({"w2"})) == {}


def test_a_round_with_a_hot_load_sends_that_worker_its_keys() -> None:
    """w1 holds keys of an earlier round that compare as this round's (so no order would go),
    and this round sends it a HOT load: its order goes too, with this round's keys."""
    core = heat_core()
    now = _three_versions(core, (40, 3, 10))
    current = core.planner.plan(core.state, core.tracker, now).hot_orders["w1"]
    older = tuple((eid, key * 2.0 - 1.0) for eid, key in current)  # same comparisons
    core.planner.hot_order_sent("w1", older)
    snapshot = core.planner.plan(core.state, core.tracker, now).snapshot
    assert core.planner.hot_orders(core.state, snapshot) == {}  # without the load: none
    res = core.round(now)
    assert [i.pending.spec.worker_id for i in res.issued
            if i.pending.spec.kind is CommandKind.LOAD_HOT] == ["w1"]
    assert res.round.hot_orders == {"w1": current}
