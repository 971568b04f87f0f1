"""Compatibility check against the catalogue of served base models.

The base model must be served and be the one the adapter config names; the tokenizer
revision recorded for the version must be the served model's; the rank must not exceed
the engine's ``max_lora_rank`` (a larger rank kills a vLLM engine, see FACTS.md); every
target module must be one the engine supports for that model.
"""

from __future__ import annotations

from collections.abc import Sequence

from loraplane.admission.problems import (
    BASE_MODEL_MISMATCH,
    RANK_TOO_LARGE,
    TARGET_MODULE_UNSUPPORTED,
    TOKENIZER_MISMATCH,
    Problem,
)
from loraplane.shared.catalogue import BaseModelSpec, Catalogue


def resolve_base_model(
    catalogue: Catalogue, base_model: str
) -> tuple[BaseModelSpec | None, list[Problem]]:
    """The catalogue entry of the released ``base_model``, or a problem."""
    if base_model in catalogue:
        return catalogue.get(base_model), []
    served = ", ".join(sorted(catalogue.base_models)) or "none"
    return None, [Problem(BASE_MODEL_MISMATCH, f"base model {base_model[:128]!r} is not served "
                          f"(served: {served})")]


def check_compatibility(
    spec: BaseModelSpec,
    *,
    tokenizer_revision: str,
    config_base_model: str | None,
    rank: int | None,
    target_modules: Sequence[str],
) -> list[Problem]:
    """Problems of the version against its (served) base model ``spec``.

    ``config_base_model``, ``rank`` and ``target_modules`` come from the adapter config
    (None / empty when the config did not parse; those checks are then skipped).
    """
    problems: list[Problem] = []
    if config_base_model is not None and config_base_model != spec.name:
        problems.append(Problem(BASE_MODEL_MISMATCH, f"config base_model_name_or_path "
                                f"{config_base_model[:128]!r} differs from the released base "
                                f"model {spec.name!r}", "adapter_config.json"))
    if tokenizer_revision != spec.tokenizer_revision:
        got = tokenizer_revision[:64] or "(none recorded)"
        problems.append(Problem(TOKENIZER_MISMATCH, f"tokenizer revision {got} differs from "
                                f"{spec.name}'s {spec.tokenizer_revision}"))
    if rank is not None and rank > spec.max_lora_rank:
        problems.append(Problem(RANK_TOO_LARGE, f"rank {rank} > max_lora_rank "
                                f"{spec.max_lora_rank} of {spec.name}"))
    for module in target_modules:
        if module not in spec.supported_target_modules:
            problems.append(Problem(TARGET_MODULE_UNSUPPORTED, f"target module {module!r} is "
                                    f"not supported for {spec.name} (supported: "
                                    f"{', '.join(sorted(spec.supported_target_modules))})"))
    return problems
