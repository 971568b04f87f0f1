"""Settings shared by every service (pydantic-settings, ``LORAPLANE_*`` variables).

Each service defines its own settings class deriving from :class:`CommonSettings`
with its own prefix for service-specific fields (``LORAPLANE_REGISTRY_GRPC_PORT``),
loads it once in ``main`` and passes it down; nothing reads the environment deep
inside helpers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from loraplane.shared.kafka_client import KafkaConnection, SaslMechanism, SecurityProtocol
from loraplane.shared.tls import TlsFiles


class CommonSettings(BaseSettings):
    """Connections to the shared infrastructure; defaults point at the ``make run`` stack."""

    model_config = SettingsConfigDict(env_prefix="LORAPLANE_", extra="ignore",
                                      validate_by_name=True, validate_by_alias=True)

    postgres_dsn: str = "postgresql://loraplane:loraplane-dev@127.0.0.1:19001/loraplane"
    """PostgreSQL DSN (asyncpg)."""
    kafka_bootstrap: str = "127.0.0.1:19002"
    """Kafka bootstrap servers (Tansu locally, apache/kafka in compose)."""
    kafka_security_protocol: SecurityProtocol = Field(
        default="PLAINTEXT", validation_alias=AliasChoices("LORAPLANE_KAFKA_SECURITY_PROTOCOL"))
    """``LORAPLANE_KAFKA_SECURITY_PROTOCOL``: ``PLAINTEXT`` (the local stack's Tansu serves no
    TLS), ``SSL`` (TLS, the broker verified; mutual with the two files below) or
    ``SASL_SSL`` (TLS and a SASL login). Every Kafka client takes it from :meth:`kafka`."""
    kafka_ca_file: str = Field(default="", validation_alias=AliasChoices("LORAPLANE_KAFKA_CA_FILE"))
    """``LORAPLANE_KAFKA_CA_FILE``: PEM bundle of the CA the broker's certificate must chain
    to (empty: the system's roots); needs ``SSL`` or ``SASL_SSL``."""
    kafka_cert_file: str = Field(default="",
                                 validation_alias=AliasChoices("LORAPLANE_KAFKA_CERT_FILE"))
    """``LORAPLANE_KAFKA_CERT_FILE``: this process's client certificate (PEM), for a broker
    that requires one (``ssl.client.auth=required``); with ``_KEY_FILE``."""
    kafka_key_file: str = Field(default="", validation_alias=AliasChoices("LORAPLANE_KAFKA_KEY_FILE"))
    """``LORAPLANE_KAFKA_KEY_FILE``: its private key (PEM; never logged)."""
    kafka_sasl_mechanism: SaslMechanism = Field(
        default="SCRAM-SHA-512", validation_alias=AliasChoices("LORAPLANE_KAFKA_SASL_MECHANISM"))
    """``LORAPLANE_KAFKA_SASL_MECHANISM`` with ``SASL_SSL``: PLAIN, SCRAM-SHA-256 or -512."""
    kafka_sasl_username: str = Field(default="",
                                     validation_alias=AliasChoices("LORAPLANE_KAFKA_SASL_USERNAME"))
    kafka_sasl_password: SecretStr = Field(
        default=SecretStr(""), validation_alias=AliasChoices("LORAPLANE_KAFKA_SASL_PASSWORD"))
    """``LORAPLANE_KAFKA_SASL_USERNAME`` / ``_PASSWORD``: the SASL login (``SASL_SSL`` only;
    the password is never logged)."""
    s3_endpoint: str = "127.0.0.1:19003"
    """S3 endpoint host:port (SeaweedFS locally, MinIO in compose)."""
    s3_access_key: str = "loraplane"
    s3_secret_key: str = "loraplane-dev-secret"
    s3_secure: bool = False
    """``LORAPLANE_S3_SECURE``: speak HTTPS to the S3 endpoint (and verify its certificate)."""
    s3_ca_file: str = ""
    """``LORAPLANE_S3_CA_FILE``: PEM bundle of the CA the S3 endpoint's certificate must
    chain to (a private CA: the local stack's dev CA); empty: the system's roots. Needs
    ``LORAPLANE_S3_SECURE``. For PostgreSQL the DSN carries the same
    (``?sslmode=verify-full&sslrootcert=<CA file>``, which asyncpg and dbmate read)."""
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

    @model_validator(mode="after")
    def _check_kafka(self) -> Self:
        problems = self.kafka().problems()
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def kafka(self) -> KafkaConnection:
        """How this process's Kafka clients connect (every construction site takes it)."""
        return KafkaConnection(
            self.kafka_bootstrap, self.kafka_security_protocol, ca_file=self.kafka_ca_file,
            cert_file=self.kafka_cert_file, key_file=self.kafka_key_file,
            sasl_mechanism=self.kafka_sasl_mechanism, sasl_username=self.kafka_sasl_username,
            sasl_password=self.kafka_sasl_password.get_secret_value())

    @model_validator(mode="after")
    def _check_s3_tls(self) -> Self:
        if self.s3_ca_file and not self.s3_secure:
            raise ValueError("LORAPLANE_S3_CA_FILE is set but LORAPLANE_S3_SECURE is false: "
                             "the CA would never be used (set LORAPLANE_S3_SECURE=true)")
        if self.s3_ca_file and not Path(self.s3_ca_file).is_file():
            raise ValueError(f"LORAPLANE_S3_CA_FILE {self.s3_ca_file} is not a file")
        return self

    def tls_files(self) -> TlsFiles | None:
        """The mTLS files (``None``: TLS off); raises ``TlsConfigError`` naming a missing
        or unreadable one."""
        return TlsFiles.from_settings(self.tls_ca_file, self.tls_cert_file, self.tls_key_file)
