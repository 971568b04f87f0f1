"""Prometheus (from apt) scrapes a service's /metrics endpoint."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from loraplane.stack.stack import Stack


def _query(base: str, promql: str) -> list[dict[str, object]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success"
    return list(body["data"]["result"])


def test_prometheus_scrapes_service_metrics(stack: Stack, unique: str) -> None:
    registry = CollectorRegistry()
    gauge = Gauge("loraplane_test_marker", "marker set by the test", ["run"], registry=registry)
    gauge.labels(run=unique).set(42)
    # The supervisor metrics port is one of Prometheus' static scrape targets.
    server, thread = start_http_server(stack.settings.supervisor_metrics_port, addr="127.0.0.1",
                                       registry=registry)
    try:
        deadline = time.monotonic() + 30
        result: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            result = _query(stack.settings.prometheus_url, f'loraplane_test_marker{{run="{unique}"}}')
            if result:
                break
            time.sleep(0.5)
        assert result, "Prometheus never scraped the marker metric"
        value = result[0]["value"]
        assert isinstance(value, list) and float(value[1]) == 42.0
        up = _query(stack.settings.prometheus_url, 'up{job="loraplane-supervisor"}')
        assert up and float(up[0]["value"][1]) == 1.0  # type: ignore[index]
    finally:
        server.shutdown()
        thread.join(timeout=5)
