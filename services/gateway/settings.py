"""Gateway settings (pydantic-settings): ports, upstream addresses, budgets, limits.

Loaded once in :mod:`loraplane.gateway.__main__` and passed down. Service-specific
variables use the ``LORAPLANE_GATEWAY_`` prefix; shared ones keep their shared names
(``LORAPLANE_KAFKA_BOOTSTRAP``), and the addresses of the other services use the names
the ``make run`` supervisor exports (``LORAPLANE_REGISTRY_ADDR``,
``LORAPLANE_CACHE_MANAGER_GRPC_PORT``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import SettingsConfigDict

from loraplane.gateway.budget import BudgetConfig, load_budget_config
from loraplane.gateway.flow import FlowConfig
from loraplane.shared.settings import CommonSettings


class GatewaySettings(CommonSettings):
    """Everything the gateway process needs; defaults suit the ``make run`` stack."""

    model_config = SettingsConfigDict(
        env_prefix="LORAPLANE_GATEWAY_", extra="ignore", validate_by_name=True, validate_by_alias=True
    )

    kafka_bootstrap: str = Field(
        default="127.0.0.1:19002",
        validation_alias=AliasChoices("LORAPLANE_GATEWAY_KAFKA_BOOTSTRAP",
                                      "LORAPLANE_KAFKA_BOOTSTRAP"),
    )
    """Kafka bootstrap servers (the shared ``LORAPLANE_KAFKA_BOOTSTRAP``)."""
    instance_id: str = Field(
        default="",
        validation_alias=AliasChoices("LORAPLANE_GATEWAY_INSTANCE_ID", "LORAPLANE_INSTANCE_ID"),
    )
    """Instance name in event envelopes (``gateway/<instance>``) and Kafka client ids;
    default ``gateway-<process_index>``."""
    processes: int = Field(default=1, ge=1, le=64)
    """Gateway processes on this host serving the same public ports (``SO_REUSEPORT`` on
    both listeners when > 1; see :mod:`.scale`): each takes ``1/processes`` of every
    per-worker flow cap of ``flow``, so together they never admit more to a worker than
    one process would. Each process needs its own ``metrics_port``."""
    process_index: int = Field(default=0, ge=0)
    """This process's index, 0 … ``processes`` - 1 (its share of the caps, its default
    instance id)."""
    join_ready_timeout_s: float = Field(default=30.0, ge=0)
    """With several processes: how long a starting process waits for its views (bootstrap,
    replay of the topics) before it opens the shared public ports, so that a restarted one
    takes no connection it would answer ``keys_loading`` while the others serve; past it
    (a broker down) it opens them anyway. A single process opens them at once."""

    grpc_port: int = 19055
    """Port of the public gRPC API (``loraplane.v1.Inference``)."""
    http_port: int = 19056
    """Port of the OpenAI-compatible HTTP API (0 = disabled)."""
    metrics_port: int = 19065
    """Port of ``/metrics`` (0 = disabled)."""
    bind_host: str = "127.0.0.1"
    """Interface the public APIs bind to."""
    edge_tls_cert_file: str = ""
    """``LORAPLANE_GATEWAY_EDGE_TLS_CERT_FILE``: certificate (chain, PEM) of the public gRPC
    and HTTP listeners (TLS at the edge; tenants still authenticate with API keys, no
    client certificate). Empty with the key: plaintext."""
    edge_tls_key_file: str = ""
    """``LORAPLANE_GATEWAY_EDGE_TLS_KEY_FILE``: its private key (PEM; never logged)."""
    edge_tls_check_interval_s: float = Field(default=1.0, gt=0)
    """How often the HTTPS listener looks whether the edge certificate or key file changed
    (and then serves the new pair to new connections; the gRPC listener looks at each new
    connection)."""
    uvloop: bool = True
    """Run the event loop on uvloop (6-16 % less gateway CPU per request in bench-gateway)."""
    gc_gen0_threshold: int = Field(default=20_000, ge=0)
    """The process's garbage-collector generation-0 threshold, set after start together
    with ``gc.freeze()`` of everything start built (``python -m loraplane.gateway`` only;
    0 leaves Python's default, 700). At 700 the collector ran every ~20 streamed requests
    and a full collection walked start's ~74,000 objects every few thousand: ~25-35 us of
    the event loop's CPU a request; frozen and at 20,000, ~3-5 us
    (services/gateway/README.md)."""

    registry_addr: str = Field(
        default="127.0.0.1:19051",
        validation_alias=AliasChoices("LORAPLANE_GATEWAY_REGISTRY_ADDR", "LORAPLANE_REGISTRY_ADDR"),
    )
    """host:port of the registry admin API (bootstrap of the adapter view)."""
    registry_token: str = Field(
        default="",
        validation_alias=AliasChoices(
            "LORAPLANE_GATEWAY_REGISTRY_TOKEN", "LORAPLANE_REGISTRY_OPERATOR_TOKEN"
        ),
    )
    """Bearer token for the registry admin API (read-only calls)."""
    cache_manager_grpc_port: int = Field(
        default=19053,
        validation_alias=AliasChoices("LORAPLANE_CACHE_MANAGER_GRPC_PORT"),
    )
    """Port of the cache manager's read API (used when ``cache_manager_addr`` is empty)."""
    cache_manager_addr: str = Field(
        default="",
        validation_alias=AliasChoices(
            "LORAPLANE_GATEWAY_CACHE_MANAGER_ADDR", "LORAPLANE_CACHE_MANAGER_ADDR"
        ),
    )
    """host:port of the cache manager (bootstrap of the placement view)."""
    bootstrap: bool = True
    """Read the registry and cache manager at start (off in tests fed by events only)."""
    bootstrap_timeout_s: float = Field(default=10.0, gt=0)
    """How long one bootstrap attempt may take before the gateway serves from events."""
    consume_events: bool = True
    """Feed the views from Kafka (off in tests that feed them directly)."""

    default_base_model: str = Field(
        default="",
        validation_alias=AliasChoices("LORAPLANE_GATEWAY_DEFAULT_BASE_MODEL", "LORAPLANE_BASE_MODEL"),
    )
    """Base model of base-model requests that name none ("" = the only one served)."""
    budgets_file: Path | None = None
    """YAML file with cold-start budgets and degrade policy (see :mod:`.budget`)."""
    budgets: BudgetConfig = Field(default_factory=BudgetConfig)
    """Budgets in effect (from ``budgets_file`` when set, else the defaults)."""
    shares: dict[str, list[str]] = Field(default_factory=dict)
    """Static shares on top of the registry's (``tenant.events``):
    ``{"tenant": ["owner/name", ...]}`` (JSON in env)."""

    flow: FlowConfig = Field(default_factory=FlowConfig)
    """Admission limit per worker, headroom, ageing and fair-share weights (see
    :mod:`.flow`; JSON in env, e.g. ``LORAPLANE_GATEWAY_FLOW='{"max_in_flight_per_worker": 4}'``)."""
    default_max_in_flight: int = Field(default=32, ge=0)
    """Quota of a tenant that has none in the registry: requests queued or running at once
    at this gateway (0 = unlimited; see :mod:`.quotas`)."""
    default_tokens_per_s: float = Field(default=0.0, ge=0)
    """Quota of a tenant that has none in the registry: output tokens per second (0 =
    unlimited)."""
    max_cold_loads_per_worker: int = Field(default=2, ge=1)
    """Concurrent cold loads the gateway starts on one worker."""
    warm_load_estimate_ms: float = Field(default=50.0, ge=0)
    """Initial estimate of a WARM → HOT load (refined from ``AdapterLoaded`` reports)."""
    cold_load_estimate_ms: float = Field(default=2000.0, ge=0)
    """Initial estimate of a COLD → HOT load (refined from ``AdapterLoaded`` reports)."""
    load_estimate_alpha: float = Field(default=0.2, ge=0, le=1)
    """Weight of each new ``AdapterLoaded`` duration in the load estimates (EWMA; 0 keeps
    the configured estimates fixed)."""
    worker_stale_after_s: float = Field(default=60.0, gt=0)
    """A worker neither answering probes nor reporting on ``cache.state`` for this long is
    not routed to (a worker that answers its probes stays routable during a broker
    outage)."""
    worker_probe_interval_s: float = Field(default=1.0, ge=0)
    """How often every worker's ``GetState`` is probed over gRPC (0 = no probes: liveness
    from ``cache.state`` reports only)."""
    worker_probe_timeout_s: float = Field(default=1.0, gt=0)
    """Deadline of one probe."""
    worker_down_after_failures: int = Field(default=2, ge=1)
    """Probes failed in a row that take a worker out of routing (so a dead worker is
    routed around within about ``interval × failures + timeout`` seconds)."""
    worker_suspect_s: float = Field(default=5.0, ge=0)
    """After a worker answered UNAVAILABLE, avoid it for this long."""
    default_deadline_s: float = Field(default=120.0, gt=0)
    """Deadline of a request whose caller set none."""
    max_tokens_limit: int = Field(default=4096, gt=0)
    """Largest ``max_tokens`` a request may ask for."""
    max_prompt_chars: int = Field(default=200_000, gt=0)
    """Largest prompt accepted, in characters."""

    heat_flush_interval_s: float = Field(default=1.0, gt=0)
    """How often completed requests are published as ``HeatBatch`` events."""
    heat_max_batch: int = Field(default=500, ge=1)
    """Largest number of completions in one ``HeatBatch``."""
    heat_max_pending: int = Field(default=100_000, ge=1)
    """Completions kept while Kafka is slow; beyond, new ones are dropped and counted."""
    prewarm_dedupe_s: float = Field(default=5.0, ge=0)
    """One ``PrewarmRequested`` per version within this window."""

    @model_validator(mode="after")
    def _derive(self) -> GatewaySettings:
        if not self.cache_manager_addr:
            self.cache_manager_addr = f"127.0.0.1:{self.cache_manager_grpc_port}"
        if self.budgets_file is not None:
            self.budgets = load_budget_config(self.budgets_file)
        if self.process_index >= self.processes:
            raise ValueError(f"process_index {self.process_index} out of 0..{self.processes - 1} "
                             f"(LORAPLANE_GATEWAY_PROCESSES={self.processes})")
        self.process_flow()  # caps that cannot be split fail here, naming the cap
        if bool(self.edge_tls_cert_file) != bool(self.edge_tls_key_file):
            raise ValueError("edge TLS needs both LORAPLANE_GATEWAY_EDGE_TLS_CERT_FILE and "
                             "LORAPLANE_GATEWAY_EDGE_TLS_KEY_FILE (or neither)")
        return self

    @property
    def producer_id(self) -> str:
        """``gateway/<instance>`` for event envelopes."""
        return f"gateway/{self.instance_id or f'gateway-{self.process_index}'}"

    @property
    def reuse_port(self) -> bool:
        """Whether the public listeners share their ports (``SO_REUSEPORT``): with several
        processes only, so a single gateway still fails on a port another process holds."""
        return self.processes > 1

    def process_flow(self) -> FlowConfig:
        """This process's flow caps: its share of ``flow`` (:func:`.scale.split_flow`)."""
        from loraplane.gateway.scale import split_flow

        return split_flow(self.flow, self.processes, self.process_index)
