"""Worker liveness from the request path: the gateway probes every worker over gRPC.

The gateway routes on what it hears from the workers. ``cache.state`` reports travel
through Kafka, so a broker outage silences all of them at once although every worker
still answers gRPC; liveness must not depend on that transport. :class:`WorkerProber`
calls ``WorkerInternal.GetState`` on every known worker address every
``interval_s`` (deadline ``timeout_s``, all workers concurrently) and feeds the
answers to the :class:`~loraplane.gateway.placement.PlacementView`:

* an answer marks the worker ANSWERING and applies its snapshot (readiness, tiers), so
  a restarted worker at the same address is seen, with its empty tiers, within one
  interval, broker or not;
* ``down_after_failures`` failed probes in a row mark it DOWN: not routed to from then
  on, whatever its last report said, until it answers again.

Transitions are logged and counted (see :class:`~loraplane.gateway.metrics.GatewayMetrics`:
``loraplane_gateway_worker_state``, ``…_worker_state_since_timestamp_seconds``,
``…_worker_probes_total``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

import grpc

from loraplane.gateway.placement import PlacementView
from loraplane.v1 import events_pb2, worker_pb2

log = logging.getLogger(__name__)

Clock = Callable[[], float]


class _StateStub(Protocol):
    def GetState(
        self, request: worker_pb2.GetStateRequest, *, timeout: float
    ) -> object: ...


class _Stubs(Protocol):
    def stub(self, address: str) -> _StateStub: ...


ProbeResult = Callable[[str, str], None]
"""``(worker_id, result)`` with result ``ok``, ``timeout`` or ``error``."""


class WorkerProber:
    """Probes every known worker's ``GetState`` and records the outcome in the view."""

    def __init__(
        self,
        placement: PlacementView,
        pool: _Stubs,
        *,
        interval_s: float = 1.0,
        timeout_s: float = 1.0,
        clock: Clock = time.time,
        on_result: ProbeResult | None = None,
    ) -> None:
        """``interval_s`` between rounds; ``timeout_s``: deadline of one probe."""
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError("interval_s and timeout_s must be positive")
        self._placement = placement
        self._pool = pool
        self._interval = interval_s
        self._timeout = timeout_s
        self._clock = clock
        self._on_result = on_result
        self.rounds = 0
        """Completed probe rounds (readiness, tests)."""

    async def _probe(self, worker_id: str, address: str) -> None:
        sent_at = self._clock()
        try:
            call = self._pool.stub(address).GetState(
                worker_pb2.GetStateRequest(), timeout=self._timeout
            )
            state = await call  # type: ignore[misc]
        except grpc.aio.AioRpcError as err:
            result = "timeout" if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED else "error"
            self._placement.probe_failed(worker_id)
        except (TimeoutError, OSError):
            result = "error"
            self._placement.probe_failed(worker_id)
        else:
            assert isinstance(state, events_pb2.WorkerState)
            if state.worker_id and state.worker_id != worker_id:
                # Another worker now listens on that address: the old one is gone.
                self._placement.probe_failed(worker_id)
                result = "error"
                if not self._placement.worker(state.worker_id):
                    self._placement.probe_answered(state, sent_at)
            else:
                if not state.worker_id:
                    state.worker_id = worker_id
                self._placement.probe_answered(state, sent_at)
                result = "ok"
        if self._on_result is not None:
            self._on_result(worker_id, result)

    async def probe_once(self) -> None:
        """Probe every worker with an address once, concurrently."""
        targets = [(w.worker_id, w.address) for w in self._placement.workers() if w.address]
        if targets:
            await asyncio.gather(*(self._probe(wid, addr) for wid, addr in targets))
        for worker_id, old, new in self._placement.refresh_liveness():
            if old:
                log.warning("worker %s: %s -> %s", worker_id, old, new)
            else:
                log.info("worker %s: %s", worker_id, new)
        self.rounds += 1

    async def run(self) -> None:
        """Probe every ``interval_s`` until cancelled."""
        while True:
            started = time.monotonic()
            try:
                await self.probe_once()
            except Exception:
                log.exception("worker probe round failed")
            await asyncio.sleep(max(0.0, self._interval - (time.monotonic() - started)))
