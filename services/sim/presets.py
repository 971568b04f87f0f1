"""Reference traces of the policy benchmark (``make bench-policy``) and the tests.

Each is generated deterministically from the Azure 2023 arrivals with a fixed
seed, so the benchmark needs no checked-in trace; ``loraplane trace gen --preset
NAME`` writes the same file. ``conv-1h`` and ``large-1h`` are also checked in
(gzip) under ``tests/data/traces/`` so the unit tests run without the Azure files.
"""

from __future__ import annotations

from loraplane.sim.generator import GenConfig

PRESETS: dict[str, GenConfig] = {
    "conv-1h": GenConfig(
        seed=1, sources=("conv",), hours=1, tenants=150, mean_adapters_per_tenant=8.0,
        zipf_alpha=0.8,
    ),
    "large-1h": GenConfig(
        seed=3, sources=("conv",), hours=1, tenants=300, mean_adapters_per_tenant=8.0,
        zipf_alpha=0.8,
    ),
    "mixed-3h": GenConfig(
        seed=2, sources=("conv", "code"), hours=3, tenants=150, mean_adapters_per_tenant=8.0,
        zipf_alpha=0.8,
    ),
}
"""Reference traces, all Zipf 0.8 popularity with drift, bursts, batch sweeps and canary releases:
``conv-1h`` ~1 k versions of 150 tenants on the conversation arrivals (1 h, ~19 k requests);
``large-1h`` the same arrivals spread over 300 tenants (~2 k versions: a long tail);
``mixed-3h`` 150 tenants on conversation + code arrivals tiled over 3 h (~85 k requests)."""
