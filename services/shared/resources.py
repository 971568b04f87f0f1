"""Where the shipped defaults are: ``config/`` and ``migrations/`` as package resources.

The files live at the top of the checkout (``config/``, ``migrations/``: what compose,
Kubernetes and dbmate read) and are packaged as ``loraplane/shared/data/{config,migrations}``
(links in the checkout, copies in a wheel), so a service started from anywhere, installed
or not, finds the same files through :func:`config_file` and :func:`migrations_dir`.
"""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

STATE_ENV = "LORAPLANE_HOME"
"""Environment variable naming the root of local state (see :func:`state_dir`)."""


def _data(name: str) -> Path:
    # A regular (non-zip) install: the resource is a real directory.
    return Path(str(files("loraplane.shared") / "data" / name))


def state_dir() -> Path:
    """The one root of local state (demo models and keys, the WARM tier, quarantine, the
    embedded stacks, bench output): ``$LORAPLANE_HOME`` when set; else ``.loraplane/`` at
    the top of the source checkout when the package runs from one (the git-ignored folder
    ``make run`` and ``make test`` use); else ``.loraplane/`` in the working directory (an
    installed package). Services in containers set their own paths (compose, Kubernetes)."""
    home = os.environ.get(STATE_ENV)
    if home:
        return Path(home)
    checkout = Path(__file__).resolve().parents[2]  # services/shared/resources.py
    if (checkout / "pyproject.toml").is_file() and (checkout / "services").is_dir():
        return checkout / ".loraplane"
    return Path.cwd() / ".loraplane"


def config_file(name: str) -> Path:
    """A shipped config file, e.g. ``config_file("policy.yaml")``."""
    return _data("config") / name


def migrations_dir() -> Path:
    """The SQL migrations dbmate applies."""
    return _data("migrations")
