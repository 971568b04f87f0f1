"""The decision core: state + command tracker + planner + decision log (pure, clock injected).

The leader loop (:mod:`loraplane.cache_manager.leader`) feeds consumed events to
:meth:`CacheCore.apply`, calls :meth:`CacheCore.round` on every tick or
trigger, publishes the commands it returns and reports publish failures back
with :meth:`CacheCore.publish_failed`. Everything here runs in memory, so the
unit tests drive whole scenarios (bursts, restarts, failover, retries) with a
simulated clock and simulated worker answers.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from google.protobuf.message import Message

from loraplane.cache_manager.model import (
    ABORTED,
    WITHDRAWN,
    CommandKind,
    CommandSpec,
    Ref,
    Status,
    TakenOut,
    Tier,
    VersionRecord,
    version_id,
)
from loraplane.cache_manager.planner import Planner, Round
from loraplane.cache_manager.rules import RulesConfig
from loraplane.cache_manager.state import Applied, State, ts_seconds
from loraplane.cache_manager.tracker import CommandTracker, Pending, Resolution
from loraplane.policy.config import PolicyConfig
from loraplane.policy.online import CachePolicy
from loraplane.policy.ranking import AdaptiveRanking
from loraplane.v1 import events_pb2

NOT_PRESENT = "LOAD_ERROR_CODE_NOT_PRESENT"


@dataclass(frozen=True, slots=True)
class DecisionEntry:
    """One decision, as the read API and the CLI show it."""

    id: int
    at: float
    kind: CommandKind
    ref: Ref
    worker_id: str
    from_tier: Tier
    to_tier: Tier
    reason: str
    detail: str
    heat: float
    command_id: str
    policy: str
    """Who decided: the policy name or ``rule:<name>``."""


class DecisionLog:
    """The most recent decisions, newest last (bounded)."""

    def __init__(self, capacity: int = 2000) -> None:
        self._entries: deque[DecisionEntry] = deque(maxlen=capacity)
        self._next = 1

    def record(
        self, spec: CommandSpec, ref: Ref, command_id: str, from_tier: Tier, now: float
    ) -> DecisionEntry:
        """Append the decision behind a command."""
        entry = DecisionEntry(
            id=self._next, at=now, kind=spec.kind, ref=ref, worker_id=spec.worker_id,
            from_tier=from_tier, to_tier=spec.kind.target_tier(from_tier),
            reason=spec.reason, detail=spec.detail, heat=spec.heat, command_id=command_id,
            policy=spec.source,
        )
        self._next += 1
        self._entries.append(entry)
        return entry

    def recent(
        self, limit: int, *, worker_id: str = "", tenant_id: str = "", adapter_name: str = ""
    ) -> list[DecisionEntry]:
        """Newest first, filtered."""
        out: list[DecisionEntry] = []
        for e in reversed(self._entries):
            if worker_id and e.worker_id != worker_id:
                continue
            if tenant_id and e.ref.tenant_id != tenant_id:
                continue
            if adapter_name and e.ref.adapter_name != adapter_name:
                continue
            out.append(e)
            if len(out) >= limit:
                break
        return out

    def __iter__(self) -> Iterator[DecisionEntry]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


@dataclass(frozen=True, slots=True)
class Issued:
    """A command decided this round, to publish."""

    pending: Pending
    record: VersionRecord
    decision: DecisionEntry


@dataclass(frozen=True, slots=True)
class Block:
    """A version the canary analysis took out: demoted wherever it is HOT and loaded
    nowhere until ``until``, or until a pointer change made after ``since`` makes it the
    canary or stable version again (a person releases it again)."""

    since: float
    """When the step was taken (the first one, while a withdrawal is renewed)."""
    until: float
    reason: str
    detail: str



@dataclass(slots=True)
class RoundResult:
    """Output of :meth:`CacheCore.round`."""

    issued: list[Issued]
    resolutions: list[Resolution]
    """Timeouts (and commands voided by workers leaving) found this round."""
    gone_workers: list[str]
    round: Round


@dataclass(slots=True)
class ApplyResult:
    """Output of :meth:`CacheCore.apply`."""

    applied: Applied
    resolutions: list[Resolution] = field(default_factory=list)


class CacheCore:
    """State, tracker, planner and decision log, wired together."""

    def __init__(
        self,
        *,
        policy: CachePolicy,
        policy_config: PolicyConfig,
        rules: RulesConfig,
        worker_timeout_s: float,
        id_factory: Callable[[], str] = lambda: str(uuid.uuid4()),
        decision_capacity: int = 2000,
        tenants: frozenset[str] | None = None,
        base_models: frozenset[str] | None = None,
    ) -> None:
        self.rules = rules
        self.worker_timeout_s = worker_timeout_s
        self.state = State(
            tau_s=policy_config.score.rate_window_s,
            tau_warm_s=policy_config.score.warm_rate_window_s,
            prewarm_ttl_s=rules.prewarm.ttl_s,
            rollback_boost_ttl_s=rules.rollback.boost_ttl_s,
            tenants=tenants,
            base_models=base_models,
        )
        self.tracker = CommandTracker(
            timeout_s=rules.commands.timeout_s,
            base_backoff_s=rules.commands.backoff_base_s,
            max_backoff_s=rules.commands.backoff_max_s,
        )
        self.planner = Planner(policy, policy_config, rules)
        if policy.name == "heat" and policy_config.adaptive.enabled:
            # the heat plan ranks by the adaptive experts the simulator measures
            self.state.ranking = AdaptiveRanking(policy_config, self.planner.bandwidths)
        self.decisions = DecisionLog(decision_capacity)
        self._ids = id_factory
        self._queued: list[CommandSpec] = []
        self._no_load: dict[tuple[str, str], float] = {}
        """(worker, version) → until when a canary that failed its golden set there may
        not load there."""
        self._demotions: dict[tuple[str, str], CommandSpec] = {}
        """(worker, version) → the demotion asked while it is blocked from loading there."""
        self.blocked: dict[str, Block] = {}
        """Version id → its block on every worker (aborted / withdrawn by the analysis)."""

    @property
    def policy_name(self) -> str:
        """Name of the policy in use."""
        return self.planner.policy.name

    def apply(self, msg: Message, now: float) -> ApplyResult:
        """Apply one event; resolve the commands it answers."""
        applied = self.state.apply(msg, now)
        if self.blocked:
            self._released_again(msg, now)
        result = ApplyResult(applied)
        for wid in applied.restarted_workers:
            result.resolutions.extend(self.tracker.forget_worker(wid, now))
        for o in applied.outcomes:
            pending = self.tracker.pending_for(o.worker_id, o.version_id)
            ok = o.ok
            if not ok and o.code == NOT_PRESENT and pending is not None and \
                    pending.command_id == o.command_id and pending.spec.kind in (
                        CommandKind.DEMOTE, CommandKind.EVICT):
                # Asked to remove something the worker does not hold: the goal is reached.
                ok = True
                w = self.state.workers.get(o.worker_id)
                if w is not None and pending.spec.kind is CommandKind.EVICT:
                    w.placements.pop(o.version_id, None)
            res = self.tracker.resolve(o.command_id, ok=ok, now=now, retriable=o.retriable,
                                       code=o.code)
            if res is not None:
                result.resolutions.append(res)
        return result

    def round(self, now: float) -> RoundResult:
        """Expire what timed out, plan, and record the commands to send."""
        self.state.expire_boosts(now)
        resolutions = self.tracker.expire(now)
        gone = self.state.expire_workers(now, self.worker_timeout_s)
        for wid in gone:
            resolutions.extend(self.tracker.forget_worker(wid, now))
        self._no_load = {k: until for k, until in self._no_load.items() if until > now}
        self._demotions = {k: d for k, d in self._demotions.items() if k in self._no_load}
        self.blocked = {v: b for v, b in self.blocked.items() if b.until > now}
        queued, self._queued = self._queued, []
        # a failing canary's (or withdrawn version's) HOT copies are asked to go every round
        # until they are gone: a demotion the guards dropped (a request still in flight in
        # the last report) is not lost
        asked = {(s.worker_id, s.version_id) for s in queued}
        no_load = set(self._no_load)
        for vid, b in self.blocked.items():
            for wid, view in self.state.workers.items():
                no_load.add((wid, vid))
                if (wid, vid) not in asked and view.tier_of(vid) is Tier.HOT:
                    queued.append(CommandSpec(CommandKind.DEMOTE, wid, vid, b.reason, b.detail,
                                              source="rule:canary_analysis"))
                    asked.add((wid, vid))
        for (wid, vid), spec in self._demotions.items():
            w = self.state.workers.get(wid)
            if (wid, vid) not in asked and w is not None and w.tier_of(vid) is Tier.HOT:
                queued.append(spec)
        rnd = self.planner.plan(self.state, self.tracker, now, extra=queued,
                                no_load=frozenset(no_load))
        issued: list[Issued] = []
        for spec in rnd.commands:
            rec = self.state.versions[spec.version_id]
            w = self.state.workers[spec.worker_id]
            pending = self.tracker.issue(spec, self._ids(), now)
            entry = self.decisions.record(spec, rec.ref, pending.command_id,
                                          w.tier_of(spec.version_id), now)
            issued.append(Issued(pending, rec, entry))
        return RoundResult(issued, resolutions, gone, rnd)

    def shadow_failed(self, worker_id: str, vid: str, now: float, detail: str) -> None:
        """A canary failed its golden set on a worker: demote it there and keep it away."""
        self._no_load[(worker_id, vid)] = now + self.rules.commands.backoff_max_s
        self._demotions[(worker_id, vid)] = CommandSpec(
            CommandKind.DEMOTE, worker_id, vid, "golden_set_failed", detail,
            source="rule:canary_shadow")

    def canary_aborted(self, vid: str, now: float, *, reason: str = ABORTED,
                       detail: str = "canary analysis") -> None:
        """The canary analysis aborted ``vid`` (or withdrew a failing stable version,
        ``reason="stable_withdrawn"``): demote it wherever it is HOT (the worker drains
        its in-flight requests first) and keep it from loading, on every worker, for the
        block time (``commands.backoff_max_s``; a withdrawal renewed by each stable tick
        keeps its first ``since``)."""
        self._block(vid, now, now + self.rules.commands.backoff_max_s, reason, detail)

    def _block(self, vid: str, since: float, until: float, reason: str, detail: str) -> None:
        old = self.blocked.get(vid)
        if old is not None:
            since, until = min(since, old.since), max(until, old.until)
        self.blocked[vid] = Block(since, until, reason, detail)

    def restore_blocks(self, taken: Iterable[TakenOut], withdrawn: Mapping[str, str],
                       now: float) -> list[str]:
        """Takeover: the blocks of the leaders before, rebuilt from what the registry
        keeps — ``taken``, the analysis' steps (audit entries, the last
        ``backoff_max_s``), and ``withdrawn``, version id → reason of the versions it
        still has withdrawn — with the registry's pointers already in the state. Each block
        ends where the in-memory one of the leader that took the step ends: ``backoff_max_s``
        after the step, sooner if the version was released again since (an aborted canary
        that is now the canary or stable version again; a withdrawal a person ended by
        releasing it); a withdrawn version that is still the stable pointer is kept out
        while it is (as the stable tick does). Returns the version ids blocked."""
        block_s = self.rules.commands.backoff_max_s
        latest: dict[str, TakenOut] = {}
        for t in taken:
            if t.version_id not in latest or t.at >= latest[t.version_id].at:
                latest[t.version_id] = t
        for vid, t in latest.items():
            rec = self.state.versions.get(vid)
            if rec is None or rec.status is Status.FOREIGN or t.at + block_s <= now:
                continue
            ptr = self.state.pointers.get(rec.ref.adapter_id)
            if t.reason == WITHDRAWN:
                if vid not in withdrawn:
                    continue  # a person released it again: the registry ended the withdrawal
            elif ptr is not None and rec.ref.version in (ptr.canary, ptr.stable):
                continue  # made the canary (or stable) again after the abort
            self._block(vid, t.at, t.at + block_s, t.reason, t.detail)
        for vid, why in withdrawn.items():
            rec = self.state.versions.get(vid)
            ptr = self.state.pointers.get(rec.ref.adapter_id) if rec is not None else None
            if rec is not None and rec.status is not Status.FOREIGN and ptr is not None \
                    and ptr.stable == rec.ref.version:
                self._block(vid, now, now + block_s, WITHDRAWN, why)
        return sorted(v for v in self.blocked if v in latest or v in withdrawn)

    def _released_again(self, msg: Message, now: float) -> None:
        """A pointer change made after a block began that makes the version the canary or
        stable version again ends the block (a replayed older change does not)."""
        if not isinstance(msg, events_pb2.LifecycleEvent):
            return
        arm = msg.WhichOneof("event")
        if arm == "canary_changed":
            meta, version = msg.canary_changed.meta, msg.canary_changed.canary_version
        elif arm == "promoted":
            meta, version = msg.promoted.meta, msg.promoted.meta.adapter.version
        elif arm == "rolled_back":
            meta, version = msg.rolled_back.meta, msg.rolled_back.to_version
        else:
            return
        vid = version_id(meta.adapter.tenant_id, meta.adapter.adapter_name, version)
        b = self.blocked.get(vid) if version else None
        if b is not None and ts_seconds(meta.occurred_at, now) > b.since:
            del self.blocked[vid]

    def publish_failed(self, command_id: str, now: float) -> Resolution | None:
        """The command never reached the broker: count a retriable failure."""
        return self.tracker.resolve(command_id, ok=False, now=now, retriable=True,
                                    code="publish_failed")
