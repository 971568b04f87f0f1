"""Fixtures of the admission integration tests: demo adapters, keys, a registry and an
admission service running in the session loop against the real test stack."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from minio import Minio
from prometheus_client import CollectorRegistry

from loraplane.admission.app import AdmissionApp
from loraplane.admission.settings import AdmissionSettings
from loraplane.devkit.builder import DemoManifest, build_demo
from loraplane.devkit.keys import write_dev_keys
from loraplane.registry.app import RegistryApp
from loraplane.shared.catalogue import BaseModelSpec, load_catalogue
from loraplane.shared.topics import ADAPTER_ADMISSIONS, ADAPTER_RELEASES
from loraplane.stack.stack import Stack
from tests.support.registry import registry_settings
from tests.support.tls import tls_settings

from .corpus import Env

REPO = Path(__file__).resolve().parents[3]
TINY = "loraplane/tiny-llama"
MAX_FILE_BYTES = 4 << 20
"""Test limit (the oversize case uploads 5 MiB of weights)."""


@pytest.fixture(scope="session")
def demo() -> DemoManifest:
    """The demo build (cached under .loraplane/models; built once, ~10 s)."""
    return build_demo()


@pytest.fixture(scope="session")
def tiny() -> BaseModelSpec:
    return load_catalogue(REPO / "config" / "base_models.yaml").get(TINY)


@dataclass
class Keys:
    """Key material of the admission tests."""

    platform_dir: Path
    tenant_dir: Path
    untrusted: Path
    globex: Path
    """Private key of the globex tenant (its public key is trusted for globex only)."""


@pytest.fixture(scope="session")
def session_id() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="session")
def tenants(session_id: str) -> dict[str, str]:
    """Logical tenant → unique tenant id of this session."""
    return {"acme": f"acme-{session_id}", "globex": f"globex-{session_id}"}


@pytest.fixture(scope="session")
def keys(tmp_path_factory: pytest.TempPathFactory, demo: DemoManifest,
         tenants: dict[str, str]) -> Keys:
    root = tmp_path_factory.mktemp("admission-keys")
    platform = root / "platform"
    platform.mkdir()
    shutil.copyfile(demo.keys.public_key, platform / "dev-signing.pub")
    untrusted = write_dev_keys(root / "untrusted", 4242, "untrusted")
    globex = write_dev_keys(root / "globex", 4242, "globex")
    tenant_dir = root / "tenants"
    (tenant_dir / tenants["globex"]).mkdir(parents=True)
    shutil.copyfile(globex.public_key, tenant_dir / tenants["globex"] / "globex.pub")
    return Keys(platform, tenant_dir, untrusted.private_key, globex.private_key)


@pytest.fixture(scope="session")
def corpus_env(tmp_path_factory: pytest.TempPathFactory, demo: DemoManifest,
               tiny: BaseModelSpec, keys: Keys) -> Env:
    return Env(demo=demo, spec=tiny, work=tmp_path_factory.mktemp("corpus"),
               trusted_key=demo.keys.private_key, untrusted_key=keys.untrusted,
               tenant_key=keys.globex)


def admission_settings(stack: Stack, keys: Keys, quarantine: Path, **over: Any
                       ) -> AdmissionSettings:
    """Admission settings pointing at the test stack."""
    env = stack.settings.client_env()
    values: dict[str, Any] = {
        "postgres_dsn": env["LORAPLANE_POSTGRES_DSN"],
        "kafka_bootstrap": env["LORAPLANE_KAFKA_BOOTSTRAP"],
        **stack.settings.s3_settings(),
        "artifact_bucket": env["LORAPLANE_ARTIFACT_BUCKET"],
        "admission_metrics_port": 0,
        "admission_consumer_group": f"admission-test-{uuid.uuid4().hex[:8]}",
        "admission_platform_keys_dir": keys.platform_dir,
        "admission_tenant_keys_dir": keys.tenant_dir,
        "admission_quarantine_dir": quarantine,
        "admission_max_file_bytes": MAX_FILE_BYTES,
        "admission_max_total_bytes": 2 * MAX_FILE_BYTES,
        "admission_probe_interval_s": 1.0,
        "instance_id": "admission-test",
        **tls_settings(stack, "admission"),
    }
    values.update(over)
    return AdmissionSettings(**values)


@pytest.fixture(scope="session")
def s3(stack: Stack) -> Minio:
    return stack.settings.s3_client()


@pytest.fixture(scope="session")
def topic_ns(session_id: str) -> str:
    """Topic namespace shared by this module's registry and admission (test isolation)."""
    return f"adm{session_id}."


@pytest.fixture(scope="session")
async def admission(stack: Stack, keys: Keys, tmp_path_factory: pytest.TempPathFactory,
                    topic_ns: str) -> AsyncIterator[AdmissionApp]:
    """Admission consuming the registry's ``adapter.releases`` (in the test namespace)."""
    settings = admission_settings(
        stack, keys, tmp_path_factory.mktemp("quarantine"),
        admission_releases_topic=topic_ns + ADAPTER_RELEASES,
        admission_admissions_topic=topic_ns + ADAPTER_ADMISSIONS)
    app = AdmissionApp(settings, registry=CollectorRegistry(), serve_metrics=False)
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


@pytest.fixture(scope="session")
async def registry_app(stack: Stack, topic_ns: str) -> AsyncIterator[RegistryApp]:
    """The registry (gRPC + outbox relay + admission-verdict consumer), in process."""
    app = RegistryApp(registry_settings(stack, registry_topic_prefix=topic_ns),
                      registry=CollectorRegistry(), serve_metrics=False)
    await app.start()
    try:
        yield app
    finally:
        await app.stop()
