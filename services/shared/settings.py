"""Settings shared by every service (pydantic-settings, ``LORAPLANE_*`` variables).

Each service defines its own settings class deriving from :class:`CommonSettings`
with its own prefix for service-specific fields (``LORAPLANE_REGISTRY_GRPC_PORT``),
loads it once in ``main`` and passes it down; nothing reads the environment deep
inside helpers.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class CommonSettings(BaseSettings):
    """Connections to the shared infrastructure; defaults point at the ``make run`` stack."""

    model_config = SettingsConfigDict(env_prefix="LORAPLANE_", extra="ignore")

    postgres_dsn: str = "postgresql://loraplane:loraplane-dev@127.0.0.1:19001/loraplane"
    """PostgreSQL DSN (asyncpg)."""
    kafka_bootstrap: str = "127.0.0.1:19002"
    """Kafka bootstrap servers (Tansu locally, apache/kafka in compose)."""
    s3_endpoint: str = "127.0.0.1:19003"
    """S3 endpoint host:port (SeaweedFS locally, MinIO in compose)."""
    s3_access_key: str = "loraplane"
    s3_secret_key: str = "loraplane-dev-secret"
    s3_secure: bool = False
    artifact_bucket: str = "loraplane-artifacts"
    """The allow-listed bucket holding every adapter version (cold tier)."""
    instance_id: str = Field(default="", description="instance name; default host:pid")
