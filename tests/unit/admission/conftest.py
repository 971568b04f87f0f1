"""Fixtures for the admission unit tests: the served catalogue, synthetic adapters, keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from loraplane.admission.checks.files import SizeLimits
from loraplane.admission.pipeline import CheckContext
from loraplane.admission.trust import TrustedKey, TrustStore
from loraplane.devkit.keys import write_dev_keys
from loraplane.shared.catalogue import BaseModelSpec, Catalogue, load_catalogue
from loraplane.shared.signing import sign_directory
from tests.support.synth import write_adapter

REPO = Path(__file__).resolve().parents[3]
TINY = "loraplane/tiny-llama"


@pytest.fixture(scope="session")
def catalogue() -> Catalogue:
    return load_catalogue(REPO / "config" / "base_models.yaml")


@pytest.fixture(scope="session")
def tiny(catalogue: Catalogue) -> BaseModelSpec:
    return catalogue.get(TINY)


@pytest.fixture(scope="session")
def keys_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Trusted platform key (seed 1) and an untrusted key (seed 2) side by side."""
    root = tmp_path_factory.mktemp("keys")
    write_dev_keys(root / "trusted", seed=1)
    write_dev_keys(root / "untrusted", seed=2)
    return root


@pytest.fixture(scope="session")
def trusted(keys_dir: Path) -> list[TrustedKey]:
    return TrustStore(keys_dir / "trusted", None).keys_for("acme")


@pytest.fixture
def adapter(tmp_path: Path, tiny: BaseModelSpec, keys_dir: Path) -> Path:
    """A valid, signed rank-8 q/v adapter for the tiny model."""
    out = write_adapter(tmp_path / "adapter", tiny, rank=8, target_modules=("q_proj", "v_proj"))
    sign_directory(out, keys_dir / "trusted" / "dev-signing.key")
    return out


@pytest.fixture
def ctx(catalogue: Catalogue, trusted: list[TrustedKey]) -> CheckContext:
    return CheckContext(catalogue, trusted, SizeLimits(1 << 24, 1 << 25), 1 << 20)
