"""Tensor names and shapes against the config and the base model's dimensions."""

from __future__ import annotations

from loraplane.admission.checks.safetensors import TensorInfo
from loraplane.admission.checks.tensors import check_tensors, parse_name
from loraplane.admission.problems import TENSOR_DTYPE, TENSOR_NAME, TENSOR_SHAPE, codes_of
from loraplane.shared.catalogue import BaseModelSpec
from tests.support.synth import lora_name

QV = ("q_proj", "v_proj")
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _tensors(spec: BaseModelSpec, rank: int, targets: tuple[str, ...],
             dtype: str = "F32") -> list[TensorInfo]:
    out = []
    for layer in range(spec.num_layers):
        for module in targets:
            a, b = spec.lora_shapes(module, rank)
            out.append(TensorInfo(lora_name(layer, module, "A"), dtype, a, 0, 0))
            out.append(TensorInfo(lora_name(layer, module, "B"), dtype, b, 0, 0))
    return out


def test_parse_name() -> None:
    p = parse_name("base_model.model.model.layers.3.mlp.down_proj.lora_B.weight")
    assert p is not None and (p.layer, p.block, p.module, p.matrix) == (3, "mlp", "down_proj",
                                                                         "B")
    for bad in ["base_model.model.model.layers.03.mlp.down_proj.lora_B.weight",
                "model.layers.0.self_attn.q_proj.lora_A.weight",
                "base_model.model.model.layers.0.self_attn.q_proj.lora_A.bias",
                "base_model.model.model.layers.0.self_attn.q_proj.lora_embedding_A.weight",
                "base_model.model.lm_head.lora_A.weight"]:
        assert parse_name(bad) is None, bad


def test_valid_sets(tiny: BaseModelSpec) -> None:
    for rank, targets in ((8, QV), (16, ALL), (1, ("down_proj",))):
        assert check_tensors(_tensors(tiny, rank, targets), rank=rank, target_modules=targets,
                             spec=tiny) == []


def test_module_the_model_lacks(tiny: BaseModelSpec) -> None:
    ts = [*_tensors(tiny, 8, QV),
          TensorInfo("base_model.model.model.layers.0.self_attn.w_proj.lora_A.weight", "F32",
                     (8, 256), 0, 0)]
    problems = check_tensors(ts, rank=8, target_modules=QV, spec=tiny)
    assert [(p.code, "has no module 'w_proj'" in p.message) for p in problems] == [
        (TENSOR_NAME, True)]


def test_module_not_targeted_layer_out_of_range_wrong_block(tiny: BaseModelSpec) -> None:
    ts = [*_tensors(tiny, 8, QV),
          TensorInfo(lora_name(0, "k_proj", "A"), "F32", (8, 256), 0, 0),
          TensorInfo(lora_name(4, "q_proj", "A"), "F32", (8, 256), 0, 0),
          TensorInfo("base_model.model.model.layers.1.mlp.q_proj.lora_A.weight", "F32",
                     (8, 256), 0, 0),
          TensorInfo("base_model.model.lm_head.weight", "F32", (800, 256), 0, 0)]
    problems = check_tensors(ts, rank=8, target_modules=QV, spec=tiny)
    assert codes_of(problems) == {TENSOR_NAME}
    messages = " | ".join(p.message for p in problems)
    for fragment in ("not in the config's target_modules", "layer 4 does not exist",
                     "lives in self_attn", "not a PEFT LoRA weight name"):
        assert fragment in messages


def test_missing_tensors(tiny: BaseModelSpec) -> None:
    ts = [t for t in _tensors(tiny, 8, QV) if "layers.2.self_attn.v_proj.lora_B" not in t.name]
    (p,) = check_tensors(ts, rank=8, target_modules=QV, spec=tiny)
    assert p.code == TENSOR_NAME and p.message == "missing lora_B for layer 2 v_proj"


def test_wrong_shape(tiny: BaseModelSpec) -> None:
    ts = _tensors(tiny, 8, QV)
    ts[0] = TensorInfo(ts[0].name, "F32", (8, 128), 0, 0)  # q_proj lora_A: in is 256
    (p,) = check_tensors(ts, rank=8, target_modules=QV, spec=tiny)
    assert p.code == TENSOR_SHAPE and "[8, 128] != expected [8, 256]" in p.message


def test_rank_mismatch_between_config_and_tensors(tiny: BaseModelSpec) -> None:
    problems = check_tensors(_tensors(tiny, 16, QV), rank=8, target_modules=QV, spec=tiny)
    assert codes_of(problems) == {TENSOR_SHAPE}
    assert problems[-1].message == "tensors have rank 16 but the config declares r=8"


def test_disallowed_dtype(tiny: BaseModelSpec) -> None:
    problems = check_tensors(_tensors(tiny, 8, QV, dtype="F64"), rank=8, target_modules=QV,
                             spec=tiny)
    assert codes_of(problems) == {TENSOR_DTYPE} and len(problems) == 16


def test_unsupported_target_module_left_to_compatibility(tiny: BaseModelSpec) -> None:
    assert check_tensors(_tensors(tiny, 8, QV), rank=8,
                         target_modules=(*QV, "lm_head"), spec=tiny) == []
