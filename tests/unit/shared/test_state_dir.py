"""The one root of local state: ``LORAPLANE_HOME``, else the checkout's ``.loraplane/``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from loraplane.admission.settings import AdmissionSettings
from loraplane.devkit.builder import default_root
from loraplane.shared import resources
from loraplane.shared.resources import STATE_ENV, state_dir
from loraplane.worker.settings import WorkerSettings

CHECKOUT = Path(__file__).resolve().parents[3]


def test_a_checkout_keeps_its_state_in_its_git_ignored_folder(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STATE_ENV, raising=False)
    assert state_dir() == CHECKOUT / ".loraplane"
    assert ".loraplane/" in (CHECKOUT / ".gitignore").read_text().splitlines()


def test_loraplane_home_moves_every_default_path(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    monkeypatch.setenv(STATE_ENV, str(tmp_path))
    for name in [k for k in os.environ
                 if k.startswith(("LORAPLANE_ADMISSION_", "LORAPLANE_WORKER_"))]:
        monkeypatch.delenv(name)
    assert state_dir() == tmp_path
    admission = AdmissionSettings()
    assert admission.admission_quarantine_dir == tmp_path / "admission" / "quarantine"
    assert admission.admission_platform_keys_dir == tmp_path / "models" / "keys"
    assert admission.admission_tenant_keys_dir == tmp_path / "tenant-keys"
    assert WorkerSettings(worker_id="w9").host_dir == tmp_path / "worker" / "w9"
    assert default_root() == tmp_path / "models"


def test_an_installed_package_uses_the_working_directory(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(STATE_ENV, raising=False)
    site = tmp_path / "site-packages" / "loraplane" / "shared"
    site.mkdir(parents=True)
    monkeypatch.setattr(resources, "__file__", str(site / "resources.py"))
    monkeypatch.chdir(tmp_path)
    assert state_dir() == tmp_path / ".loraplane"
