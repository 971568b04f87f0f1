"""Prometheus metrics of the admission service (prefix ``loraplane_admission_``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from loraplane.shared.metrics import PerRegistry

CHECK_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)
"""Seconds: one check of a tiny adapter takes ~1 ms, a full 7B adapter a few seconds."""


class AdmissionMetrics(PerRegistry):
    """Verdicts by result and reason, check durations, bytes verified, consumer health."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.verdicts = Counter(
            "loraplane_admission_verdicts",
            "Verdicts decided (first decision per version; replays are counted apart).",
            ["result"], registry=registry)
        self.reasons = Counter(
            "loraplane_admission_rejection_reasons",
            "Rejection reasons in decided verdicts, by code (one verdict may add several).",
            ["reason"], registry=registry)
        self.check_duration = Histogram(
            "loraplane_admission_check_duration_seconds",
            "Time per admission stage (source, download, files, signature, config, "
            "compatibility, safetensors, tensors, finite) and for the whole decision "
            "(check=\"total\").",
            ["check"], buckets=CHECK_BUCKETS, registry=registry)
        self.bytes_verified = Counter(
            "loraplane_admission_bytes_verified",
            "Artifact bytes whose digest was verified against the signed manifest.",
            registry=registry)
        self.bytes_downloaded = Counter(
            "loraplane_admission_bytes_downloaded",
            "Artifact bytes downloaded into quarantine.", registry=registry)
        self.replays = Counter(
            "loraplane_admission_replays",
            "Release events whose verdict already existed (redelivery): the stored verdict "
            "was published again.", registry=registry)
        self.skipped = Counter(
            "loraplane_admission_skipped_records",
            "Release records that could not be decided at all (undecodable, no adapter).",
            ["reason"], registry=registry)
        self.consumer_restarts = Counter(
            "loraplane_admission_consumer_restarts",
            "Release consumers recreated after a broker loss or an outage.",
            registry=registry)
        self.retries = Counter(
            "loraplane_admission_retries",
            "Decisions abandoned because a dependency was unavailable (retried later).",
            ["dependency"], registry=registry)
