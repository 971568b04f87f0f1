"""The interpreted twin of a module that ``loraplane.native`` may serve compiled.

A mypyc-compiled class takes no Python subclass and no patched class attribute, so the tests
that subclass :class:`~loraplane.policy.adaptive.AdaptiveHeatOnline` (to record or cross-check
every victim) use :func:`interpreted`; ``tests/unit/policy/test_native.py`` shows that the
compiled module decides exactly as this one.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from loraplane import native


def interpreted(name: str) -> ModuleType:
    """Module ``name`` run from its source (itself when it was not loaded compiled)."""
    module = importlib.import_module(name)
    if not native.is_compiled(name):
        return module
    twin = f"{name}_interpreted"
    if twin in sys.modules:
        return sys.modules[twin]
    source = Path(native.__file__).resolve().parents[1].joinpath(*name.split(".")[1:])
    spec = importlib.util.spec_from_file_location(twin, source.with_suffix(".py"))
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[twin] = loaded
    spec.loader.exec_module(loaded)
    return loaded
