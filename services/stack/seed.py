"""Demo seed for ``make run``: the tiny base model, signed demo adapters, and (once the
registry exists) the demo tenants, API keys and releases through the real release path."""

from __future__ import annotations

from collections.abc import Callable

from loraplane.devkit.builder import build_demo

DEMO_TENANT = "acme"
OTHER_TENANT = "globex"


def seed_models(echo: Callable[[str], None]) -> dict[str, str]:
    """Build (or reuse the cached) model and adapters; return their demo.env entries."""
    manifest = build_demo()
    echo(f"  demo models  ready in {manifest.root} ({len(manifest.adapters)} adapters)")
    names = sorted({a.name for a in manifest.adapters if a.tenant == DEMO_TENANT})
    return {
        "LORAPLANE_BASE_MODEL": manifest.base_model.name,
        "LORAPLANE_BASE_MODEL_DIR": str(manifest.base_model.dir),
        "LORAPLANE_SIGNING_KEY": str(manifest.keys.private_key),
        "LORAPLANE_SIGNING_PUBLIC_KEY": str(manifest.keys.public_key),
        "LORAPLANE_DEMO_TENANT": DEMO_TENANT,
        "LORAPLANE_OTHER_TENANT": OTHER_TENANT,
        "LORAPLANE_DEMO_ADAPTERS": ",".join(names),
    }
