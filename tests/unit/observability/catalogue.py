"""The metric families the services export, read from their code.

Two independent readings:

* :func:`families`: every metric class of the services instantiated in a fresh
  ``CollectorRegistry`` and every scrape-time collector collected with nothing to
  report: family name, type and label names as Prometheus will see them;
* :func:`declared_names`: every ``Counter("loraplane_…")`` / ``GaugeMetricFamily(…)`` /
  … call in ``services/`` found by parsing the source, so a family created outside
  the classes above is noticed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

ROOT = Path(__file__).resolve().parents[3]
SERVICES = ROOT / "services"

METRIC_CALLS = frozenset({
    "Counter", "Gauge", "Histogram", "Summary", "Info", "Enum",
    "CounterMetricFamily", "GaugeMetricFamily", "HistogramMetricFamily",
    "SummaryMetricFamily", "InfoMetricFamily",
})

SUPERVISOR_FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "loraplane_component_up": ("gauge", ("component",)),
    "loraplane_component_restarts": ("counter", ("component",)),
}
"""Families of the ``make run`` supervisor (created in ``Supervisor.__init__``, which needs a
whole stack): read from the source by :func:`declared_names`, their labels written here
and checked against the source by the tests."""


@dataclass(frozen=True)
class Family:
    """One metric family: ``name`` without the ``_total`` suffix of counters."""

    name: str
    type: str
    labels: tuple[str, ...]

    def samples(self) -> set[str]:
        """Names of the series Prometheus stores for this family."""
        if self.type == "counter":
            return {f"{self.name}_total"}
        if self.type in ("histogram", "summary"):
            out = {f"{self.name}_count", f"{self.name}_sum"}
            return out | ({f"{self.name}_bucket"} if self.type == "histogram" else set())
        return {self.name}

    @property
    def exported(self) -> str:
        """The name a catalogue lists: counters with ``_total``."""
        return f"{self.name}_total" if self.type == "counter" else self.name


def _metric_objects(obj: object) -> list[MetricWrapperBase]:
    return [v for v in vars(obj).values() if isinstance(v, MetricWrapperBase)]


def families() -> dict[str, Family]:
    """Every family of every service, keyed by name."""
    from loraplane.admission.metrics import AdmissionMetrics
    from loraplane.cache_manager.canary_runner import CanaryCollector
    from loraplane.cache_manager.metrics import CacheMetrics, StateCollector
    from loraplane.gateway.flow import FlowMetrics
    from loraplane.gateway.metrics import GatewayMetrics
    from loraplane.registry.metrics import RegistryMetrics
    from loraplane.shared.metrics import RpcMetrics
    from loraplane.shared.outbox import OutboxMetrics
    from loraplane.shared.tls import AuthMetrics, CertExpiry, HandshakeRefusals
    from loraplane.worker.metrics import WorkerMetrics

    out: dict[str, Family] = {}

    def add(f: Family) -> None:
        old = out.get(f.name)
        assert old is None or old == f, f"{f.name} defined twice differently: {old} / {f}"
        out[f.name] = f

    for cls in (AdmissionMetrics, CacheMetrics, FlowMetrics, GatewayMetrics, RegistryMetrics,
                RpcMetrics, OutboxMetrics, WorkerMetrics, AuthMetrics, CertExpiry,
                HandshakeRefusals):
        registry = CollectorRegistry()
        inst = cls(registry)
        for m in _metric_objects(inst):
            add(Family(m._name, m._type, tuple(m._labelnames)))
        if isinstance(inst, GatewayMetrics):
            for fam in inst.views.collect():
                add(Family(fam.name, fam.type, tuple(getattr(fam, "_labelnames", ()))))
    for fam in [*StateCollector(lambda: None).collect(),
                *CanaryCollector(lambda: None, lambda: 0.0).collect()]:
        add(Family(fam.name, fam.type, tuple(getattr(fam, "_labelnames", ()))))
    for name, (typ, labels) in SUPERVISOR_FAMILIES.items():
        add(Family(name, typ, labels))
    return out


def _literal_labels(node: ast.Call, family: bool) -> tuple[str, ...] | None:
    """The label names of a metric constructor call when written as a literal list
    (a ``*MetricFamily``'s third positional argument is its value, not its labels)."""
    arg: ast.expr | None = node.args[2] if len(node.args) > 2 and not family else None
    for kw in node.keywords:
        if kw.arg in ("labelnames", "labels"):
            arg = kw.value
    if arg is None:
        return ()
    if isinstance(arg, (ast.List, ast.Tuple)) and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in arg.elts):
        return tuple(e.value for e in arg.elts)  # type: ignore[attr-defined]
    return None


def declared_names() -> dict[str, tuple[Path, tuple[str, ...] | None]]:
    """``loraplane_*`` names passed first to a metric constructor anywhere in services/,
    with the file and the label names when they are a literal list (else ``None``).

    Counter names are given without ``_total`` (prometheus-client adds it; one that
    ends in ``_total`` is stripped the same way).
    """
    out: dict[str, tuple[Path, tuple[str, ...] | None]] = {}
    for path in sorted(SERVICES.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            first = node.args[0]
            if name in METRIC_CALLS and isinstance(first, ast.Constant) \
                    and isinstance(first.value, str) and first.value.startswith("loraplane_"):
                value = first.value
                if name in ("Counter", "CounterMetricFamily") and value.endswith("_total"):
                    value = value[: -len("_total")]
                out[value] = (path.relative_to(ROOT), _literal_labels(node, name.endswith("Family")))
    return out
