"""Prometheus metrics of the inference worker (``loraplane_worker_*``).

Adapter-level families carry ``base_model``, ``tenant``, ``adapter`` and ``version``
labels (base-model requests use ``tenant`` of the caller and ``adapter="", version=""``).

Series of versions gone from this worker are removed: :attr:`WorkerMetrics.sweeper` (a
:class:`~loraplane.shared.metrics.SeriesSweeper`, run at every scrape) removes every child
of a version that has been neither HOT nor WARM here (:attr:`WorkerMetrics.versions_placed`)
and had no request in flight for ``SERIES_GRACE_S``, so the adapter-level families hold the
versions placed on the worker (plus those that left within the grace), not every version
it ever served.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from loraplane.shared.metrics import LATENCY_BUCKETS, SeriesSweeper, _PerRegistry, families_with

ADAPTER_LABELS = ("base_model", "tenant", "adapter", "version")
"""Labels identifying one adapter version."""

LOAD_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)
"""Load-time buckets (seconds): 1 ms .. 60 s."""


class WorkerMetrics(_PerRegistry):
    """Every metric family of the worker, registered once per collector registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.loads = Counter(
            "loraplane_worker_adapter_loads",
            "Adapter loads completed, by the tier they came from and reached.",
            [*ADAPTER_LABELS, "source_tier", "target_tier"],
            registry=registry,
        )
        self.load_seconds = Histogram(
            "loraplane_worker_adapter_load_seconds",
            "Time to bring an adapter from its source tier to the target tier.",
            [*ADAPTER_LABELS, "source_tier", "target_tier"],
            buckets=LOAD_BUCKETS,
            registry=registry,
        )
        self.load_bytes = Counter(
            "loraplane_worker_adapter_load_bytes",
            "Bytes read from object storage by adapter loads.",
            list(ADAPTER_LABELS),
            registry=registry,
        )
        self.load_failures = Counter(
            "loraplane_worker_adapter_load_failures",
            "Failed cache commands and request-path loads, by reason.",
            [*ADAPTER_LABELS, "reason"],
            registry=registry,
        )
        self.evictions = Counter(
            "loraplane_worker_adapter_evictions",
            "Adapters leaving a tier on this worker.",
            [*ADAPTER_LABELS, "from_tier", "to_tier"],
            registry=registry,
        )
        self.requests = Counter(
            "loraplane_worker_requests",
            "Generate requests, by tier of the adapter at arrival and final status.",
            [*ADAPTER_LABELS, "tier", "code"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "loraplane_worker_requests_in_flight",
            "Generate requests running now.",
            list(ADAPTER_LABELS),
            registry=registry,
        )
        self.slot_queue_depth = Gauge(
            "loraplane_worker_slot_queue_depth",
            "Requests waiting for a HOT slot now, by request class.",
            ["base_model", "request_class"],
            registry=registry,
        )
        self.slot_waits = Counter(
            "loraplane_worker_slot_waits_total",
            "Requests that waited for a HOT slot, by outcome (served: got one; "
            "budget: budget spent; queue_full: refused).",
            ["base_model", "request_class", "outcome"],
            registry=registry,
        )
        self.slot_wait_seconds = Histogram(
            "loraplane_worker_slot_wait_seconds",
            "Time requests waited for a HOT slot (those that waited).",
            ["base_model", "request_class"],
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 60.0),
            registry=registry,
        )
        self.ttft = Histogram(
            "loraplane_worker_ttft_seconds",
            "Time to first token, from request arrival at the worker.",
            [*ADAPTER_LABELS, "tier"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.engine_seconds = Histogram(
            "loraplane_worker_engine_seconds",
            "Time requests spent inside the engine, by request class and phase (queue: "
            "waiting to be scheduled; prefill: scheduled to first token; decode: first to "
            "last token, every step shared with the batch).",
            ["base_model", "request_class", "phase"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.tokens = Counter(
            "loraplane_worker_tokens",
            "Tokens processed, by kind (prompt / output).",
            [*ADAPTER_LABELS, "kind"],
            registry=registry,
        )
        self.engine_slots = Gauge(
            "loraplane_worker_engine_slots",
            "Engine LoRA slots: capacity (max_loras), registered_capacity (max_cpu_loras), "
            "registered adapters (used, the all-zero base adapter included), pinned ones and "
            "the registered ones in a GPU slot now (resident).",
            ["base_model", "state"],
            registry=registry,
        )
        self.host_bytes = Gauge(
            "loraplane_worker_host_bytes",
            "WARM tier bytes: capacity, used by verified entries, reserved by downloads.",
            ["state"],
            registry=registry,
        )
        self.host_dropped = Counter(
            "loraplane_worker_host_entries_dropped",
            "Host tier entries deleted because they failed verification (restart rescan "
            "or re-verification before registering).",
            registry=registry,
        )
        self.consumer_restarts = Counter(
            "loraplane_worker_consumer_restarts",
            "Command consumers recreated (after a broker error or a broker loss).",
            registry=registry,
        )
        self.reports_dropped = Counter(
            "loraplane_worker_reports_dropped",
            "Events the worker could not publish after its retries (broker down).",
            registry=registry,
        )
        self.engine_up = Gauge(
            "loraplane_worker_engine_up",
            "1 while the engine is alive.",
            ["base_model"],
            registry=registry,
        )
        # keep last: sweeps every family above labelled by version, after it was scraped
        self.versions_placed: Callable[[], Iterable[Mapping[str, str]]] | None = None
        """The labels of the versions HOT or WARM on this worker now (set by the app)."""
        self.sweeper = SeriesSweeper(
            families_with(self, ADAPTER_LABELS), ADAPTER_LABELS, self._versions_live,
            busy=self.in_flight,
        )
        registry.register(self.sweeper)

    def _versions_live(self, keys: set[tuple[str, ...]]) -> set[tuple[str, ...]] | None:
        """Those placed on this worker, and the base model's (``adapter=""``)."""
        placed = self.versions_placed
        if placed is None:
            return None
        here = {tuple(labels[k] for k in ADAPTER_LABELS) for labels in placed()}
        return {k for k in keys if k[2] == "" or k in here}
