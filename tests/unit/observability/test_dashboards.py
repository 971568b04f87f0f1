"""The Grafana dashboards (scripts/gen_dashboard.py, grafana-foundation-sdk): fresh,
provisioned by compose, every expression valid PromQL (promtool) reading only series the
services export or the rules record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from tests.unit.observability.catalogue import families
from tests.unit.observability.promql import (
    OPERATOR_DECLARED,
    ROOT,
    dashboard_module,
    recorded,
    run_promtool,
    selectors,
)

DASHBOARDS = ROOT / "infra" / "grafana" / "dashboards"
GEN = dashboard_module()


def test_generated_files_are_fresh_and_the_only_dashboards() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "scripts/gen_dashboard.py"), "--check"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    names = sorted(p.name for p in DASHBOARDS.glob("*.json"))
    assert names == sorted(f"{b.uid}.json" for b in GEN.BOARDS)


def test_the_three_boards_and_their_panels() -> None:
    boards = {p.stem: json.loads(p.read_text()) for p in DASHBOARDS.glob("*.json")}
    assert set(boards) == {"loraplane-fleet", "loraplane-drilldown", "loraplane-cache"}
    for uid, board in boards.items():
        assert board["uid"] == uid
        panels = [p for p in board["panels"] if p["type"] != "row"]
        assert len(panels) >= 12, uid
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), f"{uid}: duplicate panel ids"
        for p in panels:
            assert p["targets"] and all(t["expr"] and t["refId"] for t in p["targets"]), p["title"]
            assert p["datasource"] == {"type": "prometheus", "uid": "prometheus"}
            assert p["options"], f"{uid}/{p['title']}: no options"


def test_drilldown_is_filtered_by_its_template_variables() -> None:
    board = json.loads((DASHBOARDS / "loraplane-drilldown.json").read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert set(variables) == {"base_model", "tenant", "adapter", "version"}
    for v in variables.values():
        assert v["type"] == "query" and v["query"].startswith("label_values(")
        assert v["includeAll"] and v["multi"] and v["allValue"] == ".*"
    unfiltered = [p["title"] for p in board["panels"] if p["type"] != "row"
                  for t in p["targets"] if '=~"$tenant"' not in t["expr"]]
    assert not unfiltered, unfiltered


def test_every_expression_parses(tmp_path: Path) -> None:
    """promtool parses each expression (as a recording rule: it accepts nothing invalid)."""
    exprs = GEN.expressions() + GEN.variable_selectors()
    assert len(exprs) >= 50
    doc = {"groups": [{"name": "dashboards", "rules": [
        {"record": f"dashboard:check_{i}:expr", "expr": e} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "dashboards.yml"
    path.write_text(yaml.safe_dump(doc))
    out = run_promtool("check", "rules", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in out.stdout


def test_promtool_rejects_a_broken_expression(tmp_path: Path) -> None:
    """The parse check above can fail: a dashboard expression with a typo is refused."""
    bad = GEN.expressions()[0].replace("(", "", 1)
    path = tmp_path / "bad.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [
        {"record": "dashboard:bad:expr", "expr": bad}]}]}))
    assert run_promtool("check", "rules", str(path)).returncode != 0


def test_dashboards_read_only_exported_or_recorded_series() -> None:
    exported = {s for f in families().values() for s in f.samples()}
    known = exported | recorded() | OPERATOR_DECLARED | {"up"}
    unknown = {}
    read: set[str] = set()
    for expr in GEN.expressions() + GEN.variable_selectors():
        names = selectors(expr)
        read |= names
        for name in names - known:
            unknown[name] = expr
    assert not unknown, unknown
    assert len(read & exported) >= 30 and len(read & recorded()) >= 15, read


def test_compose_provisions_the_dashboards() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    volumes = dict(v.rsplit(":", 1)[0].split(":", 1) for v in compose["services"]["grafana"]["volumes"])
    assert volumes["./infra/grafana/provisioning"] == "/etc/grafana/provisioning"
    provider = yaml.safe_load(
        (ROOT / "infra/grafana/provisioning/dashboards/loraplane.yml").read_text())["providers"][0]
    assert provider["type"] == "file"
    assert volumes["./infra/grafana/dashboards"] == provider["options"]["path"]
    datasource = yaml.safe_load(
        (ROOT / "infra/grafana/provisioning/datasources/prometheus.yml").read_text())["datasources"][0]
    assert datasource["uid"] == GEN.DATASOURCE.uid and datasource["type"] == "prometheus"
    assert datasource["url"] == "http://prometheus:9090" and "prometheus" in compose["services"]
