"""Settings of the admission service (``LORAPLANE_*`` / ``LORAPLANE_ADMISSION_*`` variables)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from loraplane.admission.checks.files import SizeLimits
from loraplane.shared.resources import config_file, state_dir
from loraplane.shared.settings import CommonSettings
from loraplane.shared.topics import ADAPTER_ADMISSIONS, ADAPTER_RELEASES

DEFAULT_METRICS_PORT = 19062
"""``make run`` port (stack port base 19000 + 62, see ``loraplane.stack.services``)."""


class AdmissionSettings(CommonSettings):
    """The admission process (``python -m loraplane.admission``)."""

    admission_metrics_port: int = DEFAULT_METRICS_PORT
    """``LORAPLANE_ADMISSION_METRICS_PORT``: Prometheus ``/metrics`` port (0 = off)."""
    admission_bind: str = "127.0.0.1"
    """``LORAPLANE_ADMISSION_BIND``: address the metrics server binds."""
    admission_consumer_group: str = "loraplane-admission"
    """Kafka consumer group reading the release topic (replicas share it)."""
    admission_releases_topic: str = ADAPTER_RELEASES
    """Topic of ``AdapterReleased`` events (tests use a unique copy)."""
    admission_admissions_topic: str = ADAPTER_ADMISSIONS
    """Topic the ``AdmissionEvent`` verdicts go to."""
    admission_artifact_prefix: str = "adapters"
    """First key segment(s) of artifacts in the bucket; the registry's
    ``loraplane.registry.grammar.ARTIFACT_ROOT``."""
    admission_exact_layout: bool = True
    """Also require the registry's exact layout
    ``<prefix>/<tenant>/<name>/<version>/<content digest>/`` for each version."""
    admission_catalogue_path: Path = config_file("base_models.yaml")
    """Catalogue of served base models."""
    admission_platform_keys_dir: Path | None = Field(
        default_factory=lambda: state_dir() / "models" / "keys")
    """Public keys (``*.pub``/``*.pem``) trusted for every tenant; the default holds the
    dev key written by ``loraplane demo build``."""
    admission_tenant_keys_dir: Path | None = Field(
        default_factory=lambda: state_dir() / "tenant-keys")
    """``<dir>/<tenant_id>/*.pub``: keys trusted for one tenant only."""
    admission_quarantine_dir: Path = Field(
        default_factory=lambda: state_dir() / "admission" / "quarantine")
    """Where artifacts are downloaded for checking (emptied at start, one subdirectory per
    check, removed after each verdict)."""
    admission_max_file_bytes: int = Field(default=512 << 20, gt=0)
    """Largest file of an artifact (enforced while downloading)."""
    admission_max_total_bytes: int = Field(default=1 << 30, gt=0)
    """Largest artifact (sum of its files)."""
    admission_max_files: int = Field(default=8, gt=0)
    """Most objects an artifact root may hold."""
    admission_max_header_bytes: int = Field(default=1 << 20, gt=0)
    """Bound on the safetensors JSON header."""
    admission_concurrency: int = Field(default=2, gt=0)
    """Releases checked at once (different partitions)."""
    admission_probe_interval_s: float = Field(default=2.0, gt=0)
    """How often the consumer asks the broker for metadata to detect a broker loss."""

    @model_validator(mode="after")
    def _limits(self) -> AdmissionSettings:
        if self.admission_max_total_bytes < self.admission_max_file_bytes:
            raise ValueError("admission_max_total_bytes must be >= admission_max_file_bytes")
        return self

    @property
    def limits(self) -> SizeLimits:
        """The size limits as the checks take them."""
        return SizeLimits(self.admission_max_file_bytes, self.admission_max_total_bytes,
                          self.admission_max_files)

    @property
    def producer(self) -> str:
        """Producer name in event envelopes: ``admission/<instance>``."""
        return f"admission/{self.instance_id or 'admission-0'}"
