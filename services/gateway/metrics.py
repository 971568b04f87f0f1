"""Gateway metrics (prometheus-client), labelled by tenant, adapter, version and class.

Cardinality stays bounded: tenants and adapter names come from the registry,
versions are the registry's (a handful live per name), classes are three.
Base-model requests use ``adapter="_base"`` and the base model as ``version``.

* ``loraplane_gateway_requests_total{tenant,adapter,version,class,outcome}``:
  outcome ``ok``, ``degraded``, ``cancelled``, or the gRPC status name (lowercase);
* ``loraplane_gateway_ttft_seconds`` and ``loraplane_gateway_request_seconds``
  histograms (P95 / P99 through ``histogram_quantile``);
* ``loraplane_gateway_degraded_total``, ``loraplane_gateway_budget_exceeded_total``;
* ``loraplane_gateway_routed_total{...,tier}``: tier of the version on the chosen worker;
* ``loraplane_gateway_refused_total{reason}``: refused before resolution (auth, names);
* ``loraplane_gateway_view_events_total{view}``;
* heat: ``loraplane_gateway_heat_published_total``, ``loraplane_gateway_heat_dropped_total``
  (completions given up while Kafka was away), ``loraplane_gateway_heat_pending`` and
  ``loraplane_gateway_prewarm_dropped_total``;
* what the gateway believes about each worker (:mod:`.liveness`):
  ``loraplane_gateway_worker_state{worker,state}`` (1 for its current state: answering,
  reporting, silent, down), ``loraplane_gateway_worker_state_since_timestamp_seconds{worker}``,
  ``loraplane_gateway_worker_last_answer_timestamp_seconds{worker}`` (last answered gRPC
  probe), ``loraplane_gateway_worker_last_report_timestamp_seconds{worker}`` (last
  ``cache.state`` report), ``loraplane_gateway_worker_routable{worker}`` and
  ``loraplane_gateway_worker_probes_total{worker,result}``. Bounded by the workers known.

Series of retired versions are removed: :attr:`GatewayMetrics.sweeper` (a
:class:`~loraplane.shared.metrics.SeriesSweeper`, run at every scrape) removes every
``(tenant, adapter, version)`` child of the version-labelled families once the adapter
view has called the version retired or rejected for ``SERIES_GRACE_S`` (and drops the
cached label children), so those families hold the versions not retired that this gateway
served, plus the base models.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from loraplane.shared.metrics import PerRegistry, SeriesSweeper

if TYPE_CHECKING:
    from loraplane.gateway.catalog import AdapterCatalog
    from loraplane.gateway.emit import HeatEmitter, PrewarmRequester
    from loraplane.gateway.placement import PlacementView

TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)
"""Time-to-first-token buckets (seconds): 1 ms .. 30 s (cold loads of background requests)."""
DURATION_BUCKETS: tuple[float, ...] = (
    0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)
"""Whole-request buckets (seconds)."""

_LABELS = ("tenant", "adapter", "version", "class")
VERSION_LABELS = ("tenant", "adapter", "version")
"""The labels naming one version in the version-labelled families (what the sweeper removes)."""


@dataclass(slots=True)
class Series:
    """The label children of one (tenant, adapter, version, class), bound once; the
    outcome and tier children are bound on first use."""

    labels: tuple[str, str, str, str]
    ttft: Histogram
    duration: Histogram
    degraded: Counter
    budget_exceeded: Counter
    requests_family: Counter
    routed_family: Counter
    outcomes: dict[str, Counter] = field(default_factory=dict)
    routed: dict[str, Counter] = field(default_factory=dict)

    def outcome(self, outcome: str) -> None:
        """Count one finished request."""
        c = self.outcomes.get(outcome)
        if c is None:
            c = self.requests_family.labels(*self.labels, outcome)
            self.outcomes[outcome] = c
        c.inc()

    def routed_to(self, tier: str) -> None:
        """Count one routing decision."""
        c = self.routed.get(tier)
        if c is None:
            c = self.routed_family.labels(*self.labels, tier)
            self.routed[tier] = c
        c.inc()


class GatewayMetrics(PerRegistry):
    """The gateway's metric families in one registry, with cached label children.

    Use :meth:`for_registry` so several gateways in one process share the families.
    """

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        """Register the families in ``registry`` (use a fresh registry per test)."""
        super().__init__(registry)
        self.requests = Counter(
            "loraplane_gateway_requests", "Tenant requests by outcome.",
            [*_LABELS, "outcome"], registry=registry,
        )
        self.ttft = Histogram(
            "loraplane_gateway_ttft_seconds", "Time to first token seen by the gateway.",
            _LABELS, buckets=TTFT_BUCKETS, registry=registry,
        )
        self.duration = Histogram(
            "loraplane_gateway_request_seconds", "Whole request duration seen by the gateway.",
            _LABELS, buckets=DURATION_BUCKETS, registry=registry,
        )
        self.degraded = Counter(
            "loraplane_gateway_degraded", "Requests served by the base model because the "
            "adapter was cold.", _LABELS, registry=registry,
        )
        self.budget_exceeded = Counter(
            "loraplane_gateway_budget_exceeded", "Requests whose adapter could not be served "
            "within the cold-start budget.", _LABELS, registry=registry,
        )
        self.routed = Counter(
            "loraplane_gateway_routed", "Requests routed, by the version's tier on the worker.",
            [*_LABELS, "tier"], registry=registry,
        )
        self.refused = Counter(
            "loraplane_gateway_refused", "Requests refused before resolution.", ["reason"],
            registry=registry,
        )
        self.view_events = Counter(
            "loraplane_gateway_view_events", "Events applied to the in-memory views.", ["view"],
            registry=registry,
        )
        self.probes = Counter(
            "loraplane_gateway_worker_probes", "gRPC liveness probes of workers, by result "
            "(ok, timeout, error).", ["worker", "result"], registry=registry,
        )
        self.views = _ViewCollector()
        registry.register(self.views)
        self._series: dict[tuple[str, str, str, str], Series] = {}
        self.sweeper = SeriesSweeper(
            [self.requests, self.ttft, self.duration, self.degraded, self.budget_exceeded,
             self.routed],
            VERSION_LABELS, self._version_live, on_removed=self._forget,
        )
        registry.register(self.sweeper)  # last: sweeps after the families were scraped

    def _version_live(self, keys: set[tuple[str, ...]]) -> set[tuple[str, ...]] | None:
        """Those not retired or rejected in the adapter view (the base model's series,
        ``adapter="_base"``, always are); None without a view."""
        catalog = self.views.catalog
        if catalog is None:
            return None
        from loraplane.gateway.request_path import BASE_LABEL

        def live(tenant: str, adapter: str, version: str) -> bool:
            if adapter == BASE_LABEL:
                return True
            info = catalog.version(tenant, adapter, version)
            return info is not None and not info.retired

        return {k for k in keys if live(*k)}

    def _forget(self, key: tuple[str, ...]) -> None:
        """Drop the cached label children of a removed version (a later request binds new
        ones)."""
        for labels in list(self._series):
            if labels[:3] == key:
                self._series.pop(labels, None)

    def series(self, tenant: str, adapter: str, version: str, klass: str) -> Series:
        """Label children of one (tenant, adapter, version, class), cached."""
        key = (tenant, adapter, version, klass)
        s = self._series.get(key)
        if s is None:
            s = Series(
                key, self.ttft.labels(*key), self.duration.labels(*key),
                self.degraded.labels(*key), self.budget_exceeded.labels(*key),
                self.requests, self.routed,
            )
            self._series[key] = s
        return s

    def outcome(self, labels: tuple[str, str, str, str], outcome: str) -> None:
        """Count one finished request."""
        self.series(*labels).outcome(outcome)

    def routed_to(self, labels: tuple[str, str, str, str], tier: str) -> None:
        """Count one routing decision."""
        self.series(*labels).routed_to(tier)


class _ViewCollector(Collector):
    """Reads the views it is pointed at on every scrape (no per-request cost)."""

    def __init__(self) -> None:
        self.placement: PlacementView | None = None
        self.catalog: AdapterCatalog | None = None
        """The adapter view: which versions are retired (for the series sweeper)."""
        self.heat: HeatEmitter | None = None
        self.prewarm: PrewarmRequester | None = None

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        heat = self.heat
        published = CounterMetricFamily(
            "loraplane_gateway_heat_published", "Completions published as HeatBatch events.")
        dropped = CounterMetricFamily(
            "loraplane_gateway_heat_dropped", "Completions dropped because Kafka was away or "
            "too slow for longer than the pending bound.")
        pending = GaugeMetricFamily(
            "loraplane_gateway_heat_pending", "Completions waiting to be published.")
        published.add_metric([], heat.published if heat else 0)
        dropped.add_metric([], heat.dropped if heat else 0)
        pending.add_metric([], heat.pending if heat else 0)
        prewarm_dropped = CounterMetricFamily(
            "loraplane_gateway_prewarm_dropped", "Prewarm requests dropped because too many "
            "were waiting for Kafka.")
        prewarm_dropped.add_metric([], self.prewarm.dropped if self.prewarm else 0)
        yield from (published, dropped, pending, prewarm_dropped)
        from loraplane.gateway.placement import LIVENESS

        state = GaugeMetricFamily(
            "loraplane_gateway_worker_state", "What the gateway believes about a worker: 1 for "
            "its current state.", labels=["worker", "state"])
        since = GaugeMetricFamily(
            "loraplane_gateway_worker_state_since_timestamp_seconds",
            "Since when the worker has been in its current state.", labels=["worker"])
        answer = GaugeMetricFamily(
            "loraplane_gateway_worker_last_answer_timestamp_seconds",
            "When the worker last answered a gRPC probe (0 = never).", labels=["worker"])
        report = GaugeMetricFamily(
            "loraplane_gateway_worker_last_report_timestamp_seconds",
            "When the worker's last cache.state report was made (0 = never).",
            labels=["worker"])
        routable = GaugeMetricFamily(
            "loraplane_gateway_worker_routable", "1 when requests may be routed to the worker.",
            labels=["worker"])
        view = self.placement
        for w in view.workers() if view is not None else []:
            current = view.liveness(w)  # type: ignore[union-attr]
            for name in LIVENESS:
                state.add_metric([w.worker_id, name], 1.0 if name == current else 0.0)
            since.add_metric([w.worker_id], w.state_since)
            answer.add_metric([w.worker_id], w.answered_at)
            report.add_metric([w.worker_id], w.last_seen)
            live = w.ready and bool(w.address) and current in LIVENESS[:2]
            routable.add_metric([w.worker_id], 1.0 if live else 0.0)
        yield from (state, since, answer, report, routable)
