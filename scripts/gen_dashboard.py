"""Generate the Grafana dashboards of the compose stack with grafana-foundation-sdk.

Three dashboards, written to infra/grafana/dashboards/ and provisioned by
infra/grafana/provisioning/dashboards/loraplane.yml:

* ``loraplane-fleet``: traffic, tiers, workers and the event pipeline of the whole fleet;
* ``loraplane-drilldown``: one base model / tenant / adapter / version (template variables);
* ``loraplane-cache``: the cache manager's decisions (rounds, commands, moves and why).

Panels read the recording rules of infra/prometheus/rules.yml where one answers the
question (their names say which labels they keep), raw series otherwise.

``python scripts/gen_dashboard.py`` writes them; ``--check`` fails when a file is stale.
Tests: tests/unit/observability/test_dashboards.py (every expression parses with promtool,
every series it reads is exported or recorded) and tests/integration/stack/test_dashboard.py
(every expression is accepted by the test stack's Prometheus).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from grafana_foundation_sdk.builders.common import (
    ReduceDataOptions,
    VizLegendOptions,
    VizTooltipOptions,
)
from grafana_foundation_sdk.builders.dashboard import Dashboard, QueryVariable, Row
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.stat import Panel as StatPanel
from grafana_foundation_sdk.builders.timeseries import Panel as TimeseriesPanel
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    LegendDisplayMode,
    LegendPlacement,
    SortOrder,
    TooltipDisplayMode,
)
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh

OUT_DIR = Path(__file__).resolve().parents[1] / "infra" / "grafana" / "dashboards"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="prometheus")
"""The datasource of infra/grafana/provisioning/datasources/prometheus.yml."""

# Label matchers of the drill-down's template variables.
GW = 'tenant=~"$tenant", adapter=~"$adapter", version=~"$version"'
"""Gateway / cache-manager series (no base_model label)."""
GWA = 'tenant=~"$tenant", adapter=~"$adapter"'
WK = 'base_model=~"$base_model", tenant=~"$tenant", adapter=~"$adapter", version=~"$version"'
"""Worker series and the recorded series that keep base_model."""
WKA = 'base_model=~"$base_model", tenant=~"$tenant", adapter=~"$adapter"'


@dataclass(frozen=True)
class P:
    """One panel: title, Grafana unit, (expr, legend) targets; ``stat`` for a single number."""

    title: str
    unit: str
    targets: list[tuple[str, str]]
    stat: bool = False
    description: str = ""


@dataclass(frozen=True)
class Board:
    uid: str
    title: str
    rows: list[tuple[str, list[P]]]
    variables: list[tuple[str, str]] = field(default_factory=list)
    """(name, ``label_values(...)`` query)."""


def q3(record: str, sel: str, legend: str) -> list[tuple[str, str]]:
    """p50 / p95 / p99 targets of a quantile recording rule."""
    sep = ", " if sel else ""
    return [(f'{record}{{{sel}{sep}quantile="{q}"}}', f"p{p} {legend}")
            for q, p in (("0.5", "50"), ("0.95", "95"), ("0.99", "99"))]


FLEET = Board("loraplane-fleet", "loraplane — fleet overview", [
    ("Traffic", [
        P("Gateway requests/s by outcome", "reqps", [
            ("sum by (outcome) (rate(loraplane_gateway_requests_total[5m]))", "{{outcome}}")]),
        P("Gateway 5xx ratio", "percentunit", [("loraplane:gateway_5xx:ratio_rate5m", "5xx")],
          description="Outcomes the HTTP API answers with 501-504 (alert: LoraplaneGateway5xxRatio)."),
        P("TTFT p50 / p95 / p99 by request class", "s",
          q3("class:loraplane_gateway_ttft_seconds:quantile_rate5m", "", "{{class}}")),
        P("Degraded share and budget exceeded by class", "percentunit", [
            (("sum by (class) (rate(loraplane_gateway_degraded_total{adapter!=\"_base\"}[5m])) / "
             "sum by (class) (rate(loraplane_gateway_requests_total{adapter!=\"_base\"}[5m]))"),
             "degraded {{class}}"),
            ("sum by (tenant, class) (tenant_class:loraplane_gateway_budget_misses:ratio_rate5m)",
             "budget misses {{tenant}} {{class}}")]),
        P("Refused before resolution", "reqps", [
            ("sum by (reason) (rate(loraplane_gateway_refused_total[5m]))", "{{reason}}")]),
        P("Cold-start budget: SLO miss ratio (1h) per tenant and class", "percentunit", [
            ("tenant_class:loraplane_gateway_budget_misses:ratio_rate1h", "{{tenant}} {{class}}")],
          description="SLO 99 %; LoraplaneColdStartBudgetBurnFast pages above 14.4 %."),
    ]),
    ("Tiers and loads", [
        P("Tier at arrival per base model (HOT hit ratio: hot)", "percentunit", [
            ("base_model_tier:loraplane_worker_requests:ratio_rate5m", "{{base_model}} {{tier}}")]),
        P("Cold starts per hour by tenant", "short", [
            ("tenant:loraplane_gateway_cold_starts:increase1h", "{{tenant}}")]),
        P("Load time p95 by source → target tier", "s", [
            (("base_model_source_tier_target_tier:loraplane_worker_adapter_load_seconds:quantile_rate5m"
             "{quantile=\"0.95\"}"), "{{base_model}} {{source_tier}} → {{target_tier}}")]),
        P("Load failure ratio, worst 10 adapters", "percentunit", [
            ("topk(10, base_model_tenant_adapter:loraplane_worker_adapter_load_failures:ratio_rate5m)",
             "{{tenant}}/{{adapter}} {{base_model}}")]),
        P("HOT evictions per minute per worker", "short", [
            ("instance_base_model:loraplane_worker_hot_evictions:rate1m_avg5m",
             "{{instance}} {{base_model}}")]),
        P("Worker TTFT p99 by tier at arrival", "s", [
            ("base_model_tier:loraplane_worker_ttft_seconds:quantile_rate5m{quantile=\"0.99\"}",
             "{{base_model}} {{tier}}")]),
    ]),
    ("Workers", [
        P("Worker state seen by the gateway", "short", [
            ("max by (worker, state) (loraplane_gateway_worker_state) == 1", "{{worker}} {{state}}")]),
        P("Routable workers", "short", [
            ("sum(loraplane_gateway_worker_routable)", "routable"),
            ("count(loraplane_gateway_worker_routable)", "known")], stat=True),
        P("Engines up", "short", [
            ("sum by (instance, base_model) (loraplane_worker_engine_up)", "{{instance}} {{base_model}}")]),
        P("HOT slots per worker and base model", "short", [
            ('sum by (worker, base_model, state) (loraplane_cache_tier_slots)',
             "{{worker}} {{base_model}} {{state}}")]),
        P("WARM bytes per worker", "bytes", [
            ("sum by (worker, state) (loraplane_cache_tier_bytes)", "{{worker}} {{state}}")]),
        P("Requests waiting for a HOT slot", "short", [
            ("sum by (instance, request_class) (loraplane_worker_slot_queue_depth)",
             "{{instance}} {{request_class}}")]),
    ]),
    ("Events and services", [
        P("Outbox: oldest unpublished row", "s", [
            ("max by (topic) (loraplane_outbox_oldest_age_seconds)", "{{topic}}")]),
        P("Events dropped (heat, prewarm, reports)", "short", [
            ("sum(increase(loraplane_gateway_heat_dropped_total[10m]))", "heat"),
            ("sum(increase(loraplane_gateway_prewarm_dropped_total[10m]))", "prewarm"),
            ("sum(increase(loraplane_worker_reports_dropped_total[10m]))", "reports")]),
        P("Kafka consumer restarts (15m)", "short", [
            ("sum by (instance) (increase(loraplane_worker_consumer_restarts_total[15m]))",
             "worker {{instance}}"),
            ("sum(increase(loraplane_cache_consumer_restarts_total[15m]))", "cache-manager"),
            ("sum(increase(loraplane_registry_consumer_restarts_total[15m]))", "registry"),
            ("sum(increase(loraplane_admission_consumer_restarts_total[15m]))", "admission")]),
        P("Admission verdicts and rejection reasons", "ops", [
            ("sum by (result) (rate(loraplane_admission_verdicts_total[15m]))", "{{result}}"),
            ("sum by (reason) (rate(loraplane_admission_rejection_reasons_total[15m]))", "{{reason}}")]),
        P("gRPC errors by service and method", "reqps", [
            ('sum by (service, method, code) (rate(loraplane_rpc_requests_total{code!="OK"}[5m]))',
             "{{service}}.{{method}} {{code}}")]),
        P("Services up", "short", [("up", "{{job}} {{instance}}")]),
    ]),
])

DRILLDOWN = Board("loraplane-drilldown", "loraplane — tenant / adapter / version", [
    ("Traffic", [
        P("Requests/s by version and outcome", "reqps", [
            (f"sum by (tenant, adapter, version, outcome) (rate(loraplane_gateway_requests_total{{{GW}}}[5m]))",
             "{{tenant}}/{{adapter}}@{{version}} {{outcome}}")]),
        P("Version drift: share of the adapter's traffic per version", "percentunit", [
            (f"tenant_adapter_version:loraplane_gateway_requests:share_rate5m{{{GW}}}",
             "{{tenant}}/{{adapter}}@{{version}}")]),
        P("TTFT p50 / p95 / p99 per version and class", "s",
          q3("tenant_adapter_version_class:loraplane_gateway_ttft_seconds:quantile_rate5m", GW,
             "{{adapter}}@{{version}} {{class}}")),
        P("Request duration p99 by class", "s", [
            (f"histogram_quantile(0.99, sum by (le, class) (rate(loraplane_gateway_request_seconds_bucket{{{GW}}}[5m])))",
             "{{class}}")]),
        P("Degraded share and budget exceeded by class", "percentunit", [
            (f"tenant_adapter_class:loraplane_gateway_degraded:ratio_rate5m{{{GWA}}}",
             "degraded {{tenant}}/{{adapter}} {{class}}"),
            (f"tenant_adapter_class:loraplane_gateway_budget_exceeded:ratio_rate5m{{{GWA}}}",
             "budget exceeded {{tenant}}/{{adapter}} {{class}}")]),
        P("Versions serving", "short", [
            (f"tenant_adapter:loraplane_gateway_versions_serving:count{{{GWA}}}",
             "{{tenant}}/{{adapter}}")]),
    ]),
    ("Tiers", [
        P("Tier at arrival per version (worker)", "percentunit", [
            (f"base_model_tenant_adapter_version_tier:loraplane_worker_requests:ratio_rate5m{{{WK}}}",
             "{{adapter}}@{{version}} {{tier}}")]),
        P("Tier routed to per version (gateway)", "percentunit", [
            (f"tenant_adapter_version_tier:loraplane_gateway_routed:ratio_rate5m{{{GW}}}",
             "{{adapter}}@{{version}} {{tier}}")]),
        P("Hits by tier counted by the cache manager", "reqps", [
            (f"sum by (version, tier) (rate(loraplane_cache_requests_total{{{GW}}}[5m]))",
             "{{version}} {{tier}}")]),
        P("Cold starts per version", "reqps", [
            (f"tenant_adapter_version:loraplane_gateway_cold_starts:rate5m{{{GW}}}",
             "{{adapter}}@{{version}}")]),
        P("Requests in flight on workers", "short", [
            (f"sum by (instance, version) (loraplane_worker_requests_in_flight{{{WK}}})",
             "{{instance}} {{version}}")]),
        P("Worker TTFT p95 by tier at arrival", "s", [
            (f"histogram_quantile(0.95, sum by (le, tier) (rate(loraplane_worker_ttft_seconds_bucket{{{WK}}}[5m])))",
             "{{tier}}")]),
    ]),
    ("Loads", [
        P("Load time p95 / p99 by source tier", "s", [
            (f'base_model_tenant_adapter_source_tier:loraplane_worker_adapter_load_seconds:quantile_rate5m{{{WKA}, quantile="0.95"}}',
             "p95 {{adapter}} from {{source_tier}}"),
            (f'base_model_tenant_adapter_source_tier:loraplane_worker_adapter_load_seconds:quantile_rate5m{{{WKA}, quantile="0.99"}}',
             "p99 {{adapter}} from {{source_tier}}")]),
        P("Load failure ratio", "percentunit", [
            (f"base_model_tenant_adapter:loraplane_worker_adapter_load_failures:ratio_rate5m{{{WKA}}}",
             "{{tenant}}/{{adapter}}")]),
        P("Load failures by reason", "ops", [
            (f"sum by (version, reason) (rate(loraplane_worker_adapter_load_failures_total{{{WK}}}[5m]))",
             "{{version}} {{reason}}")]),
        P("Evictions by tier", "ops", [
            (f"sum by (version, from_tier, to_tier) (rate(loraplane_worker_adapter_evictions_total{{{WK}}}[5m]))",
             "{{version}} {{from_tier}} → {{to_tier}}")]),
    ]),
], variables=[
    ("base_model", "label_values(loraplane_worker_requests_total, base_model)"),
    ("tenant", "label_values(loraplane_gateway_requests_total, tenant)"),
    ("adapter", 'label_values(loraplane_gateway_requests_total{tenant=~"$tenant"}, adapter)'),
    ("version", 'label_values(loraplane_gateway_requests_total{tenant=~"$tenant", adapter=~"$adapter"}, version)'),
])

CACHE = Board("loraplane-cache", "loraplane — cache-manager decisions", [
    ("Leadership and rounds", [
        P("Leader", "short", [("max by (instance) (loraplane_cache_leader)", "{{instance}}")], stat=True),
        P("Planning rounds by cause", "ops", [
            ("sum by (cause) (rate(loraplane_cache_rounds_total[5m]))", "{{cause}}")]),
        P("Decision latency p50 / p99", "s", [
            ("histogram_quantile(0.5, sum by (le) (rate(loraplane_cache_decision_seconds_bucket[5m])))", "p50"),
            ("histogram_quantile(0.99, sum by (le) (rate(loraplane_cache_decision_seconds_bucket[5m])))", "p99")]),
        P("Trigger → command p99", "s", [
            ("histogram_quantile(0.99, sum by (le) (rate(loraplane_cache_trigger_to_command_seconds_bucket[5m])))",
             "p99")]),
        P("Takeovers", "short", [("sum(increase(loraplane_cache_takeovers_total[1h]))", "per hour")]),
        P("Events consumed by topic and result", "ops", [
            ("sum by (topic, result) (rate(loraplane_cache_events_total[5m]))", "{{topic}} {{result}}")]),
    ]),
    ("Commands and moves", [
        P("Commands by kind and result", "ops", [
            ("sum by (kind, result) (rate(loraplane_cache_commands_total[5m]))", "{{kind}} {{result}}")]),
        P("Command round trip p95 by kind", "s", [
            ("histogram_quantile(0.95, sum by (le, kind) (rate(loraplane_cache_command_seconds_bucket[5m])))",
             "{{kind}}")]),
        P("Commands waiting for an answer", "short", [
            ("sum(loraplane_cache_pending_commands)", "pending")]),
        P("Loads issued by target tier and reason", "ops", [
            ("sum by (tier, reason) (rate(loraplane_cache_loads_total[5m]))", "{{tier}} {{reason}}")]),
        P("Demotions / evictions by reason", "ops", [
            ("sum by (kind, reason) (rate(loraplane_cache_removals_total[5m]))", "{{kind}} {{reason}}")]),
        P("Canary shadow requests by result", "ops", [
            ("sum by (result) (rate(loraplane_cache_shadow_requests_total[5m]))", "{{result}}")]),
    ]),
    ("Placement", [
        P("Versions per worker and tier", "short", [
            ("sum by (worker, tier) (loraplane_cache_tier_versions)", "{{worker}} {{tier}}")]),
        P("HOT slots used / capacity", "short", [
            ("sum by (worker, base_model, state) (loraplane_cache_tier_slots)",
             "{{worker}} {{base_model}} {{state}}")]),
        P("Workers by state", "short", [("sum by (state) (loraplane_cache_workers)", "{{state}}")]),
        P("HOT hit ratio per tenant (cache manager's count)", "percentunit", [
            (('sum by (tenant) (rate(loraplane_cache_requests_total{tier="hot"}[5m])) / '
             "sum by (tenant) (rate(loraplane_cache_requests_total[5m]))"), "{{tenant}}")]),
    ]),
])

BOARDS: tuple[Board, ...] = (FLEET, DRILLDOWN, CACHE)


def _panel(p: P, panel_id: int) -> TimeseriesPanel | StatPanel:
    builder: TimeseriesPanel | StatPanel
    if p.stat:
        builder = StatPanel().reduce_options(ReduceDataOptions().calcs(["lastNotNull"]))
    else:
        builder = (TimeseriesPanel()
                   .legend(VizLegendOptions().display_mode(LegendDisplayMode.TABLE)
                           .placement(LegendPlacement.BOTTOM).show_legend(True)
                           .calcs(["lastNotNull", "max"]))
                   .tooltip(VizTooltipOptions().mode(TooltipDisplayMode.MULTI)
                            .sort(SortOrder.DESCENDING)))
    builder = (builder.id(panel_id).title(p.title).unit(p.unit).datasource(DATASOURCE)
               .height(4 if p.stat else 8).span(6 if p.stat else 12))
    if p.description:
        builder = builder.description(p.description)
    for i, (expr, legend) in enumerate(p.targets):
        builder = builder.with_target(
            Dataquery().ref_id(chr(ord("A") + i)).expr(expr).legend_format(legend).datasource(DATASOURCE))
    return builder


def build(board: Board) -> dict[str, object]:
    """The dashboard model of ``board`` (JSON-ready)."""
    d = (Dashboard(board.title).uid(board.uid).tags(["loraplane"]).timezone("utc")
         .refresh("10s").time("now-1h", "now").editable())
    for name, query in board.variables:
        d = d.with_variable(
            QueryVariable(name).label(name).query(query).datasource(DATASOURCE)
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).include_all(True).multi(True)
            .all_value(".*"))
    panel_id = 0
    for title, panels in board.rows:
        panel_id += 1
        d = d.with_row(Row(title).id(panel_id))
        for p in panels:
            panel_id += 1
            d = d.with_panel(_panel(p, panel_id))
    out = json.loads(json.dumps(d.build(), cls=JSONEncoder, sort_keys=True))
    assert isinstance(out, dict)
    return out


def render(board: Board) -> str:
    return json.dumps(build(board), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def path_of(board: Board) -> Path:
    return OUT_DIR / f"{board.uid}.json"


def expressions() -> list[str]:
    """Every PromQL expression of every dashboard, template variables set to ``.*``."""
    out = []
    for board in BOARDS:
        for _, panels in board.rows:
            for p in panels:
                out.extend(_bind(expr) for expr, _ in p.targets)
    return out


def variable_selectors() -> list[str]:
    """The series selector inside each ``label_values(selector, label)`` variable query."""
    out = []
    for board in BOARDS:
        for _, query in board.variables:
            inner = query.removeprefix("label_values(").removesuffix(")")
            out.append(_bind(inner.rpartition(",")[0].strip()))
    return out


def _bind(expr: str) -> str:
    for var in ("base_model", "tenant", "adapter", "version"):
        expr = expr.replace(f"${var}", ".*")
    return expr


def main() -> int:
    stale = []
    for board in BOARDS:
        path, text = path_of(board), render(board)
        if "--check" in sys.argv:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    others = sorted(set(OUT_DIR.glob("*.json")) - {path_of(b) for b in BOARDS})
    if "--check" in sys.argv:
        for path in stale:
            print(f"{path} is stale: run python scripts/gen_dashboard.py", file=sys.stderr)
        for path in others:
            print(f"{path} is no generated dashboard: remove it", file=sys.stderr)
        return 1 if stale or others else 0
    for path in others:
        path.unlink()
        print(f"removed {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
