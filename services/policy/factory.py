"""Policies by name: ``POLICIES["heat"](config)``."""

from __future__ import annotations

from collections.abc import Callable

from loraplane.policy.belady import BeladyPolicy
from loraplane.policy.config import PolicyConfig
from loraplane.policy.fifo import FifoPolicy
from loraplane.policy.gdsf import GdsfPolicy
from loraplane.policy.heat import HeatPolicy
from loraplane.policy.lfu import LfuPolicy
from loraplane.policy.lru import LruPolicy
from loraplane.policy.online import CachePolicy

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
