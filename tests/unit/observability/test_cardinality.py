"""Churn 1,000 versions through the gateway's and the worker's metric sets (the calls the
request paths make per request) and count the live series against infra/METRICS.md's
bounds: version-labelled families hold one child per version *seen*, nothing more, and
the families without a version label do not grow at all."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from loraplane.gateway.metrics import GatewayMetrics
from loraplane.worker.metrics import WorkerMetrics

VERSIONS = 1_000
CLASSES = ("interactive", "background", "canary")
OUTCOMES_MAX = 19  # ok, degraded, cancelled + 16 non-OK gRPC codes (METRICS.md: O)
TIERS = ("hot", "warm", "cold")


def children(registry: CollectorRegistry) -> dict[str, int]:
    """Label combinations per family (histogram buckets and _sum/_count/_created folded)."""
    out: dict[str, int] = {}
    for fam in registry.collect():
        combos = {tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                  for s in fam.samples}
        out[fam.name] = len(combos)
    return out


def test_gateway_series_grow_with_versions_seen_and_stay_within_the_bound() -> None:
    registry = CollectorRegistry()
    m = GatewayMetrics(registry)
    for i in range(VERSIONS):
        klass = CLASSES[i % 3]
        s = m.series("acme", f"a{i % 50}", f"v{i}", klass)
        s.routed_to(TIERS[i % 3])
        s.outcome("ok" if i % 10 else "degraded")
        s.ttft.observe(0.05)
        s.duration.observe(0.2)
        if i % 10 == 0:
            s.degraded.inc()
            s.budget_exceeded.inc()
    got = children(registry)
    # one child per version for the (tenant, adapter, version, class) families
    for name in ("loraplane_gateway_ttft_seconds", "loraplane_gateway_request_seconds",
                 "loraplane_gateway_degraded", "loraplane_gateway_budget_exceeded"):
        assert got[name] == VERSIONS, (name, got[name])
        assert got[name] <= VERSIONS * len(CLASSES)  # METRICS.md: Vg × C
    # one outcome and one tier per version were used here; the bound allows O and 4
    assert got["loraplane_gateway_requests"] == VERSIONS <= VERSIONS * len(CLASSES) * OUTCOMES_MAX
    assert got["loraplane_gateway_routed"] == VERSIONS <= VERSIONS * len(CLASSES) * 4
    # families without a version label did not grow
    for name in ("loraplane_gateway_heat_dropped", "loraplane_gateway_heat_pending",
                 "loraplane_gateway_heat_published", "loraplane_gateway_prewarm_dropped"):
        assert got[name] == 1, name
    assert sum(got.values()) == 6 * VERSIONS + 4


def test_worker_series_grow_with_versions_seen_and_stay_within_the_bound() -> None:
    registry = CollectorRegistry()
    m = WorkerMetrics(registry)
    for i in range(VERSIONS):
        labels = {"base_model": "tiny", "tenant": "acme", "adapter": f"a{i % 50}", "version": f"v{i}"}
        m.loads.labels(**labels, source_tier="cold", target_tier="hot").inc()
        m.load_seconds.labels(**labels, source_tier="cold", target_tier="hot").observe(0.4)
        m.load_bytes.labels(**labels).inc(1000)
        m.requests.labels(**labels, tier="hot", code="OK").inc()
        m.ttft.labels(**labels, tier="hot").observe(0.01)
        m.in_flight.labels(**labels).set(0)
        m.tokens.labels(**labels, kind="prompt").inc(5)
        m.tokens.labels(**labels, kind="output").inc(5)
        m.evictions.labels(**labels, from_tier="hot", to_tier="warm").inc()
        m.slot_waits.labels("tiny", "interactive", "served").inc()
        m.engine_up.labels("tiny").set(1)
    got = children(registry)
    bounds = {  # METRICS.md with Vw = VERSIONS
        "loraplane_worker_adapter_loads": 3 * VERSIONS,
        "loraplane_worker_adapter_load_seconds": 3 * VERSIONS,
        "loraplane_worker_adapter_load_bytes": VERSIONS,
        "loraplane_worker_requests": 4 * 17 * VERSIONS,
        "loraplane_worker_ttft_seconds": 4 * VERSIONS,
        "loraplane_worker_requests_in_flight": VERSIONS,
        "loraplane_worker_tokens": 2 * VERSIONS,
        "loraplane_worker_adapter_evictions": 3 * VERSIONS,
    }
    for name, bound in bounds.items():
        assert VERSIONS <= got[name] <= bound, (name, got[name], bound)
    assert got["loraplane_worker_tokens"] == 2 * VERSIONS
    # base-model level families do not grow with versions
    assert got["loraplane_worker_slot_waits"] == 1
    assert got["loraplane_worker_engine_up"] == 1
