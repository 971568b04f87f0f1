"""Where the shipped defaults are: ``config/`` and ``migrations/`` as package resources.

The files live at the top of the checkout (``config/``, ``migrations/``: what compose,
Kubernetes and dbmate read) and are packaged as ``loraplane/shared/data/{config,migrations}``
(links in the checkout, copies in a wheel), so a service started from anywhere, installed
or not, finds the same files through :func:`config_file` and :func:`migrations_dir`.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def _data(name: str) -> Path:
    # A regular (non-zip) install: the resource is a real directory.
    return Path(str(files("loraplane.shared") / "data" / name))


def config_file(name: str) -> Path:
    """A shipped config file, e.g. ``config_file("policy.yaml")``."""
    return _data("config") / name


def migrations_dir() -> Path:
    """The SQL migrations dbmate applies."""
    return _data("migrations")
