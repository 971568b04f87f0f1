"""Demo seed for ``make run``: the tiny base model and signed demo adapters, then the demo
tenants, API keys and releases through the real release path (registry → admission).

Re-runnable: tenants and versions that exist are kept (versions are immutable, a re-release
with the same digest is an idempotent success); fresh API keys are issued on every run since
secrets are shown only once.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import grpc

from loraplane.devkit.builder import DemoManifest, build_demo
from loraplane.shared.resources import config_file
from loraplane.stack.services import SERVICES
from loraplane.v1 import common_pb2, registry_pb2

DEMO_TENANT = "acme"
OTHER_TENANT = "globex"
TENANT_PRIORITY = {DEMO_TENANT: common_pb2.PRIORITY_GOLD, OTHER_TENANT: common_pb2.PRIORITY_SILVER}
#: adapter (tenant, name) -> version made canary at this percent when the demo has two versions
CANARY_PERCENT = 10
VERDICT_TIMEOUT_S = 120.0


def worker_model_env(manifest: DemoManifest) -> dict[str, str]:
    """What the stack's workers serve: the demo build's base model, its directory and
    tokenizer revision, and the dev public key its adapters are signed with (a worker has
    no default model: :data:`loraplane.worker.settings.MODEL_SETTINGS`)."""
    return {
        "LORAPLANE_BASE_MODEL": manifest.base_model.name,
        "LORAPLANE_BASE_MODEL_DIR": str(manifest.base_model.dir),
        "LORAPLANE_TOKENIZER_REVISION": manifest.base_model.tokenizer_revision,
        "LORAPLANE_TRUSTED_KEYS": str(manifest.keys.public_key),
    }


def seed_models(echo: Callable[[str], None]) -> tuple[DemoManifest, dict[str, str]]:
    """Build (or reuse the cached) model and adapters; return the manifest and env entries."""
    manifest = build_demo()
    echo(f"  demo models  ready in {manifest.root} ({len(manifest.adapters)} adapters)")
    names = sorted({a.name for a in manifest.adapters if a.tenant == DEMO_TENANT})
    return manifest, {
        "LORAPLANE_BASE_MODEL": manifest.base_model.name,
        "LORAPLANE_BASE_MODEL_DIR": str(manifest.base_model.dir),
        "LORAPLANE_SIGNING_KEY": str(manifest.keys.private_key),
        "LORAPLANE_SIGNING_PUBLIC_KEY": str(manifest.keys.public_key),
        "LORAPLANE_DEMO_TENANT": DEMO_TENANT,
        "LORAPLANE_OTHER_TENANT": OTHER_TENANT,
        "LORAPLANE_DEMO_ADAPTERS": ",".join(names),
    }


def _service_running(name: str) -> bool:
    return any(svc.name == name and svc.exists() for svc in SERVICES)


def seed_platform(manifest: DemoManifest, env: dict[str, str],
                  echo: Callable[[str], None]) -> dict[str, str]:
    """Tenants, keys and releases through the registry; returns demo.env entries."""
    if not _service_running("registry"):
        return {}
    from loraplane.registry.client import (
        RegistryClient,
        release_adapter,
        s3_client,
        wait_for_verdict,
    )
    from loraplane.registry.settings import RegistryClientSettings
    from loraplane.shared.catalogue import load_catalogue
    from loraplane.shared.tls import tls_fields

    settings = RegistryClientSettings(
        registry_addr=env["LORAPLANE_REGISTRY_ADDR"],
        registry_operator_token=env["LORAPLANE_REGISTRY_OPERATOR_TOKEN"],  # type: ignore[arg-type]
        registry_actor="make-run/seed",
        s3_endpoint=env["LORAPLANE_S3_ENDPOINT"],
        s3_access_key=env["LORAPLANE_S3_ACCESS_KEY"],
        s3_secret_key=env["LORAPLANE_S3_SECRET_KEY"],
        **tls_fields(env),  # the operator's certificate (mutual TLS on)
    )
    catalogue = load_catalogue(config_file("base_models.yaml"))
    out: dict[str, str] = {}
    with RegistryClient.from_settings(settings) as reg:
        for tenant, prio in TENANT_PRIORITY.items():
            reg.ensure_tenant(tenant, display_name=f"{tenant} (demo)", priority=prio)
        _, demo_key = reg.create_api_key(DEMO_TENANT, "make run demo key")
        _, other_key = reg.create_api_key(OTHER_TENANT, "make run demo key")
        out["LORAPLANE_DEMO_API_KEY"] = demo_key
        out["LORAPLANE_OTHER_TENANT_API_KEY"] = other_key
        echo(f"  tenants      {', '.join(TENANT_PRIORITY)} with fresh API keys")

        s3 = s3_client(settings)
        released: list[tuple[str, str, str]] = []
        for a in manifest.adapters:
            # Release a copy so that the cached demo directory is never modified.
            with tempfile.TemporaryDirectory() as tmp:
                work = Path(tmp) / a.version
                shutil.copytree(a.dir, work)
                release_adapter(
                    reg, s3, directory=work, tenant=a.tenant, name=a.name, version=a.version,
                    base_model=a.base_model, signing_key=manifest.keys.private_key,
                    tokenizer_revision=catalogue.get(a.base_model).tokenizer_revision,
                )
            released.append((a.tenant, a.name, a.version))
        echo(f"  releases     {len(released)} versions registered through the release path")

        if not _service_running("admission"):
            return out
        admitted: dict[tuple[str, str], list[str]] = {}
        for tenant, name, version in released:
            rec = wait_for_verdict(reg, tenant, name, version, timeout_s=VERDICT_TIMEOUT_S)
            if rec is None:
                echo(f"  warning: no admission verdict for {tenant}/{name}@{version}")
                continue
            if rec.status == common_pb2.VERSION_STATUS_REJECTED:
                echo(f"  warning: {tenant}/{name}@{version} was rejected")
                continue
            admitted.setdefault((tenant, name), []).append(version)
        for (tenant, name), versions in sorted(admitted.items()):
            versions.sort()
            _set_release(reg, tenant, name, stable=versions[0],
                         canary=versions[1] if len(versions) > 1 else None)
        echo(f"  admitted     {sum(len(v) for v in admitted.values())} versions; stable "
             f"pointers set, canary at {CANARY_PERCENT}% where a newer version exists")
    return out


def _set_release(reg: object, tenant: str, name: str, *, stable: str, canary: str | None) -> None:
    call = reg.call  # type: ignore[attr-defined]
    current = call("GetRelease", registry_pb2.GetReleaseRequest(
        tenant_id=tenant, adapter_name=name)).release
    try:
        if current.stable_version != stable and not current.stable_version:
            call("Promote", registry_pb2.PromoteRequest(
                tenant_id=tenant, adapter_name=name, version=stable, reason="demo seed"))
        if canary and current.canary_version != canary:
            call("SetCanary", registry_pb2.SetCanaryRequest(
                tenant_id=tenant, adapter_name=name, version=canary, percent=CANARY_PERCENT,
                reason="demo seed"))
    except grpc.RpcError as exc:  # keep serving; the operator sees why
        raise RuntimeError(f"seeding the release of {tenant}/{name}: {exc.details()}") from exc
