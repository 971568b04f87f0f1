"""Compatibility with the served base model: model, tokenizer revision, rank, modules."""

from __future__ import annotations

from loraplane.admission.checks.compat import check_compatibility, resolve_base_model
from loraplane.admission.problems import (
    BASE_MODEL_MISMATCH,
    RANK_TOO_LARGE,
    TARGET_MODULE_UNSUPPORTED,
    TOKENIZER_MISMATCH,
)
from loraplane.shared.catalogue import BaseModelSpec, Catalogue


def test_unknown_base_model(catalogue: Catalogue) -> None:
    spec, problems = resolve_base_model(catalogue, "meta-llama/Llama-2-7b-hf")
    assert spec is None
    assert [p.code for p in problems] == [BASE_MODEL_MISMATCH]
    assert "loraplane/tiny-llama" in problems[0].message


def test_compatible(tiny: BaseModelSpec) -> None:
    assert check_compatibility(tiny, tokenizer_revision=tiny.tokenizer_revision,
                               config_base_model=tiny.name, rank=tiny.max_lora_rank,
                               target_modules=("q_proj", "down_proj")) == []


def test_every_incompatibility_reported(tiny: BaseModelSpec) -> None:
    problems = check_compatibility(
        tiny, tokenizer_revision="f" * 64, config_base_model="other/model",
        rank=tiny.max_lora_rank + 1, target_modules=("q_proj", "lm_head", "embed_tokens"))
    assert [p.code for p in problems] == [
        BASE_MODEL_MISMATCH, TOKENIZER_MISMATCH, RANK_TOO_LARGE,
        TARGET_MODULE_UNSUPPORTED, TARGET_MODULE_UNSUPPORTED]
    assert "rank 17 > max_lora_rank 16" in problems[2].message


def test_missing_tokenizer_revision_is_a_mismatch(tiny: BaseModelSpec) -> None:
    (p,) = check_compatibility(tiny, tokenizer_revision="", config_base_model=None, rank=None,
                               target_modules=())
    assert p.code == TOKENIZER_MISMATCH and "(none recorded)" in p.message
