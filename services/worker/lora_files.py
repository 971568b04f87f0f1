"""Write PEFT LoRA adapter directories for a Llama-style base model without PEFT.

Used for the worker's all-zero adapter (the base model served through the LoRA path,
see :mod:`loraplane.worker.guard`) and for the large adapters of the cold-path benchmark.
Only ``adapter_config.json`` and ``adapter_model.safetensors`` are written, exactly the
two files admission accepts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
ALL_LINEAR = (*ATTENTION, *MLP)
"""Every linear projection of a Llama decoder layer."""

Fill = Callable[[tuple[int, int], str], np.ndarray]
"""Returns the float32 array for a tensor shape and name."""


@dataclass(frozen=True)
class LlamaDims:
    """Shapes of a Llama-style model read from its ``config.json``."""

    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> LlamaDims:
        """Read ``model_dir/config.json``."""
        cfg = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        return cls(
            num_layers=int(cfg["num_hidden_layers"]),
            hidden=hidden,
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate=int(cfg["intermediate_size"]),
        )

    def module(self, name: str) -> tuple[str, int, int]:
        """``(block, in_features, out_features)`` of a projection."""
        q_out = self.heads * self.head_dim
        kv_out = self.kv_heads * self.head_dim
        table = {
            "q_proj": ("self_attn", self.hidden, q_out),
            "k_proj": ("self_attn", self.hidden, kv_out),
            "v_proj": ("self_attn", self.hidden, kv_out),
            "o_proj": ("self_attn", q_out, self.hidden),
            "gate_proj": ("mlp", self.hidden, self.intermediate),
            "up_proj": ("mlp", self.hidden, self.intermediate),
            "down_proj": ("mlp", self.intermediate, self.hidden),
        }
        return table[name]

    def adapter_bytes(self, rank: int, modules: Sequence[str]) -> int:
        """Tensor bytes (float32) of a rank-``rank`` adapter on ``modules``."""
        per_layer = sum(rank * (self.module(m)[1] + self.module(m)[2]) for m in modules)
        return per_layer * self.num_layers * 4


def zeros(shape: tuple[int, int], name: str) -> np.ndarray:
    """A zero tensor (the no-op adapter)."""
    return np.zeros(shape, dtype=np.float32)


def write_lora(
    out_dir: Path,
    dims: LlamaDims,
    *,
    base_model: str,
    rank: int,
    modules: Sequence[str],
    fill: Fill = zeros,
    alpha: int | None = None,
) -> Path:
    """Write a PEFT LoRA adapter into ``out_dir`` (created); returns ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, np.ndarray] = {}
    for layer in range(dims.num_layers):
        for module in modules:
            block, fan_in, fan_out = dims.module(module)
            prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = fill((rank, fan_in), f"{prefix}.lora_A")
            tensors[f"{prefix}.lora_B.weight"] = fill((fan_out, rank), f"{prefix}.lora_B")
    save_file(tensors, str(out_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {
        "base_model_name_or_path": base_model,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "lora_alpha": alpha if alpha is not None else 2 * rank,
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": rank,
        "target_modules": list(modules),
        "task_type": "CAUSAL_LM",
        "use_dora": False,
        "use_rslora": False,
    }
    tmp = out_dir / ".adapter_config.json.tmp"
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, out_dir / "adapter_config.json")
    return out_dir


def read_rank(adapter_dir: Path) -> int:
    """``r`` of ``adapter_dir/adapter_config.json`` (raises ``ValueError`` if unusable)."""
    try:
        cfg = json.loads((Path(adapter_dir) / "adapter_config.json").read_text(encoding="utf-8"))
        rank = cfg["r"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{adapter_dir}: unreadable adapter_config.json: {exc}") from exc
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise ValueError(f"{adapter_dir}: adapter_config.json has r={rank!r}")
    return rank
