"""Prometheus metrics of the cache manager.

Counters and histograms are updated by the service as things happen; tier
occupancy, worker counts and request hits by tier are read from the decision
core when Prometheus scrapes (:class:`StateCollector`), so the hot path of heat
events touches no Prometheus object.

``loraplane_cache_requests_total`` holds the versions still live: a version retired,
rejected or gone from the registry keeps its series only while it is placed on some worker
(its last requests drain there); once it is evicted everywhere its series go at the next
scrape (:data:`ENDED`).

Hit ratio by tier (PromQL), per version / adapter / tenant::

    sum by (tenant, adapter, version) (rate(loraplane_cache_requests_total{tier="hot"}[5m]))
      / sum by (tenant, adapter, version) (rate(loraplane_cache_requests_total[5m]))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from loraplane.cache_manager.core import CacheCore
from loraplane.cache_manager.model import Status, Tier
from loraplane.shared.metrics import LATENCY_BUCKETS, PerRegistry

COMMAND_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)
"""Command round trips (issue → worker report): from an engine re-register to a cold fetch."""
ENDED: frozenset[Status] = frozenset({Status.RETIRED, Status.REJECTED, Status.GONE})
"""Statuses after which a version's hit series are exported only while it is placed."""


class CacheMetrics(PerRegistry):
    """Every metric family of the cache manager (one set per collector registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.leader = Gauge("loraplane_cache_leader",
                            "1 while this instance leads (unsharded, or at least one shard).", registry=registry)
        self.shard_leader = Gauge(
            "loraplane_cache_shard_leader",
            "1 while this instance leads the shard (a base model; * = unsharded).",
            ["shard"], registry=registry)
        self.commands = Counter(
            "loraplane_cache_commands",
            "Cache commands by kind and result (issued, ok, failed, timeout, void, "
            "publish_failed).",
            ["kind", "result"], registry=registry,
        )
        self.command_seconds = Histogram(
            "loraplane_cache_command_seconds", "Command issue → worker answer.", ["kind"],
            buckets=COMMAND_BUCKETS, registry=registry,
        )
        self.removals = Counter(
            "loraplane_cache_removals",
            "Demotions and evictions issued, by reason (policy reason or business rule).",
            ["kind", "reason"], registry=registry,
        )
        self.loads = Counter(
            "loraplane_cache_loads", "Loads issued, by target tier and reason.",
            ["tier", "reason"], registry=registry,
        )
        self.decision_seconds = Histogram(
            "loraplane_cache_decision_seconds",
            "Compute time of one planning round (snapshot + policy + rules + guards).",
            buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.trigger_seconds = Histogram(
            "loraplane_cache_trigger_to_command_seconds",
            "Triggering event applied → its round's commands published.",
            buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.rounds = Counter("loraplane_cache_rounds", "Planning rounds.", ["cause"],
                              registry=registry)
        self.events = Counter(
            "loraplane_cache_events", "Consumed events by topic and result "
            "(applied, duplicate, undecodable).", ["topic", "result"], registry=registry,
        )
        self.takeovers = Counter("loraplane_cache_takeovers",
                                 "Times this instance became leader.", registry=registry)
        self.takeover_seconds = Histogram(
            "loraplane_cache_takeover_seconds",
            "Lock acquired → first planning round allowed (state rebuilt).",
            buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.shadow = Counter("loraplane_cache_shadow_requests",
                              "Golden-set shadow requests to canaries, by result.", ["result"],
                              registry=registry)
        self.canary_steps = Counter(
            "loraplane_cache_canary_steps",
            "Steps the canary analysis took through the registry, by action (advance, "
            "promote, abort) and reason.", ["action", "reason"], registry=registry)
        self.page_requests = Counter(
            "loraplane_cache_page_requests",
            "Requests to the placement page, by path (page, json) and HTTP status code.",
            ["path", "code"], registry=registry,
        )
        self.consumer_restarts = Counter(
            "loraplane_cache_consumer_restarts",
            "Consumers recreated (error or stall after a broker loss).", registry=registry,
        )


class StateCollector(Collector):
    """Occupancy, workers and hits read from the live core at scrape time."""

    def __init__(self, core: Callable[[], CacheCore | None]) -> None:
        self._core = core

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        core = self._core()
        slots = GaugeMetricFamily(
            "loraplane_cache_tier_slots",
            "HOT slots per worker and base model (state: capacity, used, pinned).",
            labels=["worker", "base_model", "state"],
        )
        bytes_ = GaugeMetricFamily(
            "loraplane_cache_tier_bytes", "Host (WARM tier) bytes per worker (capacity, used).",
            labels=["worker", "state"],
        )
        versions = GaugeMetricFamily(
            "loraplane_cache_tier_versions", "Versions per worker, base model and tier.",
            labels=["worker", "base_model", "tier"],
        )
        workers = GaugeMetricFamily(
            "loraplane_cache_workers", "Known workers (state: alive, gone, synced).",
            labels=["state"],
        )
        pending = GaugeMetricFamily("loraplane_cache_pending_commands",
                                    "Commands sent and not answered yet.")
        hits = CounterMetricFamily(
            "loraplane_cache_requests",
            "Completed requests by version and tier at arrival (hit ratio = hot / all).",
            labels=["tenant", "adapter", "version", "tier"],
        )
        if core is not None:
            state = core.state
            alive = gone = synced = 0
            placed: set[str] = set()
            for w in list(state.workers.values()):
                alive += w.alive
                gone += not w.alive
                synced += w.synced
                placements = dict(w.placements)
                placed.update(placements)
                used = sum(p.size_bytes for p in placements.values())
                bytes_.add_metric([w.worker_id, "capacity"], w.warm_bytes_capacity)
                bytes_.add_metric([w.worker_id, "used"], used)
                for bm, cap in dict(w.capacities).items():
                    mine = [p for p in placements.values() if p.ref.base_model == bm]
                    hot = [p for p in mine if p.tier is Tier.HOT]
                    slots.add_metric([w.worker_id, bm, "capacity"], cap.slots)
                    slots.add_metric([w.worker_id, bm, "used"], len(hot))
                    slots.add_metric([w.worker_id, bm, "pinned"], sum(p.pinned for p in hot))
                    versions.add_metric([w.worker_id, bm, "hot"], len(hot))
                    versions.add_metric([w.worker_id, bm, "warm"], len(mine) - len(hot))
            workers.add_metric(["alive"], alive)
            workers.add_metric(["gone"], gone)
            workers.add_metric(["synced"], synced)
            pending.add_metric([], len(core.tracker))
            records = state.versions.copy()
            for (vid, tier), n in state.hits.copy().items():
                rec = records.get(vid)
                if vid not in placed and (rec is None or rec.status in ENDED):
                    continue
                adapter_id, _, version = vid.rpartition("@")
                tenant, _, name = adapter_id.partition("/")
                hits.add_metric([tenant, name, version, tier.value], n)
        yield from (slots, bytes_, versions, workers, pending, hits)
