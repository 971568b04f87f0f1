"""Executes the canary analysis: snapshot → :func:`decide` → the registry (I/O).

The cache-manager leader runs one :class:`CanaryRunner`. Every ``interval_s`` (and when a
canary's pointers change) :meth:`CanaryRunner.tick` builds a
:class:`~loraplane.cache_manager.canary_analysis.CanarySnapshot` per adapter with a
canary — pointers from the leader's state, figures from its
:class:`~loraplane.cache_manager.canary_window.CanaryWindow`, the stage start from the
durable run (``canary_runs``) — and applies what the analysis decides **only through
the registry's admin API** (``RegistryActions``): ``SetCanary`` to advance, ``Promote``,
``SetCanary("", 0)`` to abort. The registry writes the audit entry (its reason carries
:meth:`Decision.figures` as JSON after :data:`REASON_PREFIX`) and the lifecycle event
(``CanaryChanged`` / ``AdapterPromoted``) in one transaction, so every automated step
survives restarts and is seen by the gateways and by the cache manager itself.

A step is never taken twice:

* before acting, the runner re-reads the pointers from the registry and acts only when
  they are still those the decision was made on (same canary, same share);
* the registry's operations are idempotent on their target (the same share, an already
  promoted or already cleared canary change nothing and write no audit entry);
* the run records the id of the step taken (``last_decision_id``); a new leader loads
  the runs and does not repeat a recorded step.

After an abort the version is demoted wherever it is HOT (``CacheCore.canary_aborted``)
and kept from loading again for the block time, so it is drained and taken out of HOT;
stable is unchanged.

:meth:`CanaryRunner.tick_stable` judges every adapter's stable version the same way
(:func:`~loraplane.cache_manager.canary_analysis.decide_stable`, against the rest of its
base model's stable traffic): a failing one is rolled back through the registry's
``Rollback`` (audited with the figures, ``RolledBack`` event: the gateways route to the
target; ``withdraw``: the version rolled back from is withdrawn in the same transaction) and
demoted everywhere; with no target it is *withdrawn* through ``WithdrawVersion`` (audited
``version.withdraw`` with the figures, ``VersionWithdrawn`` event: the gateways refuse its
requests naming the withdrawal), demoted everywhere and kept from loading while it stays
the stable pointer. The registry keeps the withdrawals (``adapter_versions.
withdrawn_reason``), and the runner reads them at takeover and every stable tick: a new
leader neither forgets one (the version stays out, no rollback returns to it) nor takes
the step again; a person who promotes the version again ends its withdrawal.

Canary clearance: a new canary receives no tenant traffic until the runner clears it
(``ClearCanary``, audited, ``CanaryChanged`` with ``cleared``) once its golden set has
answered within the rule's failures and no run of it is in flight (at the first tick when
no golden set applies). The gateways
send it golden-set requests only until then; a canary that fails its golden set is aborted
without ever having served a tenant.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

import asyncpg
import grpc
from google.protobuf.message import Message

from loraplane.cache_manager import store
from loraplane.cache_manager.canary_analysis import (
    Action,
    AnalysisRules,
    CanarySnapshot,
    Decision,
    StableAction,
    StableDecision,
    StableSnapshot,
    VersionFigures,
    decide,
    decide_stable,
    sum_figures,
)
from loraplane.cache_manager.canary_window import CanaryWindow
from loraplane.cache_manager.core import ApplyResult
from loraplane.cache_manager.model import ACTOR as ACTOR  # noqa: PLC0414 - re-exported
from loraplane.cache_manager.model import REASON_PREFIX as REASON_PREFIX  # noqa: PLC0414
from loraplane.cache_manager.model import CommandKind, Ref, request_class_from_proto, version_id
from loraplane.cache_manager.prewarm import PrewarmStatus
from loraplane.cache_manager.state import State, ts_seconds
from loraplane.shared.tls import REGISTRY_ID, TlsFiles, secure_or_insecure_aio_channel
from loraplane.v1 import common_pb2, events_pb2, registry_pb2, registry_pb2_grpc

log = logging.getLogger(__name__)



@dataclass(frozen=True, slots=True)
class Run:
    """The durable state of one running canary."""

    adapter_id: str
    version: str
    percent: int
    stage_started_at: float
    paused: bool = False
    """Mirror of the registry's ``canary_paused`` (read every tick)."""
    last_decision_id: str = ""
    last_decision: Mapping[str, Any] | None = None


class RunStore(Protocol):
    """Where runs are kept (Postgres ``canary_runs``; a dict in unit tests)."""

    async def load(self) -> dict[str, Run]:
        """Every run of this deployment by adapter id."""

    async def save(self, run: Run) -> None:
        """Insert or replace one run."""

    async def delete(self, adapter_id: str) -> None:
        """Forget a run (its canary was promoted, aborted or cleared)."""

    async def paused(self) -> set[str]:
        """Adapter ids whose canary an operator paused (the registry's ``canary_paused``)."""

    async def uncleared(self) -> set[str]:
        """Adapter ids whose canary is not cleared for tenant traffic yet (the registry's
        ``canary_cleared``)."""

    async def withdrawn(self) -> dict[str, str]:
        """Version id → reason of the versions the analysis withdrew (the registry's
        ``withdrawn_reason``: it survives restarts and leader changes)."""


class PgRunStore:
    """:class:`RunStore` on the ``canary_runs`` table of one deployment."""

    def __init__(self, pool: asyncpg.Pool, deployment: str) -> None:
        self.pool = pool
        self.deployment = deployment

    async def load(self) -> dict[str, Run]:
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT adapter_id, version, percent, stage_started_at, paused, "
                "last_decision_id, last_decision FROM canary_runs WHERE deployment = $1",
                self.deployment)
        return {r["adapter_id"]: Run(r["adapter_id"], r["version"], r["percent"],
                                     r["stage_started_at"], r["paused"], r["last_decision_id"],
                                     json.loads(r["last_decision"]) or None)
                for r in rows}

    async def save(self, run: Run) -> None:
        async with self.pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO canary_runs (deployment, adapter_id, version, percent, "
                "stage_started_at, paused, last_decision_id, last_decision) "
                "VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb) "
                "ON CONFLICT (deployment, adapter_id) DO UPDATE SET version = $3, "
                "percent = $4, stage_started_at = $5, paused = $6, last_decision_id = $7, "
                "last_decision = $8::jsonb, updated_at = now()",
                self.deployment, run.adapter_id, run.version, run.percent,
                run.stage_started_at, run.paused, run.last_decision_id,
                json.dumps(dict(run.last_decision or {})))

    async def delete(self, adapter_id: str) -> None:
        async with self.pool.acquire() as conn:
            await conn.execute("DELETE FROM canary_runs WHERE deployment = $1 AND adapter_id = $2",
                               self.deployment, adapter_id)

    async def paused(self) -> set[str]:
        # read-only on the registry's table, like the rest of store.py
        async with self.pool.acquire() as conn:
            rows = await conn.fetch("SELECT adapter_id FROM release_pointers "
                                    "WHERE canary_paused AND canary_version IS NOT NULL")
        return {r["adapter_id"] for r in rows}

    async def uncleared(self) -> set[str]:
        async with self.pool.acquire() as conn:
            rows = await conn.fetch("SELECT adapter_id FROM release_pointers "
                                    "WHERE NOT canary_cleared AND canary_version IS NOT NULL")
        return {r["adapter_id"] for r in rows}

    async def withdrawn(self) -> dict[str, str]:
        async with self.pool.acquire() as conn:
            return await store.withdrawn(conn)


class RegistryActions(Protocol):
    """The registry operations the runner uses (every one audited by the registry)."""

    async def current(self, tenant_id: str, adapter_name: str) -> tuple[str, int]:
        """The adapter's canary version ("" if none) and share, as the registry has them."""

    async def set_share(self, tenant_id: str, adapter_name: str, version: str, percent: int,
                        reason: str) -> None:
        """``SetCanary``: set the canary's share (``version=""`` and 0: clear it)."""

    async def promote(self, tenant_id: str, adapter_name: str, version: str,
                      reason: str) -> None:
        """``Promote``: make the canary stable."""

    async def stable_of(self, tenant_id: str, adapter_name: str) -> str:
        """The adapter's stable version as the registry has it ("" if none)."""

    async def rollback(self, tenant_id: str, adapter_name: str, to_version: str,
                       reason: str) -> None:
        """``Rollback``: make ``to_version`` stable again, withdrawing the version rolled
        back from (no rollback returns to it)."""

    async def withdraw(self, tenant_id: str, adapter_name: str, version: str,
                       reason: str) -> None:
        """``WithdrawVersion``: take a failing version with nothing to fall back to out."""

    async def clear(self, tenant_id: str, adapter_name: str, version: str,
                    reason: str) -> None:
        """``ClearCanary``: let the canary receive tenant traffic (its golden set passed)."""


class GrpcRegistryActions:
    """:class:`RegistryActions` over the registry's admin gRPC API (operator token)."""

    def __init__(self, address: str, token: str, *, timeout_s: float = 10.0,
                 actor: str = ACTOR, tls: TlsFiles | None = None) -> None:
        """``tls``: the cache manager's certificate (mutual TLS; the token still
        authorizes), ``None``: plaintext."""
        self.address = address
        self.timeout_s = timeout_s
        self._tls = tls
        self._metadata = (("authorization", f"Bearer {token}"), ("x-loraplane-actor", actor))
        self._channel: grpc.aio.Channel | None = None

    def _stub(self) -> registry_pb2_grpc.RegistryAdminStub:
        if self._channel is None:
            self._channel = secure_or_insecure_aio_channel(
                self.address, self._tls, server=REGISTRY_ID)
        return registry_pb2_grpc.RegistryAdminStub(self._channel)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def current(self, tenant_id: str, adapter_name: str) -> tuple[str, int]:
        resp = await self._stub().GetRelease(
            registry_pb2.GetReleaseRequest(tenant_id=tenant_id, adapter_name=adapter_name),
            metadata=self._metadata, timeout=self.timeout_s)
        return resp.release.canary_version, int(resp.release.canary_percent)

    async def set_share(self, tenant_id: str, adapter_name: str, version: str, percent: int,
                        reason: str) -> None:
        await self._stub().SetCanary(
            registry_pb2.SetCanaryRequest(tenant_id=tenant_id, adapter_name=adapter_name,
                                          version=version, percent=percent, reason=reason),
            metadata=self._metadata, timeout=self.timeout_s)

    async def promote(self, tenant_id: str, adapter_name: str, version: str,
                      reason: str) -> None:
        await self._stub().Promote(
            registry_pb2.PromoteRequest(tenant_id=tenant_id, adapter_name=adapter_name,
                                        version=version, reason=reason),
            metadata=self._metadata, timeout=self.timeout_s)

    async def stable_of(self, tenant_id: str, adapter_name: str) -> str:
        resp = await self._stub().GetRelease(
            registry_pb2.GetReleaseRequest(tenant_id=tenant_id, adapter_name=adapter_name),
            metadata=self._metadata, timeout=self.timeout_s)
        return str(resp.release.stable_version)

    async def rollback(self, tenant_id: str, adapter_name: str, to_version: str,
                       reason: str) -> None:
        await self._stub().Rollback(
            registry_pb2.RollbackRequest(tenant_id=tenant_id, adapter_name=adapter_name,
                                         to_version=to_version, reason=reason, withdraw=True),
            metadata=self._metadata, timeout=self.timeout_s)

    async def withdraw(self, tenant_id: str, adapter_name: str, version: str,
                       reason: str) -> None:
        await self._stub().WithdrawVersion(
            registry_pb2.WithdrawVersionRequest(tenant_id=tenant_id, adapter_name=adapter_name,
                                                version=version, reason=reason),
            metadata=self._metadata, timeout=self.timeout_s)

    async def clear(self, tenant_id: str, adapter_name: str, version: str,
                    reason: str) -> None:
        await self._stub().ClearCanary(
            registry_pb2.ClearCanaryRequest(tenant_id=tenant_id, adapter_name=adapter_name,
                                            version=version, reason=reason),
            metadata=self._metadata, timeout=self.timeout_s)


RulesFor = Callable[[str, str], AnalysisRules]
"""(tenant, adapter name) → the analysis rules that apply."""


def reason_text(decision: Decision | StableDecision) -> str:
    """The registry reason of a step: :data:`REASON_PREFIX` + its figures as JSON."""
    return REASON_PREFIX + json.dumps(decision.figures(), sort_keys=True,
                                      separators=(",", ":"))


class CanaryRunner:
    """Runs the analysis of every canary of one cache-manager leadership."""

    def __init__(self, rules_for: RulesFor, actions: RegistryActions, store: RunStore,
                 window: CanaryWindow) -> None:
        self.rules_for = rules_for
        self.actions = actions
        self.store = store
        self.window = window
        self.runs: dict[str, Run] = {}
        self.last: dict[str, Decision] = {}
        """The latest decision per adapter id (hold included), for status and metrics."""
        self.on_abort: Callable[[str, float], None] = lambda _vid, _now: None
        """Called with the aborted version id (the service demotes it everywhere)."""
        self.on_step: Callable[[Decision], None] = lambda _d: None
        """Called after each step the registry took (metrics, logs)."""
        self.stable_last: dict[str, StableDecision] = {}
        """The latest stable decision per adapter id."""
        self.withdrawn: dict[str, str] = {}
        """Version id → reason of the versions the analysis took out (withdrawn, or rolled
        back from), as the registry holds them (read again every stable tick)."""
        self.on_withdraw: Callable[[str, float, str], None] = lambda _vid, _now, _d: None
        """Called with a failing stable version id (the service demotes it everywhere and
        keeps it from loading), the time and the decision's detail."""
        self.on_stable_step: Callable[[StableDecision], None] = lambda _d: None
        self.golden_pending: Callable[[str], bool] = lambda _vid: False
        """Whether a canary version's golden set applies and has not answered yet (the
        service knows its shadow runs)."""
        self.prewarm: Callable[[State, str], PrewarmStatus | None] = lambda _s, _vid: None
        """A staged canary version's prewarm schedule and where it stands (None: none;
        the service wires :func:`loraplane.cache_manager.prewarm.status`)."""
        self.cleared: list[str] = []
        """Adapter ids whose canary this leadership cleared for tenant traffic."""

    async def start(self) -> None:
        """Load the durable runs and the withdrawn versions (takeover)."""
        self.runs = await self.store.load()
        self.withdrawn = await self.store.withdrawn()

    def watched(self, state: State) -> set[str]:
        """Version ids whose events the window keeps: every canary and every stable."""
        out: set[str] = set()
        for adapter_id, ptr in state.pointers.items():
            tenant, _, name = adapter_id.partition("/")
            if ptr.canary:
                out.add(version_id(tenant, name, ptr.canary))
            if ptr.stable:
                out.add(version_id(tenant, name, ptr.stable))
        return out

    def snapshot(self, state: State, adapter_id: str, run: Run, now: float) -> CanarySnapshot:
        """The analysis input of one canary."""
        tenant, _, name = adapter_id.partition("/")
        ptr = state.pointers[adapter_id]
        rules = self.rules_for(tenant, name)
        since = max(run.stage_started_at, now - rules.window_s)
        vid = version_id(tenant, name, ptr.canary)
        canary = self.window.figures(vid, since, now)
        # the golden set judges the version's weights, not a stage's traffic: every run
        # kept counts, whenever it finished (one that finished before a share change started
        # this stage, or older than the window while an abort step kept failing, would
        # otherwise leave a canary that failed it neither cleared nor aborted)
        golden = self.window.figures(vid, -math.inf, math.inf)
        canary = replace(canary, golden_ok=golden.golden_ok, golden_failed=golden.golden_failed,
                         last_golden_error=golden.last_golden_error)
        stable = self.window.figures(version_id(tenant, name, ptr.stable), since, now) \
            if ptr.stable else self.window.figures("", since, now)
        pre = self.prewarm(state, vid) if ptr.canary_percent <= 0 else None
        return CanarySnapshot(adapter_id, ptr.canary, ptr.stable, ptr.canary_percent,
                              run.stage_started_at, canary, stable, run.paused,
                              self.golden_pending(vid),
                              *((pre.start_percent, pre.targets, pre.ready) if pre else ()))

    async def _sync_runs(self, state: State, now: float) -> None:
        """One run per canary pointer: new canaries and share changes made by someone
        else start a stage now; runs whose canary is gone are forgotten."""
        live: dict[str, tuple[str, int]] = {
            a: (p.canary, p.canary_percent) for a, p in state.pointers.items() if p.canary}
        for adapter_id in [a for a in self.runs if a not in live]:
            gone = self.runs.pop(adapter_id)
            if (gone.last_decision or {}).get("action") == Action.ABORT.value:
                # again here: a leader that died between the abort and its demotion left
                # the version HOT (a no-op where it is no longer HOT)
                tenant, _, name = adapter_id.partition("/")
                self.on_abort(version_id(tenant, name, gone.version), now)
            await self.store.delete(adapter_id)
        for adapter_id, (version, percent) in live.items():
            run = self.runs.get(adapter_id)
            if run is not None and (run.version, run.percent) == (version, percent):
                continue
            # a new canary's stage starts when its pointer event was applied (its first
            # load answers may come before this tick); a share change made by someone else
            # starts now
            tenant, _, name = adapter_id.partition("/")
            since = state.canary_since.get(version_id(tenant, name, version), 0.0)
            start = min(since, now) if run is None and since > 0 else now
            new = Run(adapter_id, version, percent, start, False,
                      run.last_decision_id if run is not None else "",
                      run.last_decision if run is not None else None)
            self.runs[adapter_id] = new
            await self.store.save(new)

    async def tick(self, state: State, now: float) -> list[Decision]:
        """Decide for every canary; apply what acts. Returns the steps taken."""
        await self._sync_runs(state, now)
        self.window.keep(self.watched(state))
        paused = await self.store.paused() if self.runs else set()
        uncleared = await self.store.uncleared() if self.runs else set()
        taken: list[Decision] = []
        for adapter_id, run in list(self.runs.items()):
            if run.paused != (adapter_id in paused):
                run = self.runs[adapter_id] = replace(run, paused=adapter_id in paused)
                await self.store.save(run)
            tenant, _, name = adapter_id.partition("/")
            decision = decide(self.snapshot(state, adapter_id, run, now),
                              self.rules_for(tenant, name), now)
            self.last[adapter_id] = decision
            if adapter_id in uncleared and decision.action is not Action.ABORT:
                await self._clear(state, adapter_id, run, now)
            if not decision.acts or decision.decision_id == run.last_decision_id:
                continue
            if await self._apply(decision, run, now):
                taken.append(decision)
        return taken

    async def _clear(self, state: State, adapter_id: str, run: Run, now: float) -> None:
        """Clear a canary for tenant traffic once its golden set passed (at once when none
        applies): until then the gateways send it golden-set requests only."""
        tenant, _, name = adapter_id.partition("/")
        vid = version_id(tenant, name, run.version)
        if (state.pointers[adapter_id].canary != run.version or vid not in state.versions
                or self.golden_pending(vid)):
            return
        rules = self.rules_for(tenant, name)
        fig = self.window.figures(vid, now - rules.window_s, now)
        # every golden-set run kept, whenever it finished: one that finished while this
        # tick awaited the registry is later than ``now`` (``golden_pending`` had seen it),
        # and one older than the window still passed
        golden = self.window.figures(vid, -math.inf, math.inf)
        if golden.golden_failed > rules.golden_max_failures:
            return  # the analysis aborts it
        figures = {"action": "clear", "reason": "golden_set_passed" if golden.golden_ok
                   else "no_golden_set", "from_percent": run.percent,
                   "to_percent": run.percent,
                   "canary": {"version": run.version, **fig.as_dict(),
                              "golden_ok": golden.golden_ok,
                              "golden_failed": golden.golden_failed}}
        await self.actions.clear(tenant, name, run.version, REASON_PREFIX + json.dumps(
            figures, sort_keys=True, separators=(",", ":")))
        self.cleared.append(adapter_id)
        log.info("canary %s@%s cleared for tenant traffic (%s)", adapter_id, run.version,
                 figures["reason"])

    def stable_snapshots(self, state: State, now: float) -> list[StableSnapshot]:
        """The stable analysis' input: one per adapter with a stable version, its reference
        the other stable versions of the same base model over the same window (each
        version's figures summed once: linear in the adapters)."""
        rows: list[tuple[str, str, str, VersionFigures]] = []
        totals: dict[str, list[VersionFigures]] = {}
        for adapter_id, ptr in state.pointers.items():
            if not ptr.stable:
                continue
            tenant, _, name = adapter_id.partition("/")
            vid = version_id(tenant, name, ptr.stable)
            rec = state.versions.get(vid)
            base = rec.ref.base_model if rec else ""
            fig = self.window.figures(vid, now - self.rules_for(tenant, name).window_s, now)
            rows.append((adapter_id, ptr.stable, base, fig))
            totals.setdefault(base, []).append(fig)
        summed = {base: sum_figures(figs) for base, figs in totals.items()}
        out: list[StableSnapshot] = []
        for adapter_id, version, base, fig in rows:
            ptr = state.pointers[adapter_id]
            tenant, _, name = adapter_id.partition("/")
            target = ptr.rollback_target
            if target and version_id(tenant, name, target) in self.withdrawn:
                target = ""  # never back to a version the analysis took out
            t = summed[base]
            others = VersionFigures(requests=t.requests - fig.requests,
                                    errors=t.errors - fig.errors,
                                    degraded=t.degraded - fig.degraded,
                                    infra_errors=t.infra_errors - fig.infra_errors)
            out.append(StableSnapshot(adapter_id, version, target, fig, others))
        return out

    async def tick_stable(self, state: State, now: float) -> list[StableDecision]:
        """Judge every stable version; roll back or withdraw the failing ones. Returns the
        steps taken (a withdrawn version is kept out while it stays stable, silently)."""
        self.withdrawn = await self.store.withdrawn()
        taken: list[StableDecision] = []
        for snap in self.stable_snapshots(state, now):
            tenant, _, name = snap.adapter_id.partition("/")
            vid = version_id(tenant, name, snap.stable_version)
            if vid in self.withdrawn:
                # taken out already (by this leader or an earlier one; a rollback may still
                # be on its way to the pointers): keep it out of HOT while it is stable.
                # Made stable again by a person, the registry forgets the withdrawal and
                # it is judged afresh.
                self.on_withdraw(vid, now, self.withdrawn[vid])
                continue
            d = decide_stable(snap, self.rules_for(tenant, name), now)
            self.stable_last[snap.adapter_id] = d
            if not d.acts:
                continue
            if await self.actions.stable_of(tenant, name) != d.stable_version:
                continue  # someone moved the pointer meanwhile
            if d.action is StableAction.ROLLBACK:
                await self.actions.rollback(tenant, name, d.to_version, reason_text(d))
            else:
                await self.actions.withdraw(tenant, name, d.stable_version, reason_text(d))
            self.withdrawn[vid] = d.detail
            self.on_withdraw(vid, now, d.detail)
            log.warning("stable %s@%s: %s (%s): %s", d.adapter_id, d.stable_version,
                        d.action.value, d.reason.value, d.detail)
            self.on_stable_step(d)
            taken.append(d)
        return taken

    async def _apply(self, d: Decision, run: Run, now: float) -> bool:
        tenant, _, name = d.adapter_id.partition("/")
        current = await self.actions.current(tenant, name)
        if current != (d.canary_version, d.from_percent):
            log.info("canary %s: registry has %s, not the %s@%d %% decided on: skipped",
                     d.adapter_id, current, d.canary_version, d.from_percent)
            return False
        reason = reason_text(d)
        if d.action is Action.ADVANCE:
            await self.actions.set_share(tenant, name, d.canary_version, d.to_percent, reason)
            nxt = replace(run, percent=d.to_percent, stage_started_at=now,
                          last_decision_id=d.decision_id, last_decision=d.figures())
            self.runs[d.adapter_id] = nxt
            await self.store.save(nxt)
        else:
            if d.action is Action.PROMOTE:
                await self.actions.promote(tenant, name, d.canary_version, reason)
            else:  # ABORT
                await self.actions.set_share(tenant, name, "", 0, reason)
                self.on_abort(version_id(tenant, name, d.canary_version), now)
            # the run ends: keep its last step until the pointers say so (sync deletes it)
            done = replace(run, last_decision_id=d.decision_id, last_decision=d.figures())
            self.runs[d.adapter_id] = done
            await self.store.save(done)
        log.warning("canary %s@%s: %s (%s) %d %% -> %d %%: %s", d.adapter_id, d.canary_version,
                    d.action.value, d.reason.value, d.from_percent, d.to_percent, d.detail)
        self.on_step(d)
        return True


LOAD_KINDS = frozenset({CommandKind.LOAD_HOT, CommandKind.LOAD_WARM})


def observe(window: CanaryWindow, msg: Message, result: ApplyResult, now: float) -> None:
    """Feed one consumed event (and what applying it resolved) to the window: completed
    requests of a heat batch, answers to load commands (timeouts are not verdicts on the
    version and are left out)."""
    if isinstance(msg, events_pb2.HeatBatch):
        for c in msg.completions:
            a = c.meta.adapter
            if not a.adapter_name or c.request_class == common_pb2.REQUEST_CLASS_CANARY:
                continue  # base-model requests; shadow requests are the golden set's
            t = min(ts_seconds(c.meta.occurred_at, now), now)
            window.request(Ref.of(a).version_id, t, request_id=c.request_id,
                           klass=request_class_from_proto(c.request_class).value,
                           ok=c.status_code == 0, degraded=c.degraded_to_base,
                           ttft_ms=c.ttft_ms,
                           cold=c.tier_at_arrival == common_pb2.TIER_COLD,
                           status_code=c.status_code)
        return
    if not result.resolutions:
        return
    messages = {o.command_id: o for o in result.applied.outcomes}
    for res in result.resolutions:
        if res.pending.spec.kind not in LOAD_KINDS or res.result not in ("ok", "failed"):
            continue
        o = messages.get(res.pending.command_id)
        error = f"{res.code}: {o.message}" if o is not None and o.message else res.code
        window.load(res.pending.spec.version_id, now, ok=res.ok,
                    error="" if res.ok else error)


async def run_loop(runner: CanaryRunner, state: State, *, interval_s: float,
                   clock: Callable[[], float]) -> None:
    """The leader's canary task: a tick every ``interval_s``. A registry that cannot be
    reached or refuses a step is retried at the next tick (the step is not recorded)."""
    await runner.start()
    while True:
        try:
            await runner.tick(state, clock())
            await runner.tick_stable(state, clock())
        except (grpc.aio.AioRpcError, OSError, asyncpg.PostgresError,
                asyncpg.InterfaceError) as exc:
            log.warning("canary analysis: step failed, retried next tick: %s", exc)
        await asyncio.sleep(interval_s)


class CanaryCollector:
    """Scrape-time families of the running canaries (one series per canary: bounded by the
    adapters with a canary pointer): stage share, time in stage, last decision."""

    def __init__(self, runner: Callable[[], CanaryRunner | None],
                 clock: Callable[[], float]) -> None:
        self._runner = runner
        self._clock = clock

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        labels = ["tenant", "adapter", "version"]
        share = GaugeMetricFamily("loraplane_cache_canary_stage_percent",
                                  "Share of the canary's current stage, in percent.",
                                  labels=labels)
        age = GaugeMetricFamily("loraplane_cache_canary_stage_seconds",
                                "Time the canary has been in its current stage.", labels=labels)
        paused = GaugeMetricFamily("loraplane_cache_canary_paused",
                                   "1 when an operator paused the canary's analysis.",
                                   labels=labels)
        runner = self._runner()
        if runner is not None:
            now = self._clock()
            for adapter_id, run in list(runner.runs.items()):
                tenant, _, name = adapter_id.partition("/")
                values = [tenant, name, run.version]
                share.add_metric(values, run.percent)
                age.add_metric(values, max(0.0, now - run.stage_started_at))
                paused.add_metric(values, 1.0 if run.paused else 0.0)
        yield share
        yield age
        yield paused
