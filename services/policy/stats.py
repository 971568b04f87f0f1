"""Per-version request statistics, updated in O(1) per request.

The request rate is an exponentially decayed count with time constant
``tau`` (300 s for HOT: the decayed equivalent of "qps over the last 10 minutes", since
a 10-minute sliding window's samples are 5 minutes old on average, as are those of a
decay with time constant 300 s): each request adds 1, and the
count decays by ``exp(-dt / tau)``. For a steady stream of ``λ`` requests per
second the count converges to ``λ·tau``, so ``count / tau`` estimates the rate.
Unlike fixed buckets it needs one float per version and no timer, and it orders
versions by a blend of frequency and recency (LRFU).

:class:`VersionStats` is the mutable accumulator the cache-manager and the
simulator keep per version; :class:`StatsView` is its immutable copy inside a
:class:`~loraplane.policy.snapshot.Snapshot`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .model import RequestClass

DEFAULT_TAU_S = 300.0
"""Time constant of the HOT request rate (``score.rate_window_s``)."""
DEFAULT_WARM_TAU_S = 3600.0
"""Time constant of the WARM request rate (``score.warm_rate_window_s``)."""

GAP_SMOOTHING = 0.3
"""Weight of the newest inter-arrival gap in :attr:`StatsView.mean_gap_s` (an EWMA)."""

_CLASS_INDEX: dict[RequestClass, int] = {
    RequestClass.INTERACTIVE: 0,
    RequestClass.BACKGROUND: 1,
    RequestClass.CANARY: 2,
}


def decayed(count: float, as_of: float, now: float, tau_s: float) -> float:
    """``count`` (valid at ``as_of``) decayed to ``now``; a clock that goes back decays nothing."""
    dt = now - as_of
    if dt <= 0.0 or count == 0.0:
        return count
    return count * math.exp(-dt / tau_s)


@dataclass(frozen=True, slots=True)
class StatsView:
    """Immutable statistics of one version, as carried by a snapshot."""

    decayed_count: float = 0.0
    """Decayed request count (HOT time constant), valid at ``as_of``."""
    decayed_count_warm: float = 0.0
    """Decayed request count with the (longer) WARM time constant, valid at ``as_of``."""
    as_of: float = 0.0
    """Clock value at which ``decayed_count`` was computed."""
    last_access: float | None = None
    """Clock value of the last request (None: never requested)."""
    requests: int = 0
    """Requests since the statistics began."""
    mean_gap_s: float = 0.0
    """Smoothed gap between consecutive requests (EWMA, newest weight :data:`GAP_SMOOTHING`);
    0 while fewer than two requests were seen (unknown)."""
    interactive: int = 0
    """Requests of class interactive."""
    background: int = 0
    """Requests of class background."""
    canary: int = 0
    """Requests of class canary."""
    loads: int = 0
    """Times the version was loaded into an engine."""
    requests_after_load: int = 0
    """Requests finished since the last load."""
    errors_after_load: int = 0
    """Of those, how many failed."""

    def count(self, now: float, tau_s: float) -> float:
        """Decayed request count at ``now``."""
        return decayed(self.decayed_count, self.as_of, now, tau_s)

    def rate(self, now: float, tau_s: float) -> float:
        """Estimated requests per second at ``now`` (decayed count / tau)."""
        return self.count(now, tau_s) / tau_s

    def rate_warm(self, now: float, tau_warm_s: float) -> float:
        """Estimated requests per second at ``now`` over the WARM time constant."""
        return decayed(self.decayed_count_warm, self.as_of, now, tau_warm_s) / tau_warm_s

    def idle_s(self, now: float) -> float:
        """Seconds since the last request (infinite if never requested)."""
        if self.last_access is None:
            return math.inf
        return max(0.0, now - self.last_access)

    def error_rate_after_load(self) -> float:
        """Share of requests that failed since the last load (0 when none finished)."""
        if self.requests_after_load == 0:
            return 0.0
        return self.errors_after_load / self.requests_after_load

    def class_shares(self) -> tuple[float, float, float]:
        """Shares of interactive, background and canary requests (interactive=1 when none)."""
        total = self.interactive + self.background + self.canary
        if total == 0:
            return (1.0, 0.0, 0.0)
        return (self.interactive / total, self.background / total, self.canary / total)


class VersionStats:
    """Mutable O(1) accumulator for one version (kept by the cache-manager and the simulator)."""

    __slots__ = (
        "as_of",
        "class_counts",
        "decayed_count",
        "decayed_count_warm",
        "errors_after_load",
        "in_flight",
        "last_access",
        "loads",
        "mean_gap_s",
        "requests",
        "requests_after_load",
        "tau_s",
        "tau_warm_s",
    )

    def __init__(self, tau_s: float = DEFAULT_TAU_S, tau_warm_s: float = DEFAULT_WARM_TAU_S) -> None:
        if tau_s <= 0 or tau_warm_s <= 0:
            raise ValueError(f"time constants must be > 0, got {tau_s}, {tau_warm_s}")
        self.tau_s = tau_s
        self.tau_warm_s = tau_warm_s
        self.decayed_count = 0.0
        self.decayed_count_warm = 0.0
        self.as_of = 0.0
        self.last_access: float | None = None
        self.requests = 0
        self.mean_gap_s = 0.0
        self.class_counts = [0, 0, 0]
        self.in_flight = 0
        self.loads = 0
        self.requests_after_load = 0
        self.errors_after_load = 0

    def record_request(self, now: float, request_class: RequestClass) -> None:
        """Count one request arriving at ``now`` (O(1))."""
        if now > self.as_of:
            self.decayed_count = decayed(self.decayed_count, self.as_of, now, self.tau_s)
            self.decayed_count_warm = decayed(
                self.decayed_count_warm, self.as_of, now, self.tau_warm_s
            )
            self.as_of = now
        self.decayed_count += 1.0
        self.decayed_count_warm += 1.0
        if self.last_access is not None and now >= self.last_access:
            # out-of-order arrivals (several gateways' batches, a replay) are not gaps;
            # a mean of 0 means "unknown" (first gap, or rows saved before it existed)
            gap = now - self.last_access
            self.mean_gap_s = (
                gap if self.mean_gap_s == 0.0
                else (1.0 - GAP_SMOOTHING) * self.mean_gap_s + GAP_SMOOTHING * gap
            )
        self.last_access = now if self.last_access is None else max(self.last_access, now)
        self.requests += 1
        self.class_counts[_CLASS_INDEX[request_class]] += 1

    def start_request(self) -> None:
        """A request for this version began executing (in-flight + 1)."""
        self.in_flight += 1

    def finish_request(self, *, error: bool) -> None:
        """A request finished; ``error`` counts towards the error rate after load."""
        if self.in_flight > 0:
            self.in_flight -= 1
        self.requests_after_load += 1
        if error:
            self.errors_after_load += 1

    def record_load(self) -> None:
        """The version was loaded into an engine: the error rate after load restarts."""
        self.loads += 1
        self.requests_after_load = 0
        self.errors_after_load = 0

    def rate(self, now: float) -> float:
        """Estimated requests per second at ``now`` (HOT time constant)."""
        return decayed(self.decayed_count, self.as_of, now, self.tau_s) / self.tau_s

    def view(self) -> StatsView:
        """Immutable copy for a snapshot."""
        interactive, background, canary = self.class_counts
        return StatsView(
            decayed_count=self.decayed_count,
            decayed_count_warm=self.decayed_count_warm,
            as_of=self.as_of,
            last_access=self.last_access,
            requests=self.requests,
            mean_gap_s=self.mean_gap_s,
            interactive=interactive,
            background=background,
            canary=canary,
            loads=self.loads,
            requests_after_load=self.requests_after_load,
            errors_after_load=self.errors_after_load,
        )
