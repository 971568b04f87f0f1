"""Settings of the registry service and of its clients (``LORAPLANE_*`` variables)."""

from __future__ import annotations

from pydantic import Field, SecretStr, model_validator

from loraplane.shared.settings import CommonSettings

DEFAULT_GRPC_PORT = 19051
"""``make run`` port (stack port base 19000 + 51, see ``loraplane.stack.services``)."""
DEFAULT_METRICS_PORT = 19061


class RegistrySettings(CommonSettings):
    """The registry process (``python -m loraplane.registry``)."""

    registry_grpc_port: int = DEFAULT_GRPC_PORT
    """``LORAPLANE_REGISTRY_GRPC_PORT``: RegistryAdmin gRPC port (0 = any free port)."""
    registry_metrics_port: int = DEFAULT_METRICS_PORT
    """``LORAPLANE_REGISTRY_METRICS_PORT``: Prometheus ``/metrics`` port (0 = off)."""
    registry_bind: str = "127.0.0.1"
    """``LORAPLANE_REGISTRY_BIND``: address the gRPC and metrics servers bind
    (``0.0.0.0`` in containers)."""
    registry_operator_token: SecretStr = SecretStr("")
    """``LORAPLANE_REGISTRY_OPERATOR_TOKEN``: the bearer token operators and CI present.
    Required: the registry refuses to start without one."""
    registry_consumer_group: str = "loraplane-registry"
    """Kafka consumer group reading ``adapter.admissions``."""
    registry_relay_batch: int = Field(default=200, gt=0)
    """Outbox rows published per relay round trip."""
    registry_relay_poll_s: float = Field(default=1.0, gt=0)
    """Relay poll interval when no ``NOTIFY`` arrives."""
    registry_grace_s: float = Field(default=5.0, ge=0)
    """Grace period for in-flight RPCs on SIGTERM."""
    registry_canary_clearance: bool = True
    """``LORAPLANE_REGISTRY_CANARY_CLEARANCE``: a new canary receives no tenant traffic until
    the cache manager's canary analysis clears it (its golden set passed, or none applies:
    ``ClearCanary``); only golden-set requests reach it meanwhile. ``false`` where no
    analysis runs (a cache manager without the operator token): canaries are cleared when
    set."""
    registry_topic_prefix: str = ""
    """Prefix of every topic the registry publishes to and consumes from (an isolated
    namespace for tests, e.g. ``t1a2b.``); empty in production."""

    @model_validator(mode="after")
    def _token_strength(self) -> RegistrySettings:
        token = self.registry_operator_token.get_secret_value()
        if token and len(token) < 16:
            raise ValueError("LORAPLANE_REGISTRY_OPERATOR_TOKEN must be at least 16 characters")
        return self

    @property
    def producer(self) -> str:
        """Producer name in event envelopes: ``registry/<instance>``."""
        return f"registry/{self.instance_id or 'registry-0'}"


class RegistryClientSettings(CommonSettings):
    """What the ``loraplane`` CLI needs to reach the registry (and S3 for uploads)."""

    registry_addr: str = f"127.0.0.1:{DEFAULT_GRPC_PORT}"
    """``LORAPLANE_REGISTRY_ADDR``: host:port of the registry's gRPC server."""
    registry_operator_token: SecretStr = SecretStr("")
    """``LORAPLANE_REGISTRY_OPERATOR_TOKEN``: sent as ``authorization: Bearer <token>``."""
    registry_actor: str = ""
    """``LORAPLANE_REGISTRY_ACTOR``: who acts, for the audit log (e.g. ``ci/acme-pipeline``);
    default ``cli/<user>``."""
    registry_timeout_s: float = Field(default=30.0, gt=0)
    """Deadline of each registry call."""
