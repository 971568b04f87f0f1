"""Read API over a real gRPC server on loopback, and the command messages."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from prometheus_client import CollectorRegistry

from loraplane.cache_manager.core import CacheCore
from loraplane.cache_manager.grpc_api import CacheManagerApi
from loraplane.cache_manager.messages import build_command
from loraplane.cache_manager.model import CommandKind, CommandSpec, Tier
from loraplane.cache_manager.rules import RulesConfig
from loraplane.policy.config import PolicyConfig
from loraplane.policy.factory import make_policy
from loraplane.shared.grpcutil import Service, build_server
from loraplane.shared.metrics import RpcMetrics
from loraplane.v1 import cache_pb2, cache_pb2_grpc, common_pb2
from tests.support import eventgen as ev

T0 = 1_800_000_000.0
A, B = ev.ref("a"), ev.ref("b")


def core_with_state() -> CacheCore:
    core = CacheCore(policy=make_policy("lru", PolicyConfig()), policy_config=PolicyConfig(),
                     rules=RulesConfig(), worker_timeout_s=60)
    core.apply(ev.admitted(A, 1, T0), T0)
    core.apply(ev.admitted(B, 2, T0), T0)
    core.apply(ev.snapshot(ev.WorkerSpec("w1", held=[ev.Held(A, pinned=True)]), 1, T0), T0)
    core.apply(ev.snapshot(ev.WorkerSpec("w2", held=[ev.Held(A, tier=common_pb2.TIER_WARM),
                                                     ev.Held(B)]), 1, T0), T0)
    core.apply(ev.heat(B, 3, T0), T0)
    core.round(T0 + 1)
    return core


@pytest.fixture
async def api() -> AsyncIterator[tuple[cache_pb2_grpc.CacheManagerStub, dict[str, object]]]:
    holder: dict[str, object] = {"core": core_with_state()}
    servicer = CacheManagerApi(lambda: holder["core"], "test-instance")  # type: ignore[return-value, arg-type]
    server = build_server(
        [Service(cache_pb2_grpc.add_CacheManagerServicer_to_server, servicer,
                 "loraplane.v1.CacheManager")],
        port=0, metrics=RpcMetrics.for_registry(CollectorRegistry()),
    )
    await server.start()
    holder["port"] = server.port
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield cache_pb2_grpc.CacheManagerStub(channel), holder
    finally:
        await channel.close()
        await server.stop(0)


async def test_placement_hot_first_and_base_model(api: tuple[object, dict[str, object]]) -> None:
    stub, _ = api
    resp = await stub.GetPlacement(cache_pb2.GetPlacementRequest(adapter=A.proto()))  # type: ignore[attr-defined]
    assert [(p.worker_id, p.placement.tier, p.placement.pinned) for p in resp.placements] == [
        ("w1", common_pb2.TIER_HOT, True), ("w2", common_pb2.TIER_WARM, False)]
    assert resp.placements[0].grpc_address
    base = common_pb2.AdapterRef(base_model=A.base_model)
    resp = await stub.GetPlacement(cache_pb2.GetPlacementRequest(adapter=base))  # type: ignore[attr-defined]
    assert [p.worker_id for p in resp.placements] == ["w1", "w2"]
    none = await stub.GetPlacement(cache_pb2.GetPlacementRequest(  # type: ignore[attr-defined]
        adapter=ev.ref("nothing").proto()))
    assert list(none.placements) == []


async def test_workers_and_errors(api: tuple[object, dict[str, object]]) -> None:
    stub, holder = api
    resp = await stub.ListWorkers(cache_pb2.ListWorkersRequest())  # type: ignore[attr-defined]
    assert [w.state.worker_id for w in resp.workers] == ["w1", "w2"]
    w1 = resp.workers[0]
    assert w1.alive and w1.state.capacities[0].hot_slots_used == 1
    assert w1.state.capacities[0].hot_slots_pinned == 1
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetWorker(cache_pb2.GetWorkerRequest(worker_id="nope"))  # type: ignore[attr-defined]
    assert err.value.code() is grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ListDecisions(cache_pb2.ListDecisionsRequest(adapter_name="a"))  # type: ignore[attr-defined]
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    holder["core"] = None  # standby
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ListWorkers(cache_pb2.ListWorkersRequest())  # type: ignore[attr-defined]
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "standby" in (err.value.details() or "")


async def test_decisions_newest_first_with_reasons(api: tuple[object, dict[str, object]]) -> None:
    stub, holder = api
    core = holder["core"]
    assert isinstance(core, CacheCore)
    n = len(core.decisions)
    resp = await stub.ListDecisions(cache_pb2.ListDecisionsRequest(limit=100))  # type: ignore[attr-defined]
    assert len(resp.decisions) == n
    ids = [d.id for d in resp.decisions]
    assert ids == sorted(ids, reverse=True)
    for d in resp.decisions:
        assert d.reason and d.policy and d.command_id and d.at.seconds > 0


@pytest.mark.parametrize(
    ("kind", "arm", "tier"),
    [(CommandKind.LOAD_HOT, "load", common_pb2.TIER_HOT),
     (CommandKind.LOAD_WARM, "load", common_pb2.TIER_WARM),
     (CommandKind.DEMOTE, "evict", common_pb2.TIER_WARM),
     (CommandKind.EVICT, "evict", common_pb2.TIER_COLD),
     (CommandKind.PIN, "pin", None), (CommandKind.UNPIN, "unpin", None)],
)
def test_command_messages(kind: CommandKind, arm: str, tier: int | None) -> None:
    core = core_with_state()
    spec = CommandSpec(kind, "w1", A.version_id, "heat", "detail", pin=True)
    pending = core.tracker.issue(spec, "cmd-x", T0 + 2)
    from loraplane.cache_manager.core import Issued

    entry = core.decisions.record(spec, A, "cmd-x", Tier.HOT, T0 + 2)
    cmd = build_command(Issued(pending, core.state.versions[A.version_id], entry), "cm/test")
    assert cmd.WhichOneof("command") == arm and cmd.worker_id == "w1"
    assert cmd.meta.adapter == A.proto() and cmd.meta.producer == "cm/test"
    assert cmd.reason == "heat: detail" and cmd.command_id == "cmd-x"
    body = getattr(cmd, arm)
    assert body.engine_id == 1
    if arm == "load":
        assert body.target_tier == tier and body.pin == (kind is CommandKind.LOAD_HOT)
        assert body.sha256 and body.artifact_uri and body.size_bytes and body.rank
    if arm == "evict":
        assert body.to_tier == tier


async def test_cli_status_and_placement(api: tuple[object, dict[str, object]],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from typer.testing import CliRunner

    from loraplane.cache_manager.cli import app

    _, holder = api
    addr = f"127.0.0.1:{holder['port']}"
    runner = CliRunner()
    status = await asyncio.to_thread(runner.invoke, app, ["status", "--addr", addr, "-n", "5"])
    assert status.exit_code == 0, status.output
    assert "w1" in status.output and "w2" in status.output and "recent decisions" in status.output
    placement = await asyncio.to_thread(runner.invoke, app,
                                        ["placement", "acme/a@v1", "--addr", addr])
    assert placement.exit_code == 0, placement.output
    lines = placement.output.strip().splitlines()
    assert lines[0].startswith("w1") and "HOT" in lines[0] and "WARM" in lines[1]
    missing = await asyncio.to_thread(runner.invoke, app, ["placement", "bad-id", "--addr", addr])
    assert missing.exit_code != 0


async def test_decisions_of_every_shard_a_process_leads_are_merged_newest_first() -> None:
    """A process leading several shards answers ListDecisions from all their cores."""
    first, second = core_with_state(), core_with_state()
    spec = CommandSpec(CommandKind.DEMOTE, "w2", B.version_id, "idle", source="test")
    for i, core in enumerate((first, second, first)):
        core.decisions.record(spec, B, f"late-{i}", Tier.HOT, T0 + 10 + i)
    cores = [first, second]
    api = CacheManagerApi(lambda: first, "test-instance", cores=lambda: cores)
    resp = await api.ListDecisions(cache_pb2.ListDecisionsRequest(limit=3), None)  # type: ignore[arg-type]
    assert [d.command_id for d in resp.decisions] == ["late-2", "late-1", "late-0"]
    everything = await api.ListDecisions(cache_pb2.ListDecisionsRequest(limit=100), None)  # type: ignore[arg-type]
    assert len(everything.decisions) == len(first.decisions) + len(second.decisions)
    ats = [d.at.ToNanoseconds() for d in everything.decisions]
    assert ats == sorted(ats, reverse=True)
    alone = CacheManagerApi(lambda: first, "test-instance")
    resp = await alone.ListDecisions(cache_pb2.ListDecisionsRequest(limit=100), None)  # type: ignore[arg-type]
    assert len(resp.decisions) == len(first.decisions)
