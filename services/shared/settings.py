"""Settings shared by every service (pydantic-settings, ``LORAPLANE_*`` variables).

Each service defines its own settings class deriving from :class:`CommonSettings`
with its own prefix for service-specific fields (``LORAPLANE_REGISTRY_GRPC_PORT``),
loads it once in ``main`` and passes it down; nothing reads the environment deep
inside helpers.
"""

from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from loraplane.shared.tls import TlsFiles


class CommonSettings(BaseSettings):
    """Connections to the shared infrastructure; defaults point at the ``make run`` stack."""

    model_config = SettingsConfigDict(env_prefix="LORAPLANE_", extra="ignore",
                                      validate_by_name=True, validate_by_alias=True)

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
    tls_ca_file: str = Field(default="", validation_alias=AliasChoices("LORAPLANE_TLS_CA_FILE"))
    """``LORAPLANE_TLS_CA_FILE``: PEM bundle of the CA whose certificates this process
    trusts on the internal gRPC APIs (mutual TLS). Empty with the two below: plaintext
    (trust the network); ``make run`` and the test stack set all three (their dev CA)."""
    tls_cert_file: str = Field(default="", validation_alias=AliasChoices("LORAPLANE_TLS_CERT_FILE"))
    """``LORAPLANE_TLS_CERT_FILE``: this process's certificate (chain, PEM); its SAN URI
    ``spiffe://loraplane/<identity>`` (or CN) is who it is to the servers it calls."""
    tls_key_file: str = Field(default="", validation_alias=AliasChoices("LORAPLANE_TLS_KEY_FILE"))
    """``LORAPLANE_TLS_KEY_FILE``: the private key of that certificate (PEM; never
    logged). Certificate and key files are re-read when they change (rotation)."""

    def tls_files(self) -> TlsFiles | None:
        """The mTLS files (``None``: TLS off); raises ``TlsConfigError`` naming a missing
        or unreadable one."""
        return TlsFiles.from_settings(self.tls_ca_file, self.tls_cert_file, self.tls_key_file)
