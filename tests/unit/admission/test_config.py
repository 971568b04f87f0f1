"""adapter_config.json: strict JSON, PEFT LoRA fields, unsupported features, registry agreement."""

from __future__ import annotations

import json
from typing import Any

import pytest

from loraplane.admission.checks.config import (
    MAX_CONFIG_BYTES,
    check_config_bytes,
    check_config_matches_release,
)
from loraplane.admission.problems import CONFIG_INVALID
from tests.support.synth import adapter_config

GOOD = adapter_config(rank=8, target_modules=("q_proj", "v_proj"),
                      base_model="loraplane/tiny-llama")


def _messages(doc: Any) -> list[str]:
    data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    view, problems = check_config_bytes(data)
    assert (view is None) == bool(problems)
    assert all(p.code == CONFIG_INVALID and p.path == "adapter_config.json" for p in problems)
    return [p.message for p in problems]


def test_valid_config() -> None:
    view, problems = check_config_bytes(json.dumps(GOOD).encode())
    assert problems == []
    assert view is not None
    assert (view.r, view.lora_alpha, view.target_modules, view.base_model) == (
        8, 16.0, ("q_proj", "v_proj"), "loraplane/tiny-llama")


@pytest.mark.parametrize(("data", "fragment"), [
    (b"{not json", "not strict JSON"),
    (b'{"r": 8, "r": 16}', "duplicate key"),
    (b'{"lora_alpha": NaN}', "non-standard JSON constant"),
    (b'{"lora_alpha": Infinity}', "non-standard JSON constant"),
    (b"\xff\xfe{}", "not strict JSON"),
    (b"[1, 2]", "not an object"),
    (b"[" * 100_000 + b"]" * 100_000, "bytes > limit"),
    (b'"' + b"a" * MAX_CONFIG_BYTES + b'"', "bytes > limit"),
])
def test_not_strict_json(data: bytes, fragment: str) -> None:
    messages = _messages(data)
    assert any(fragment in m for m in messages), messages


def test_deeply_nested_json_within_limit() -> None:
    messages = _messages(b"[" * 30_000 + b"]" * 30_000)
    assert messages


def test_missing_fields_are_all_named() -> None:
    doc = {k: v for k, v in GOOD.items() if k not in ("r", "target_modules", "peft_type")}
    (message,) = _messages(doc)
    assert message == "missing fields: peft_type, r, target_modules"


@pytest.mark.parametrize(("change", "fragment"), [
    ({"peft_type": "PREFIX_TUNING"}, "peft_type"),
    ({"r": 0}, "r must be"),
    ({"r": True}, "r must be"),
    ({"r": 8.0}, "r must be"),
    ({"lora_alpha": -1}, "lora_alpha"),
    ({"lora_alpha": "16"}, "lora_alpha"),
    ({"target_modules": "q_proj|v_proj"}, "regular expressions"),
    ({"target_modules": []}, "non-empty list"),
    ({"target_modules": ["q_proj", "q_proj"]}, "duplicates"),
    ({"target_modules": [".*proj"]}, "plain module names"),
    ({"base_model_name_or_path": ""}, "base_model_name_or_path"),
    ({"use_dora": True}, "use_dora"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"rank_pattern": {"q_proj": 4}}, "rank_pattern"),
    ({"layers_to_transform": [0]}, "layers_to_transform"),
    ({"bias": "all"}, "bias"),
    ({"task_type": "SEQ_CLS"}, "task_type"),
])
def test_invalid_fields(change: dict[str, Any], fragment: str) -> None:
    messages = _messages({**GOOD, **change})
    assert len(messages) == 1 and fragment in messages[0], messages


def test_every_field_problem_is_reported() -> None:
    assert len(_messages({**GOOD, "r": -1, "lora_alpha": 0, "use_dora": True})) == 3


def test_peft_written_config_with_null_features_passes() -> None:
    doc = {**GOOD, "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {},
           "alora_invocation_tokens": None, "lora_bias": False, "use_qalora": False}
    assert _messages(doc) == []


def test_release_agreement() -> None:
    view, _ = check_config_bytes(json.dumps(GOOD).encode())
    assert view is not None
    ok = check_config_matches_release(view, rank=8, target_modules=["v_proj", "q_proj"],
                                      lora_alpha=16.0, artifact_format="peft")
    assert ok == []
    bad = check_config_matches_release(view, rank=16, target_modules=["q_proj"],
                                       lora_alpha=32.0, artifact_format="gguf")
    assert len(bad) == 4 and all(p.code == CONFIG_INVALID for p in bad)
    # zero / empty registry values mean "not recorded" and are not compared
    assert check_config_matches_release(view, rank=8, target_modules=[], lora_alpha=0.0,
                                        artifact_format="peft") == []
