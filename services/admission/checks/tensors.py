"""Tensor check: every tensor is a LoRA matrix of a targeted module of the base model.

PEFT names LoRA weights of a causal LM
``base_model.model.model.layers.<i>.<block>.<module>.lora_<A|B>.weight`` where ``<block>``
is ``self_attn`` or ``mlp``. For rank ``r`` and a module ``nn.Linear(in, out)``:
``lora_A`` is ``(r, in)`` and ``lora_B`` is ``(out, r)``. Every ``(layer, module)`` pair of
every targeted module must have both matrices, and nothing else may be present. Only
the header is used (names, dtypes, shapes); values are checked by :mod:`.finite`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from loraplane.admission.checks.safetensors import TensorInfo
from loraplane.admission.problems import (
    TENSOR_DTYPE,
    TENSOR_NAME,
    TENSOR_SHAPE,
    Problem,
)
from loraplane.shared.catalogue import BaseModelSpec

NAME_RE = re.compile(
    r"^base_model\.model\.model\.layers\.(?P<layer>0|[1-9][0-9]{0,4})\."
    r"(?P<block>self_attn|mlp)\.(?P<module>[a-z][a-z0-9_]{0,63})\.lora_(?P<ab>[AB])\.weight$"
)
"""PEFT's LoRA weight names for a Llama-style causal LM."""
BLOCK_OF_MODULE = {
    "q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
    "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp",
}
"""Where each Llama projection lives; a name putting it elsewhere is refused."""


@dataclass(frozen=True, slots=True)
class LoraTensorName:
    """A parsed LoRA weight name."""

    layer: int
    block: str
    module: str
    matrix: str
    """``"A"`` or ``"B"``."""


def parse_name(name: str) -> LoraTensorName | None:
    """Parse a PEFT LoRA weight name, or None when it does not follow the scheme."""
    m = NAME_RE.match(name)
    if m is None:
        return None
    return LoraTensorName(int(m["layer"]), m["block"], m["module"], m["ab"])


def check_tensors(
    tensors: Iterable[TensorInfo],
    *,
    rank: int,
    target_modules: Iterable[str],
    spec: BaseModelSpec,
) -> list[Problem]:
    """Check names, dtypes and shapes of ``tensors`` against the config and the base model.

    ``rank`` and ``target_modules`` come from the (already checked) adapter config;
    modules the base model does not support are left to the compatibility check.
    """
    problems: list[Problem] = []
    targets = set(target_modules)
    supported = spec.supported_target_modules
    checkable = targets & supported
    seen: Counter[tuple[int, str, str]] = Counter()
    shapes: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {}
    ranks_found: Counter[int] = Counter()

    for t in tensors:
        if t.dtype not in spec.allowed_dtypes:
            problems.append(Problem(TENSOR_DTYPE, f"dtype {t.dtype} is not allowed "
                                    f"(allowed: {', '.join(spec.allowed_dtypes)})", t.name))
        parsed = parse_name(t.name)
        if parsed is None:
            problems.append(Problem(TENSOR_NAME, "not a PEFT LoRA weight name "
                                    "(base_model.model.model.layers.<i>.<block>.<module>."
                                    "lora_<A|B>.weight)", t.name))
            continue
        if parsed.layer >= spec.num_layers:
            problems.append(Problem(TENSOR_NAME, f"layer {parsed.layer} does not exist "
                                    f"({spec.name} has {spec.num_layers} layers)", t.name))
            continue
        if parsed.module not in supported:
            problems.append(Problem(TENSOR_NAME, f"{spec.name} has no module "
                                    f"{parsed.module!r}", t.name))
            continue
        if parsed.module not in targets:
            problems.append(Problem(TENSOR_NAME, f"module {parsed.module!r} is not in the "
                                    f"config's target_modules", t.name))
            continue
        block = BLOCK_OF_MODULE.get(parsed.module)
        if block is not None and parsed.block != block:
            problems.append(Problem(TENSOR_NAME, f"{parsed.module} lives in {block}, "
                                    f"not {parsed.block}", t.name))
            continue
        seen[(parsed.layer, parsed.module, parsed.matrix)] += 1

        a_shape, b_shape = shapes.get(parsed.module) or shapes.setdefault(
            parsed.module, spec.lora_shapes(parsed.module, rank))
        want = a_shape if parsed.matrix == "A" else b_shape
        if t.shape != want:
            found_rank = _rank_of(t.shape, parsed.matrix)
            if found_rank is not None and _fits_module(t.shape, parsed.matrix,
                                                       a_shape, b_shape):
                ranks_found[found_rank] += 1
            problems.append(Problem(TENSOR_SHAPE, f"shape {list(t.shape)} != expected "
                                    f"{list(want)} (r={rank}, {parsed.module} "
                                    f"{a_shape[1]}->{b_shape[0]})", t.name))

    for module in sorted(checkable):
        for layer in range(spec.num_layers):
            for matrix in ("A", "B"):
                if seen[(layer, module, matrix)] == 0:
                    problems.append(Problem(
                        TENSOR_NAME, f"missing lora_{matrix} for layer {layer} {module}",
                        f"layers.{layer}.{module}.lora_{matrix}",
                    ))
    if ranks_found:
        found = ", ".join(str(r) for r, _ in ranks_found.most_common())
        problems.append(Problem(TENSOR_SHAPE, f"tensors have rank {found} but the config "
                                f"declares r={rank}"))
    return problems


def _rank_of(shape: tuple[int, ...], matrix: str) -> int | None:
    if len(shape) != 2:
        return None
    return shape[0] if matrix == "A" else shape[1]


def _fits_module(shape: tuple[int, ...], matrix: str, a_shape: tuple[int, int],
                 b_shape: tuple[int, int]) -> bool:
    """The shape has the module's in/out width, i.e. only the rank differs."""
    if len(shape) != 2:
        return False
    return shape[1] == a_shape[1] if matrix == "A" else shape[0] == b_shape[0]
