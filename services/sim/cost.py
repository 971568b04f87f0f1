"""Cost model of the simulator: turns hits and loads into time to first token.

::

    TTFT = slot wait + load + base_ttft + prompt_tokens * prefill_ms_per_token
    load = 0                                                  (HOT, in a GPU slot)
         = activate + size / host_to_gpu                      (HOT, registered, not in a slot)
         = register + activate + size / host_to_gpu           (WARM)
         = s3_latency + size / s3 + size / verify + WARM load  (COLD)

A request then stays in flight for ``output_tokens * tpot_ms`` more, which
keeps its version busy (not evictable) on that worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loraplane.policy.cost import MB, Bandwidths


@dataclass(frozen=True, slots=True)
class CostModel:
    """Constants of the simulated serving path (defaults: an 8B model on one modern GPU)."""

    bandwidths: Bandwidths = field(default_factory=Bandwidths)
    """Load path: host→GPU, S3 bandwidth and latency, verification, registration."""
    prefill_ms_per_token: float = 0.05
    """Prefill cost per prompt token (20 k tokens/s)."""
    base_ttft_ms: float = 20.0
    """Scheduling + first decode step, paid by every request."""
    tpot_ms: float = 15.0
    """Time per output token: how long a request keeps its version busy after TTFT."""

    def as_dict(self) -> dict[str, Any]:
        """The constants, in the units the CLI takes, for printing with results."""
        bw = self.bandwidths
        return {
            "host_to_gpu_mb_per_s": bw.host_to_gpu_bytes_per_s / MB,
            "s3_mb_per_s": bw.s3_bytes_per_s / MB,
            "s3_latency_ms": bw.s3_latency_s * 1000.0,
            "verify_mb_per_s": bw.verify_bytes_per_s / MB,
            "register_ms": bw.register_s * 1000.0,
            "activate_ms": bw.activate_s * 1000.0,
            "prefill_ms_per_token": self.prefill_ms_per_token,
            "base_ttft_ms": self.base_ttft_ms,
            "tpot_ms": self.tpot_ms,
        }

    @staticmethod
    def from_units(
        *,
        host_to_gpu_mb_per_s: float = 12_000.0,
        s3_mb_per_s: float = 200.0,
        s3_latency_ms: float = 50.0,
        verify_mb_per_s: float = 1_000.0,
        register_ms: float = 15.0,
        activate_ms: float = 0.0,
        prefill_ms_per_token: float = 0.05,
        base_ttft_ms: float = 20.0,
        tpot_ms: float = 15.0,
    ) -> CostModel:
        """Build from the CLI's units (MB/s, ms)."""
        for name, value in (
            ("host_to_gpu_mb_per_s", host_to_gpu_mb_per_s),
            ("s3_mb_per_s", s3_mb_per_s),
            ("verify_mb_per_s", verify_mb_per_s),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        for name, value in (
            ("s3_latency_ms", s3_latency_ms),
            ("register_ms", register_ms),
            ("activate_ms", activate_ms),
            ("prefill_ms_per_token", prefill_ms_per_token),
            ("base_ttft_ms", base_ttft_ms),
            ("tpot_ms", tpot_ms),
        ):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        return CostModel(
            bandwidths=Bandwidths(
                host_to_gpu_bytes_per_s=host_to_gpu_mb_per_s * MB,
                s3_bytes_per_s=s3_mb_per_s * MB,
                s3_latency_s=s3_latency_ms / 1000.0,
                verify_bytes_per_s=verify_mb_per_s * MB,
                register_s=register_ms / 1000.0,
                activate_s=activate_ms / 1000.0,
            ),
            prefill_ms_per_token=prefill_ms_per_token,
            base_ttft_ms=base_ttft_ms,
            tpot_ms=tpot_ms,
        )
