"""Catalogue of served base models (``config/base_models.yaml``).

Admission checks an adapter against its base model's entry (tokenizer
revision, rank limit, target modules and their dimensions, dtypes); the
release CLI copies ``tokenizer_revision`` into the registry record. The demo
entry is generated from the locally built tiny model by
``loraplane demo catalogue --write`` and checked by a unit test.

File shape::

    base_models:
      loraplane/tiny-llama:
        architecture: LlamaForCausalLM
        tokenizer_revision: <sha256 hex of tokenizer.json>
        num_layers: 4
        hidden_size: 256
        vocab_size: 800
        max_lora_rank: 16
        allowed_dtypes: [F32, F16, BF16]
        target_modules:
          q_proj: {in_features: 256, out_features: 256}
          ...
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from loraplane.shared.errors import NotFound

SAFETENSORS_DTYPES = frozenset(
    {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2"}
)
"""dtype codes as written in a safetensors header."""


class UnknownBaseModel(NotFound):
    """The catalogue has no entry for this base model name."""

    code = "unknown_base_model"


class ModuleDims(BaseModel):
    """Shape of one linear projection (``nn.Linear(in_features, out_features)``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    in_features: int = Field(gt=0)
    """Input width; LoRA ``lora_A.weight`` has shape ``(r, in_features)``."""
    out_features: int = Field(gt=0)
    """Output width; LoRA ``lora_B.weight`` has shape ``(out_features, r)``."""


class BaseModelSpec(BaseModel):
    """What the platform needs to know about one served base model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    """Model name, e.g. ``loraplane/tiny-llama`` (the adapters' ``base_model``)."""
    architecture: str
    """HF architecture class, e.g. ``LlamaForCausalLM``."""
    tokenizer_revision: str = Field(pattern=r"^[0-9a-f]{64}$")
    """sha256 hex of the base model's ``tokenizer.json``."""
    num_layers: int = Field(gt=0)
    """Number of transformer layers (``layers.<i>`` with 0 <= i < num_layers)."""
    hidden_size: int = Field(gt=0)
    """Model width."""
    vocab_size: int = Field(gt=0)
    """Embedding rows."""
    max_lora_rank: int = Field(gt=0)
    """Largest LoRA rank the engines serving this model accept (vLLM ``max_lora_rank``)."""
    allowed_dtypes: tuple[str, ...] = Field(min_length=1)
    """safetensors dtype codes accepted for adapter tensors."""
    target_modules: dict[str, ModuleDims] = Field(min_length=1)
    """Projections an adapter may target, with their dimensions."""

    @field_validator("allowed_dtypes")
    @classmethod
    def _known_dtypes(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(v) - SAFETENSORS_DTYPES)
        if unknown:
            raise ValueError(f"unknown safetensors dtypes {unknown}")
        return v

    @property
    def supported_target_modules(self) -> frozenset[str]:
        """Names of the projections an adapter may target."""
        return frozenset(self.target_modules)

    def lora_shapes(self, module: str, rank: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """Expected ``(lora_A shape, lora_B shape)`` for ``module`` at rank ``rank``.

        Raises ``KeyError`` for an unsupported module.
        """
        dims = self.target_modules[module]
        return (rank, dims.in_features), (dims.out_features, rank)


class Catalogue(BaseModel):
    """All served base models, by name."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_models: dict[str, BaseModelSpec]
    """Name → spec."""

    @model_validator(mode="before")
    @classmethod
    def _names_from_keys(cls, data: Any) -> Any:
        """Let the YAML omit ``name`` inside an entry (the key is the name)."""
        if isinstance(data, dict) and isinstance(data.get("base_models"), dict):
            entries = {}
            for key, entry in data["base_models"].items():
                if isinstance(entry, dict):
                    entry = {"name": key, **entry}
                entries[key] = entry
            data = {**data, "base_models": entries}
        return data

    @model_validator(mode="after")
    def _keys_match_names(self) -> Catalogue:
        wrong = [k for k, spec in self.base_models.items() if spec.name != k]
        if wrong:
            raise ValueError(f"entry name differs from its key: {wrong}")
        return self

    def get(self, name: str) -> BaseModelSpec:
        """The spec of ``name``; raises :class:`UnknownBaseModel`."""
        try:
            return self.base_models[name]
        except KeyError:
            raise UnknownBaseModel(f"unknown base model {name!r}") from None

    def __contains__(self, name: object) -> bool:
        return name in self.base_models

    def to_yaml(self) -> str:
        """Canonical YAML text (names as keys, no ``name`` inside entries)."""
        doc = {
            "base_models": {
                name: spec.model_dump(mode="json", exclude={"name"})
                for name, spec in sorted(self.base_models.items())
            }
        }
        return str(yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100))


def load_catalogue(path: Path) -> Catalogue:
    """Read and validate a catalogue YAML file (every problem reported at once)."""
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    return Catalogue.model_validate(data)
