"""Execution of ``cache.commands`` addressed to this worker.

:class:`CommandExecutor` turns one ``CacheCommand`` into its effect on the
:class:`~loraplane.worker.manager.AdapterManager` and the ``WorkerReport`` that answers it
(``AdapterLoaded`` / ``AdapterEvicted`` / ``LoadFailed``). Commands are idempotent:

* a command id seen before is answered with the report it got the first time (same
  ``event_id``, so consumers dedupe it) without running again;
* loading what is already there, evicting what is already gone, pinning what is
  pinned all succeed and report the current state;
* a command past its deadline is refused (``LOAD_ERROR_CODE_DEADLINE_EXCEEDED``);
* a HOT load on a full worker waits for a slot up to ``slot_wait_s`` (and the command's
  deadline), in the slot queue behind the requests that wait, instead of failing at once:
  a round's demotion and load run concurrently (different versions), and the load must
  not be checked before the demotion freed its slot. It never demotes anything itself
  (the cache manager chose what leaves); past the wait it fails ``NO_CAPACITY``.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime

from loraplane.v1 import common_pb2, events_pb2
from loraplane.worker import reports
from loraplane.worker.errors import BadRequest, CommandExpired
from loraplane.worker.host_tier import ArtifactSpec
from loraplane.worker.manager import (
    TIER_COLD,
    TIER_HOT,
    TIER_WARM,
    AdapterManager,
    LoadOutcome,
    SlotWait,
    Tier,
)

log = logging.getLogger(__name__)

REMEMBERED_COMMANDS = 10_000
"""How many answered command ids are kept for deduplication."""

Clock = Callable[[], datetime]


def _now() -> datetime:
    return datetime.now(UTC)


class CommandExecutor:
    """Runs cache commands for one worker and builds their reports."""

    def __init__(
        self, manager: AdapterManager, *, worker_id: str, clock: Clock = _now,
        remembered: int = REMEMBERED_COMMANDS, slot_wait_s: float = 0.0,
    ) -> None:
        """``worker_id``: commands addressed to another worker are ignored. ``slot_wait_s``:
        how long a HOT load waits for a slot on a full worker (0: fails at once)."""
        self.manager = manager
        self.slot_wait_s = slot_wait_s
        self.worker_id = worker_id
        self.clock = clock
        self.remembered = remembered
        self._answers: OrderedDict[str, events_pb2.WorkerReport] = OrderedDict()

    def is_mine(self, cmd: events_pb2.CacheCommand) -> bool:
        """Whether ``cmd`` is addressed to this worker."""
        return cmd.worker_id == self.worker_id

    def _remember(self, command_id: str, report: events_pb2.WorkerReport) -> None:
        if not command_id:
            return
        self._answers[command_id] = report
        self._answers.move_to_end(command_id)
        while len(self._answers) > self.remembered:
            self._answers.popitem(last=False)

    async def execute(self, cmd: events_pb2.CacheCommand) -> events_pb2.WorkerReport | None:
        """Run ``cmd``; returns its report (``None`` for another worker's command and for a
        ``HotOrder``, which no report answers)."""
        if not self.is_mine(cmd):
            return None
        previous = self._answers.get(cmd.command_id)
        if previous is not None:
            return previous
        if cmd.WhichOneof("command") == "hot_order":
            # the cache manager's HOT order after a round: nothing to load, nothing to report
            self.manager.set_hot_order(
                {k.engine_id: k.keep for k in cmd.hot_order.keeps}, replace=True)
            return None
        ctx = reports.ReportContext(self.worker_id, self.clock, cmd)
        ref = cmd.meta.adapter if cmd.meta.HasField("adapter") else None
        engine_id = _engine_id(cmd)
        try:
            report = await self._run(ctx, cmd)
        except Exception as exc:  # noqa: BLE001 - every failure is reported, classified
            if not isinstance(exc, BadRequest | CommandExpired):
                log.info("command %s failed: %s", cmd.command_id, exc)
            report = reports.failed(ctx, exc, engine_id, ref)
            if isinstance(exc, BadRequest | CommandExpired):
                self.manager.record_failure(None, exc)
        self._remember(cmd.command_id, report)
        return report

    def _slot_wait(self, tier: int, remaining: float | None) -> SlotWait | None:
        """A HOT load's wait for a slot: the least urgent place in the queue (a background
        request of no tier: every waiting request goes first), bounded by ``slot_wait_s``
        and what is left of the command's deadline."""
        if tier != TIER_HOT or self.slot_wait_s <= 0:
            return None
        wait_s = self.slot_wait_s if remaining is None else min(self.slot_wait_s, remaining)
        return SlotWait(common_pb2.REQUEST_CLASS_BACKGROUND,
                        deadline=self.manager.monotonic() + wait_s)

    def _deadline_s(self, cmd: events_pb2.CacheCommand) -> float | None:
        if not cmd.HasField("deadline"):
            return None
        deadline: datetime = cmd.deadline.ToDatetime(tzinfo=UTC)
        return (deadline - self.clock()).total_seconds()

    async def _run(
        self, ctx: reports.ReportContext, cmd: events_pb2.CacheCommand
    ) -> events_pb2.WorkerReport:
        remaining = self._deadline_s(cmd)
        if remaining is not None and remaining <= 0:
            raise CommandExpired(f"command {cmd.command_id} expired {-remaining:.1f}s ago")
        kind = cmd.WhichOneof("command")
        if kind == "load":
            if cmd.load.target_tier not in (TIER_WARM, TIER_HOT):
                raise BadRequest(f"load target tier {cmd.load.target_tier} is not WARM or HOT")
            if cmd.load.pin and cmd.load.target_tier != TIER_HOT:
                raise BadRequest("pin is only allowed with target tier HOT")
            spec = reports.spec_from_load(cmd)
            if not spec.tenant_id or not spec.adapter_name or spec.engine_id < 1:
                raise BadRequest("load needs meta.adapter (tenant, name, version) and engine_id")
            outcome: LoadOutcome = await self.manager.load(
                spec, cmd.load.target_tier, pin=cmd.load.pin, never_evict=cmd.load.never_evict,
                wait=self._slot_wait(cmd.load.target_tier, remaining),
            )
            if cmd.load.HasField("hot_keep"):
                self.manager.set_hot_order({spec.engine_id: cmd.load.hot_keep}, replace=False)
            return reports.loaded(ctx, outcome)
        if kind == "evict":
            if cmd.evict.to_tier not in (TIER_WARM, TIER_COLD):
                raise BadRequest(f"evict target tier {cmd.evict.to_tier} is not WARM or COLD")
            evicted = await self.manager.evict(
                cmd.evict.engine_id, cmd.evict.to_tier, cmd.evict.reason or cmd.reason,
                timeout_s=remaining,
            )
            return reports.evicted(ctx, evicted, cmd.meta.adapter)
        if kind == "pin":
            p = await self.manager.pin(cmd.pin.engine_id)
            return reports.loaded(ctx, _current(p.spec, p.tier, p.pinned))
        if kind == "unpin":
            p = await self.manager.unpin(cmd.unpin.engine_id)
            return reports.loaded(ctx, _current(p.spec, p.tier, p.pinned))
        raise BadRequest(f"command {cmd.command_id} has no action")


def _current(spec: ArtifactSpec, tier: Tier, pinned: bool) -> LoadOutcome:
    """A no-move outcome describing where a version is (pin / unpin answers)."""
    return LoadOutcome(spec=spec, source_tier=tier, tier=tier, pinned=pinned, duration_s=0.0,
                       bytes_read=0)


def _engine_id(cmd: events_pb2.CacheCommand) -> int:
    kind = cmd.WhichOneof("command")
    if kind is None or kind == "hot_order":
        return 0
    return int(getattr(cmd, kind).engine_id)
