"""PromQL helpers of the observability tests: promtool, the rule files, the names an
expression reads."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
PROM_DIR = ROOT / "infra" / "prometheus"
RULES = PROM_DIR / "rules.yml"
RULE_TESTS = sorted((PROM_DIR / "tests").glob("*_test.yml"))

OPERATOR_DECLARED = frozenset({"tenant:loraplane_tenant_priority:info"})
"""Recorded series the shipped rules read but leave to the operator to declare (the
platinum tenants: the ``loraplane-priorities`` group)."""

_NAME = re.compile(r"(?<![\w.:$])[a-zA-Z_:][a-zA-Z0-9_:]*")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_KEYWORDS = frozenset({
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "by", "without", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "bool", "offset", "rate", "irate", "increase", "delta", "idelta",
    "deriv", "histogram_quantile", "label_replace", "label_join", "time", "vector", "scalar",
    "abs", "ceil", "floor", "round", "clamp", "clamp_min", "clamp_max", "absent",
    "absent_over_time", "avg_over_time", "max_over_time", "min_over_time", "sum_over_time",
    "count_over_time", "last_over_time", "quantile_over_time", "changes", "resets", "sort",
    "sort_desc", "timestamp", "exp", "ln", "log2", "log10", "sqrt", "predict_linear",
    "label_values", "inf", "nan", "le",
})


def promtool() -> str:
    """The promtool of the apt ``prometheus`` package (found like the stack finds prometheus)."""
    return shutil.which("promtool") or "/usr/bin/promtool"


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = promtool()
    if not Path(binary).exists():
        raise AssertionError("promtool not found: `make system-deps` installs Prometheus (apt)")
    return subprocess.run([binary, *args], capture_output=True, text=True, check=False,
                          timeout=120)


def load_rules() -> list[dict[str, Any]]:
    """Every rule of rules.yml (recording and alerting)."""
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in (g.get("rules") or [])]


def alerts() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for r in load_rules() if "alert" in r}


def recorded() -> set[str]:
    return {r["record"] for r in load_rules() if "record" in r}


def selectors(expr: str) -> set[str]:
    """Metric and recorded-series names an expression reads (label names and values,
    functions, keywords and durations left out)."""
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", "{}", text)  # label matchers
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", text)
    text = re.sub(r"\[[^\]]*\]", "[]", text)  # range durations
    names = set()
    for m in _NAME.finditer(text):
        word = m.group(0)
        if word in _KEYWORDS or word.lower() in _KEYWORDS:
            continue
        rest = text[m.end():].lstrip()
        if rest.startswith("(") and ":" not in word:
            continue  # a function call
        names.add(word)
    return names


def dashboard_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_dashboard", ROOT / "scripts/gen_dashboard.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gen_dashboard"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod
