"""Cost model of the simulator: turns hits and loads into time to first token.

::

    TTFT = slot wait + load + base_ttft + prompt_tokens * prefill_ms_per_token
    load = 0                                                  (HOT, in a GPU slot)
         = activate + size / host_to_gpu                      (HOT, registered, not in a slot)
         = register + activate + size / host_to_gpu           (WARM)
         = s3_latency + size / s3 + size / verify + WARM load  (COLD)

A request then stays in flight for ``output_tokens * tpot_ms`` more, which
keeps its version busy (not evictable) on that worker.

In the simulator's CLI and ``make bench-policy`` (:meth:`CostModel.measured`,
:meth:`CostModel.from_units`), ``register`` and ``activate`` default to the engine's
measured costs in ``engine_costs.json`` beside this module (:func:`measured_engine_costs`),
written by ``python -m benchmarks.cold --sim-costs services/sim/engine_costs.json`` (the
bench-cold run; its command, date and load average inside); a GPU deployment passes its
own (``loraplane sim --register-ms/--activate-ms``, ``CostModel.from_units``). A bare
``CostModel()`` keeps the fixed reference constants the policies' unit tests assume.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

from loraplane.policy.cost import MB, Bandwidths

ENGINE_COSTS_FILE = "engine_costs.json"
"""The bench's measured engine costs, package data of :mod:`loraplane.sim`."""


@dataclass(frozen=True, slots=True)
class EngineCosts:
    """The engine's two moves as measured by ``benchmarks.cold`` (fixed parts, ms)."""

    register_ms: float
    """WARM → registered: ``add_lora`` less its slot activation."""
    activate_ms: float
    """Registered → GPU slot: vLLM's ``activate_adapter``."""
    source: str
    """The command, date and machine load of the run that measured them."""


def parse_engine_costs(text: str) -> EngineCosts:
    """:class:`EngineCosts` from the JSON ``benchmarks.cold`` writes; raises ValueError naming
    every missing or negative field."""
    data = json.loads(text)
    problems = [f"{k} missing or not a number >= 0" for k in ("register_ms", "activate_ms")
                if not isinstance(data.get(k), int | float) or data[k] < 0]
    if problems:
        raise ValueError(f"{ENGINE_COSTS_FILE}: " + "; ".join(problems))
    return EngineCosts(float(data["register_ms"]), float(data["activate_ms"]),
                       f"{data.get('command', '?')} at {data.get('measured_at', '?')}")


@functools.cache
def measured_engine_costs() -> EngineCosts:
    """The checked-in measurement (read once)."""
    text = resources.files("loraplane.sim").joinpath(ENGINE_COSTS_FILE).read_text()
    return parse_engine_costs(text)


def measured_bandwidths() -> Bandwidths:
    """The load path's defaults with the engine's two moves as measured."""
    costs = measured_engine_costs()
    return replace(Bandwidths(), register_s=costs.register_ms / 1000.0,
                   activate_s=costs.activate_ms / 1000.0)


@dataclass(frozen=True, slots=True)
class CostModel:
    """Constants of the simulated serving path (defaults: an 8B model on one modern GPU)."""

    bandwidths: Bandwidths = field(default_factory=Bandwidths)
    """Load path: host→GPU, S3 bandwidth and latency, verification, registration. The bare
    dataclass keeps the fixed reference constants (:class:`Bandwidths`: what the unit tests
    of the policies assume); :meth:`measured` and :meth:`from_units` (the simulator's CLI
    and ``make bench-policy``) take the engine's two moves as measured."""
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
    def measured() -> CostModel:
        """The defaults with the engine's two moves from the bench's measurement
        (:func:`measured_bandwidths`): what ``loraplane sim`` and ``make bench-policy`` run."""
        return CostModel(bandwidths=measured_bandwidths())

    @staticmethod
    def from_units(
        *,
        host_to_gpu_mb_per_s: float = 12_000.0,
        s3_mb_per_s: float = 200.0,
        s3_latency_ms: float = 50.0,
        verify_mb_per_s: float = 1_000.0,
        register_ms: float | None = None,
        activate_ms: float | None = None,
        prefill_ms_per_token: float = 0.05,
        base_ttft_ms: float = 20.0,
        tpot_ms: float = 15.0,
    ) -> CostModel:
        """Build from the CLI's units (MB/s, ms); ``register_ms`` / ``activate_ms`` left
        None take the measured defaults (:func:`measured_engine_costs`)."""
        measured = measured_engine_costs()
        register_ms = measured.register_ms if register_ms is None else register_ms
        activate_ms = measured.activate_ms if activate_ms is None else activate_ms
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
