"""Worker liveness from gRPC probes: a silent broker never un-routes an answering worker,
a worker that stops answering is routed around within a few probes."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from prometheus_client import CollectorRegistry

from loraplane.gateway.budget import TIER_COLD, TIER_HOT
from loraplane.gateway.liveness import WorkerProber
from loraplane.gateway.metrics import GatewayMetrics
from loraplane.gateway.placement import ANSWERING, DOWN, REPORTING, SILENT, PlacementView
from loraplane.v1 import events_pb2

from .events import loaded, state


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class _Error(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="fake")


class FakeWorkers:
    """address -> the WorkerState it answers, or the status code it fails with."""

    def __init__(self) -> None:
        self.answers: dict[str, events_pb2.WorkerState | grpc.StatusCode] = {}
        self.calls: list[str] = []

    def stub(self, address: str) -> FakeWorkers._Stub:
        return FakeWorkers._Stub(self, address)

    class _Stub:
        def __init__(self, outer: FakeWorkers, address: str) -> None:
            self.outer, self.address = outer, address

        async def GetState(
            self, request: object, *, timeout: float
        ) -> events_pb2.WorkerState:
            self.outer.calls.append(self.address)
            answer = self.outer.answers.get(self.address, grpc.StatusCode.UNAVAILABLE)
            if isinstance(answer, grpc.StatusCode):
                raise _Error(answer)
            out = events_pb2.WorkerState()
            out.CopyFrom(answer)
            return out


def _snapshot(worker_id: str, address: str, seq: int, hot: tuple[int, ...] = (),
              started: float = 1000.0, ready: bool = True) -> events_pb2.WorkerState:
    return state(worker_id, address, hot=hot, seq=seq, started=started, ready=ready).state


def test_answering_worker_stays_routable_when_reports_stop() -> None:
    clock = Clock(2000)
    view = PlacementView(clock=clock, stale_after_s=30)
    view.apply_report(state("w1", "h:1", hot=(7,), at=2000))
    assert view.liveness(view.worker("w1")) == REPORTING  # type: ignore[arg-type]
    for t in range(2001, 2200, 5):  # the broker is gone: no report for 200 s
        clock.now = t
        view.probe_answered(_snapshot("w1", "h:1", seq=t), sent_at=t)
        assert [w.worker_id for w in view.routable("tiny")] == ["w1"]
    assert view.liveness(view.worker("w1")) == ANSWERING  # type: ignore[arg-type]
    assert view.tier("w1", 7) == TIER_COLD  # the probe's snapshot replaced the old tiers


def test_without_probes_a_silent_worker_goes_stale() -> None:
    clock = Clock(2000)
    view = PlacementView(clock=clock, stale_after_s=30)
    view.apply_report(state("w1", "h:1", at=2000))
    clock.now = 2031
    assert view.routable("tiny") == []
    assert view.liveness(view.worker("w1")) == SILENT  # type: ignore[arg-type]


def test_failed_probes_take_a_fresh_worker_out_until_it_answers() -> None:
    clock = Clock(2000)
    view = PlacementView(clock=clock, stale_after_s=60, down_after_failures=2)
    changes: list[int] = []
    view.on_change(lambda: changes.append(1))
    view.apply_report(state("w1", "h:1", hot=(7,), at=2000))
    n = len(changes)
    view.probe_failed("w1")
    assert [w.worker_id for w in view.routable("tiny")] == ["w1"]  # one miss is not enough
    view.probe_failed("w1")
    assert view.routable("tiny") == []
    assert view.liveness(view.worker("w1")) == DOWN  # type: ignore[arg-type]
    assert len(changes) == n + 1  # waiters are woken once, when it goes down
    view.apply_report(loaded("w1", 8, TIER_HOT, at=2001))  # a late report does not revive it
    assert view.routable("tiny") == []
    view.probe_answered(_snapshot("w1", "h:1", seq=9, hot=(7,)), sent_at=2002)
    assert [w.worker_id for w in view.routable("tiny")] == ["w1"]


def test_probe_snapshot_is_ordered_against_reports() -> None:
    view = PlacementView(clock=Clock(2010))
    view.apply_report(state("w1", "h:1", hot=(7,), seq=5, at=2000))
    view.probe_answered(_snapshot("w1", "h:1", seq=6, hot=(7, 8)), sent_at=2005)
    view.apply_report(state("w1", "h:1", hot=(), seq=4, at=2004))  # older snapshot, late
    assert view.tier("w1", 8) == TIER_HOT
    view.apply_report(loaded("w1", 9, TIER_HOT, at=2006))  # a delta after the probe applies
    assert view.tier("w1", 9) == TIER_HOT


def test_refresh_liveness_reports_transitions_and_since() -> None:
    clock = Clock(2000)
    view = PlacementView(clock=clock, stale_after_s=30, down_after_failures=1)
    view.apply_report(state("w1", "h:1", at=2000))
    assert view.refresh_liveness() == [("w1", "", REPORTING)]
    assert view.refresh_liveness() == []
    clock.now = 2003
    view.probe_failed("w1")
    assert view.refresh_liveness() == [("w1", REPORTING, DOWN)]
    w = view.worker("w1")
    assert w is not None and w.state == DOWN and w.state_since == 2003


def test_down_after_failures_must_be_positive() -> None:
    with pytest.raises(ValueError, match="down_after_failures"):
        PlacementView(down_after_failures=0)


async def test_prober_marks_dead_worker_down_and_revives_a_restarted_one() -> None:
    clock = Clock(2000)
    view = PlacementView(clock=clock, stale_after_s=60, down_after_failures=2)
    view.apply_report(state("w1", "h:1", hot=(7,), at=2000))
    view.apply_report(state("w2", "h:2", hot=(7,), at=2000))
    fake = FakeWorkers()
    fake.answers["h:1"] = _snapshot("w1", "h:1", seq=2, hot=(7,))
    fake.answers["h:2"] = grpc.StatusCode.UNAVAILABLE  # w2's process is gone
    results: list[tuple[str, str]] = []
    prober = WorkerProber(view, fake, interval_s=0.01, timeout_s=0.5, clock=clock,
                          on_result=lambda w, r: results.append((w, r)))
    await prober.probe_once()
    await prober.probe_once()
    assert sorted(set(fake.calls)) == ["h:1", "h:2"]
    assert [w.worker_id for w in view.routable("tiny")] == ["w1"]
    assert ("w2", "error") in results and ("w1", "ok") in results
    # w2 restarts at the same address: its fresh snapshot (new start, no adapters) is applied
    fake.answers["h:2"] = _snapshot("w2", "h:2", seq=1, started=2001)
    clock.now = 2002
    await prober.probe_once()
    assert [w.worker_id for w in sorted(view.routable("tiny"), key=lambda w: w.worker_id)] == [
        "w1", "w2"]
    assert view.tier("w2", 7) == TIER_COLD


async def test_prober_counts_a_timeout_as_a_failure() -> None:
    view = PlacementView(clock=Clock(2000), down_after_failures=1)
    view.apply_report(state("w1", "h:1", at=2000))
    fake = FakeWorkers()
    fake.answers["h:1"] = grpc.StatusCode.DEADLINE_EXCEEDED
    results: list[tuple[str, str]] = []
    prober = WorkerProber(view, fake, clock=Clock(2000),
                          on_result=lambda w, r: results.append((w, r)))
    await prober.probe_once()
    assert results == [("w1", "timeout")] and view.routable("tiny") == []


async def test_prober_run_survives_a_bad_round() -> None:
    view = PlacementView(clock=Clock(2000))
    view.apply_report(state("w1", "h:1", at=2000))

    class Broken:
        def stub(self, address: str) -> object:
            raise RuntimeError("boom")

    prober = WorkerProber(view, Broken(), interval_s=0.01)  # type: ignore[arg-type]
    task = asyncio.create_task(prober.run())
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert prober.rounds == 0  # every round failed, and the loop kept going without raising


def test_metrics_export_worker_beliefs_and_heat() -> None:
    registry = CollectorRegistry()
    metrics = GatewayMetrics.for_registry(registry)
    clock = Clock(2000)
    view = PlacementView(clock=clock, down_after_failures=1)
    view.apply_report(state("w1", "h:1", at=1999))
    view.apply_report(state("w2", "h:2", at=1999))
    view.probe_answered(_snapshot("w1", "h:1", seq=3), sent_at=2000)
    view.probe_failed("w2")
    view.refresh_liveness()
    metrics.views.placement = view
    assert registry.get_sample_value(
        "loraplane_gateway_worker_state", {"worker": "w1", "state": ANSWERING}) == 1.0
    assert registry.get_sample_value(
        "loraplane_gateway_worker_state", {"worker": "w2", "state": DOWN}) == 1.0
    assert registry.get_sample_value(
        "loraplane_gateway_worker_state", {"worker": "w2", "state": ANSWERING}) == 0.0
    assert registry.get_sample_value("loraplane_gateway_worker_routable", {"worker": "w2"}) == 0
    assert registry.get_sample_value(
        "loraplane_gateway_worker_last_answer_timestamp_seconds", {"worker": "w1"}) == 2000
    assert registry.get_sample_value(
        "loraplane_gateway_worker_state_since_timestamp_seconds", {"worker": "w1"}) == 2000
    assert registry.get_sample_value("loraplane_gateway_heat_dropped_total") == 0
