"""Every PromQL expression of the Grafana dashboards (scripts/gen_dashboard.py) and every
template-variable selector is accepted by the real Prometheus of the test stack.

Freshness, provisioning and the offline parse / metric-name checks:
tests/unit/observability/test_dashboards.py.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

from loraplane.stack.stack import Stack
from tests.unit.observability.promql import dashboard_module


def test_every_expression_is_valid_promql(stack: Stack) -> None:
    gen = dashboard_module()
    bad = []
    exprs = gen.expressions() + gen.variable_selectors()
    assert len(exprs) >= 50
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
