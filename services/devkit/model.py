"""The tiny Llama base model (random weights, seeded), built with transformers.

It is not trained: outputs are gibberish but deterministic, which is all the
serving path needs (greedy decoding gives the same tokens every time, and an
adapter visibly changes them).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loraplane.devkit.tokenizer import MODEL_MAX_LENGTH, build_tokenizer, save_tokenizer

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM

MODEL_NAME = "loraplane/tiny-llama"
"""The base model's name: the adapters' ``base_model`` and the registry's key."""
MODEL_NAME_CONFIG_KEY = "loraplane_model_name"
"""Extra ``config.json`` key holding :data:`MODEL_NAME` (transformers drops
``_name_or_path`` on save)."""


@dataclass(frozen=True)
class TinyLlamaShape:
    """Architecture hyper-parameters of the tiny model."""

    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = MODEL_MAX_LENGTH

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (for build stamps)."""
        return asdict(self)


def build_base_model(out_dir: Path, *, seed: int, shape: TinyLlamaShape) -> LlamaForCausalLM:
    """Write tokenizer + config + ``model.safetensors`` into ``out_dir``.

    Weights come from transformers' own initialiser under ``torch.manual_seed(seed)``
    (the global RNG is restored afterwards). Returns the in-memory model, which
    the adapter builder reuses.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    save_tokenizer(tokenizer, out_dir)

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=shape.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        dtype="float32",
    )
    setattr(config, MODEL_NAME_CONFIG_KEY, MODEL_NAME)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    model.eval()  # type: ignore[no-untyped-call]
    model.save_pretrained(str(out_dir), safe_serialization=True)
    return model
