"""Admission service properties on the real stack: one verdict per version under
redelivery, nothing admitted by a crash mid-check, recovery after a broker restart, and the
``python -m loraplane.admission`` entry point with its metrics."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from minio import Minio
from prometheus_client import CollectorRegistry

from loraplane.admission import admitter as admitter_mod
from loraplane.admission.app import AdmissionApp
from loraplane.stack.stack import Stack
from loraplane.v1 import events_pb2
from tests.support.ports import free_port

from .conftest import Keys, admission_settings
from .corpus import Built, Case, Env, base_copy, signed
from .drive import plan_direct, publish_releases, read_verdicts, upload


def _release(env: Env, stack: Stack, s3: Minio, tenant_id: str, name: str
             ) -> events_pb2.AdapterReleased:
    """Upload a valid signed adapter and return the release an honest registry would send."""
    def build(env: Env, out: Path) -> Built:
        return Built(signed(env, base_copy(env, out)))

    case = Case(name, "direct", frozenset(), "", build)
    built = build(env, env.work / f"svc-{name}-{uuid.uuid4().hex[:6]}")
    planned = plan_direct(case, built, tenant_id=tenant_id,
                          bucket=stack.settings.artifact_bucket, tiny=env.spec.name,
                          tokenizer_revision=env.spec.tokenizer_revision)
    upload(s3, planned.bucket, planned.objects)
    return planned.release


class Isolated:
    """An admission app on unique topics and a unique consumer group."""

    def __init__(self, stack: Stack, keys: Keys, quarantine: Path, **over: Any) -> None:
        u = uuid.uuid4().hex[:8]
        self.releases = f"adapter.releases.t{u}"
        self.admissions = f"adapter.admissions.t{u}"
        self.settings = admission_settings(
            stack, keys, quarantine, admission_releases_topic=self.releases,
            admission_admissions_topic=self.admissions, **over)
        self.bootstrap = stack.settings.kafka_bootstrap

    def app(self) -> AdmissionApp:
        return AdmissionApp(self.settings, registry=CollectorRegistry(), serve_metrics=False)

    async def verdicts(self, key: tuple[str, str], n: int, timeout: float = 60
                       ) -> list[events_pb2.AdmissionEvent]:
        got = await read_verdicts(self.bootstrap, lambda g: len(g.get(key, [])) >= n,
                                  topic=self.admissions, timeout=timeout)
        return got[key]


@pytest.fixture
async def isolated(stack: Stack, keys: Keys, tmp_path: Path) -> AsyncIterator[Isolated]:
    yield Isolated(stack, keys, tmp_path / "quarantine")


def _key(release: events_pb2.AdapterReleased) -> tuple[str, str]:
    ref = release.meta.adapter
    return f"{ref.tenant_id}/{ref.adapter_name}", ref.version


async def test_redelivered_release_yields_the_same_single_verdict(
        stack: Stack, s3: Minio, corpus_env: Env, tenants: dict[str, str],
        isolated: Isolated) -> None:
    release = await asyncio.to_thread(_release, corpus_env, stack, s3, tenants["acme"],
                                      "redelivered")
    again = events_pb2.AdapterReleased()
    again.CopyFrom(release)
    again.meta.event_id = str(uuid.uuid4())  # a second release event for the same version
    app = isolated.app()
    await app.start()
    try:
        await publish_releases(isolated.bootstrap, [release, release, again],
                               topic=isolated.releases)
        events = await isolated.verdicts(_key(release), 3)
    finally:
        await app.stop()
    assert len(events) == 3
    assert events[0].WhichOneof("verdict") == "admitted"
    assert {e.SerializeToString(deterministic=True) for e in events} == {
        events[0].SerializeToString(deterministic=True)}  # same bytes, same event_id
    assert app.metrics.replays._value.get() == 2
    assert app.metrics.verdicts.labels("admitted")._value.get() == 1
    conn = await asyncpg.connect(stack.settings.postgres_dsn)
    try:
        rows = await conn.fetch("SELECT result, verdict_event_id::text AS id FROM "
                                "admission_verdicts WHERE adapter_id = $1", _key(release)[0])
    finally:
        await conn.close()
    assert [(r["result"], r["id"]) for r in rows] == [
        ("admitted", events[0].admitted.meta.event_id)]


async def test_crash_mid_check_admits_nothing(
        stack: Stack, s3: Minio, corpus_env: Env, tenants: dict[str, str],
        isolated: Isolated, monkeypatch: pytest.MonkeyPatch) -> None:
    release = await asyncio.to_thread(_release, corpus_env, stack, s3, tenants["acme"],
                                      "crashed")
    entered, resume = threading.Event(), threading.Event()
    real = admitter_mod.check_quarantined

    def stuck(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        resume.wait(30)
        raise RuntimeError("the process died here")

    monkeypatch.setattr(admitter_mod, "check_quarantined", stuck)
    app = isolated.app()
    await app.start()
    await publish_releases(isolated.bootstrap, [release], topic=isolated.releases)
    assert await asyncio.to_thread(entered.wait, 60), "the check never started"
    for task in app._tasks:  # the process dies: no graceful end of the check
        task.cancel()
    await app.stop()
    resume.set()
    monkeypatch.setattr(admitter_mod, "check_quarantined", real)

    conn = await asyncpg.connect(stack.settings.postgres_dsn)
    try:
        stored = await conn.fetchval("SELECT count(*) FROM admission_verdicts "
                                     "WHERE adapter_id = $1", _key(release)[0])
    finally:
        await conn.close()
    assert stored == 0
    with pytest.raises(TimeoutError):
        await isolated.verdicts(_key(release), 1, timeout=3)

    restarted = isolated.app()  # same group: the uncommitted release is delivered again
    await restarted.start()
    try:
        events = await isolated.verdicts(_key(release), 1)
    finally:
        await restarted.stop()
    assert [e.WhichOneof("verdict") for e in events] == ["admitted"]


async def test_consumer_recovers_after_a_broker_restart(
        stack: Stack, s3: Minio, corpus_env: Env, tenants: dict[str, str],
        isolated: Isolated) -> None:
    first = await asyncio.to_thread(_release, corpus_env, stack, s3, tenants["acme"],
                                    "before-restart")
    second = await asyncio.to_thread(_release, corpus_env, stack, s3, tenants["acme"],
                                     "after-restart")
    app = isolated.app()
    await app.start()
    try:
        await publish_releases(isolated.bootstrap, [first], topic=isolated.releases)
        await isolated.verdicts(_key(first), 1)
        assert app.consumer is not None and app.consumer.consumers_started == 1
        stack.tansu.kill()
        await asyncio.sleep(2.5)  # the probe notices the loss
        stack.tansu.start()
        await publish_releases(isolated.bootstrap, [second], topic=isolated.releases)
        events = await isolated.verdicts(_key(second), 1, timeout=90)
    finally:
        await app.stop()
    assert events[0].WhichOneof("verdict") == "admitted"
    assert app.consumer.consumers_started >= 2
    assert app.metrics.consumer_restarts._value.get() >= 1


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


async def _until(check: Callable[[], bool], timeout: float) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.2)


async def test_entry_point_serves_and_stops(
        stack: Stack, s3: Minio, corpus_env: Env, tenants: dict[str, str], keys: Keys,
        tmp_path: Path) -> None:
    release = await asyncio.to_thread(_release, corpus_env, stack, s3, tenants["globex"],
                                      "entry-point")
    u = uuid.uuid4().hex[:8]
    port = free_port()
    env = {**os.environ, **stack.settings.client_env(),
           "LORAPLANE_ADMISSION_METRICS_PORT": str(port),
           "LORAPLANE_ADMISSION_RELEASES_TOPIC": f"adapter.releases.e{u}",
           "LORAPLANE_ADMISSION_ADMISSIONS_TOPIC": f"adapter.admissions.e{u}",
           "LORAPLANE_ADMISSION_CONSUMER_GROUP": f"admission-e{u}",
           "LORAPLANE_ADMISSION_PLATFORM_KEYS_DIR": str(keys.platform_dir),
           "LORAPLANE_ADMISSION_TENANT_KEYS_DIR": str(keys.tenant_dir),
           "LORAPLANE_ADMISSION_QUARANTINE_DIR": str(tmp_path / "q")}
    log = (tmp_path / "admission.log").open("w+")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loraplane.admission", env=env, stdout=log,
        stderr=subprocess.STDOUT)
    try:
        await _until(lambda: "admission ready" in Path(log.name).read_text(), 60)
        await publish_releases(stack.settings.kafka_bootstrap, [release],
                               topic=f"adapter.releases.e{u}")
        got = await read_verdicts(stack.settings.kafka_bootstrap,
                                  lambda g: _key(release) in g,
                                  topic=f"adapter.admissions.e{u}", timeout=60)
        assert got[_key(release)][0].WhichOneof("verdict") == "admitted"
        metrics = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
        assert 'loraplane_admission_verdicts_total{result="admitted"} 1.0' in metrics
        assert "loraplane_admission_check_duration_seconds_bucket" in metrics
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        log.close()
    assert not any((tmp_path / "q").rglob("q-*"))  # no quarantine copy left behind
