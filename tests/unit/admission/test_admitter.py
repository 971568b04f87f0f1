"""Admitter and ReleaseConsumer with in-memory fakes: one verdict per version, nothing
fetched for refused sources, streaming limits, quarantine always emptied, outages retried."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from loraplane.admission import admitter as admitter_mod
from loraplane.admission.admitter import Admitter, DependencyDown
from loraplane.admission.consumer import ReleaseConsumer
from loraplane.admission.metrics import AdmissionMetrics
from loraplane.admission.problems import (
    DOWNLOAD_FAILED,
    FORBIDDEN_FILE,
    INTERNAL,
    SIZE_LIMIT,
    SOURCE_NOT_ALLOWED,
)
from loraplane.admission.settings import AdmissionSettings
from loraplane.admission.trust import TrustStore
from loraplane.admission.verdicts import MemoryVerdictStore
from loraplane.shared.catalogue import BaseModelSpec, Catalogue
from loraplane.shared.codec import encode, kafka_headers
from loraplane.shared.errors import Unavailable
from loraplane.shared.objectstore import ObjectInfo, ObjectMissing
from loraplane.shared.signing import compute_manifest_digest
from loraplane.shared.topics import new_meta
from loraplane.v1 import common_pb2, events_pb2

BUCKET = "loraplane-artifacts"


@dataclass
class FakeStore:
    """Objects in a dict; records what was listed and fetched."""

    objects: dict[str, bytes] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # lies in the listing
    listed: list[str] = field(default_factory=list)
    fetched: list[str] = field(default_factory=list)
    down: bool = False

    def list(self, bucket: str, prefix: str) -> list[ObjectInfo]:
        if self.down:
            raise Unavailable("object store: connection refused")
        self.listed.append(prefix)
        return [ObjectInfo(k, self.sizes.get(k, len(v))) for k, v in sorted(self.objects.items())
                if k.startswith(prefix)]

    def stream(self, bucket: str, key: str) -> Iterator[bytes]:
        if key not in self.objects:
            raise ObjectMissing(key)
        self.fetched.append(key)
        data = self.objects[key]
        return iter([data[i:i + 1000] for i in range(0, len(data), 1000)])


def _release(adapter: Path, tiny: BaseModelSpec, **kw: Any) -> events_pb2.AdapterReleased:
    sha = kw.pop("sha256", None) or compute_manifest_digest(adapter)
    ref = common_pb2.AdapterRef(tenant_id="acme", adapter_name="support", version="v1",
                                base_model=tiny.name)
    uri = f"s3://{BUCKET}/adapters/acme/support/v1/{sha}/"
    fields: dict[str, Any] = {
        "meta": new_meta("registry/test", ref), "engine_id": 7, "rank": 8, "format": "peft",
        "target_modules": ["q_proj", "v_proj"], "artifact_uri": uri, "sha256": sha,
        "size_bytes": 123, "tokenizer_revision": tiny.tokenizer_revision, "lora_alpha": 16.0,
        "priority": common_pb2.PRIORITY_GOLD}
    fields.update(kw)
    return events_pb2.AdapterReleased(**fields)


def _upload(store: FakeStore, adapter: Path, release: events_pb2.AdapterReleased) -> None:
    key = release.artifact_uri.removeprefix(f"s3://{BUCKET}/")
    for f in sorted(adapter.iterdir()):
        store.objects[key + f.name] = f.read_bytes()


@pytest.fixture
def settings(tmp_path: Path, keys_dir: Path) -> AdmissionSettings:
    return AdmissionSettings(
        admission_quarantine_dir=tmp_path / "quarantine", artifact_bucket=BUCKET,
        admission_platform_keys_dir=keys_dir / "trusted", admission_tenant_keys_dir=None,
        admission_max_file_bytes=1 << 20, admission_max_total_bytes=2 << 20)


def _admitter(settings: AdmissionSettings, store: FakeStore, catalogue: Catalogue,
              verdicts: MemoryVerdictStore | None = None) -> Admitter:
    return Admitter(settings=settings, store=store, verdicts=verdicts or MemoryVerdictStore(),
                    catalogue=catalogue, trust=TrustStore(settings.admission_platform_keys_dir,
                                                          None),
                    metrics=AdmissionMetrics(CollectorRegistry()))


async def test_admits_and_copies_the_release(adapter: Path, tiny: BaseModelSpec,
                                             catalogue: Catalogue,
                                             settings: AdmissionSettings) -> None:
    store = FakeStore()
    release = _release(adapter, tiny)
    _upload(store, adapter, release)
    admitter = _admitter(settings, store, catalogue)
    event, new = await admitter.decide(release)
    assert new and event.WhichOneof("verdict") == "admitted"
    a = event.admitted
    assert (a.sha256, a.engine_id, a.artifact_uri, a.rank, a.priority, list(a.target_modules)) \
        == (release.sha256, 7, release.artifact_uri, 8, common_pb2.PRIORITY_GOLD,
            ["q_proj", "v_proj"])
    assert a.meta.adapter == release.meta.adapter
    assert a.meta.causation_id == release.meta.event_id
    assert a.meta.producer == "admission/admission-0"
    assert list(a.checks_passed) == ["source", "download", "files", "signature", "config",
                                     "compatibility", "safetensors", "tensors", "finite"]
    assert a.duration_ms > 0
    assert list(admitter.quarantine_root.iterdir()) == []
    assert admitter.metrics.verdicts.labels("admitted")._value.get() == 1
    assert admitter.metrics.bytes_verified._value.get() > 0


async def test_redelivery_yields_the_same_single_verdict(adapter: Path, tiny: BaseModelSpec,
                                                         catalogue: Catalogue,
                                                         settings: AdmissionSettings) -> None:
    store = FakeStore()
    release = _release(adapter, tiny)
    _upload(store, adapter, release)
    admitter = _admitter(settings, store, catalogue)
    first, new1 = await admitter.decide(release)
    fetched = list(store.fetched)
    second, new2 = await admitter.decide(release)
    assert (new1, new2) == (True, False)
    assert second == first  # byte-identical, same event_id
    assert store.fetched == fetched  # nothing fetched or checked again
    assert admitter.metrics.replays._value.get() == 1


async def test_refused_source_fetches_nothing(adapter: Path, tiny: BaseModelSpec,
                                              catalogue: Catalogue,
                                              settings: AdmissionSettings) -> None:
    store = FakeStore()
    sha = compute_manifest_digest(adapter)
    for uri in (f"s3://{BUCKET}/adapters/acme/../globex/x/v1/{sha}/",
                f"s3://{BUCKET}/adapters/acme/support/v0/{sha}/",  # not this version's place
                f"s3://other/adapters/acme/support/v1/{sha}/"):
        release = _release(adapter, tiny, artifact_uri=uri,
                           meta=new_meta("t", _release(adapter, tiny).meta.adapter))
        event, _ = await _admitter(settings, store, catalogue).decide(release)
        assert {r.code for r in event.rejected.reasons} == {SOURCE_NOT_ALLOWED}, uri
    assert store.listed == [] and store.fetched == []


async def test_pickle_and_oversize_never_fetched(adapter: Path, tiny: BaseModelSpec,
                                                 catalogue: Catalogue,
                                                 settings: AdmissionSettings) -> None:
    store = FakeStore()
    release = _release(adapter, tiny)
    _upload(store, adapter, release)
    root = release.artifact_uri.removeprefix(f"s3://{BUCKET}/")
    store.objects[root + "adapter_model.bin"] = b"\x80\x04pickle"
    store.objects[root + "huge.json"] = b"x" * ((1 << 20) + 1)
    store.objects[root + "sub/adapter_config.json"] = b"{}"
    event, _ = await _admitter(settings, store, catalogue).decide(release)
    reasons = {(r.code, r.path) for r in event.rejected.reasons}
    assert reasons == {(FORBIDDEN_FILE, "adapter_model.bin"), (SIZE_LIMIT, "huge.json"),
                       (FORBIDDEN_FILE, "sub/adapter_config.json")}
    assert not [k for k in store.fetched if k.endswith((".bin", "huge.json", "sub/adapter_config.json"))]


async def test_size_limit_enforced_while_streaming(adapter: Path, tiny: BaseModelSpec,
                                                   catalogue: Catalogue,
                                                   settings: AdmissionSettings) -> None:
    store = FakeStore()
    release = _release(adapter, tiny)
    _upload(store, adapter, release)
    key = release.artifact_uri.removeprefix(f"s3://{BUCKET}/") + "adapter_model.safetensors"
    store.sizes[key] = 10  # the listing lies; the body is 2 MiB
    store.objects[key] = b"\x00" * (2 << 20)
    event, _ = await _admitter(settings, store, catalogue).decide(release)
    reasons = [(r.code, r.path, r.message) for r in event.rejected.reasons]
    assert (SIZE_LIMIT, "adapter_model.safetensors",
            "grew past the size limit while streaming (download aborted)") in reasons
    assert {r[0] for r in reasons} == {SIZE_LIMIT}


async def test_empty_artifact_is_a_download_failure(adapter: Path, tiny: BaseModelSpec,
                                                    catalogue: Catalogue,
                                                    settings: AdmissionSettings) -> None:
    event, _ = await _admitter(settings, FakeStore(), catalogue).decide(_release(adapter, tiny))
    assert [r.code for r in event.rejected.reasons] == [DOWNLOAD_FAILED]


async def test_missing_signature_object(adapter: Path, tiny: BaseModelSpec,
                                        catalogue: Catalogue,
                                        settings: AdmissionSettings) -> None:
    store = FakeStore()
    release = _release(adapter, tiny)
    (adapter / "model.sig").unlink()
    _upload(store, adapter, release)
    event, _ = await _admitter(settings, store, catalogue).decide(release)
    assert [(r.code, r.message) for r in event.rejected.reasons] == [
        (events_pb2.REJECTION_CODE_SIGNATURE_INVALID, "signature bundle is missing")]


async def test_outage_stores_nothing_and_raises(adapter: Path, tiny: BaseModelSpec,
                                                catalogue: Catalogue,
                                                settings: AdmissionSettings) -> None:
    store = FakeStore(down=True)
    verdicts = MemoryVerdictStore()
    with pytest.raises(DependencyDown) as err:
        await _admitter(settings, store, catalogue, verdicts).decide(_release(adapter, tiny))
    assert err.value.dependency == "s3" and err.value.retriable
    assert verdicts.rows == {}
    assert not any(settings.admission_quarantine_dir.rglob("q-*"))


async def test_crash_refuses_and_cleans_quarantine(adapter: Path, tiny: BaseModelSpec,
                                                   catalogue: Catalogue,
                                                   settings: AdmissionSettings,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    store = FakeStore()
    release = _release(adapter, tiny)
    _upload(store, adapter, release)

    def boom(*_: object, **__: object) -> None:
        raise MemoryError("simulated")

    monkeypatch.setattr(admitter_mod, "check_quarantined", boom)
    event, _ = await _admitter(settings, store, catalogue).decide(release)
    assert [r.code for r in event.rejected.reasons] == [INTERNAL]
    assert not any(settings.admission_quarantine_dir.rglob("q-*"))


def test_clear_quarantine(settings: AdmissionSettings, catalogue: Catalogue) -> None:
    import os

    q = settings.admission_quarantine_dir
    gone = q / "proc-999999999" / "q-left" / "artifact"
    gone.mkdir(parents=True)
    (gone / "adapter_model.safetensors").write_bytes(b"x")
    mine = q / f"proc-{os.getpid()}" / "q-old"
    mine.mkdir(parents=True)
    alive = q / "proc-1" / "q-busy"  # pid 1 is alive: another process's check
    alive.mkdir(parents=True)
    admitter = _admitter(settings, FakeStore(), catalogue)
    admitter.clear_quarantine()
    assert sorted(p.name for p in q.iterdir()) == ["proc-1", f"proc-{os.getpid()}"]
    assert list(admitter.quarantine_root.iterdir()) == []
    assert alive.is_dir()


@dataclass
class FakeRecord:
    value: bytes
    headers: list[tuple[str, bytes]]
    partition: int = 0
    offset: int = 0


@dataclass
class FakeProducer:
    sent: list[tuple[str, bytes, bytes, list[tuple[str, bytes]]]] = field(default_factory=list)

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send_and_wait(self, topic: str, value: bytes | None = None,
                            key: bytes | None = None, *,
                            headers: list[tuple[str, bytes]] | None = None) -> Any:
        self.sent.append((topic, value or b"", key or b"", headers or []))


async def test_consumer_publishes_keyed_verdicts_and_skips_garbage(
        adapter: Path, tiny: BaseModelSpec, catalogue: Catalogue,
        settings: AdmissionSettings) -> None:
    store = FakeStore()
    release = _release(adapter, tiny)
    _upload(store, adapter, release)
    admitter = _admitter(settings, store, catalogue)
    consumer = ReleaseConsumer(admitter=admitter, settings=settings, metrics=admitter.metrics)
    producer = FakeProducer()
    body, headers = encode(release)
    record = FakeRecord(body, kafka_headers(headers))
    assert await consumer.handle(record, producer) == "decided"
    assert await consumer.handle(record, producer) == "replayed"
    assert await consumer.handle(FakeRecord(b"junk", []), producer) == "skipped"
    no_ref = events_pb2.AdapterReleased(meta=common_pb2.EventMeta(event_id=str(uuid.uuid4())))
    b2, h2 = encode(no_ref)
    assert await consumer.handle(FakeRecord(b2, kafka_headers(h2)), producer) == "skipped"
    assert len(producer.sent) == 2
    (topic, value, key, hdrs), second = producer.sent
    assert second == producer.sent[0]
    assert topic == "adapter.admissions" and key == b"acme/support"
    assert ("x-proto-type", b"loraplane.v1.AdmissionEvent") in hdrs
    assert events_pb2.AdmissionEvent.FromString(value).WhichOneof("verdict") == "admitted"
    assert consumer.outcomes == {"decided": 1, "replayed": 1, "skipped": 2}


def test_registry_layout_matches_the_registry_grammar() -> None:
    from loraplane.admission.admitter import layout_problems
    from loraplane.admission.checks.source import check_location
    from loraplane.admission.claim import ReleaseClaim
    from loraplane.registry.grammar import ARTIFACT_ROOT, artifact_prefix, artifact_uri

    assert AdmissionSettings().admission_artifact_prefix == ARTIFACT_ROOT
    digest = "a" * 64
    uri = artifact_uri(BUCKET, artifact_prefix("acme", "support", "v1", digest))
    claim = ReleaseClaim("acme", "support", "v1", "m", 8, (), 0, "peft", uri, "", "b" * 64, 0,
                         "", "")
    root, problems = check_location(uri, tenant_id="acme", bucket=BUCKET, prefix=ARTIFACT_ROOT,
                                    directory=True)
    assert problems == [] and root is not None
    assert layout_problems(ARTIFACT_ROOT, claim, root) == []
    for other in ("adapters/acme/support/v2/" + digest + "/", "adapters/acme/support/v1/xyz/",
                  "adapters/acme/other/v1/" + digest + "/", "adapters/acme/support/v1/"):
        loc, _ = check_location(f"s3://{BUCKET}/{other}", tenant_id="acme", bucket=BUCKET,
                                prefix=ARTIFACT_ROOT, directory=True)
        assert loc is not None
        assert [p.code for p in layout_problems(ARTIFACT_ROOT, claim, loc)] == [
            SOURCE_NOT_ALLOWED], other


@dataclass
class FakeTP:
    topic: str
    partition: int

    def __hash__(self) -> int:
        return hash((self.topic, self.partition))


class FakeConsumer:
    """Hands out one batch (two partitions), records commits."""

    def __init__(self, batch: dict[FakeTP, list[FakeRecord]], commits: list[dict[Any, int]]
                 ) -> None:
        self.batch = batch
        self.commits = commits

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def getmany(self, timeout_ms: int = 0, max_records: int = 0) -> Any:
        import asyncio

        batch, self.batch = self.batch, {}
        if not batch:
            await asyncio.sleep(timeout_ms / 1000)
        return batch

    async def commit(self, offsets: dict[Any, int]) -> None:
        self.commits.append(offsets)
        if self.on_commit is not None:
            self.on_commit(offsets)

    on_commit: Any = None

    async def topics(self) -> set[str]:
        return set()

    def assignment(self) -> set[FakeTP]:
        return {FakeTP("r", 0), FakeTP("r", 1)}


async def test_run_commits_after_publishing_and_retries_outages(
        adapter: Path, tiny: BaseModelSpec, catalogue: Catalogue,
        settings: AdmissionSettings) -> None:
    import asyncio

    store = FakeStore(down=True)
    good = _release(adapter, tiny)
    _upload(store, adapter, good)
    body, headers = encode(good)
    tp0, tp1 = FakeTP("r", 0), FakeTP("r", 1)
    commits: list[dict[Any, int]] = []
    made: list[FakeConsumer] = []
    stop = asyncio.Event()

    def consumer_factory() -> Any:
        c = FakeConsumer({tp0: [FakeRecord(b"junk", [], 0, 5)],
                          tp1: [FakeRecord(body, kafka_headers(headers), 1, 9)]}, commits)
        c.on_commit = lambda offsets: stop.set() if tp1 in offsets else None
        made.append(c)
        if len(made) == 2:
            store.down = False  # the outage ends before the second consumer
        return c

    producer = FakeProducer()
    admitter = _admitter(settings, store, catalogue)
    rc = ReleaseConsumer(admitter=admitter, settings=settings, metrics=admitter.metrics,
                         consumer_factory=consumer_factory, producer_factory=lambda: producer)
    await asyncio.wait_for(rc.run(stop), 30)
    assert len(made) == 2
    assert admitter.metrics.retries.labels("s3")._value.get() == 1
    assert admitter.metrics.consumer_restarts._value.get() == 1
    # first consumer: the junk record was skipped and committed; the release was neither
    # decided nor committed (S3 down); the second consumer decided, published, committed
    assert commits[0] == {tp0: 6}
    assert [c[tp1] for c in commits if tp1 in c] == [10]
    assert all(tp1 not in c for c in commits[:commits.index(next(c for c in commits
                                                                 if tp1 in c))])
    assert len(producer.sent) == 1
