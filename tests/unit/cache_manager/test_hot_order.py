"""The round's HOT order reaches the worker: the keep keys the worker's request-path victim
follows (``LoadAdapter.hot_keep``, ``HotOrder``), from the same ranking the heat plan uses."""

from __future__ import annotations

from loraplane.cache_manager.messages import build_command, build_hot_order
from loraplane.cache_manager.model import CommandKind
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
