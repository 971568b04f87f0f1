"""PEFT LoRA adapters for the tiny model, with seeded non-zero weights.

PEFT initialises ``lora_B`` to zero (an adapter that changes nothing); here
both matrices are filled from a generator seeded by the adapter's identity, so
every adapter is deterministic and visibly changes the model's output. The
*zero* adapter keeps ``lora_B`` at zero: serving the base model through the
LoRA path with it gives base-model output (workaround for the vLLM CPU bug
where a no-LoRA request batched with LoRA requests gets an adapter's output).
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loraplane.devkit.model import MODEL_NAME

if TYPE_CHECKING:
    from peft import LoraConfig
    from transformers import PreTrainedModel

ATTENTION_QV = ("q_proj", "v_proj")
"""Query and value projections only."""
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear projection of a Llama layer."""
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
"""The only files an adapter directory holds (besides its signature)."""
LORA_INIT_STD = 0.1
"""Std of the seeded normal values written into ``lora_A`` and ``lora_B``."""


@dataclass(frozen=True)
class AdapterSpec:
    """One adapter version to build."""

    tenant: str
    name: str
    version: str
    rank: int
    target_modules: tuple[str, ...]
    alpha: int = 0
    """LoRA alpha; 0 means ``2 * rank`` (scaling 2)."""
    zero: bool = False
    """Keep ``lora_B`` at zero (a no-op adapter)."""
    base_model: str = field(default=MODEL_NAME)

    @property
    def lora_alpha(self) -> int:
        """Effective alpha."""
        return self.alpha or 2 * self.rank

    @property
    def relpath(self) -> Path:
        """Directory under the adapters root: ``<tenant>/<name>/<version>``."""
        return Path(self.tenant) / self.name / self.version

    def seed(self, base_seed: int) -> int:
        """Stable per-adapter seed (sha256, never Python's ``hash``)."""
        ident = f"{base_seed}/{self.tenant}/{self.name}/{self.version}".encode()
        return int.from_bytes(hashlib.sha256(ident).digest()[:8], "big")

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (for build stamps)."""
        return {
            "tenant": self.tenant,
            "name": self.name,
            "version": self.version,
            "rank": self.rank,
            "target_modules": list(self.target_modules),
            "alpha": self.lora_alpha,
            "zero": self.zero,
            "base_model": self.base_model,
        }


DEMO_ADAPTERS: tuple[AdapterSpec, ...] = (
    AdapterSpec("acme", "support", "2026-11-01.1", 8, ATTENTION_QV),
    AdapterSpec("acme", "support", "2026-11-15.1", 8, ATTENTION_QV),
    AdapterSpec("acme", "code", "2026-11-01.1", 16, ALL_LINEAR),
    AdapterSpec("globex", "legal", "2026-11-01.1", 16, ATTENTION_QV),
    AdapterSpec("globex", "chat", "2026-11-01.1", 8, ALL_LINEAR),
)
"""The demo adapter versions (two tenants)."""

ZERO_ADAPTER = AdapterSpec("_system", "zero", "r8", 8, ATTENTION_QV, zero=True)
"""All-zero rank-8 adapter: the base model served through the LoRA path."""


def config_of(peft_model: Any) -> LoraConfig:
    """The LoRA config PEFT will save for the default adapter."""
    config: LoraConfig = peft_model.peft_config["default"]
    return config


def build_adapter(
    base_model: PreTrainedModel, spec: AdapterSpec, out_dir: Path, *, base_seed: int
) -> None:
    """Write ``adapter_config.json`` + ``adapter_model.safetensors`` for ``spec``.

    ``base_model`` is not modified (a copy is wrapped).
    """
    import torch
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.lora_alpha,
        target_modules=list(spec.target_modules),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed(base_seed))
        peft_model = get_peft_model(copy.deepcopy(base_model), config)
    generator = torch.Generator().manual_seed(spec.seed(base_seed))
    with torch.no_grad():
        for name, param in sorted(peft_model.named_parameters()):
            if ".lora_A." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * LORA_INIT_STD)
            elif ".lora_B." in name:
                if spec.zero:
                    param.zero_()
                else:
                    param.copy_(torch.randn(param.shape, generator=generator) * LORA_INIT_STD)
    saved_config = config_of(peft_model)
    saved_config.base_model_name_or_path = spec.base_model  # a name, never a local path
    saved_config.target_modules = list(spec.target_modules)  # PEFT keeps a set: fix the order
    out_dir.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(out_dir), safe_serialization=True, save_embedding_layers=False)
    for extra in sorted(out_dir.iterdir()):  # PEFT also writes a README.md model card
        if extra.name not in ADAPTER_FILES:
            extra.unlink()
