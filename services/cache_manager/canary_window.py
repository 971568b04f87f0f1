"""The figures of canary analysis: what each version did, kept per version over time (pure).

The cache-manager leader feeds it what it already consumes — completed requests
(``adapter.heat``), the answers to its load commands (``cache.state``) and the
golden-set results of its shadow runner — and :meth:`CanaryWindow.figures` sums one
version's events between two instants into a
:class:`~loraplane.cache_manager.canary_analysis.VersionFigures`. A request reported
by both the gateway and the worker counts once (request id). Memory is bounded: at
most ``max_events`` per version, and :meth:`CanaryWindow.keep` drops the versions the
analysis no longer watches.

The figures live in memory: after a restart or a leader change the window starts
again from what is consumed (the committed offsets replay the last few seconds), while
the stage start and the decisions taken are durable (``canary_runs``).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass

from loraplane.cache_manager.canary_analysis import VersionFigures

INFRA_STATUS = frozenset({1, 4, 8, 14})
"""gRPC CANCELLED, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, UNAVAILABLE: what a killed
worker, a client giving up or a quota gives any version alike."""


@dataclass(frozen=True, slots=True)
class _Request:
    t: float
    klass: str
    ok: bool
    degraded: bool
    ttft_ms: float
    refused: bool = False
    infra: bool = False
    """Failed with a transport / capacity status (see :data:`INFRA_STATUS`)."""


@dataclass(frozen=True, slots=True)
class _Load:
    t: float
    ok: bool
    error: str


@dataclass(frozen=True, slots=True)
class _Golden:
    t: float
    ok: int
    failed: int
    error: str


class CanaryWindow:
    """Timestamped per-version events, summed on demand."""

    def __init__(self, *, max_events: int = 20_000, dedupe_capacity: int = 100_000) -> None:
        self.max_events = max_events
        self._requests: dict[str, deque[_Request]] = {}
        self._loads: dict[str, deque[_Load]] = {}
        self._golden: dict[str, deque[_Golden]] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._dedupe_capacity = dedupe_capacity

    def _queue(self, table: dict[str, deque], vid: str) -> deque:  # type: ignore[type-arg]
        q = table.get(vid)
        if q is None:
            q = table[vid] = deque(maxlen=self.max_events)
        return q

    # ------------------------------------------------------------------ input

    def request(self, vid: str, t: float, *, request_id: str, klass: str, ok: bool,
                degraded: bool, ttft_ms: float, cold: bool = False,
                status_code: int = 0) -> bool:
        """One completed request resolved to ``vid``; False when already counted.
        ``cold``: it arrived while the version was COLD (a failure then is a refusal per
        its cold-start budget or a load failure, not an error after load)."""
        if request_id:
            if request_id in self._seen:
                return False
            self._seen[request_id] = None
            if len(self._seen) > self._dedupe_capacity:
                self._seen.popitem(last=False)
        self._queue(self._requests, vid).append(
            _Request(t, klass, ok, degraded, ttft_ms, cold and not ok and not degraded,
                     not ok and status_code in INFRA_STATUS))
        return True

    def load(self, vid: str, t: float, *, ok: bool, error: str = "") -> None:
        """A load command for ``vid`` was answered (``error``: ``code: message``)."""
        self._queue(self._loads, vid).append(_Load(t, ok, error))

    def golden(self, vid: str, t: float, *, ok: int, failed: int, error: str = "") -> None:
        """A golden-set run against ``vid`` finished."""
        self._queue(self._golden, vid).append(_Golden(t, ok, failed, error))

    def golden_seen(self, vid: str) -> bool:
        """Whether any golden-set run against ``vid`` finished (whenever)."""
        return bool(self._golden.get(vid))

    def keep(self, vids: Iterable[str]) -> None:
        """Forget every version not in ``vids``."""
        wanted = set(vids)
        for table in (self._requests, self._loads, self._golden):
            for vid in [v for v in table if v not in wanted]:
                del table[vid]

    # ------------------------------------------------------------------ output

    def figures(self, vid: str, since: float, until: float) -> VersionFigures:
        """``vid``'s events with ``since <= t <= until``, summed."""
        requests = errors = degraded = refused = infra = 0
        ttft: dict[str, list[float]] = {}
        for r in self._requests.get(vid, ()):
            if not since <= r.t <= until:
                continue
            if r.refused:
                refused += 1
                continue
            requests += 1
            if r.degraded:
                degraded += 1
            elif not r.ok:
                errors += 1
                infra += r.infra
            else:
                ttft.setdefault(r.klass, []).append(r.ttft_ms)
        attempts = failures = 0
        last_load = ""
        for ld in self._loads.get(vid, ()):
            if not since <= ld.t <= until:
                continue
            attempts += 1
            if not ld.ok:
                failures += 1
                last_load = ld.error
        g_ok = g_failed = 0
        last_golden = ""
        for g in self._golden.get(vid, ()):
            if not since <= g.t <= until:
                continue
            g_ok += g.ok
            g_failed += g.failed
            if g.failed:
                last_golden = g.error
        return VersionFigures(
            requests=requests, errors=errors, degraded=degraded, refused=refused,
            infra_errors=infra,
            load_attempts=attempts,
            load_failures=failures, last_load_error=last_load, golden_ok=g_ok,
            golden_failed=g_failed, last_golden_error=last_golden,
            ttft_ms={k: tuple(v) for k, v in ttft.items()},
        )
