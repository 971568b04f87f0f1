"""Cache policy core: which adapter versions are HOT, WARM or COLD (pure code, no I/O).

Entry points:

* :func:`make_policy` / :data:`POLICIES` — a policy by name (``heat``, ``lru``,
  ``fifo``, ``lfu``, ``gdsf``, ``belady``);
* ``policy.plan(snapshot, now) -> Plan`` — for the cache-manager
  (:class:`Snapshot` in, :class:`Plan` of :class:`Action` out);
* ``policy.online(ctx)`` — per-request victim selection for the simulator;
* :func:`load_config` — the YAML configuration (``config/policy.yaml``).

See ``services/policy/README.md``.
"""

from __future__ import annotations

from .config import (
    PolicyConfig,
    PolicyConfigError,
    config_from_mapping,
    load_config,
)
from .cost import Bandwidths
from .factory import POLICIES, UnknownPolicyError, make_policy
from .heat import HeatPolicy, SnapshotError
from .model import Priority, RequestClass, Tier
from .online import CachePolicy, OnlineContext, OnlinePolicy
from .plan import Action, ActionKind, Plan, Reason
from .snapshot import Snapshot, VersionMeta, WorkerState
from .stats import StatsView, VersionStats

__all__ = [
    "POLICIES",
    "Action",
    "ActionKind",
    "Bandwidths",
    "CachePolicy",
    "HeatPolicy",
    "OnlineContext",
    "OnlinePolicy",
    "Plan",
    "PolicyConfig",
    "PolicyConfigError",
    "Priority",
    "Reason",
    "RequestClass",
    "Snapshot",
    "SnapshotError",
    "StatsView",
    "Tier",
    "UnknownPolicyError",
    "VersionMeta",
    "VersionStats",
    "WorkerState",
    "config_from_mapping",
    "load_config",
    "make_policy",
]
