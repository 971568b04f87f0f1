"""What the in-process platform tests share: a private control plane on the test stack.

``test_outages``, ``test_churn`` and ``test_e2e_gateway`` each run the registry (on a
private database of the session's PostgreSQL, migrated), admission, a worker on the real
vLLM engine and a gateway in the test's own event loop, against the session's Tansu,
SeaweedFS and PostgreSQL. Each gets unique database, consumer-group and instance names,
so the tests never read each other's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from loraplane.admission.app import AdmissionApp
from loraplane.admission.settings import AdmissionSettings
from loraplane.cli.main import app as cli_app
from loraplane.devkit.builder import DemoManifest
from loraplane.gateway.settings import GatewaySettings
from loraplane.registry.app import RegistryApp
from loraplane.shared.migrations import migrate_up
from loraplane.stack.stack import Stack
from loraplane.worker.settings import WorkerSettings
from tests.support.registry import TOKEN, registry_settings


def free_port() -> int:
    """A port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ControlPlane:
    """Registry and admission on a private database, and the CLI's environment."""

    dsn: str
    registry: RegistryApp
    admission: AdmissionApp
    cli_env: dict[str, str]
    """``LORAPLANE_*`` of the ``loraplane`` CLI against this registry (operator token)."""


@contextlib.asynccontextmanager
async def control_plane(stack: Stack, work: Path, demo: DemoManifest, *, name: str,
                        unique: str, actor: str) -> AsyncIterator[ControlPlane]:
    """Database ``<name>_<unique>`` (created, migrated; dropped on exit), the registry on
    it and admission trusting the demo's dev key (consumer group
    ``admission-<name>-<unique>``). On exit: admission, then the registry stop."""
    s = stack.settings
    admin = await asyncpg.connect(s.postgres_dsn)
    db = f"{name}_{unique}"
    await admin.execute(f'CREATE DATABASE "{db}"')
    await admin.close()
    dsn = s.postgres_dsn.rsplit("/", 1)[0] + f"/{db}"
    try:
        await asyncio.to_thread(migrate_up, dsn)
        registry = RegistryApp(
            registry_settings(stack, postgres_dsn=dsn, instance_id=f"reg-{unique}"),
            registry=CollectorRegistry(), serve_metrics=False)
        await registry.start()
        try:
            keys = work / "platform-keys"
            keys.mkdir()
            shutil.copyfile(demo.keys.public_key, keys / "dev-signing.pub")
            admission = AdmissionApp(
                AdmissionSettings(
                    postgres_dsn=dsn, kafka_bootstrap=s.kafka_bootstrap,
                    s3_endpoint=s.s3_endpoint, s3_access_key=s.s3_access_key,
                    s3_secret_key=s.s3_secret_key, artifact_bucket=s.artifact_bucket,
                    admission_metrics_port=0,
                    admission_consumer_group=f"admission-{name}-{unique}",
                    admission_platform_keys_dir=keys,
                    admission_tenant_keys_dir=work / "tenant-keys",
                    admission_quarantine_dir=work / "quarantine",
                    admission_probe_interval_s=1.0, instance_id=f"adm-{unique}",
                ),
                registry=CollectorRegistry(), serve_metrics=False,
            )
            await admission.start()
            try:
                yield ControlPlane(dsn, registry, admission, {
                    "LORAPLANE_REGISTRY_ADDR": registry.address,
                    "LORAPLANE_REGISTRY_OPERATOR_TOKEN": TOKEN,
                    "LORAPLANE_REGISTRY_ACTOR": actor,
                    "LORAPLANE_S3_ENDPOINT": s.s3_endpoint,
                    "LORAPLANE_S3_ACCESS_KEY": s.s3_access_key,
                    "LORAPLANE_S3_SECRET_KEY": s.s3_secret_key,
                    "LORAPLANE_ARTIFACT_BUCKET": s.artifact_bucket,
                })
            finally:
                await admission.stop()
        finally:
            await registry.stop()
    finally:
        admin = await asyncpg.connect(s.postgres_dsn)
        await admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        await admin.close()


def worker_settings(stack: Stack, demo: DemoManifest, work: Path, worker_id: str,
                    **overrides: Any) -> WorkerSettings:
    """An in-process worker on the stack: any free gRPC port, no metrics server, the
    demo's base model and key, WARM tier under ``work``, fast state and heat reports."""
    s = stack.settings
    values: dict[str, Any] = {
        "worker_id": worker_id, "worker_grpc_port": 0, "worker_metrics_port": 0,
        "kafka_bootstrap": s.kafka_bootstrap, "s3_endpoint": s.s3_endpoint,
        "s3_access_key": s.s3_access_key, "s3_secret_key": s.s3_secret_key,
        "artifact_bucket": s.artifact_bucket, "base_model": demo.base_model.name,
        "base_model_dir": demo.base_model.dir, "trusted_keys": str(demo.keys.public_key),
        "tokenizer_revision": demo.base_model.tokenizer_revision,
        "worker_host_dir": work / "worker-host", "worker_max_lora_rank": 16,
        "worker_state_interval_s": 1.0, "worker_heat_flush_s": 0.5,
    }
    values.update(overrides)
    return WorkerSettings(**values)


def gateway_settings(stack: Stack, cp: ControlPlane, demo: DemoManifest, *,
                     instance_id: str, **overrides: Any) -> GatewaySettings:
    """An in-process gateway on free ports against ``cp``'s registry (no metrics server;
    a cache-manager address nobody serves unless the test starts one there)."""
    values: dict[str, Any] = {
        "kafka_bootstrap": stack.settings.kafka_bootstrap, "grpc_port": free_port(),
        "http_port": free_port(), "metrics_port": 0, "registry_addr": cp.registry.address,
        "registry_token": TOKEN, "cache_manager_addr": f"127.0.0.1:{free_port()}",
        "default_base_model": demo.base_model.name, "heat_flush_interval_s": 0.5,
        "instance_id": instance_id,
    }
    values.update(overrides)
    return GatewaySettings(**values)


async def run_cli(env: dict[str, str], *args: str, ok: bool = True) -> Any:
    """The ``loraplane`` CLI in a thread (the services share the test's loop); asserts
    exit 0 unless ``ok`` is false. Returns the click result."""
    result = await asyncio.to_thread(CliRunner().invoke, cli_app, list(args), env=env)
    if ok:
        assert result.exit_code == 0, (args, result.stdout, result.stderr)
    return result


async def eventually(check: Any, *, timeout_s: float = 30.0, every_s: float = 0.1) -> Any:
    """Poll ``check`` (a function, or a coroutine function) until it returns something
    true; that value, or AssertionError naming the last one after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(every_s)
    raise AssertionError(f"not met within {timeout_s}s; last: {last!r}")
