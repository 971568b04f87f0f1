"""A worker has no default model (issue 15: the demo model is the stack's business).

Without the served model's settings ``python -m loraplane.worker`` exits 2 naming the
ones missing, before it builds, loads or starts anything; the stack passes every one of
them from the demo build.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loraplane.devkit.builder import BaseModelArtifact, DemoManifest, KeyPair
from loraplane.stack.seed import worker_model_env
from loraplane.worker.settings import MODEL_SETTINGS, WorkerSettings


def test_a_worker_without_its_model_exits_2_naming_what_is_missing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LORAPLANE_")}
    env["LORAPLANE_HOME"] = str(tmp_path)  # where a demo build would land
    env["LORAPLANE_BASE_MODEL"] = "loraplane/tiny-llama"  # one of the three set
    run = subprocess.run([sys.executable, "-m", "loraplane.worker"], env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "worker: configuration error: LORAPLANE_BASE_MODEL_DIR, LORAPLANE_TRUSTED_KEYS " \
           "unset" in run.stderr
    assert "starting engine" not in run.stderr
    assert list(tmp_path.iterdir()) == []  # no demo model built


def test_missing_model_settings_names_only_the_unset_ones(tmp_path: Path) -> None:
    none = WorkerSettings(base_model="", base_model_dir=None, trusted_keys="")
    assert none.missing_model_settings() == list(MODEL_SETTINGS.values())
    full = WorkerSettings(base_model="m", base_model_dir=tmp_path, trusted_keys="k.pem")
    assert full.missing_model_settings() == []


def test_the_stack_passes_every_model_setting_from_the_demo_build(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = DemoManifest.model_construct(
        root=tmp_path,
        base_model=BaseModelArtifact.model_construct(
            name="loraplane/tiny-llama", dir=tmp_path / "base", tokenizer_revision="ab" * 32,
            size_bytes=1),
        keys=KeyPair.model_construct(private_key=tmp_path / "k.pem",
                                     public_key=tmp_path / "k.pub", identity="key:sha256:0"),
    )
    env = worker_model_env(manifest)
    assert set(MODEL_SETTINGS.values()) <= set(env)
    for var, value in env.items():  # what the supervisor puts in the worker's environment
        monkeypatch.setenv(var, value)
    settings = WorkerSettings()
    assert settings.missing_model_settings() == []
    assert settings.base_model == "loraplane/tiny-llama"
    assert settings.base_model_dir == tmp_path / "base"
    assert settings.trusted_key_paths() == [tmp_path / "k.pub"]
    assert settings.tokenizer_revision == "ab" * 32
