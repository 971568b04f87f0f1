"""infra/METRICS.md lists exactly the metric families the services define: names, types,
labels, and a cardinality bound with how it is kept for each."""

from __future__ import annotations

import re

from tests.unit.observability.catalogue import SUPERVISOR_FAMILIES, declared_names, families
from tests.unit.observability.promql import ROOT

CATALOGUE = ROOT / "infra" / "METRICS.md"
ROW = re.compile(r"^\| `(loraplane_[a-z0-9_]+)` \| (\w+) \| ([^|]*) \| ([^|]*) \| ([^|]*) \|$")


def documented() -> dict[str, tuple[str, tuple[str, ...], str, str]]:
    rows: dict[str, tuple[str, tuple[str, ...], str, str]] = {}
    for line in CATALOGUE.read_text().splitlines():
        m = ROW.match(line)
        if m is None:
            continue
        name, typ, labels, bound, kept = m.groups()
        assert name not in rows, f"{name} listed twice"
        names = tuple(re.findall(r"`([a-z_]+)`", labels))
        assert names or labels.strip() == "—", f"{name}: labels {labels!r}"
        rows[name] = (typ, names, bound.strip(), kept.strip())
    return rows


def test_code_families_agree_with_their_source() -> None:
    """The two readings of the code agree: every constructor found in services/ is a
    family of the instantiated metric classes, with the same literal labels."""
    found = families()
    declared = declared_names()
    assert set(declared) == set(found), set(declared) ^ set(found)
    for name, (path, labels) in declared.items():
        if labels is not None:
            assert labels == found[name].labels, f"{name} ({path}): {labels} / {found[name].labels}"
    for name in SUPERVISOR_FAMILIES:
        assert declared[name][1] == found[name].labels, name


def test_catalogue_lists_every_family_with_its_type_and_labels() -> None:
    code = {f.exported: f for f in families().values()}
    docs = documented()
    assert len(docs) >= 70
    missing = sorted(set(code) - set(docs))
    extra = sorted(set(docs) - set(code))
    assert not missing, f"not in infra/METRICS.md: {missing}"
    assert not extra, f"in infra/METRICS.md but not exported: {extra}"
    wrong = []
    for name, (typ, labels, bound, kept) in docs.items():
        f = code[name]
        if typ != f.type:
            wrong.append(f"{name}: type {typ}, code {f.type}")
        if labels != f.labels:
            wrong.append(f"{name}: labels {labels}, code {f.labels}")
        if not bound or not kept:
            wrong.append(f"{name}: no bound or no way it is kept")
        if not f.labels and bound != "1":
            wrong.append(f"{name}: no labels, bound must be 1")
    assert not wrong, wrong
