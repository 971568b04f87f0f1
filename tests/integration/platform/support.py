"""What the in-process platform tests share: a private control plane on the test stack.

``test_outages``, ``test_churn`` and ``test_e2e_gateway`` each run the registry (on a
private database of the session's PostgreSQL, migrated), admission, a worker on the real
vLLM engine and a gateway in the test's own event loop, against the session's Tansu,
SeaweedFS and PostgreSQL. Each gets unique database, consumer-group and instance names,
so the tests never read each other's state.

Beside the control plane: :func:`serving_worker` (a worker on the real engine, closed and
its memory freed on exit), :func:`tenant_with_key`, :func:`adapter_copy` and
:func:`release` (the ``loraplane release`` of a demo adapter), and
:func:`catalog_shows` (wait until the gateway's view of an adapter satisfies a check).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import shutil
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
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
from loraplane.gateway.app import GatewayApp
from loraplane.gateway.settings import GatewaySettings
from loraplane.registry.app import RegistryApp
from loraplane.shared.errors import LoraplaneError
from loraplane.shared.migrations import migrate_up
from loraplane.shared.tls import GATEWAY, OPERATOR, WORKER
from loraplane.stack.stack import Stack
from loraplane.worker.app import WorkerApp
from loraplane.worker.settings import WorkerSettings
from loraplane.worker.vllm_engine import VllmEngine
from tests.support.cache_manager import Launcher, Manager
from tests.support.registry import TOKEN, registry_settings
from tests.support.tls import edge_tls_settings, tls_env, tls_settings


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
                        unique: str, actor: str,
                        canary_clearance: bool = True) -> AsyncIterator[ControlPlane]:
    """Database ``<name>_<unique>`` (created, migrated; dropped on exit), the registry on
    it and admission trusting the demo's dev key (consumer group
    ``admission-<name>-<unique>``). On exit: admission, then the registry stop.
    ``canary_clearance`` False: canaries are cleared for tenant traffic when set (a test
    whose cache manager runs no canary analysis)."""
    s = stack.settings
    admin = await asyncpg.connect(s.postgres_dsn)
    db = f"{name}_{unique}"
    await admin.execute(f'CREATE DATABASE "{db}"')
    await admin.close()
    dsn = s.dsn_for(db)
    try:
        await asyncio.to_thread(migrate_up, dsn)
        registry = RegistryApp(
            registry_settings(stack, postgres_dsn=dsn, instance_id=f"reg-{unique}",
                              registry_canary_clearance=canary_clearance),
            registry=CollectorRegistry(), serve_metrics=False)
        await registry.start()
        try:
            keys = work / "platform-keys"
            keys.mkdir()
            shutil.copyfile(demo.keys.public_key, keys / "dev-signing.pub")
            admission = AdmissionApp(
                AdmissionSettings(
                    postgres_dsn=dsn, kafka_bootstrap=s.kafka_bootstrap,
                    **s.s3_settings(), artifact_bucket=s.artifact_bucket,
                    admission_metrics_port=0,
                    admission_consumer_group=f"admission-{name}-{unique}",
                    admission_platform_keys_dir=keys,
                    admission_tenant_keys_dir=work / "tenant-keys",
                    admission_quarantine_dir=work / "quarantine",
                    admission_probe_interval_s=1.0, instance_id=f"adm-{unique}",
                    **tls_settings(stack, "admission"),
                ),
                registry=CollectorRegistry(), serve_metrics=False,
            )
            await admission.start()
            try:
                yield ControlPlane(dsn, registry, admission, {
                    "LORAPLANE_REGISTRY_ADDR": registry.address,
                    "LORAPLANE_REGISTRY_OPERATOR_TOKEN": TOKEN,
                    "LORAPLANE_REGISTRY_ACTOR": actor,
                    **s.s3_env(),
                    "LORAPLANE_ARTIFACT_BUCKET": s.artifact_bucket,
                    **tls_env(stack, OPERATOR),
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
        "kafka_bootstrap": s.kafka_bootstrap, **s.s3_settings(),
        "artifact_bucket": s.artifact_bucket, "base_model": demo.base_model.name,
        "base_model_dir": demo.base_model.dir, "trusted_keys": str(demo.keys.public_key),
        "tokenizer_revision": demo.base_model.tokenizer_revision,
        "worker_host_dir": work / "worker-host", "worker_max_lora_rank": 16,
        "worker_state_interval_s": 1.0, "worker_heat_flush_s": 0.5,
        **tls_settings(stack, WORKER),
    }
    values.update(overrides)
    return WorkerSettings(**values)


@contextlib.asynccontextmanager
async def serving_worker(stack: Stack, demo: DemoManifest, work: Path, worker_id: str,
                         **overrides: Any) -> AsyncIterator[WorkerApp]:
    """A started worker (:func:`worker_settings` with ``overrides``) on a real vLLM engine
    of the demo's base model. On exit the worker stops and the engine closes, its memory
    collected before the next module starts one (also when the worker failed to start)."""
    settings = worker_settings(stack, demo, work, worker_id, **overrides)
    engine = await VllmEngine.start(demo.base_model.dir, settings.engine_options())
    try:
        worker = WorkerApp(settings, engine, registry=CollectorRegistry())
        await worker.start()
        try:
            yield worker
        finally:
            await worker.stop()
    finally:
        await engine.close()
        del engine
        gc.collect()


def gateway_settings(stack: Stack, cp: ControlPlane, demo: DemoManifest, *,
                     instance_id: str, **overrides: Any) -> GatewaySettings:
    """An in-process gateway on free ports against ``cp``'s registry (no metrics server;
    a cache-manager address nobody serves unless the test starts one there), its public
    ports on TLS as the stack's gateways serve them (tenants: ``tenant_channel``)."""
    values: dict[str, Any] = {
        "kafka_bootstrap": stack.settings.kafka_bootstrap, "grpc_port": free_port(),
        "http_port": free_port(), "metrics_port": 0, "registry_addr": cp.registry.address,
        "registry_token": TOKEN, "cache_manager_addr": f"127.0.0.1:{free_port()}",
        "default_base_model": demo.base_model.name, "heat_flush_interval_s": 0.5,
        "instance_id": instance_id, **tls_settings(stack, GATEWAY),
        **edge_tls_settings(stack),  # its public ports: TLS as the stack's gateways'
    }
    values.update(overrides)
    return GatewaySettings(**values)


BUDGETS_YAML = (
    "interactive: {budget_ms: 300, on_cold: degrade}\n"
    "background: {budget_ms: 60000, on_cold: wait}\n"
)
"""Budgets of a managed platform: interactive degrades past 300 ms, background waits."""


@dataclass
class Managed:
    """An in-process gateway and a cache-manager process that leads, one tenant's key."""

    gateway: GatewayApp
    manager: Manager
    manager_addr: str
    """The cache manager's gRPC address (the gateway's ``cache_manager_addr``)."""
    key: str


@contextlib.asynccontextmanager
async def managed_gateway(stack: Stack, cp: ControlPlane, demo: DemoManifest, work: Path, *,
                          unique: str, tenant: str, rules: dict[str, object],
                          policy: dict[str, object] | None = None,
                          **manager_env: str) -> AsyncIterator[Managed]:
    """A gateway (budgets :data:`BUDGETS_YAML`) whose cache manager is a real process
    started with ``rules`` / ``policy`` and planning, ``tenant`` with an API key; both
    stopped at the end (the manager first)."""
    cm_port = free_port()
    budgets = work / "budgets.yaml"
    budgets.write_text(BUDGETS_YAML)
    gateway = GatewayApp(
        gateway_settings(stack, cp, demo, instance_id=f"gw-{unique}",
                         cache_manager_addr=f"127.0.0.1:{cm_port}", budgets_file=budgets),
        registry=CollectorRegistry(),
        serve_metrics=False,
    )
    await gateway.start()
    try:
        await gateway.wait_ready(60)
        launcher = Launcher({**stack.settings.client_env(), "LORAPLANE_POSTGRES_DSN": cp.dsn},
                            work, unique, tenants=tenant, stack=stack)
        try:
            key = await tenant_with_key(cp.cli_env, tenant)
            manager = launcher.start(
                rules, policy,
                LORAPLANE_REGISTRY_ADDR=cp.registry.address,
                LORAPLANE_REGISTRY_OPERATOR_TOKEN=cp.cli_env["LORAPLANE_REGISTRY_OPERATOR_TOKEN"],
                LORAPLANE_CACHE_MANAGER_GRPC_PORT=str(cm_port),
                **manager_env,
            )
            await manager.wait_planning(60)
            yield Managed(gateway, manager, f"127.0.0.1:{cm_port}", key)
        finally:
            launcher.stop_all()
    finally:
        await gateway.stop(1)


async def run_cli(env: dict[str, str], *args: str, ok: bool = True) -> Any:
    """The ``loraplane`` CLI in a thread (the services share the test's loop); asserts
    exit 0 unless ``ok`` is false. Returns the click result."""
    result = await asyncio.to_thread(CliRunner().invoke, cli_app, list(args), env=env)
    if ok:
        assert result.exit_code == 0, (args, result.stdout, result.stderr)
    return result


async def tenant_with_key(cli_env: dict[str, str], tenant: str, *,
                          priority: str = "gold") -> str:
    """Create ``tenant`` (``priority``) and an API key of it, through the CLI; the key."""
    await run_cli(cli_env, "tenants", "create", tenant, "--priority", priority)
    created = await run_cli(cli_env, "keys", "create", tenant, "--json")
    return str(json.loads(created.stdout)["secret"])


def adapter_copy(demo: DemoManifest, work: Path, name: str, version: str) -> Path:
    """A private copy (under ``work``) of the demo adapter ``name`` ``version``: a release
    never touches the demo's cache."""
    src = next(a for a in demo.adapters if (a.name, a.version) == (name, version))
    dst = work / "adapters" / f"{name}-{version}-{uuid.uuid4().hex[:6]}"
    shutil.copytree(src.dir, dst)
    return dst


async def release(cli_env: dict[str, str], demo: DemoManifest, adapter: Path, *,
                  tenant: str, name: str, version: str, wait_s: int = 120,
                  ok: bool = True) -> Any:
    """``loraplane release adapter`` as ``tenant/name`` ``version`` on the demo's base
    model, signed with the demo's key, waiting ``wait_s`` for the verdict (``--json``);
    asserts exit 0 unless ``ok`` is false. Returns the click result."""
    return await run_cli(
        cli_env, "release", str(adapter), "--tenant", tenant, "--name", name,
        "--version", version, "--base-model", demo.base_model.name,
        "--signing-key", str(demo.keys.private_key), "--wait", str(wait_s), "--json", ok=ok)


async def catalog_shows(gateway: GatewayApp, tenant: str, name: str,
                        check: Callable[[Any], bool], *, timeout_s: float = 60.0) -> None:
    """Wait until ``check(entry)`` holds for the gateway's catalogue entry of
    ``tenant/name`` (an adapter the gateway does not know yet counts as not)."""
    catalog = gateway.gateway.catalog

    def shows() -> bool:
        try:
            return bool(check(catalog.lookup(tenant, name)))
        except LoraplaneError:
            return False

    await eventually(shows, timeout_s=timeout_s, every_s=0.2)


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
