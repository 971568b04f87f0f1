"""Load-cost estimate: how long it takes to bring a version into the engine.

HOT has two levels in vLLM, and each move has its own cost: WARM → *registered*
(``add_lora``: the files read into the engine's host memory, ``register_s``) and
registered → *slot* (``activate_adapter``: the weights copied into one of the ``max_loras``
GPU slots a batch reads, ``activate_s`` + size / ``host_to_gpu_bytes_per_s``; the engine
does it itself for every batch that needs an adapter not in a slot). ``add_lora`` does
both, so a WARM → HOT load pays both.

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
    """WARM → registered (``add_lora`` without its slot activation), independent of size."""
    activate_s: float = 0.0
    """Registered → GPU slot, fixed part (vLLM's ``activate_adapter``; the copy itself is
    size / ``host_to_gpu_bytes_per_s``)."""

    def activation_s(self, size_bytes: int) -> float:
        """Seconds to move a registered version into a GPU slot."""
        return self.activate_s + size_bytes / self.host_to_gpu_bytes_per_s

    def warm_to_hot_s(self, size_bytes: int) -> float:
        """Seconds to load a version that is WARM on the worker into its engine: registered,
        then activated into a slot (the same sum as :meth:`activation_s` + ``register_s``, in
        the order that keeps the one-level figures bit for bit)."""
        return size_bytes / self.host_to_gpu_bytes_per_s + self.register_s + self.activate_s

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
