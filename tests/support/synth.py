"""Synthesise LoRA adapters and raw safetensors files (benchmark and test corpus).

The demo adapters (``loraplane.devkit``) are built with PEFT for the tiny model; this
module writes adapters of any shape directly with numpy (no torch), in any float dtype
including BF16, and writes safetensors files byte by byte so tests can craft headers
that no well-behaved library would produce.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from loraplane.admission.checks.tensors import BLOCK_OF_MODULE
from loraplane.shared.catalogue import BaseModelSpec, ModuleDims

_NUMPY_DTYPE: dict[str, str] = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I8": "i1",
                                "I32": "<i4", "U8": "u1"}


@dataclass(frozen=True)
class RawTensor:
    """A tensor as written to a safetensors file: dtype code, shape and raw bytes."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes


def to_raw(values: npt.NDArray[Any], dtype: str) -> RawTensor:
    """Encode a float array as ``dtype`` (``BF16`` by truncating float32 bits)."""
    if dtype == "BF16":
        bits = np.ascontiguousarray(values, dtype="<f4").view("<u4") >> 16
        return RawTensor("BF16", tuple(values.shape), bits.astype("<u2").tobytes())
    return RawTensor(dtype, tuple(values.shape),
                     np.ascontiguousarray(values, dtype=_NUMPY_DTYPE[dtype]).tobytes())


def safetensors_bytes(
    tensors: Mapping[str, RawTensor],
    metadata: Mapping[str, str] | None = None,
    *,
    header: Mapping[str, Any] | None = None,
) -> bytes:
    """A complete safetensors file. ``header`` replaces the computed header entirely."""
    doc: dict[str, Any] = {}
    if metadata is not None:
        doc["__metadata__"] = dict(metadata)
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        doc[name] = {"dtype": t.dtype, "shape": list(t.shape),
                     "data_offsets": [offset, offset + len(t.data)]}
        offset += len(t.data)
    text = json.dumps(header if header is not None else doc, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(tensors[n].data for n in sorted(tensors))


def lora_name(layer: int, module: str, matrix: str) -> str:
    """PEFT's name of a LoRA weight."""
    block = BLOCK_OF_MODULE.get(module, "self_attn")
    return f"base_model.model.model.layers.{layer}.{block}.{module}.lora_{matrix}.weight"


def lora_tensors(
    spec: BaseModelSpec,
    rank: int,
    target_modules: Sequence[str],
    *,
    dtype: str = "F32",
    seed: int = 0,
    std: float = 0.02,
) -> dict[str, RawTensor]:
    """Random LoRA matrices of every layer for ``target_modules`` of ``spec``."""
    rng = np.random.default_rng(seed)
    out: dict[str, RawTensor] = {}
    for layer in range(spec.num_layers):
        for module in target_modules:
            a_shape, b_shape = spec.lora_shapes(module, rank)
            for matrix, shape in (("A", a_shape), ("B", b_shape)):
                values = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
                out[lora_name(layer, module, matrix)] = to_raw(values, dtype)
    return out


def adapter_config(
    *, rank: int, target_modules: Sequence[str], base_model: str, lora_alpha: float | None = None
) -> dict[str, Any]:
    """A minimal PEFT LoRA ``adapter_config.json`` document."""
    return {
        "base_model_name_or_path": base_model,
        "bias": "none",
        "fan_in_fan_out": False,
        "lora_alpha": lora_alpha if lora_alpha is not None else 2 * rank,
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": rank,
        "target_modules": list(target_modules),
        "task_type": "CAUSAL_LM",
        "use_dora": False,
    }


def write_adapter(
    out_dir: Path,
    spec: BaseModelSpec,
    *,
    rank: int,
    target_modules: Sequence[str],
    dtype: str = "F32",
    seed: int = 0,
) -> Path:
    """Write a valid adapter (config + weights) for ``spec`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config = adapter_config(rank=rank, target_modules=target_modules, base_model=spec.name)
    (out_dir / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    data = safetensors_bytes(lora_tensors(spec, rank, target_modules, dtype=dtype, seed=seed),
                             {"format": "pt"})
    (out_dir / "adapter_model.safetensors").write_bytes(data)
    return out_dir


def llama_shape_spec(
    name: str = "bench/llama-7b-shape",
    *,
    hidden: int = 4096,
    intermediate: int = 11008,
    kv_hidden: int = 4096,
    num_layers: int = 32,
    max_lora_rank: int = 64,
    tokenizer_revision: str = "0" * 64,
) -> BaseModelSpec:
    """A catalogue entry with a Llama layer shape (7B by default) for realistic sizes."""
    dims = {
        "q_proj": ModuleDims(in_features=hidden, out_features=hidden),
        "k_proj": ModuleDims(in_features=hidden, out_features=kv_hidden),
        "v_proj": ModuleDims(in_features=hidden, out_features=kv_hidden),
        "o_proj": ModuleDims(in_features=hidden, out_features=hidden),
        "gate_proj": ModuleDims(in_features=hidden, out_features=intermediate),
        "up_proj": ModuleDims(in_features=hidden, out_features=intermediate),
        "down_proj": ModuleDims(in_features=intermediate, out_features=hidden),
    }
    return BaseModelSpec(
        name=name, architecture="LlamaForCausalLM", tokenizer_revision=tokenizer_revision,
        num_layers=num_layers, hidden_size=hidden, vocab_size=32000,
        max_lora_rank=max_lora_rank, allowed_dtypes=("F32", "F16", "BF16"),
        target_modules=dims,
    )
