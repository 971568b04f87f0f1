"""Gateway metrics: the per-series bound children count under the right labels, and the
family-level helpers land on the same series."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from loraplane.gateway.metrics import GatewayMetrics

LABELS = ("acme", "support", "v1", "interactive")
NAMES = dict(zip(("tenant", "adapter", "version", "class"), LABELS, strict=True))


def test_series_counts_outcomes_and_tiers_under_their_labels() -> None:
    registry = CollectorRegistry()
    m = GatewayMetrics(registry)
    s = m.series(*LABELS)
    assert m.series(*LABELS) is s
    s.outcome("ok")
    s.outcome("ok")
    m.outcome(LABELS, "ok")  # the family helper reaches the same child
    s.outcome("cancelled")
    s.routed_to("hot")
    m.routed_to(LABELS, "warm")
    other = m.series("acme", "support", "v2", "interactive")
    other.outcome("ok")

    def value(name: str, **extra: str) -> float:
        return registry.get_sample_value(name, {**NAMES, **extra}) or 0.0

    assert value("loraplane_gateway_requests_total", outcome="ok") == 3
    assert value("loraplane_gateway_requests_total", outcome="cancelled") == 1
    assert value("loraplane_gateway_routed_total", tier="hot") == 1
    assert value("loraplane_gateway_routed_total", tier="warm") == 1
    assert registry.get_sample_value(
        "loraplane_gateway_requests_total", {**NAMES, "version": "v2", "outcome": "ok"}) == 1
