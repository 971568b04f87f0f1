"""The demo build: layout, PEFT configs, tensor shapes, idempotence, determinism."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from safetensors import safe_open

from loraplane.devkit.adapters import ALL_LINEAR, ATTENTION_QV, DEMO_ADAPTERS
from loraplane.devkit.builder import (
    MANIFEST_NAME,
    DemoManifest,
    build_demo,
    build_stamp,
    load_demo,
)
from loraplane.devkit.model import MODEL_NAME
from loraplane.shared.catalogue import load_catalogue
from loraplane.shared.signing import key_identity

REPO = Path(__file__).resolve().parents[3]
BLOCK = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}


def test_demo_set(demo: DemoManifest) -> None:
    got = {(a.tenant, a.name, a.version, a.rank, a.target_modules) for a in demo.adapters}
    assert got == {
        ("acme", "support", "2026-11-01.1", 8, ATTENTION_QV),
        ("acme", "support", "2026-11-15.1", 8, ATTENTION_QV),
        ("acme", "code", "2026-11-01.1", 16, ALL_LINEAR),
        ("globex", "legal", "2026-11-01.1", 16, ATTENTION_QV),
        ("globex", "chat", "2026-11-01.1", 8, ALL_LINEAR),
    }
    assert demo.adapter("acme", "support").version == "2026-11-15.1"  # latest
    assert demo.zero_adapter.rank == 8


def test_layout_and_files(demo: DemoManifest) -> None:
    assert demo.root.is_absolute()
    for a in (*demo.adapters, demo.zero_adapter):
        assert a.dir.is_relative_to(demo.root)
        assert sorted(p.name for p in a.dir.iterdir()) == [
            "adapter_config.json",
            "adapter_model.safetensors",
            "model.sig",
        ]
        assert a.size_bytes == sum(
            (a.dir / n).stat().st_size for n in ("adapter_config.json", "adapter_model.safetensors")
        )
    base = sorted(p.name for p in demo.base_model.dir.iterdir())
    assert base == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert key_identity(demo.keys.public_key) == demo.keys.identity
    assert oct(demo.keys.private_key.stat().st_mode & 0o777) == "0o600"


def test_base_model_config(demo: DemoManifest) -> None:
    config = json.loads((demo.base_model.dir / "config.json").read_text())
    assert config["loraplane_model_name"] == MODEL_NAME == demo.base_model.name
    assert (
        config["hidden_size"],
        config["num_hidden_layers"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["intermediate_size"],
        config["max_position_embeddings"],
    ) == (256, 4, 4, 2, 512, 512)
    tok_config = json.loads((demo.base_model.dir / "tokenizer_config.json").read_text())
    assert tok_config["bos_token"] == "<|begin_of_text|>"
    assert tok_config["eos_token"] == "<|end_of_text|>"
    assert "messages" in tok_config["chat_template"]
    vocab = json.loads((demo.base_model.dir / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(vocab) == config["vocab_size"] == 800


def test_tokenizer_and_chat_template_work(demo: DemoManifest) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(demo.base_model.dir))
    ids = tok("Hello, how can I help you today?").input_ids
    assert ids[0] == tok.bos_token_id and len(ids) < 20  # merges learnt from the corpus
    assert tok.decode(ids, skip_special_tokens=True) == "Hello, how can I help you today?"
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|begin_of_text|>user: Hi\nassistant:"


def test_adapter_configs(demo: DemoManifest) -> None:
    for a in (*demo.adapters, demo.zero_adapter):
        cfg = json.loads((a.dir / "adapter_config.json").read_text())
        assert cfg["peft_type"] == "LORA"
        assert cfg["base_model_name_or_path"] == MODEL_NAME
        assert cfg["r"] == a.rank and cfg["lora_alpha"] == a.alpha == 2 * a.rank
        assert cfg["target_modules"] == list(a.target_modules)  # ordered, not a set
        assert cfg["use_dora"] is False and cfg["modules_to_save"] is None


def test_tensor_names_and_shapes_follow_rank_and_module_dims(demo: DemoManifest) -> None:
    spec = load_catalogue(REPO / "config" / "base_models.yaml").get(MODEL_NAME)
    for a in (*demo.adapters, demo.zero_adapter):
        expected = {}
        for layer in range(spec.num_layers):
            for module in a.target_modules:
                a_shape, b_shape = spec.lora_shapes(module, a.rank)
                prefix = f"base_model.model.model.layers.{layer}.{BLOCK[module]}.{module}"
                expected[f"{prefix}.lora_A.weight"] = a_shape
                expected[f"{prefix}.lora_B.weight"] = b_shape
        with safe_open(str(a.dir / "adapter_model.safetensors"), framework="np") as f:
            assert set(f.keys()) == set(expected)
            for name, shape in expected.items():
                sl = f.get_slice(name)
                assert tuple(sl.get_shape()) == shape, name
                assert sl.get_dtype() == "F32"
            names = list(f.keys())
            b_max = max(float(np.abs(f.get_tensor(n)).max()) for n in names if "lora_B" in n)
            a_max = min(float(np.abs(f.get_tensor(n)).max()) for n in names if "lora_A" in n)
        assert a_max > 0.1
        if a is demo.zero_adapter:
            assert b_max == 0.0
        else:
            assert b_max > 0.1  # PEFT's zero init replaced: the adapter changes outputs


def test_second_build_is_a_no_op(demo: DemoManifest) -> None:
    stamp_file = demo.root / MANIFEST_NAME
    before = stamp_file.stat().st_mtime_ns
    again = build_demo(demo.root)
    assert again == demo
    assert stamp_file.stat().st_mtime_ns == before


def test_stale_or_incomplete_builds_are_not_reused(demo: DemoManifest, tmp_path: Path) -> None:
    assert load_demo(demo.root) == demo
    assert load_demo(tmp_path) is None  # nothing there
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(demo.root), str(copy)], check=True)
    reused = load_demo(copy)
    assert reused is not None and reused.root == copy
    assert reused.base_model.dir == copy / "base" / "tiny-llama"
    data = json.loads((copy / MANIFEST_NAME).read_text())
    (copy / MANIFEST_NAME).write_text(json.dumps({**data, "build_stamp": "0" * 64}))
    assert load_demo(copy) is None
    (copy / MANIFEST_NAME).write_text(json.dumps(data))
    (copy / demo.adapters[0].dir.relative_to(demo.root) / "model.sig").unlink()
    assert load_demo(copy) is None
    assert build_stamp(seed=1) != build_stamp()


def test_build_is_deterministic_across_processes(demo: DemoManifest, tmp_path: Path) -> None:
    """A second build in a fresh interpreter (other hash seed) gives identical files."""
    other_root = tmp_path / "models"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    code = (
        "import sys; from pathlib import Path; from loraplane.devkit.builder import "
        "build_demo; print(build_demo(Path(sys.argv[1])).model_dump_json())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(other_root)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    other = DemoManifest.model_validate_json(out.strip().splitlines()[-1])
    assert other.build_stamp == demo.build_stamp
    assert other.keys.identity == demo.keys.identity
    assert other.base_model.tokenizer_revision == demo.base_model.tokenizer_revision
    assert [a.manifest_digest for a in other.adapters] == [a.manifest_digest for a in demo.adapters]
    assert other.zero_adapter.manifest_digest == demo.zero_adapter.manifest_digest
    for name in ("model.safetensors", "config.json", "tokenizer_config.json"):
        assert (other.base_model.dir / name).read_bytes() == (
            demo.base_model.dir / name
        ).read_bytes()


def test_demo_adapters_constant_is_what_was_built(demo: DemoManifest) -> None:
    assert [(a.tenant, a.name, a.version) for a in demo.adapters] == [
        (s.tenant, s.name, s.version) for s in DEMO_ADAPTERS
    ]
