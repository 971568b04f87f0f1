"""The gateway's request path: authenticate, resolve, decide, route, proxy, account.

:class:`Gateway` is shared by the gRPC API (:mod:`.grpc_api`) and the HTTP API
(:mod:`.http_api`). It reads only in-memory views (auth, adapters, placement) — no
database, broker or object-store call happens on a request — and hands
completions and prewarm requests to :mod:`.emit`, which publishes them in the
background.

One request:

1. validate the parameters (every problem reported at once) and the adapter name
   (path-like names refused before any lookup);
2. look the name up for the caller's tenant (own or shared adapters);
3. resolve one immutable version (sticky canary split; the canary only once warm);
4. :func:`~loraplane.gateway.budget.decide` on the workers serving its base model:
   route HOT / WARM / cold-load, degrade to the base model, fail fast, or wait for a
   cold-load slot;
5. stream from the worker with the request's deadline, cancelling the worker call
   when the caller goes away; a worker that is UNAVAILABLE before the first token
   is avoided for a while and the request is re-planned once on another worker; a
   worker that found no HOT slot within the budget (RESOURCE_EXHAUSTED, reason
   ``no_slot`` / ``queue_full``) is answered by the base model when the class's policy
   degrades, else its refusal (429 + retry hint) is the answer;
6. record metrics and the completion (heat).

The version resolved in step 3 travels with the request to the worker and comes
back in the first message's ``resolved``; a pointer change while the stream runs
does not affect it.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

import grpc

from loraplane.gateway.auth import AuthView, Principal
from loraplane.gateway.budget import (
    CANARY,
    CLASS_NAMES,
    INTERACTIVE,
    TIER_COLD,
    TIER_HOT,
    TIER_NAMES,
    BudgetConfig,
    ClassBudget,
    ColdPolicy,
    Decision,
    Degrade,
    FailFast,
    Route,
    WaitForSlot,
    decide,
    degrades_without_slot,
    least_loaded,
)
from loraplane.gateway.catalog import AdapterCatalog, VersionInfo
from loraplane.gateway.emit import Completion, HeatEmitter, PrewarmRequester
from loraplane.gateway.errors import (
    AdapterCold,
    ColdStartBudgetExceeded,
    NoReleasedVersion,
    NoWorker,
    VersionNotReady,
    VersionWithdrawn,
    from_rpc_error,
    withdrawal_detail,
)
from loraplane.gateway.flow import FlowController, Permit
from loraplane.gateway.metrics import GatewayMetrics, Series
from loraplane.gateway.names import check_adapter_name, is_base_model
from loraplane.gateway.placement import LocalLoad, PlacementView, WorkerView, worker_options
from loraplane.gateway.quotas import QuotaBook, QuotaExceeded, QuotaLease
from loraplane.gateway.resolution import resolve
from loraplane.shared.errors import InvalidArgument, LoraplaneError
from loraplane.shared.grpcutil import REASON_METADATA
from loraplane.v1 import common_pb2, inference_pb2, worker_pb2, worker_pb2_grpc

BASE_LABEL = "_base"
"""``adapter`` metric label of base-model requests."""
MAX_ROUTE_ATTEMPTS = 2
"""Workers tried for one request when a worker is UNAVAILABLE before its first token."""
VERSION_LEVEL_REASONS = frozenset({"draining", "cold", "in_use"})
"""Worker refusals about one version (not the worker): re-plan, never mark the worker down."""
NO_SLOT_REASONS = frozenset({"no_slot", "queue_full"})
"""Worker refusals for want of a HOT slot within the budget (RESOURCE_EXHAUSTED): a class
whose policy degrades is served by the base model instead; the others get the refusal
(429 with the worker's retry hint)."""
MAX_STOP_STRINGS = 16
"""Stop strings a request may carry."""
MAX_REQUEST_KEY_CHARS = 256
"""Longest request key (sticky canary split)."""
MAX_CHOICES = 16
"""Largest ``n`` (the worker's limit too)."""
MAX_LOGPROBS = 20
"""Largest ``logprobs`` (the worker's limit too: vLLM's default ``max_logprobs``)."""
MAX_LOGIT_BIAS = 300
"""Most ``logit_bias`` entries of one request."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Request limits and defaults of the request path."""

    max_tokens: int = 4096
    """Largest ``max_tokens``."""
    max_prompt_chars: int = 200_000
    """Largest prompt."""
    default_deadline_s: float = 120.0
    """Deadline when the caller sets none."""
    worker_suspect_s: float = 5.0
    """How long a worker that answered UNAVAILABLE is avoided."""


@dataclass(slots=True)
class _Target:
    """Where a request goes, decided before the stream starts."""

    worker: WorkerView
    tier: int
    use_base: bool
    cold_budget_ms: int
    starts_load: bool
    budget_exceeded: bool


@dataclass(slots=True)
class _Resolved:
    """What a request's name resolved to: one immutable version, or the base model (one per
    request: not frozen, whose ``__init__`` costs more; never changed once built)."""

    info: VersionInfo | None
    """The version (None: the base model itself)."""
    ref: common_pb2.AdapterRef
    base_model: str
    canary: bool
    """Chosen by the canary split."""
    labels: tuple[str, str, str, str]
    """Its metric series: tenant, adapter, version, class."""


@dataclass(slots=True)
class _Served:
    """How far one request got, filled in on the way and read by its accounting."""

    target: _Target | None = None
    first_at: float = 0.0
    """When the first message came (monotonic; 0: none yet)."""
    prompt_tokens: int = 0
    output_tokens: int = 0
    quota: QuotaLease | None = None
    outcome: str = "ok"
    status: grpc.StatusCode = grpc.StatusCode.OK


class WorkerStubs(Protocol):
    """What :class:`Gateway` needs from :class:`~loraplane.gateway.workers.WorkerPool`."""

    def stub(self, address: str) -> worker_pb2_grpc.WorkerInternalStub:
        """The WorkerInternal stub for ``address``."""


def _trailing(err: grpc.aio.AioRpcError, key: str) -> str:
    for k, v in err.trailing_metadata() or ():
        if k == key:
            return v if isinstance(v, str) else v.decode()
    return ""


def validate_params(req: inference_pb2.GenerateRequest, limits: Limits) -> list[str]:
    """Every problem of a request's generation parameters (empty list: valid)."""
    problems = []
    if not req.prompt:
        problems.append("prompt must not be empty")
    elif len(req.prompt) > limits.max_prompt_chars:
        problems.append(f"prompt longer than {limits.max_prompt_chars} characters")
    if req.max_tokens < 0 or req.max_tokens > limits.max_tokens:
        problems.append(f"max_tokens must be within 0..{limits.max_tokens}")
    if req.HasField("temperature") and not (0.0 <= req.temperature <= 2.0):
        problems.append("temperature must be within 0..2")
    if req.HasField("top_p") and not (0.0 < req.top_p <= 1.0):
        problems.append("top_p must be within (0, 1]")
    if req.request_class not in CLASS_NAMES:
        problems.append(f"unknown request_class {req.request_class}")
    if len(req.request_key) > MAX_REQUEST_KEY_CHARS:
        problems.append(f"request_key longer than {MAX_REQUEST_KEY_CHARS} characters")
    stop = req.stop
    if stop and (len(stop) > MAX_STOP_STRINGS or not all(stop)):
        problems.append(f"stop takes at most {MAX_STOP_STRINGS} non-empty strings")
    if math.isnan(req.temperature) or math.isnan(req.top_p):
        problems.append("temperature and top_p must be numbers")
    if not 0 <= req.n <= MAX_CHOICES:
        problems.append(f"n must be within 1..{MAX_CHOICES}")
    if req.n > 1 and req.HasField("temperature") and req.temperature == 0:
        problems.append("n > 1 needs a temperature > 0 (greedy sampling has one answer)")
    if req.HasField("logprobs") and not 0 <= req.logprobs <= MAX_LOGPROBS:
        problems.append(f"logprobs must be within 0..{MAX_LOGPROBS}")
    if req.HasField("logprobs") and req.echo:
        problems.append("echo with logprobs is not supported (prompt log probabilities are "
                        "not returned)")
    # NaN fails too
    if req.HasField("presence_penalty") and not -2.0 <= req.presence_penalty <= 2.0:
        problems.append("presence_penalty must be within -2..2")
    if req.HasField("frequency_penalty") and not -2.0 <= req.frequency_penalty <= 2.0:
        problems.append("frequency_penalty must be within -2..2")
    bias = req.logit_bias
    if bias and (len(bias) > MAX_LOGIT_BIAS or any(
        t < 0 or not -100.0 <= v <= 100.0 for t, v in bias.items()
    )):
        problems.append(f"logit_bias takes at most {MAX_LOGIT_BIAS} token ids >= 0, each with "
                        "a bias within -100..100")
    return problems


_ID_BATCH = 256
"""Request ids' random bytes drawn from ``os.urandom`` at once (one system call, not one
per request)."""
_id_bytes: list[bytes] = []
"""The drawn bytes not used yet, 16 per id (emptied in a forked child: never shared)."""
os.register_at_fork(after_in_child=_id_bytes.clear)


def new_request_id() -> str:
    """A fresh request id: a random UUID (version 4) as 32 hex digits, like
    ``uuid.uuid4().hex`` (the same ``os.urandom`` bytes, drawn ``_ID_BATCH`` ids at a time)
    at a fraction of its cost."""
    try:
        raw = _id_bytes.pop()
    except IndexError:
        drawn = os.urandom(16 * _ID_BATCH)
        _id_bytes.extend(drawn[i:i + 16] for i in range(16, len(drawn), 16))
        raw = drawn[:16]
    b = bytearray(raw)
    b[6] = (b[6] & 0x0F) | 0x40  # version 4
    b[8] = (b[8] & 0x3F) | 0x80  # RFC 4122 variant
    return b.hex()


class Gateway:
    """The request path over the in-memory views."""

    def __init__(
        self,
        *,
        auth: AuthView,
        catalog: AdapterCatalog,
        placement: PlacementView,
        local: LocalLoad,
        workers: WorkerStubs,
        heat: HeatEmitter,
        prewarm: PrewarmRequester,
        metrics: GatewayMetrics,
        budgets: BudgetConfig,
        limits: Limits = Limits(),
        default_base_model: str = "",
        on_incomplete: Callable[[str, str, str], None] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        flow: FlowController | None = None,
        quotas: QuotaBook | None = None,
    ) -> None:
        """Wire the request path to its views and sinks (see the module doc).

        ``flow``: admission limit, priority order and fair share per worker
        (:mod:`.flow`; None = every request goes straight to its worker); ``quotas``:
        tenant quotas and tiers (:mod:`.quotas`; None = no quota).
        """
        self.flow = flow
        self.quotas = quotas
        self.auth = auth
        self.catalog = catalog
        self.placement = placement
        self.local = local
        self.workers = workers
        self.heat = heat
        self.prewarm = prewarm
        self.metrics = metrics
        self.budgets = budgets
        self.limits = limits
        self.default_base_model = default_base_model
        self._on_incomplete = on_incomplete
        self._clock = clock
        self._monotonic = monotonic
        self._suspect: dict[str, float] = {}
        self._changed = asyncio.Event()
        placement.on_change(self._wake)
        local.on_slot_freed(self._wake)

    # ------------------------------------------------------------------ helpers

    def _wake(self) -> None:
        """Wake every request waiting for a load slot or a placement change."""
        self._changed.set()
        self._changed = asyncio.Event()

    def authenticate(self, token: str | None) -> Principal:
        """The caller of an API key (counts refusals)."""
        try:
            return self.auth.authenticate(token)
        except LoraplaneError as exc:
            self.metrics.refused.labels(getattr(exc, "code", exc.grpc_code.name.lower())).inc()
            raise

    def _excluded(self) -> frozenset[str]:
        if not self._suspect:
            return frozenset()
        now = self._monotonic()
        for wid in [w for w, until in self._suspect.items() if until <= now]:
            del self._suspect[wid]
        return frozenset(self._suspect)

    def _base_model_of(self, req: inference_pb2.GenerateRequest) -> str:
        if req.base_model:
            return req.base_model
        if self.default_base_model:
            return self.default_base_model
        served = self.placement.base_models()
        if len(served) == 1:
            return next(iter(served))
        raise InvalidArgument(f"base_model is required; served: {sorted(served)}")

    # ------------------------------------------------------------------ planning

    async def _plan(
        self,
        info: VersionInfo,
        budget: ClassBudget,
        request_class: int,
        started: float,
        exclude: frozenset[str],
    ) -> _Target:
        """Decide where the version is served; waits for a cold-load slot when told to."""
        while True:
            workers = self.placement.routable(info.base_model)
            options = worker_options(workers, self.local, info.engine_id, exclude=exclude)
            elapsed_ms = (self._monotonic() - started) * 1000.0
            remaining = budget.budget_ms - elapsed_ms
            decision: Decision = decide(options, budget, remaining, self.placement.estimates())
            plan = decision.plan
            if decision.prewarm:
                self.prewarm.request(info.ref(), info.engine_id, request_class, "cold_miss")
            if isinstance(plan, Route):
                worker = next(w for w in workers if w.worker_id == plan.worker_id)
                return _Target(worker, plan.tier, False, plan.cold_budget_ms, plan.starts_load,
                               False)
            if isinstance(plan, Degrade):
                worker = next(w for w in workers if w.worker_id == plan.worker_id)
                return _Target(worker, self.placement.tier(worker.worker_id, info.engine_id),
                               True, 0, False, True)
            if isinstance(plan, WaitForSlot):
                changed = self._changed
                try:
                    await asyncio.wait_for(changed.wait(), max(0.0, remaining) / 1000.0)
                except TimeoutError:
                    pass
                continue
            assert isinstance(plan, FailFast)
            if not options:
                raise NoWorker(plan.reason, retry_after_s=plan.retry_after_s)
            if plan.exhausted:
                raise ColdStartBudgetExceeded(plan.reason, retry_after_s=plan.retry_after_s)
            raise AdapterCold(plan.reason, retry_after_s=plan.retry_after_s)

    def _plan_degrade(self, info: VersionInfo, exclude: frozenset[str]) -> _Target:
        """The base model on the least-loaded worker (the version got no HOT slot in time)."""
        target = self._plan_base(info.base_model, exclude)
        target.tier = self.placement.tier(target.worker.worker_id, info.engine_id)
        target.budget_exceeded = True
        return target

    def _plan_base(self, base_model: str, exclude: frozenset[str]) -> _Target:
        workers = [w for w in self.placement.routable(base_model) if w.worker_id not in exclude]
        if not workers:
            raise NoWorker(f"no ready worker serves base model {base_model!r}", retry_after_s=1.0)
        options = worker_options(workers, self.local, 0)
        chosen = least_loaded(options).worker_id
        worker = next(w for w in workers if w.worker_id == chosen)
        return _Target(worker, TIER_HOT, True, 0, False, False)

    # ------------------------------------------------------------------ request path

    async def generate(
        self,
        principal: Principal,
        req: inference_pb2.GenerateRequest,
        *,
        request_id: str | None = None,
        timeout_s: float | None = None,
        on_first: Callable[[inference_pb2.GenerateResponse], None] | None = None,
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        """Serve one request; yields the worker's stream with ``resolved`` on the first message
        (``on_first`` sees that message before it is yielded: the gRPC API's trailing
        metadata).

        The steps, each narrowing what is left: :meth:`_check` the fields, :meth:`_resolve`
        the name to one immutable version, :meth:`_budget` its cold-start budget,
        :meth:`_take_quota`, then the attempts on workers until one streams (:meth:`_plan`,
        flow control, the worker's stream; in this generator itself, not a nested one: each
        layer costs every message a resumption), and :meth:`_account` for what it cost,
        however it ended.

        Raises a :class:`~loraplane.shared.errors.LoraplaneError` (classified) on refusal.
        """
        started = self._monotonic()
        rid = request_id or new_request_id()
        base_request = self._check(req)
        request_class = req.request_class or INTERACTIVE
        timeout = timeout_s if timeout_s is not None else self.limits.default_deadline_s
        resolved = self._resolve(principal, req, rid, request_class, base_request)
        series = self.metrics.series(*resolved.labels)
        budget = self._budget(resolved, request_class)
        served = _Served()
        deadline = started + timeout
        info, ref, base_model = resolved.info, resolved.ref, resolved.base_model
        try:
            served.quota = self._take_quota(principal, req)
            # The attempts, in this generator itself (one generator per stream, not two:
            # each layer costs every message an extra resumption). Plan a worker, pass flow
            # control, stream its answer; before the first token, plan again (up to
            # MAX_ROUTE_ATTEMPTS) without a worker that answered UNAVAILABLE, with the
            # version COLD on one it is leaving, or on the base model when no HOT slot frees
            # within the budget. ``served`` records the target, first token and usage.
            exclude = self._excluded()
            priority = self.quotas.policies.priority(principal.tenant_id) if self.quotas else 0
            degrade = False
            for attempt in range(MAX_ROUTE_ATTEMPTS):
                if info is None:
                    target = self._plan_base(base_model, exclude)
                elif degrade:
                    target = self._plan_degrade(info, exclude)
                else:
                    target = await self._plan(info, budget, request_class, started, exclude)
                served.target = target
                if target.budget_exceeded:
                    series.budget_exceeded.inc()
                series.routed_to(TIER_NAMES.get(target.tier, "unspecified"))
                wreq = self._worker_request(rid, req, request_class, ref, info, base_model,
                                            target, deadline)
                # the canary must not be the worker's own LRU victim mid-split
                wreq.never_evict = resolved.canary and info is not None and not target.use_base
                wid = target.worker.worker_id
                wreq.priority = priority  # type: ignore[assignment]
                permit: Permit | None = None
                if self.flow is not None:
                    self.local.begin(wid)  # a waiter counts as load: the next goes elsewhere
                    try:
                        permit = await self.flow.admit(
                            wid, tenant=principal.tenant_id, request_class=request_class,
                            priority=priority, cost=req.max_tokens or 1,
                        )
                    finally:
                        self.local.end(wid)
                call = self.workers.stub(target.worker.address).Generate(
                    wreq, timeout=max(0.001, deadline - self._monotonic())
                )
                self.local.begin(wid)
                if target.starts_load and info is not None:
                    self.local.start_load(wid, info.engine_id)
                load_open = target.starts_load
                try:
                    first = True
                    async for msg in call:
                        if first:
                            first = False
                            served.first_at = self._monotonic()
                            if load_open and info is not None:
                                load_open = False
                                self.local.finish_load(wid, info.engine_id)
                            self._stamp(msg, ref, target, resolved.canary, rid)
                            if msg.finished:
                                self._finish(msg, served, started, permit)
                            if on_first is not None:
                                on_first(msg)
                        elif msg.finished:
                            self._finish(msg, served, started, permit)
                        yield msg
                    break
                except grpc.aio.AioRpcError as err:
                    if (
                        err.code() == grpc.StatusCode.UNAVAILABLE
                        and served.first_at == 0.0
                        and attempt + 1 < MAX_ROUTE_ATTEMPTS
                    ):
                        reason = _trailing(err, REASON_METADATA)
                        if reason in VERSION_LEVEL_REASONS and info is not None:
                            # The worker is fine; this version is leaving it (or left):
                            # plan again with the version COLD there (budget rules apply).
                            self.placement.forget_version(wid, info.engine_id)
                            continue
                        self._suspect[wid] = self._monotonic() + self.limits.worker_suspect_s
                        exclude = exclude | {wid}
                        continue
                    if (
                        err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                        and served.first_at == 0.0
                        and info is not None
                        and not target.use_base
                        and attempt + 1 < MAX_ROUTE_ATTEMPTS
                        and _trailing(err, REASON_METADATA) in NO_SLOT_REASONS
                        and degrades_without_slot(budget)
                    ):
                        degrade = True  # no HOT slot within the budget: base model
                        self.prewarm.request(info.ref(), info.engine_id, request_class,
                                             "no_slot")
                        continue
                    raise from_rpc_error(err, wid) from None
                finally:
                    if not call.done():
                        call.cancel()
                    self.local.end(wid)
                    if permit is not None:
                        permit.release()
                    if load_open and info is not None:
                        self.local.finish_load(wid, info.engine_id)
            if served.target is not None and served.target.use_base and info is not None:
                served.outcome = "degraded"
                series.degraded.inc()
        except LoraplaneError as exc:
            served.status = exc.grpc_code
            served.outcome = served.status.name.lower()
            raise
        except (asyncio.CancelledError, GeneratorExit):
            served.status = grpc.StatusCode.CANCELLED
            served.outcome = "cancelled"
            raise
        finally:
            self._account(resolved, rid, request_class, series, started, served)

    def _finish(self, msg: inference_pb2.GenerateResponse, served: _Served, started: float,
                permit: Permit | None) -> None:
        """The last message: its usage into ``served``, the gateway's TTFT and duration into
        the message, and the flow permit back (the engine is done with it: free the slot
        before the client can send its next request, else that one waits for this
        generator to resume)."""
        usage = msg.usage
        served.prompt_tokens = usage.prompt_tokens
        served.output_tokens = usage.output_tokens
        usage.ttft_ms = (served.first_at - started) * 1000.0
        usage.duration_ms = (self._monotonic() - started) * 1000.0
        if permit is not None:
            permit.release()

    def _check(self, req: inference_pb2.GenerateRequest) -> bool:
        """Refuse a request with bad fields, naming every problem (INVALID_ARGUMENT);
        return whether it names the base model rather than an adapter."""
        problems = validate_params(req, self.limits)
        base_request = is_base_model(req.adapter)
        if not base_request:
            try:
                check_adapter_name(req.adapter)
            except InvalidArgument as exc:
                problems.append(exc.message)
        if problems:
            self.metrics.refused.labels("invalid_argument").inc()
            raise InvalidArgument("; ".join(problems))
        return base_request

    def _resolve(
        self,
        principal: Principal,
        req: inference_pb2.GenerateRequest,
        rid: str,
        request_class: int,
        base_request: bool,
    ) -> _Resolved:
        """Name → one immutable version (the sticky canary split), or the base model; refuses
        an unknown, unreleased, withdrawn or not yet routable one."""
        klass = CLASS_NAMES[request_class]
        if base_request:
            base_model = self._base_model_of(req)
            ref = common_pb2.AdapterRef(tenant_id=principal.tenant_id, base_model=base_model)
            return _Resolved(None, ref, base_model, False,
                             (principal.tenant_id, BASE_LABEL, base_model, klass))
        try:
            entry = self.catalog.lookup(principal.tenant_id, req.adapter)
        except LoraplaneError as exc:
            self.metrics.refused.labels(getattr(exc, "code", "lookup")).inc()
            raise
        release = entry.release
        canary_info = entry.versions.get(release.canary) if release.canary else None
        canary_warm = canary_info is not None and self.placement.is_warm(
            canary_info.base_model or entry.base_model, canary_info.engine_id
        )
        resolution = resolve(
            release, req.request_key or rid, request_class, canary_warm=canary_warm
        )
        if resolution is None:
            raise NoReleasedVersion(f"adapter {req.adapter!r} has no released version")
        if resolution.canary_held_back and canary_info is not None:
            self.prewarm.request(
                canary_info.ref(), canary_info.engine_id, CANARY, "canary_not_warm"
            )
        info = entry.versions.get(resolution.version)
        if info is not None and info.withdrawn:
            self.metrics.refused.labels(VersionWithdrawn.code).inc()
            raise VersionWithdrawn(
                f"version {resolution.version} of {req.adapter!r} was withdrawn by the "
                f"canary analysis ({withdrawal_detail(info.withdrawn)}); there is no "
                "version to fall back to until its owner promotes one")
        if info is None or not info.complete or info.retired:
            if self._on_incomplete is not None and (info is None or not info.complete):
                self._on_incomplete(release.tenant_id, release.name, resolution.version)
            raise VersionNotReady(
                f"version {resolution.version} of {req.adapter!r} is not routable yet",
                retry_after_s=1.0,
            )
        return _Resolved(info, info.ref(), info.base_model or entry.base_model,
                         resolution.canary,
                         (release.tenant_id, release.name, resolution.version, klass))

    def _budget(self, resolved: _Resolved, request_class: int) -> ClassBudget:
        """The cold-start budget of the version's class (the base model is never cold)."""
        if resolved.info is None:
            return ClassBudget(budget_ms=0, on_cold=ColdPolicy.FAIL_FAST)
        ref = resolved.ref
        return self.budgets.for_request(ref.tenant_id, ref.adapter_name, request_class)

    def _take_quota(
        self, principal: Principal, req: inference_pb2.GenerateRequest
    ) -> QuotaLease | None:
        """The tenant's quota lease (None without quotas); refuses beyond it (429)."""
        if self.quotas is None:
            return None
        try:
            return self.quotas.acquire(principal.tenant_id, req.adapter,
                                       req.max_tokens or 1, self._monotonic())
        except QuotaExceeded as exc:
            if self.flow is not None and self.flow.metrics is not None:
                self.flow.metrics.quota_refused.labels(principal.tenant_id, exc.quota).inc()
            raise

    def _account(
        self,
        resolved: _Resolved,
        rid: str,
        request_class: int,
        series: Series,
        started: float,
        served: _Served,
    ) -> None:
        """Record what the request cost, however it ended: the quota lease back with the
        tokens it made, outcome, TTFT and duration, and its heat when it named a version or
        reached a worker."""
        end = self._monotonic()
        if served.quota is not None and self.quotas is not None:
            self.quotas.release(served.quota, served.output_tokens, end)
        series.outcome(served.outcome)
        first_at, target, info = served.first_at, served.target, resolved.info
        if first_at:
            series.ttft.observe(first_at - started)
        series.duration.observe(end - started)
        if info is not None or target is not None:
            self.heat.record(
                Completion(
                    adapter=resolved.ref,
                    request_id=rid,
                    worker_id=target.worker.worker_id if target is not None else "",
                    request_class=request_class,
                    # never reached a worker: refused because it was cold (or no worker)
                    tier_at_arrival=target.tier if target is not None else TIER_COLD,
                    ttft_ms=(first_at - started) * 1000.0 if first_at else 0.0,
                    duration_ms=(end - started) * 1000.0,
                    prompt_tokens=served.prompt_tokens,
                    output_tokens=served.output_tokens,
                    status_code=served.status.value[0],
                    degraded_to_base=bool(target is not None and target.use_base
                                          and info is not None),
                    engine_id=info.engine_id if info is not None else 0,
                    at=self._clock(),
                )
            )

    def _worker_request(
        self,
        rid: str,
        req: inference_pb2.GenerateRequest,
        request_class: int,
        ref: common_pb2.AdapterRef,
        info: VersionInfo | None,
        base_model: str,
        target: _Target,
        deadline_monotonic: float,
    ) -> worker_pb2.WorkerGenerateRequest:
        wreq = worker_pb2.WorkerGenerateRequest(
            request_id=rid,
            params=req,
            request_class=request_class,  # type: ignore[arg-type]
            cold_budget_ms=target.cold_budget_ms,
            use_base=target.use_base,
            base_model=base_model,
        )
        if info is not None:
            wreq.adapter.CopyFrom(ref)
            wreq.engine_id = info.engine_id
            wreq.sha256 = info.sha256
            wreq.artifact_uri = info.artifact_uri
            wreq.rank = info.rank
            wreq.size_bytes = info.size_bytes
        deadline = wreq.deadline  # set directly: Timestamp.FromNanoseconds is Python code
        deadline.seconds, deadline.nanos = divmod(
            int((self._clock() + (deadline_monotonic - self._monotonic())) * 1e9), 1_000_000_000)
        return wreq

    @staticmethod
    def _stamp(
        msg: inference_pb2.GenerateResponse,
        ref: common_pb2.AdapterRef,
        target: _Target,
        canary: bool,
        rid: str,
    ) -> None:
        """Fill ``resolved`` on the first message (the worker's tier is kept when it knows)."""
        resolved = msg.resolved
        worker_tier = resolved.tier_at_arrival
        resolved.adapter.CopyFrom(ref)
        resolved.degraded_to_base = target.use_base and bool(ref.adapter_name)
        resolved.canary = canary
        resolved.worker_id = target.worker.worker_id
        resolved.request_id = rid
        tier = worker_tier if worker_tier and not target.use_base else target.tier
        resolved.tier_at_arrival = tier  # type: ignore[assignment]

