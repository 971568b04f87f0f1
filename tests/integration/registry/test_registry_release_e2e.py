"""End to end: ``loraplane release`` (a real subprocess, as in CI) against the registry
process (``python -m loraplane.registry``) and the admission service
(``python -m loraplane.admission``) on the test stack.

* a release while the broker is down registers (pending) and ``--wait`` exits 4; once
  the broker is back the same release is admitted and ``--wait`` exits 0;
* a tampered adapter (NaN written after signing) is rejected: exit 3, every reason
  printed;
* the registry unreachable, or the object store stopped: exit 5, the component named
  with its address;
* SIGTERM stops the registry process cleanly (exit 0) and its ``/metrics`` counted the
  registrations.

Both processes use their own topic namespace (``LORAPLANE_REGISTRY_TOPIC_PREFIX`` and the
admission topic settings), so other tests' services never see these releases.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import struct
import sys
import urllib.request
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from loraplane.devkit.builder import DemoManifest, build_demo
from loraplane.shared.signing import sign_directory
from loraplane.shared.tls import GATEWAY, OPERATOR, REGISTRY_ID
from loraplane.shared.topics import ADAPTER_ADMISSIONS, ADAPTER_RELEASES
from loraplane.stack.stack import Stack
from tests.support.ports import free_port
from tests.support.tls import tls_env

TOKEN = "e2e-operator-token-0123456789"
LOGS = Path(os.environ.get("LORAPLANE_TEST_LOGS", "/tmp"))


@dataclass
class Proc:
    """A service subprocess."""

    proc: asyncio.subprocess.Process
    log: Path

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])


async def _start(module: str, env: dict[str, str], ready: str, log: Path) -> Proc:
    logf = log.open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, env=env, stdout=logf, stderr=asyncio.subprocess.STDOUT)
    logf.close()
    p = Proc(proc, log)
    deadline = asyncio.get_running_loop().time() + 60
    while ready not in log.read_text(errors="replace"):
        if proc.returncode is not None or asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{module} did not start:\n{p.tail()}")
        await asyncio.sleep(0.2)
    return p


async def _terminate(p: Proc) -> int:
    if p.proc.returncode is None:
        p.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(p.proc.wait(), 20)
        except TimeoutError:
            p.proc.kill()
            await p.proc.wait()
    assert p.proc.returncode is not None
    return p.proc.returncode


@dataclass
class E2E:
    """The running services and the CLI environment."""

    env: dict[str, str]
    registry: Proc
    metrics_port: int
    demo: DemoManifest
    work: Path
    admission: Proc | None = None

    async def cli(self, *args: str, timeout: float = 120) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "loraplane.cli.main", *args, env=self.env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    def adapter_copy(self, name: str, *, keep_signature: bool) -> Path:
        src = self.demo.adapter("acme", "support").dir
        dst = self.work / name
        shutil.copytree(src, dst)
        if not keep_signature:
            (dst / "model.sig").unlink()
        return dst

    def release_args(self, directory: Path, tenant: str, version: str) -> list[str]:
        return ["release", str(directory), "--tenant", tenant, "--name", "support",
                "--version", version, "--base-model", self.demo.base_model.name,
                "--signing-key", str(self.demo.keys.private_key)]


@pytest.fixture(scope="module")
async def e2e(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[E2E]:
    demo = await asyncio.to_thread(build_demo)
    work = tmp_path_factory.mktemp("e2e")
    ns = f"e2e{uuid.uuid4().hex[:8]}."
    port, metrics_port = free_port(), free_port()
    base = {**os.environ, **stack.settings.client_env(), "HF_HUB_OFFLINE": "1"}
    registry_env = {
        **base,
        "LORAPLANE_REGISTRY_GRPC_PORT": str(port),
        "LORAPLANE_REGISTRY_METRICS_PORT": str(metrics_port),
        "LORAPLANE_REGISTRY_OPERATOR_TOKEN": TOKEN,
        "LORAPLANE_REGISTRY_CONSUMER_GROUP": f"registry-{ns}",
        "LORAPLANE_REGISTRY_TOPIC_PREFIX": ns,
        "LORAPLANE_REGISTRY_GRACE_S": "1",
        "LORAPLANE_INSTANCE_ID": "registry-e2e",
        **tls_env(stack, REGISTRY_ID),
    }
    empty = work / "no-tenant-keys"
    empty.mkdir()
    admission_env = {
        **base,
        "LORAPLANE_ADMISSION_METRICS_PORT": "0",
        "LORAPLANE_ADMISSION_CONSUMER_GROUP": f"admission-{ns}",
        "LORAPLANE_ADMISSION_RELEASES_TOPIC": ns + ADAPTER_RELEASES,
        "LORAPLANE_ADMISSION_ADMISSIONS_TOPIC": ns + ADAPTER_ADMISSIONS,
        "LORAPLANE_ADMISSION_PLATFORM_KEYS_DIR": str(demo.keys.public_key.parent),
        "LORAPLANE_ADMISSION_TENANT_KEYS_DIR": str(empty),
        "LORAPLANE_ADMISSION_QUARANTINE_DIR": str(work / "quarantine"),
        "LORAPLANE_ADMISSION_PROBE_INTERVAL_S": "1",
        "LORAPLANE_INSTANCE_ID": "admission-e2e",
        **tls_env(stack, "admission"),
    }
    registry = await _start("loraplane.registry", registry_env, "registry ready",
                            LOGS / f"registry-{ns}log")
    admission = None
    try:
        admission = await _start("loraplane.admission", admission_env, "admission ready",
                                 LOGS / f"admission-{ns}log")
        cli_env = {**base, "LORAPLANE_REGISTRY_ADDR": f"127.0.0.1:{port}",
                   "LORAPLANE_REGISTRY_OPERATOR_TOKEN": TOKEN,
                   "LORAPLANE_REGISTRY_ACTOR": "ci/e2e-pipeline", "COLUMNS": "200",
                   **tls_env(stack, OPERATOR)}
        yield E2E(cli_env, registry, metrics_port, demo, work, admission)
    finally:
        if admission is not None:
            await _terminate(admission)
        await _terminate(registry)


async def test_release_pending_timeout_then_admitted(e2e: E2E, stack: Stack,
                                                     unique: str) -> None:
    tenant = f"e2e-{unique}"
    rc, out, err = await e2e.cli("tenants", "create", tenant, "--priority", "gold")
    assert rc == 0, err
    adapter = e2e.adapter_copy("good", keep_signature=False)
    args = e2e.release_args(adapter, tenant, "v1")

    # Broker down: the release registers (pending); the verdict cannot come: exit 4.
    stack.tansu.stop()
    try:
        rc, out, err = await e2e.cli(*args, "--wait", "2", "--json")
        assert rc == 4, err
        result = json.loads(out)
        assert result["verdict"] == "timeout"
        assert result["version"]["status"] == "VERSION_STATUS_PENDING"
        assert (adapter / "model.sig").exists()  # signed by the CLI
    finally:
        stack.tansu.start()

    # Broker back: the same release (idempotent, nothing re-uploaded) is admitted: exit 0.
    rc, out, err = await e2e.cli(*args, "--wait", "90", "--json")
    admission_log = e2e.admission.tail() if e2e.admission is not None else "(none)"
    assert rc == 0, (f"{err}\n--- registry log ---\n{e2e.registry.tail()}"
                     f"\n--- admission log ---\n{admission_log}")
    result = json.loads(out)
    assert result["verdict"] == "admitted"
    version = result["version"]
    assert version["status"] == "VERSION_STATUS_ADMITTED"
    assert version["artifact_uri"].startswith(
        f"s3://{stack.settings.artifact_bucket}/adapters/{tenant}/support/v1/")
    assert version["sha256"] == e2e.demo.adapter("acme", "support").manifest_digest
    assert version["signer_identity"] == e2e.demo.keys.identity
    assert version["effective_priority"] == "PRIORITY_GOLD"

    # Operators see it and can promote it.
    rc, out, _ = await e2e.cli("promote", f"{tenant}/support", "v1", "--json")
    assert rc == 0 and json.loads(out)["stable_version"] == "v1"
    rc, out, _ = await e2e.cli("adapters", "list", "--tenant", tenant, "--json")
    assert [(v["version"], v["status"]) for v in json.loads(out)] == [
        ("v1", "VERSION_STATUS_ACTIVE")]
    rc, out, _ = await e2e.cli("audit", "--subject", f"{tenant}/", "--json")
    entries = json.loads(out)
    assert [e["action"] for e in entries] == ["release.promote", "version.admit",
                                              "version.register"]
    assert entries[-1]["actor"] == "ci/e2e-pipeline"
    assert entries[1]["actor"] == "system/admission"


async def test_tampered_release_is_rejected_with_every_reason(e2e: E2E, unique: str) -> None:
    tenant = f"e2e-{unique}"
    assert (await e2e.cli("tenants", "create", tenant))[0] == 0
    adapter = e2e.adapter_copy("tampered", keep_signature=True)
    sign_directory(adapter, e2e.demo.keys.private_key)
    weights = adapter / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    (header_len,) = struct.unpack("<Q", data[:8])
    data[8 + header_len: 8 + header_len + 4] = struct.pack("<f", float("nan"))
    weights.write_bytes(bytes(data))  # after signing: digest mismatch + NaN

    rc, out, err = await e2e.cli(*e2e.release_args(adapter, tenant, "v1"), "--wait", "90")
    assert rc == 3, f"{out}\n{err}\n--- registry log ---\n{e2e.registry.tail()}"
    assert "rejected" in err
    assert "digest_mismatch" in err and "non_finite" in err  # every reason printed
    rc, out, _ = await e2e.cli("adapters", "show", f"{tenant}/support", "v1")
    shown = json.loads(out)
    assert shown["status"] == "VERSION_STATUS_REJECTED"
    codes = {r["code"] for r in shown["reasons"]}
    assert {"REJECTION_CODE_DIGEST_MISMATCH", "REJECTION_CODE_NON_FINITE"} <= codes


async def test_bad_input_and_auth_exit_nonzero(e2e: E2E, stack: Stack, unique: str) -> None:
    adapter = e2e.adapter_copy("bad-input", keep_signature=True)
    rc, _, err = await e2e.cli(*e2e.release_args(adapter, f"nobody-{unique}", "v1"))
    assert rc == 1 and "NOT_FOUND" in err
    env = dict(e2e.env)
    e2e.env["LORAPLANE_REGISTRY_OPERATOR_TOKEN"] = "not-the-operator-token"
    # a certificate of the platform that is not the operator's (the operator's alone
    # administers): the token decides
    e2e.env.update(tls_env(stack, GATEWAY))
    try:
        rc, _, err = await e2e.cli("tenants", "list")
    finally:
        e2e.env.clear()
        e2e.env.update(env)
    assert rc == 1 and "PERMISSION_DENIED" in err


async def test_an_unreachable_registry_or_object_store_is_named_and_exits_5(
    e2e: E2E, stack: Stack, unique: str
) -> None:
    """No raw ``MaxRetryError`` / gRPC status: which component, at which address, exit 5."""
    tenant = f"e2e-{unique}"
    rc, _, err = await e2e.cli("tenants", "create", tenant)
    assert rc == 0, err
    args = e2e.release_args(e2e.adapter_copy("unreachable", keep_signature=False), tenant, "v1")

    closed = f"127.0.0.1:{free_port()}"  # nothing listens there
    env = dict(e2e.env)
    e2e.env["LORAPLANE_REGISTRY_ADDR"] = closed
    try:
        rc, _, err = await e2e.cli(*args)
    finally:
        e2e.env.clear()
        e2e.env.update(env)
    assert rc == 5, err
    assert f"cannot reach the registry at {closed} (LORAPLANE_REGISTRY_ADDR)" in err
    assert "Traceback" not in err

    endpoint = e2e.env["LORAPLANE_S3_ENDPOINT"]
    await asyncio.to_thread(stack.seaweedfs.stop)
    try:
        rc, _, err = await e2e.cli(*args)
    finally:
        await asyncio.to_thread(stack.seaweedfs.start)
    assert rc == 5, err
    assert (f"cannot reach the object store at {endpoint} (LORAPLANE_S3_ENDPOINT): "
            "Connection refused") in err
    assert "MaxRetryError" not in err and "Traceback" not in err
    # nothing was registered: once the store is back the same release goes through
    rc, out, _ = await e2e.cli("adapters", "list", "--tenant", tenant, "--json")
    assert rc == 0 and json.loads(out) == []
    rc, _, err = await e2e.cli(*args)
    assert rc == 0, err


async def test_registry_process_metrics_and_graceful_stop(e2e: E2E) -> None:
    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{e2e.metrics_port}/metrics",
                                    timeout=5) as resp:
            return str(resp.read().decode())

    text = await asyncio.to_thread(scrape)
    assert "loraplane_registry_registrations_total{" in text
    assert "loraplane_outbox_rows_waiting" in text
    assert 'code="OK",method="RegisterVersion"' in text
    assert await _terminate(e2e.registry) == 0
    assert "registry stopped" in e2e.registry.log.read_text()
