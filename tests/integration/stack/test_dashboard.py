"""The Grafana dashboard is generated from scripts/gen_dashboard.py and every PromQL
expression in it is accepted by the real Prometheus of the test stack."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from loraplane.stack.stack import Stack

ROOT = Path(__file__).resolve().parents[3]


def _gen():
    spec = importlib.util.spec_from_file_location("gen_dashboard", ROOT / "scripts/gen_dashboard.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_dashboard_file_is_fresh() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "scripts/gen_dashboard.py"), "--check"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    board = json.loads((ROOT / "infra/grafana/dashboards/loraplane.json").read_text())
    assert board["panels"] and all(p["targets"] for p in board["panels"])


def test_every_expression_is_valid_promql(stack: Stack) -> None:
    bad = []
    exprs = _gen().expressions()
    assert len(exprs) >= 15
    for expr in exprs:
        url = f"{stack.settings.prometheus_url}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                body = json.loads(resp.read())
            if body.get("status") != "success":
                bad.append((expr, body))
        except urllib.error.HTTPError as exc:
            bad.append((expr, exc.read().decode()))
    assert not bad, bad
