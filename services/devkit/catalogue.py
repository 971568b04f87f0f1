"""Derive base-model catalogue entries from a built model directory.

``config/base_models.yaml`` is generated from the built tiny model
(``loraplane demo catalogue --write``) and checked against it by a unit test
and ``loraplane demo catalogue --check``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from safetensors import safe_open

from loraplane.devkit.model import MODEL_NAME_CONFIG_KEY
from loraplane.shared.catalogue import BaseModelSpec, Catalogue, ModuleDims

ENGINE_MAX_LORA_RANK = 16
"""``max_lora_rank`` the engines are started with."""
ALLOWED_ADAPTER_DTYPES = ("F32", "F16", "BF16")
"""safetensors dtypes accepted for adapter tensors."""
_PROJECTIONS = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}


def catalogue_entry(model_dir: Path, name: str | None = None) -> BaseModelSpec:
    """The catalogue entry of the Llama-style model in ``model_dir``.

    Projection dimensions come from the weight shapes in ``model.safetensors``
    (layer 0; ``weight`` is ``(out_features, in_features)``), the name from the
    config's ``loraplane_model_name`` unless given.
    """
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    modules: dict[str, ModuleDims] = {}
    with safe_open(str(model_dir / "model.safetensors"), framework="np") as weights:
        for proj, block in _PROJECTIONS.items():
            shape = weights.get_slice(f"model.layers.0.{block}.{proj}.weight").get_shape()
            modules[proj] = ModuleDims(in_features=shape[1], out_features=shape[0])
    tokenizer_sha = hashlib.sha256((model_dir / "tokenizer.json").read_bytes()).hexdigest()
    return BaseModelSpec(
        name=name or config[MODEL_NAME_CONFIG_KEY],
        architecture=config["architectures"][0],
        tokenizer_revision=tokenizer_sha,
        num_layers=config["num_hidden_layers"],
        hidden_size=config["hidden_size"],
        vocab_size=config["vocab_size"],
        max_lora_rank=ENGINE_MAX_LORA_RANK,
        allowed_dtypes=ALLOWED_ADAPTER_DTYPES,
        target_modules=modules,
    )


def catalogue_problems(catalogue: Catalogue, built: BaseModelSpec) -> list[str]:
    """Every field where ``catalogue``'s entry for ``built.name`` differs from ``built``."""
    if built.name not in catalogue:
        return [f"{built.name}: missing from the catalogue"]
    entry = catalogue.get(built.name)
    want = built.model_dump()
    have = entry.model_dump()
    return [
        f"{built.name}.{k}: catalogue has {have[k]!r}, built model has {want[k]!r}"
        for k in want
        if have[k] != want[k]
    ]
