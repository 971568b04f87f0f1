"""One demo build per test session (tiny model, demo adapters, dev key)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from loraplane.devkit.builder import DemoManifest, build_demo
from loraplane.devkit.keys import DevKeyPair, write_dev_keys


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoManifest:
    """A fresh build in a session temp dir (never the repo's cached one)."""
    return build_demo(tmp_path_factory.mktemp("demo") / "models")


@pytest.fixture(scope="session")
def other_keys(tmp_path_factory: pytest.TempPathFactory) -> DevKeyPair:
    """A second key pair nobody signed the demo with."""
    return write_dev_keys(tmp_path_factory.mktemp("other-keys"), seed=7, label="other")


@pytest.fixture
def adapter_copy(demo: DemoManifest, tmp_path: Path) -> Path:
    """A private copy of a signed demo adapter that a test may tamper with."""
    src = demo.adapter("acme", "support", "2026-11-01.1").dir
    return Path(shutil.copytree(src, tmp_path / "adapter"))
