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


def test_fast_observe_and_inc_record_what_observe_and_inc_record() -> None:
    """The request path's straight-to-the-value ``observe`` / ``inc`` (they rely on
    prometheus-client internals) give the same samples as the public calls: every bucket,
    the sum and the count, over amounts on, between, below and beyond the bounds."""
    from prometheus_client import Counter, Histogram

    from loraplane.gateway.metrics import TTFT_BUCKETS, counter_inc, histogram_observe

    registry = CollectorRegistry()
    h = Histogram("h", "h", ["k"], buckets=TTFT_BUCKETS, registry=registry)
    c = Counter("c", "c", ["k"], registry=registry)
    amounts = [*TTFT_BUCKETS, *(b * 0.999 for b in TTFT_BUCKETS),
               *(b * 1.001 for b in TTFT_BUCKETS), 0.0, -0.5, 1e9, float("inf"), 0.0004, 0.0123]
    public, fast = h.labels("public"), histogram_observe(h.labels("fast"))
    for a in amounts:
        public.observe(a)
        fast(a)
    cp, cf = c.labels("public"), counter_inc(c.labels("fast"))
    for a in (1, 1, 2.5, 0):
        cp.inc(a)
        cf(a)

    def samples(k: str) -> list[tuple[str, str, float]]:
        out = []
        for fam in registry.collect():
            for s in fam.samples:
                if s.labels.get("k") == k and not s.name.endswith("_created"):
                    out.append((s.name, s.labels.get("le", ""), s.value))
        return out

    want = samples("public")
    assert len(want) == len(TTFT_BUCKETS) + 1 + 2 + 1  # +Inf, count and sum, the counter
    assert samples("fast") == want
    # NaN: in the sum, in no bucket (the sum is NaN then: the buckets and count compared)
    public.observe(float("nan"))
    fast(float("nan"))
    got = [s for s in samples("fast") if s[0] != "h_sum"]
    assert got == [s for s in samples("public") if s[0] != "h_sum"]
    assert [s[2] != s[2] for s in samples("fast") if s[0] == "h_sum"] == [True]
