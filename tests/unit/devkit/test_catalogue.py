"""config/base_models.yaml: loader validation and agreement with the built model."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from loraplane.devkit.builder import DemoManifest
from loraplane.devkit.catalogue import catalogue_entry, catalogue_problems
from loraplane.devkit.model import MODEL_NAME
from loraplane.shared.catalogue import Catalogue, UnknownBaseModel, load_catalogue

CATALOGUE = Path(__file__).resolve().parents[3] / "config" / "base_models.yaml"


def test_built_model_matches_the_catalogue(demo: DemoManifest) -> None:
    catalogue = load_catalogue(CATALOGUE)
    built = catalogue_entry(demo.base_model.dir)
    assert catalogue_problems(catalogue, built) == []
    assert catalogue.get(MODEL_NAME).tokenizer_revision == demo.base_model.tokenizer_revision


def test_catalogue_entry_values(demo: DemoManifest) -> None:
    spec = load_catalogue(CATALOGUE).get(MODEL_NAME)
    assert spec.num_layers == 4 and spec.hidden_size == 256 and spec.max_lora_rank == 16
    assert spec.supported_target_modules == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    assert spec.lora_shapes("k_proj", 8) == ((8, 256), (128, 8))
    assert spec.lora_shapes("down_proj", 16) == ((16, 512), (256, 16))
    assert "F32" in spec.allowed_dtypes


def test_mismatch_is_reported_field_by_field(demo: DemoManifest) -> None:
    built = catalogue_entry(demo.base_model.dir)
    wrong = built.model_copy(update={"tokenizer_revision": "0" * 64, "num_layers": 5})
    problems = catalogue_problems(Catalogue(base_models={MODEL_NAME: wrong}), built)
    assert len(problems) == 2
    assert any("tokenizer_revision" in p for p in problems)
    assert catalogue_problems(Catalogue(base_models={}), built) == [
        f"{MODEL_NAME}: missing from the catalogue"
    ]


def test_yaml_round_trip(tmp_path: Path) -> None:
    catalogue = load_catalogue(CATALOGUE)
    (tmp_path / "c.yaml").write_text(catalogue.to_yaml())
    assert load_catalogue(tmp_path / "c.yaml") == catalogue


def test_unknown_model() -> None:
    with pytest.raises(UnknownBaseModel):
        load_catalogue(CATALOGUE).get("nobody/model")


def test_invalid_entries_report_every_problem(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(
        "base_models:\n"
        "  m:\n"
        "    architecture: LlamaForCausalLM\n"
        "    tokenizer_revision: nothex\n"
        "    num_layers: 0\n"
        "    hidden_size: 8\n"
        "    vocab_size: 8\n"
        "    max_lora_rank: 8\n"
        "    allowed_dtypes: [F32, FP4]\n"
        "    target_modules: {q_proj: {in_features: 8, out_features: -1}}\n"
    )
    with pytest.raises(pydantic.ValidationError) as err:
        load_catalogue(tmp_path / "bad.yaml")
    fields = {e["loc"][-1] for e in err.value.errors()}
    assert {"tokenizer_revision", "num_layers", "allowed_dtypes", "out_features"} <= fields
