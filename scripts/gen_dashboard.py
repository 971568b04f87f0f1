"""Generate the Grafana dashboard of the compose stack: infra/grafana/dashboards/loraplane.json.

``python scripts/gen_dashboard.py`` writes it; ``--check`` fails when the file is stale.
Every PromQL expression here is also checked against a running Prometheus by
tests/integration/stack/test_dashboard.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "infra" / "grafana" / "dashboards" / "loraplane.json"
SEL = 'tenant=~"$tenant", adapter=~"$adapter"'
WSEL = 'base_model=~"$base_model", tenant=~"$tenant", adapter=~"$adapter"'

# (title, unit, [(expr, legend)])
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("Gateway requests/s by outcome", "reqps", [
        (f"sum by (tenant, adapter, version, outcome) (rate(loraplane_gateway_requests_total{{{SEL}}}[5m]))",
         "{{tenant}}/{{adapter}}@{{version}} {{outcome}}")]),
    ("Gateway TTFT p95 / p99", "s", [
        (f"histogram_quantile(0.95, sum by (le, adapter, version) (rate(loraplane_gateway_ttft_seconds_bucket{{{SEL}}}[5m])))",
         "p95 {{adapter}}@{{version}}"),
        (f"histogram_quantile(0.99, sum by (le, adapter, version) (rate(loraplane_gateway_ttft_seconds_bucket{{{SEL}}}[5m])))",
         "p99 {{adapter}}@{{version}}")]),
    ("Request latency p99 by class", "s", [
        (f"histogram_quantile(0.99, sum by (le, class) (rate(loraplane_gateway_request_seconds_bucket{{{SEL}}}[5m])))",
         "{{class}}")]),
    ("Degraded to base / budget exceeded", "reqps", [
        (f"sum by (tenant, adapter) (rate(loraplane_gateway_degraded_total{{{SEL}}}[5m]))",
         "degraded {{tenant}}/{{adapter}}"),
        (f"sum by (tenant, adapter) (rate(loraplane_gateway_budget_exceeded_total{{{SEL}}}[5m]))",
         "budget exceeded {{tenant}}/{{adapter}}")]),
    ("Routed tier at arrival", "reqps", [
        (f"sum by (tier) (rate(loraplane_gateway_routed_total{{{SEL}}}[5m]))", "{{tier}}")]),
    ("Refused before resolution", "reqps", [
        ("sum by (reason) (rate(loraplane_gateway_refused_total[5m]))", "{{reason}}")]),
    ("HOT hit ratio per version", "percentunit", [
        ((f"sum by (tenant, adapter, version) (rate(loraplane_cache_requests_total{{tier=\"hot\", {SEL}}}[5m]))"
          f" / sum by (tenant, adapter, version) (rate(loraplane_cache_requests_total{{{SEL}}}[5m]))"),
         "{{tenant}}/{{adapter}}@{{version}}")]),
    ("Worker TTFT p99 by tier", "s", [
        (f"histogram_quantile(0.99, sum by (le, tier) (rate(loraplane_worker_ttft_seconds_bucket{{{WSEL}}}[5m])))",
         "{{tier}}")]),
    ("Adapter load time p95 (source → target tier)", "s", [
        (f"histogram_quantile(0.95, sum by (le, source_tier, target_tier) (rate(loraplane_worker_adapter_load_seconds_bucket{{{WSEL}}}[5m])))",
         "{{source_tier}} → {{target_tier}}")]),
    ("HOT slots per worker and base model", "short", [
        ('sum by (worker, base_model, state) (loraplane_cache_tier_slots{base_model=~"$base_model"})',
         "{{worker}} {{base_model}} {{state}}")]),
    ("WARM bytes per worker", "bytes", [
        ("sum by (worker, state) (loraplane_cache_tier_bytes)", "{{worker}} {{state}}")]),
    ("Cache commands by kind and result", "ops", [
        ("sum by (kind, result) (rate(loraplane_cache_commands_total[5m]))", "{{kind}} {{result}}")]),
    ("Demotions / evictions by reason", "ops", [
        ("sum by (kind, reason) (rate(loraplane_cache_removals_total[5m]))", "{{kind}} {{reason}}")]),
    ("Cache-manager decision latency p99", "s", [
        ("histogram_quantile(0.99, sum by (le) (rate(loraplane_cache_decision_seconds_bucket[5m])))", "p99")]),
    ("Admission verdicts and rejection reasons", "ops", [
        ("sum by (result) (rate(loraplane_admission_verdicts_total[15m]))", "{{result}}"),
        ("sum by (reason) (rate(loraplane_admission_rejection_reasons_total[15m]))", "{{reason}}")]),
    ("Outbox rows waiting", "short", [
        ("sum by (topic) (loraplane_outbox_rows_waiting)", "{{topic}}")]),
    ("gRPC errors by service and method", "reqps", [
        ('sum by (service, method, code) (rate(loraplane_rpc_requests_total{code!="OK"}[5m]))',
         "{{service}}.{{method}} {{code}}")]),
    ("Services up", "short", [("up", "{{job}} {{instance}}")]),
]

VARIABLES = [
    ("base_model", "label_values(loraplane_worker_requests_total, base_model)"),
    ("tenant", "label_values(loraplane_gateway_requests_total, tenant)"),
    ("adapter", 'label_values(loraplane_gateway_requests_total{tenant=~"$tenant"}, adapter)'),
]


def expressions() -> list[str]:
    """Every PromQL expression of the dashboard with template variables set to ``.*``."""
    out = []
    for _, _, targets in PANELS:
        for expr, _ in targets:
            out.append(expr.replace("$tenant", ".*").replace("$adapter", ".*")
                       .replace("$base_model", ".*"))
    return out


def build() -> dict[str, object]:
    panels = []
    for i, (title, unit, targets) in enumerate(PANELS):
        panels.append({
            "id": i + 1,
            "type": "timeseries",
            "title": title,
            "datasource": {"type": "prometheus", "uid": "prometheus"},
            "gridPos": {"h": 8, "w": 12, "x": (i % 2) * 12, "y": (i // 2) * 8},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [
                {"refId": chr(ord("A") + j), "expr": expr, "legendFormat": legend,
                 "datasource": {"type": "prometheus", "uid": "prometheus"}}
                for j, (expr, legend) in enumerate(targets)
            ],
        })
    templating = [{
        "name": name, "type": "query", "query": query, "refresh": 2, "includeAll": True,
        "multi": True, "allValue": ".*", "current": {"text": "All", "value": "$__all"},
        "datasource": {"type": "prometheus", "uid": "prometheus"},
    } for name, query in VARIABLES]
    return {
        "uid": "loraplane-overview",
        "title": "loraplane — adapters, tiers, tenants",
        "tags": ["loraplane"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": templating},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python scripts/gen_dashboard.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
