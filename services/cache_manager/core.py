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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from google.protobuf.message import Message

from loraplane.cache_manager.model import CommandKind, CommandSpec, Ref, Tier, VersionRecord
from loraplane.cache_manager.planner import Planner, Round
from loraplane.cache_manager.rules import RulesConfig
from loraplane.cache_manager.state import Applied, State
from loraplane.cache_manager.tracker import CommandTracker, Pending, Resolution
from loraplane.policy.config import PolicyConfig
from loraplane.policy.online import CachePolicy
from loraplane.policy.ranking import AdaptiveRanking

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
        self._demotions: dict[tuple[str, str], CommandSpec] = {}
        """(worker, version) → the demotion asked while it is blocked from loading there."""

    @property
    def policy_name(self) -> str:
        """Name of the policy in use."""
        return self.planner.policy.name

    def apply(self, msg: Message, now: float) -> ApplyResult:
        """Apply one event; resolve the commands it answers."""
        applied = self.state.apply(msg, now)
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
        queued, self._queued = self._queued, []
        # a failing canary's (or withdrawn version's) HOT copies are asked to go every round
        # until they are gone: a demotion the guards dropped (a request still in flight in
        # the last report) is not lost
        asked = {(s.worker_id, s.version_id) for s in queued}
        for (wid, vid), spec in self._demotions.items():
            w = self.state.workers.get(wid)
            if (wid, vid) not in asked and w is not None and w.tier_of(vid) is Tier.HOT:
                queued.append(spec)
        rnd = self.planner.plan(self.state, self.tracker, now, extra=queued,
                                no_load=frozenset(self._no_load))
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

    def canary_aborted(self, vid: str, now: float, *, reason: str = "canary_aborted",
                       detail: str = "canary analysis") -> None:
        """The canary analysis aborted ``vid`` (or withdrew a failing stable version,
        ``reason="stable_withdrawn"``): demote it wherever it is HOT (the worker drains
        its in-flight requests first) and keep it from loading for the block time."""
        for w in self.state.workers.values():
            self._no_load[(w.worker_id, vid)] = now + self.rules.commands.backoff_max_s
            self._demotions[(w.worker_id, vid)] = CommandSpec(
                CommandKind.DEMOTE, w.worker_id, vid, reason, detail,
                source="rule:canary_analysis")

    def publish_failed(self, command_id: str, now: float) -> Resolution | None:
        """The command never reached the broker: count a retriable failure."""
        return self.tracker.resolve(command_id, ok=False, now=now, retriable=True,
                                    code="publish_failed")
