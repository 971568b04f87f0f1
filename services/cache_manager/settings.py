"""Settings of the cache-manager process (``LORAPLANE_CACHE_MANAGER_*`` plus the common ones).

Loaded once in ``main`` and passed down. Operational timings live here; business
rules (canary, rollback, schedules, limits) live in the rules YAML
(:mod:`loraplane.cache_manager.rules`), the policy's knobs in ``config/policy.yaml``.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, SecretStr, model_validator

from loraplane.cache_manager.sharding import ShardSelection, parse_shards
from loraplane.shared.settings import CommonSettings

DEFAULT_GRPC_PORT = 19053
"""``make run`` port (stack port base 19000 + 53, see ``loraplane.stack.services``)."""
DEFAULT_METRICS_PORT = 19063

LOCK_KEY = 0x6C6F_7261_0007
"""Postgres advisory lock key of the cache-manager leader ("lora" + issue 7); fixed, not hashed."""


class CacheManagerSettings(CommonSettings):
    """Everything the cache-manager process needs; defaults suit the ``make run`` stack."""

    cache_manager_grpc_port: int = DEFAULT_GRPC_PORT
    """``LORAPLANE_CACHE_MANAGER_GRPC_PORT``: read API (``loraplane.v1.CacheManager``); 0 = any."""
    cache_manager_metrics_port: int = DEFAULT_METRICS_PORT
    """``LORAPLANE_CACHE_MANAGER_METRICS_PORT``: Prometheus ``/metrics`` (0 = off)."""
    cache_manager_bind: str = "127.0.0.1"
    """Address the gRPC, metrics and page servers bind."""
    cache_manager_page_port: int = Field(default=0, ge=0)
    """``LORAPLANE_CACHE_MANAGER_PAGE_PORT``: the read-only placement page (``/placement``,
    :mod:`loraplane.cache_manager.page`); 0 = off."""
    registry_operator_token: SecretStr = SecretStr("")
    """``LORAPLANE_REGISTRY_OPERATOR_TOKEN``: the operators' token (the registry's), which
    the placement page asks for; required when the page is on."""
    registry_addr: str = "127.0.0.1:19051"
    """``LORAPLANE_REGISTRY_ADDR``: the registry's gRPC address; the canary analysis takes
    its steps there (with the operator token; no token: the analysis only observes)."""
    cache_manager_canary_interval_s: float = Field(default=2.0, gt=0)
    """Period of the canary analysis (``canary.analysis`` in the rules)."""
    cache_manager_rules_file: Path | None = None
    """Business rules YAML (default ``config/cache_manager.yaml`` when present)."""
    cache_manager_consumer_group: str = "loraplane-cache-manager"
    """Kafka group id under which the leader commits its input offsets; also names the
    deployment whose statistics and worker directory are kept in Postgres."""
    cache_manager_tenants: str = ""
    """Comma-separated tenants this deployment manages (empty: all). Versions of other
    tenants found on its workers are left alone (their room counts as taken)."""
    cache_manager_tick_s: float = Field(default=2.0, gt=0)
    """Planning period when nothing triggers an earlier round."""
    cache_manager_min_round_interval_s: float = Field(default=0.05, ge=0)
    """Shortest time between two rounds (triggers arriving faster are batched)."""
    cache_manager_worker_timeout_s: float = Field(default=30.0, gt=0)
    """A worker silent for longer is gone (≥ 2× the workers' snapshot period)."""
    cache_manager_bootstrap_grace_s: float = Field(default=12.0, ge=0)
    """After taking over, the longest wait for every worker's state before commanding
    (≥ the workers' snapshot period). Known workers are asked directly (GetState), so
    the wait usually ends sooner."""
    cache_manager_leader_poll_s: float = Field(default=1.0, gt=0)
    """How often a standby tries the leader lock (and the leader checks it still holds it)."""
    cache_manager_lock_key: int = LOCK_KEY
    """Postgres advisory lock key (one per cache-manager deployment)."""
    cache_manager_shards: str = ""
    """Which shards (base models) this process may lead, each with its own leader lock
    (:mod:`loraplane.cache_manager.sharding`): empty = not sharded, one leader for every
    base model; ``*`` = every base model of the registry; or a comma-separated list."""
    cache_manager_registry_refresh_s: float = Field(default=60.0, gt=0)
    """Period of the full re-read of the registry (catches missed lifecycle events)."""
    cache_manager_stats_flush_s: float = Field(default=10.0, gt=0)
    """Period of the statistics snapshot to Postgres (survives restarts and failover)."""
    cache_manager_commit_interval_s: float = Field(default=2.0, gt=0)
    """Period of the offset commits of the consumed topics."""
    cache_manager_consumer_stall_s: float = Field(default=60.0, gt=0)
    """Recreate the consumer when nothing arrived for this long while workers are known
    (an aiokafka consumer can go silent after a broker restart)."""
    cache_manager_get_state_timeout_s: float = Field(default=2.0, gt=0)
    """Deadline of the GetState call to each known worker at takeover."""
    cache_manager_grace_s: float = Field(default=3.0, ge=0)
    """Grace period of in-flight RPCs on shutdown."""

    @model_validator(mode="after")
    def _checks(self) -> CacheManagerSettings:
        if self.cache_manager_worker_timeout_s <= self.cache_manager_tick_s:
            raise ValueError("cache_manager_worker_timeout_s must exceed cache_manager_tick_s")
        parse_shards(self.cache_manager_shards)  # names every problem
        if self.cache_manager_page_port and not self.registry_operator_token.get_secret_value():
            raise ValueError("LORAPLANE_CACHE_MANAGER_PAGE_PORT is set but "
                             "LORAPLANE_REGISTRY_OPERATOR_TOKEN is not: the placement page "
                             "needs the operator token")
        return self

    @property
    def tenant_set(self) -> frozenset[str] | None:
        """:attr:`cache_manager_tenants` as a set (None: every tenant)."""
        names = frozenset(t.strip() for t in self.cache_manager_tenants.split(",") if t.strip())
        return names or None

    @property
    def shard_selection(self) -> ShardSelection | None:
        """:attr:`cache_manager_shards` parsed (None: not sharded)."""
        return parse_shards(self.cache_manager_shards)

    @property
    def instance(self) -> str:
        """Instance name (``instance_id`` or ``host:pid``)."""
        return self.instance_id or f"{os.uname().nodename}:{os.getpid()}"

    @property
    def producer(self) -> str:
        """Producer name in event envelopes: ``cache-manager/<instance>``."""
        return f"cache-manager/{self.instance}"
