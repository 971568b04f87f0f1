"""Every PromQL query the runbook's query tables name parses (promtool) and reads only
series the services export or the rules record: the answers to the seed's metric
questions are queries that work, not prose."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.unit.observability.promql import (
    OPERATOR_DECLARED,
    PROM_DIR,
    recorded,
    run_promtool,
    selectors,
)
from tests.unit.observability.test_rules import SYNTHETIC, exported_samples

RUNBOOK = PROM_DIR / "RUNBOOK.md"


def queries() -> list[str]:
    """Backticked cells of the runbook's ``| question | query |`` tables that are PromQL
    (have a call or a selector with labels); recorded names alone are checked too."""
    text = RUNBOOK.read_text()
    out: list[str] = []
    for table in re.findall(r"\| question \| query \|\n\|---\|---\|\n((?:\|.*\|\n)+)", text):
        for row in table.splitlines():
            cell = row.split("|")[2]
            out.extend(q for q in re.findall(r"`([^`]+)`", cell)
                       if "…" not in q and not q.startswith("by ("))
    return out


def test_runbook_queries_parse_and_read_known_series(tmp_path: Path) -> None:
    found = queries()
    assert len(found) >= 20, found
    exprs = [q for q in found if "(" in q or "{" in q or ":" in q]
    rules = {"groups": [{"name": "runbook", "rules": [
        {"record": f"runbook:query:{i}", "expr": q} for i, q in enumerate(exprs)]}]}
    path = tmp_path / "runbook.yml"
    path.write_text(yaml.safe_dump(rules))
    out = run_promtool("check", "rules", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    known = exported_samples() | recorded() | OPERATOR_DECLARED | SYNTHETIC
    unknown = {name: q for q in exprs for name in selectors(q) - known}
    assert not unknown, unknown
