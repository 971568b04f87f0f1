"""Load-cost estimate: how long it takes to bring a version into the engine.

The cache-manager fills :class:`Bandwidths` with figures measured on its workers
(EWMA of observed loads); the simulator uses the same class with the constants
of its cost model. Pure arithmetic, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import Tier

MB = 1_000_000
GB = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Bandwidths:
    """Measured (or assumed) throughputs and fixed costs of the load path."""

    host_to_gpu_bytes_per_s: float = 12 * GB
    """Host memory/disk → engine copy throughput."""
    s3_bytes_per_s: float = 200 * MB
    """Object-store download throughput (one stream)."""
    s3_latency_s: float = 0.050
    """Object-store first-byte latency."""
    verify_bytes_per_s: float = 1 * GB
    """Digest + signature verification throughput on the worker."""
    register_s: float = 0.015
    """Engine registration cost (``add_lora``) per load, independent of size."""

    def warm_to_hot_s(self, size_bytes: int) -> float:
        """Seconds to load a version that is WARM on the worker into its engine."""
        return size_bytes / self.host_to_gpu_bytes_per_s + self.register_s

    def cold_to_warm_s(self, size_bytes: int) -> float:
        """Seconds to fetch and verify a COLD version onto the worker host."""
        return (
            self.s3_latency_s
            + size_bytes / self.s3_bytes_per_s
            + size_bytes / self.verify_bytes_per_s
        )

    def load_s(self, size_bytes: int, source: Tier) -> float:
        """Seconds to make a version HOT when it currently sits in ``source``."""
        if source is Tier.HOT:
            return 0.0
        if source is Tier.WARM:
            return self.warm_to_hot_s(size_bytes)
        return self.cold_to_warm_s(size_bytes) + self.warm_to_hot_s(size_bytes)
