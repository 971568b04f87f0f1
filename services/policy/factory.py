"""Policies by name: ``POLICIES["heat"](config)``."""

from __future__ import annotations

from collections.abc import Callable

from .belady import BeladyPolicy
from .config import PolicyConfig
from .fifo import FifoPolicy
from .gdsf import GdsfPolicy
from .heat import HeatPolicy
from .lfu import LfuPolicy
from .lru import LruPolicy
from .online import CachePolicy

POLICIES: dict[str, Callable[[PolicyConfig], CachePolicy]] = {
    "heat": HeatPolicy,
    "lru": lambda _cfg: LruPolicy(),
    "fifo": lambda _cfg: FifoPolicy(),
    "lfu": lambda _cfg: LfuPolicy(),
    "gdsf": lambda _cfg: GdsfPolicy(),
    "belady": lambda _cfg: BeladyPolicy(),
}
"""Every policy by its CLI name; each takes the policy configuration (baselines ignore it)."""


class UnknownPolicyError(KeyError):
    """A policy name that is not in :data:`POLICIES`."""

    retriable = False


def make_policy(name: str, config: PolicyConfig | None = None) -> CachePolicy:
    """Instantiate the policy called ``name``."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise UnknownPolicyError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
    return factory(config or PolicyConfig())
