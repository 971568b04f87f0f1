"""Churn 300 versions through the gateway's and the worker's metric sets (the calls the
request paths make per request), retiring them (gateway) or taking them off the worker
(worker) as they go, and count the live series against infra/METRICS.md's bounds: the
version-labelled families hold the live versions (plus those gone within the grace), the
families without a version label do not grow at all. The sweeper itself (grace, requests
in flight, a version coming back, no view yet) is tested on its own below.

The same bound through a real gateway and worker on the test stack:
``tests/integration/platform/test_series_bound.py``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from loraplane.gateway.catalog import AdapterCatalog, VersionInfo
from loraplane.gateway.metrics import GatewayMetrics
from loraplane.shared.metrics import SeriesSweeper
from loraplane.v1 import common_pb2
from loraplane.worker.metrics import WorkerMetrics

VERSIONS = 300
LIVE = 5
"""Versions live at any time while the others churn through."""
STEP_S = 5.0
"""One new version every 5 s ..."""
SCRAPE_EVERY = 3
"""... and a scrape every 15 s (the sweeper runs at scrapes)."""
IN_GRACE = int(60.0 // STEP_S) + SCRAPE_EVERY
"""Gone versions whose series may still be there: gone within the grace (60 s), or since
before it but not swept yet (the next scrape removes them)."""
CLASSES = ("interactive", "background", "canary")
TIERS = ("hot", "warm", "cold")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def children(registry: CollectorRegistry) -> dict[str, int]:
    """Label combinations per family (histogram buckets and _sum/_count/_created folded)."""
    out: dict[str, int] = {}
    for fam in registry.collect():
        combos = {tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                  for s in fam.samples}
        out[fam.name] = len(combos)
    return out


def versions_in(registry: CollectorRegistry, family: str) -> set[str]:
    return {s.labels["version"] for fam in registry.collect() if fam.name == family
            for s in fam.samples}


def test_gateway_series_of_retired_versions_are_removed() -> None:
    registry = CollectorRegistry()
    m = GatewayMetrics(registry)
    clock = Clock()
    m.sweeper.clock = clock
    catalog = AdapterCatalog()
    m.views.catalog = catalog
    peak = 0
    for i in range(VERSIONS):
        catalog.upsert_version(VersionInfo("acme", f"a{i % 50}", f"v{i}", "tiny", i + 1,
                                           status=common_pb2.VERSION_STATUS_ACTIVE))
        for klass in CLASSES:
            s = m.series("acme", f"a{i % 50}", f"v{i}", klass)
            s.routed_to(TIERS[i % 3])
            s.outcome("ok" if i % 10 else "degraded")
            s.ttft.observe(0.05)
            s.duration.observe(0.2)
            s.degraded.inc()
            s.budget_exceeded.inc()
        if i >= LIVE:  # keep LIVE versions live, retire the oldest
            old = i - LIVE
            catalog.upsert_version(VersionInfo("acme", f"a{old % 50}", f"v{old}", "tiny",
                                               status=common_pb2.VERSION_STATUS_RETIRED))
        clock.t += STEP_S
        if i % SCRAPE_EVERY == 0:
            got = children(registry)  # a scrape: the sweeper runs after the families
            peak = max(peak, got["loraplane_gateway_ttft_seconds"])
    bound = (LIVE + IN_GRACE) * len(CLASSES)  # METRICS.md: Vg × C, Vg = live + in grace
    assert peak <= bound, (peak, bound)
    children(registry)  # marks the last ones retired
    clock.t += m.sweeper.grace_s
    children(registry)  # exports their last values, then removes them
    got = children(registry)
    for name in ("loraplane_gateway_ttft_seconds", "loraplane_gateway_request_seconds",
                 "loraplane_gateway_degraded", "loraplane_gateway_budget_exceeded",
                 "loraplane_gateway_requests", "loraplane_gateway_routed"):
        assert got[name] == LIVE * len(CLASSES), (name, got[name])
    live = {f"v{i}" for i in range(VERSIONS - LIVE, VERSIONS)}
    assert versions_in(registry, "loraplane_gateway_requests") == live
    assert len(m._series) == LIVE * len(CLASSES)  # cached children dropped with them
    assert m.sweeper.removed == VERSIONS - LIVE
    # a request of a live version after the sweep still counts (fresh children)
    m.series("acme", "a999", "v999", "interactive").outcome("ok")
    # families without a version label did not grow
    for name in ("loraplane_gateway_heat_dropped", "loraplane_gateway_heat_pending",
                 "loraplane_gateway_heat_published", "loraplane_gateway_prewarm_dropped"):
        assert got[name] == 1, name


def test_gateway_base_model_series_stay() -> None:
    registry = CollectorRegistry()
    m = GatewayMetrics(registry)
    clock = Clock()
    m.sweeper.clock = clock
    m.views.catalog = AdapterCatalog()
    m.series("acme", "_base", "tiny", "interactive").outcome("ok")
    m.series("acme", "ghost", "v1", "interactive").outcome("ok")  # unknown to the view
    children(registry)  # marks v1
    clock.t += m.sweeper.grace_s
    children(registry)  # exports it a last time, then removes it
    assert versions_in(registry, "loraplane_gateway_requests") == {"tiny"}


def test_worker_series_of_versions_gone_from_the_worker_are_removed() -> None:
    registry = CollectorRegistry()
    m = WorkerMetrics(registry)
    clock = Clock()
    m.sweeper.clock = clock
    placed: dict[str, dict[str, str]] = {}
    m.versions_placed = lambda: list(placed.values())
    peak = 0
    for i in range(VERSIONS):
        labels = {"base_model": "tiny", "tenant": "acme", "adapter": f"a{i % 50}",
                  "version": f"v{i}"}
        placed[labels["version"]] = labels
        m.loads.labels(**labels, source_tier="cold", target_tier="hot").inc()
        m.load_seconds.labels(**labels, source_tier="cold", target_tier="hot").observe(0.4)
        m.load_bytes.labels(**labels).inc(1000)
        m.requests.labels(**labels, tier="hot", code="OK").inc()
        m.ttft.labels(**labels, tier="hot").observe(0.01)
        m.in_flight.labels(**labels).set(0)
        m.tokens.labels(**labels, kind="prompt").inc(5)
        m.tokens.labels(**labels, kind="output").inc(5)
        m.slot_waits.labels("tiny", "interactive", "served").inc()
        m.engine_up.labels("tiny").set(1)
        if i >= LIVE:  # the oldest leaves the worker (HOT → COLD)
            old = placed.pop(f"v{i - LIVE}")
            m.evictions.labels(**old, from_tier="hot", to_tier="cold").inc()
        clock.t += STEP_S
        if i % SCRAPE_EVERY == 0:
            got = children(registry)
            peak = max(peak, got["loraplane_worker_adapter_load_bytes"])
    assert peak <= LIVE + IN_GRACE, peak  # METRICS.md: Vw = placed + gone within the grace
    children(registry)
    clock.t += m.sweeper.grace_s
    children(registry)
    got = children(registry)
    for name in ("loraplane_worker_adapter_loads", "loraplane_worker_adapter_load_seconds",
                 "loraplane_worker_adapter_load_bytes", "loraplane_worker_requests",
                 "loraplane_worker_ttft_seconds", "loraplane_worker_requests_in_flight"):
        assert got[name] == LIVE, (name, got[name])
    assert got["loraplane_worker_tokens"] == 2 * LIVE
    assert "loraplane_worker_adapter_evictions" not in got or \
        got["loraplane_worker_adapter_evictions"] == 0  # only gone versions were evicted
    assert got["loraplane_worker_slot_waits"] == 1
    assert got["loraplane_worker_engine_up"] == 1


def test_sweeper_grace_in_flight_revival_and_no_view() -> None:
    registry = CollectorRegistry()
    requests = Counter("t_requests", "r", ["version", "code"], registry=registry)
    in_flight = Gauge("t_in_flight", "f", ["version"], registry=registry)
    clock = Clock()
    live: set[tuple[str, ...]] | None = None
    sweeper = SeriesSweeper([requests, in_flight], ["version"],
                            lambda keys: None if live is None else keys & live,
                            busy=in_flight, grace_s=60.0, clock=clock)
    for v in ("v1", "v2", "v3"):
        requests.labels(v, "OK").inc()
        in_flight.labels(v).set(0)
    assert sweeper.sweep() == []  # no view yet: nothing is marked
    clock.t = 1_000.0
    assert sweeper.sweep() == []
    live = {("v1",)}
    in_flight.labels("v3").set(1)  # v3 still has a request running
    assert sweeper.sweep() == []  # v2 marked now
    clock.t += 59.0
    assert sweeper.sweep() == []
    live = {("v1",), ("v2",)}  # v2 back before its grace ended: unmarked
    clock.t += 5.0
    assert sweeper.sweep() == []
    live = {("v1",)}
    assert sweeper.sweep() == []  # v2 marked again from now
    clock.t += 60.0
    assert sweeper.sweep() == [("v2",)]
    assert {s.labels["version"] for s in requests.collect()[0].samples} == {"v1", "v3"}
    in_flight.labels("v3").set(0)  # v3's request ended
    assert sweeper.sweep() == []
    clock.t += 60.0
    assert sweeper.sweep() == [("v3",)]
    assert {s.labels["version"] for s in in_flight.collect()[0].samples} == {"v1"}
    assert sweeper.removed == 2
