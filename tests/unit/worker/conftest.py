"""Fixtures of the worker unit tests: signed tiny adapters in a directory object store,
a host tier, and an adapter manager over the vLLM-model test double."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from loraplane.devkit.keys import DevKeyPair, write_dev_keys
from loraplane.shared.signing import sign_directory
from loraplane.worker.engine import EngineAdapter
from loraplane.worker.guard import SafeEngine
from loraplane.worker.host_tier import ArtifactSpec, HostTier
from loraplane.worker.lora_files import write_lora
from loraplane.worker.manager import AdapterManager
from loraplane.worker.metrics import WorkerMetrics

sys.path.insert(0, str(Path(__file__).parent))
from worker_fakes import BASE, BUCKET, DIMS, LIMITS, PREFIX, DirStore, MakeAdapter, Rig, VllmModel

_ids = itertools.count(1)


@pytest.fixture(scope="session")
def keys(tmp_path_factory: pytest.TempPathFactory) -> DevKeyPair:
    return write_dev_keys(tmp_path_factory.mktemp("keys"), seed=1)


@pytest.fixture(scope="session")
def other_keys(tmp_path_factory: pytest.TempPathFactory) -> DevKeyPair:
    return write_dev_keys(tmp_path_factory.mktemp("other"), seed=2, label="other")


@pytest.fixture
def store(tmp_path: Path) -> DirStore:
    return DirStore(tmp_path / "s3")


@pytest.fixture
def make_adapter(store: DirStore, keys: DevKeyPair, tmp_path: Path) -> MakeAdapter:
    """Build, sign and upload an adapter; returns its spec (as a load command has it)."""

    def make(
        name: str = "support", *, tenant: str = "acme", version: str = "v1", rank: int = 8,
        key: DevKeyPair | None = None, base_model: str = BASE,
    ) -> ArtifactSpec:
        engine_id = next(_ids)
        rng = np.random.default_rng(engine_id)
        src = tmp_path / "src" / f"{tenant}-{name}-{version}-{engine_id}"
        write_lora(src, DIMS, base_model=base_model, rank=rank, modules=("q_proj", "v_proj"),
                   fill=lambda shape, _: rng.standard_normal(shape).astype(np.float32))
        signed = sign_directory(src, (key or keys).private_key)
        prefix = f"{PREFIX}/{tenant}/{name}/{version}/{signed.manifest_digest[:16]}/"
        store.put_dir(BUCKET, prefix, src)
        return ArtifactSpec(
            engine_id=engine_id, tenant_id=tenant, adapter_name=name, version=version,
            base_model=base_model, artifact_uri=f"s3://{BUCKET}/{prefix}",
            sha256=signed.manifest_digest, size_bytes=signed.size_bytes, rank=rank,
        )

    return make


@pytest.fixture
def host_factory(store: DirStore, keys: DevKeyPair, tmp_path: Path) -> Callable[..., HostTier]:
    def make(capacity_bytes: int = 50 << 20, root: Path | None = None) -> HostTier:
        return HostTier(
            root or tmp_path / "host", capacity_bytes=capacity_bytes, store=store,
            trusted_keys=[keys.public_key], bucket=BUCKET, prefix=PREFIX,
            max_lora_rank=LIMITS.max_lora_rank,
        )

    return make


@pytest.fixture
async def rig(host_factory: Callable[..., HostTier], tmp_path: Path) -> Rig:
    model = VllmModel(LIMITS, step_delay_s=0.001)
    engine = SafeEngine(model, pin_wait_s=0.5)
    host = host_factory()
    metrics = WorkerMetrics.for_registry(CollectorRegistry())
    events: list[object] = []

    async def sink(outcome: object) -> None:
        events.append(outcome)

    zero = EngineAdapter(2_147_483_647, "_system/zero", tmp_path / "zero", 8)
    manager = AdapterManager(engine, host, base_model=BASE, zero_adapter=zero, metrics=metrics,
                             drain_timeout_s=5.0, on_event=sink)
    await manager.start()
    return Rig(model, engine, host, manager, metrics, events)
