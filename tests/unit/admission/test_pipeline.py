"""The local pipeline runs every check and collects every problem; a crash never admits."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from loraplane.admission import pipeline
from loraplane.admission.checks.files import SizeLimits
from loraplane.admission.claim import ReleaseClaim
from loraplane.admission.pipeline import REQUIRED_CHECKS, CheckContext, check_quarantined, fold
from loraplane.admission.problems import (
    FORBIDDEN_FILE,
    INTERNAL,
    NON_FINITE,
    TENSOR_SHAPE,
    TOKENIZER_MISMATCH,
    UNSIGNED_FILE,
    Problem,
)
from loraplane.shared.catalogue import BaseModelSpec
from loraplane.shared.signing import compute_manifest_digest, sign_directory
from tests.support.synth import lora_tensors, safetensors_bytes, to_raw


def _claim(adapter: Path, tiny: BaseModelSpec, **kw: object) -> ReleaseClaim:
    base = ReleaseClaim(
        tenant_id="acme", adapter_name="support", version="v1", base_model=tiny.name, rank=8,
        target_modules=("q_proj", "v_proj"), lora_alpha=16.0, artifact_format="peft",
        artifact_uri="", signature_uri="", sha256=compute_manifest_digest(adapter),
        size_bytes=0, signer_identity="", tokenizer_revision=tiny.tokenizer_revision)
    return replace(base, **kw)  # type: ignore[arg-type]


def test_valid_adapter_admitted(adapter: Path, tiny: BaseModelSpec, ctx: CheckContext) -> None:
    report = check_quarantined(adapter, adapter / "model.sig", _claim(adapter, tiny), ctx)
    assert report.verdict.problems == ()
    assert report.verdict.admitted
    assert report.verdict.checks_passed == REQUIRED_CHECKS
    weights = (adapter / "adapter_model.safetensors").stat().st_size
    assert report.bytes_hashed == weights + (adapter / "adapter_config.json").stat().st_size
    assert 0 < report.bytes_scanned < weights


def test_every_reason_collected(adapter: Path, tiny: BaseModelSpec, ctx: CheckContext,
                                keys_dir: Path) -> None:
    tensors = lora_tensors(tiny, 8, ("q_proj", "v_proj"))
    name = sorted(tensors)[3]
    values = np.zeros(tensors[name].shape, np.float32)
    values[0, 0] = np.nan
    tensors[name] = to_raw(values, "F32")
    (adapter / "adapter_model.safetensors").write_bytes(safetensors_bytes(tensors))
    sign_directory(adapter, keys_dir / "trusted" / "dev-signing.key")
    (adapter / "notes.txt").write_text("added after signing")
    claim = _claim(adapter, tiny, tokenizer_revision="e" * 64)
    report = check_quarantined(adapter, adapter / "model.sig", claim, ctx)
    assert not report.verdict.admitted
    assert report.verdict.codes == {NON_FINITE, TOKENIZER_MISMATCH, UNSIGNED_FILE,
                                    FORBIDDEN_FILE}
    assert set(report.verdict.checks_passed) == {"config", "safetensors", "tensors"}


def test_crashing_check_refuses(adapter: Path, tiny: BaseModelSpec, ctx: CheckContext,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: object, **__: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(pipeline, "check_finite", boom)
    report = check_quarantined(adapter, adapter / "model.sig", _claim(adapter, tiny), ctx)
    assert not report.verdict.admitted
    assert [(p.code, p.message) for p in report.verdict.problems] == [
        (INTERNAL, "check finite failed: RuntimeError: bug")]


def test_a_skipped_check_never_admits(adapter: Path, tiny: BaseModelSpec, ctx: CheckContext,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline, "read_header", lambda *a, **k: (None, []))
    report = check_quarantined(adapter, adapter / "model.sig", _claim(adapter, tiny), ctx)
    assert not report.verdict.admitted
    assert report.verdict.problems[0].code == INTERNAL
    assert "tensors, finite" in report.verdict.problems[0].message


def test_rank_mismatch_is_folded(tmp_path: Path, tiny: BaseModelSpec, ctx: CheckContext,
                                 keys_dir: Path) -> None:
    from tests.support.synth import write_adapter

    d = write_adapter(tmp_path / "a", tiny, rank=16, target_modules=("q_proj", "v_proj"))
    config = json.loads((d / "adapter_config.json").read_text())
    config.update(r=8, lora_alpha=16)
    (d / "adapter_config.json").write_text(json.dumps(config))
    sign_directory(d, keys_dir / "trusted" / "dev-signing.key")
    report = check_quarantined(d, d / "model.sig", _claim(d, tiny), ctx)
    shape = [p for p in report.verdict.problems if p.code == TENSOR_SHAPE]
    assert report.verdict.codes == {TENSOR_SHAPE}
    assert len(shape) == pipeline.MAX_PROBLEMS_PER_CODE + 1
    assert shape[-1].message == "... and 5 more problems of this kind"


def test_fold_keeps_order_and_counts() -> None:
    ps = [Problem(NON_FINITE, f"m{i}") for i in range(5)] + [Problem(INTERNAL, "x")]
    folded = fold(ps, limit=2)
    assert [p.message for p in folded] == ["m0", "m1", "x",
                                           "... and 3 more problems of this kind"]


def test_limits_apply_on_disk(adapter: Path, tiny: BaseModelSpec, ctx: CheckContext) -> None:
    small = replace(ctx, limits=SizeLimits(max_file_bytes=50_000, max_total_bytes=10**6))
    report = check_quarantined(adapter, adapter / "model.sig", _claim(adapter, tiny), small)
    assert [p.path for p in report.verdict.problems] == ["adapter_model.safetensors"]
