"""Config check: ``adapter_config.json`` is a strict-JSON PEFT LoRA config we can serve.

Strict means: UTF-8, at most :data:`MAX_CONFIG_BYTES`, one JSON object, no duplicate
keys, no ``NaN``/``Infinity`` constants, required fields present with the right types.
Features the engine does not serve (DoRA, per-module ranks, extra trained modules,
layer subsets, LoRA bias, ...) are refused rather than silently ignored.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from loraplane.admission.problems import CONFIG_INVALID, Problem

MAX_CONFIG_BYTES = 64 * 1024
"""Configs are small; anything larger is refused unread."""
CONFIG_PATH = "adapter_config.json"

# field -> value meaning "feature not used"; any other value is refused.
_UNSUPPORTED_WHEN_SET: dict[str, tuple[Any, ...]] = {
    "use_dora": (False, None),
    "modules_to_save": (None, []),
    "layers_to_transform": (None, []),
    "layers_pattern": (None, [], ""),
    "rank_pattern": ({}, None),
    "alpha_pattern": ({}, None),
    "bias": ("none", None),
    "lora_bias": (False, None),
    "layer_replication": (None, []),
    "target_parameters": (None, []),
    "trainable_token_indices": (None, {}, []),
    "fan_in_fan_out": (False, None),
    "use_qalora": (False, None),
    "alora_invocation_tokens": (None, []),
}


@dataclass(frozen=True, slots=True)
class LoraConfigView:
    """The fields of a PEFT LoRA config that admission relies on."""

    r: int
    """LoRA rank."""
    lora_alpha: float
    """Scaling numerator."""
    target_modules: tuple[str, ...]
    """Targeted projections, in file order."""
    base_model: str
    """``base_model_name_or_path``."""


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constants(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def parse_strict_json(data: bytes) -> Any:
    """Parse ``data`` as strict JSON (UTF-8, no duplicate keys, no NaN/Infinity).

    Raises ``ValueError`` (with the reason) on anything else.
    """
    text = data.decode("utf-8")  # UnicodeDecodeError is a ValueError
    return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> TypeGuard[float]:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def check_config_bytes(data: bytes) -> tuple[LoraConfigView | None, list[Problem]]:
    """Parse and validate config bytes; every problem is reported."""

    def bad(msg: str) -> Problem:
        return Problem(CONFIG_INVALID, msg, CONFIG_PATH)

    if len(data) > MAX_CONFIG_BYTES:
        return None, [bad(f"{len(data)} bytes > limit {MAX_CONFIG_BYTES}")]
    try:
        doc = parse_strict_json(data)
    except (ValueError, RecursionError) as exc:
        return None, [bad(f"not strict JSON: {exc}")]
    if not isinstance(doc, dict):
        return None, [bad(f"top level is a {type(doc).__name__}, not an object")]

    problems: list[Problem] = []
    required = ("peft_type", "r", "lora_alpha", "target_modules", "base_model_name_or_path")
    missing = [f for f in required if f not in doc]
    if missing:
        problems.append(bad("missing fields: " + ", ".join(missing)))

    peft_type = doc.get("peft_type")
    if "peft_type" in doc and peft_type != "LORA":
        problems.append(bad(f"peft_type is {peft_type!r}, only 'LORA' is served"))
    r = doc.get("r")
    if "r" in doc and not (_is_int(r) and r > 0):
        problems.append(bad(f"r must be a positive integer, got {r!r}"))
    alpha = doc.get("lora_alpha")
    if "lora_alpha" in doc and not (_is_number(alpha) and alpha > 0):
        problems.append(bad(f"lora_alpha must be a positive number, got {alpha!r}"))
    targets = doc.get("target_modules")
    if "target_modules" in doc:
        if not isinstance(targets, list) or not targets:
            problems.append(bad("target_modules must be a non-empty list of module names "
                                "(regular expressions are not accepted)"))
        elif not all(isinstance(t, str) and t.isidentifier() for t in targets):
            problems.append(bad(f"target_modules must be plain module names, got {targets!r}"))
        elif len(set(targets)) != len(targets):
            problems.append(bad(f"target_modules has duplicates: {targets!r}"))
    base = doc.get("base_model_name_or_path")
    if "base_model_name_or_path" in doc and not (isinstance(base, str) and base):
        problems.append(bad(f"base_model_name_or_path must be a non-empty string, got {base!r}"))
    task = doc.get("task_type", "CAUSAL_LM")
    if task not in ("CAUSAL_LM", None):
        problems.append(bad(f"task_type {task!r} is not served (CAUSAL_LM only)"))
    for name, unused in _UNSUPPORTED_WHEN_SET.items():
        if name in doc and doc[name] not in unused:
            problems.append(bad(f"{name}={doc[name]!r} is not supported"))

    if problems:
        return None, problems
    return LoraConfigView(
        r=int(r),  # type: ignore[arg-type]  # checked above
        lora_alpha=float(alpha),  # type: ignore[arg-type]
        target_modules=tuple(targets),  # type: ignore[arg-type]
        base_model=str(base),
    ), []


def check_config_file(path: Path) -> tuple[LoraConfigView | None, list[Problem]]:
    """:func:`check_config_bytes` of a file, reading at most one byte past the limit."""
    try:
        with Path(path).open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        return None, []  # reported by the files check
    except OSError as exc:
        return None, [Problem(CONFIG_INVALID, f"unreadable: {exc}", CONFIG_PATH)]
    return check_config_bytes(data)


def check_config_matches_release(
    config: LoraConfigView,
    *,
    rank: int,
    target_modules: Sequence[str],
    lora_alpha: float,
    artifact_format: str,
) -> list[Problem]:
    """The config agrees with what the registry recorded for the version."""
    problems: list[Problem] = []
    if artifact_format != "peft":
        problems.append(Problem(CONFIG_INVALID, f"format {artifact_format!r} is not 'peft'"))
    if rank != config.r:
        problems.append(Problem(CONFIG_INVALID, f"config r={config.r} but the registry "
                                f"recorded rank {rank}", CONFIG_PATH))
    if target_modules and set(target_modules) != set(config.target_modules):
        problems.append(Problem(CONFIG_INVALID, f"config target_modules "
                                f"{sorted(config.target_modules)} differ from the registry's "
                                f"{sorted(target_modules)}", CONFIG_PATH))
    if lora_alpha and not math.isclose(lora_alpha, config.lora_alpha, rel_tol=1e-6):
        problems.append(Problem(CONFIG_INVALID, f"config lora_alpha={config.lora_alpha} but "
                                f"the registry recorded {lora_alpha}", CONFIG_PATH))
    return problems
