"""Host (WARM) tier: fetch + verify + atomic placement, byte budget, eviction, restart."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from worker_fakes import BUCKET, DirStore, MakeAdapter

from loraplane.devkit.keys import DevKeyPair
from loraplane.worker.errors import (
    DigestMismatch,
    DownloadFailed,
    NoCapacity,
    RankTooLarge,
    SourceNotAllowed,
)
from loraplane.worker.host_tier import SIGNATURE_ALLOWANCE, HostTier

HostFactory = Callable[..., HostTier]


def _leftovers(host: HostTier) -> list[str]:
    return sorted(p.name for p in (host.root / ".incoming").iterdir())


async def test_fetch_places_verified_files(make_adapter: MakeAdapter,
                                           host_factory: HostFactory) -> None:
    host = host_factory()
    spec = make_adapter()
    entry, timing = await host.fetch(spec)
    assert entry.dir == host.root / spec.dirname
    assert sorted(p.name for p in entry.files_dir.iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors", "model.sig"]
    meta = json.loads((entry.dir / "meta.json").read_text())
    assert meta["spec"]["sha256"] == spec.sha256 and meta["rank"] == 8
    assert host.used_bytes == entry.size_bytes > spec.size_bytes  # signature included
    assert timing.bytes_read == entry.size_bytes
    again, timing2 = await host.fetch(spec)  # idempotent: nothing downloaded
    assert again == entry and timing2.bytes_read == 0
    assert _leftovers(host) == []


async def test_budget_is_enforced_before_downloading(
    make_adapter: MakeAdapter, host_factory: HostFactory, store: DirStore
) -> None:
    spec = make_adapter()
    host = host_factory(capacity_bytes=spec.size_bytes // 2)
    with pytest.raises(NoCapacity, match="needs"):
        await host.fetch(spec)
    assert store.downloads == 0 and host.used_bytes == 0 and _leftovers(host) == []


async def test_budget_counts_held_entries(make_adapter: MakeAdapter,
                                          host_factory: HostFactory) -> None:
    a, b = make_adapter("a"), make_adapter("b")
    host = host_factory(capacity_bytes=a.size_bytes + SIGNATURE_ALLOWANCE + a.size_bytes // 2)
    await host.fetch(a)
    with pytest.raises(NoCapacity):
        await host.fetch(b)
    await host.remove(a.engine_id)
    assert host.used_bytes == 0
    await host.fetch(b)
    assert [e.spec.engine_id for e in host.entries()] == [b.engine_id]


async def test_tampered_object_is_refused_and_nothing_stays(
    make_adapter: MakeAdapter, host_factory: HostFactory, store: DirStore
) -> None:
    spec = make_adapter()
    key = spec.artifact_uri.removeprefix(f"s3://{BUCKET}/") + "adapter_model.safetensors"
    data = bytearray(store.path(BUCKET, key).read_bytes())
    data[-1] ^= 0x01
    store.path(BUCKET, key).write_bytes(bytes(data))
    host = host_factory()
    with pytest.raises(DigestMismatch, match="adapter_model.safetensors"):
        await host.fetch(spec)
    assert host.entries() == [] and _leftovers(host) == []
    assert [p.name for p in host.root.iterdir() if not p.name.startswith(".")] == []


async def test_digest_must_be_the_admitted_one(make_adapter: MakeAdapter,
                                               host_factory: HostFactory) -> None:
    spec = dataclasses.replace(make_adapter(), sha256="0" * 64)
    with pytest.raises(DigestMismatch, match="!= admitted"):
        await host_factory().fetch(spec)


async def test_untrusted_signer_is_refused(make_adapter: MakeAdapter, host_factory: HostFactory,
                                           other_keys: DevKeyPair) -> None:
    spec = make_adapter(key=other_keys)
    with pytest.raises(DigestMismatch, match="not signed by any trusted key"):
        await host_factory().fetch(spec)


async def test_rank_above_engine_max_is_refused(make_adapter: MakeAdapter,
                                                host_factory: HostFactory,
                                                store: DirStore) -> None:
    declared = make_adapter(rank=32)
    with pytest.raises(RankTooLarge, match="rank 32 > max_lora_rank 16"):
        await host_factory().fetch(declared)
    assert store.downloads == 0
    hidden = dataclasses.replace(make_adapter(rank=32), rank=0)  # only the file knows
    with pytest.raises(RankTooLarge, match="rank 32"):
        await host_factory().fetch(hidden)


@pytest.mark.parametrize("uri", [
    "s3://other-bucket/adapters/acme/support/v1/x/",
    "s3://loraplane-artifacts/adapters/globex/support/v1/x/",
    "s3://loraplane-artifacts/adapters/acme/../globex/x/",
    "file:///etc/",
])
async def test_locations_outside_the_tenant_prefix_are_refused(
    make_adapter: MakeAdapter, host_factory: HostFactory, uri: str
) -> None:
    spec = dataclasses.replace(make_adapter(), artifact_uri=uri)
    with pytest.raises(SourceNotAllowed):
        await host_factory().fetch(spec)


async def test_store_failure_is_a_download_failure(make_adapter: MakeAdapter,
                                                   host_factory: HostFactory,
                                                   store: DirStore) -> None:
    spec = make_adapter()
    store.fail = True
    with pytest.raises(DownloadFailed):
        await host_factory().fetch(spec)


async def test_reverify_catches_tampering_on_disk(make_adapter: MakeAdapter,
                                                  host_factory: HostFactory) -> None:
    host = host_factory()
    entry, _ = await host.fetch(make_adapter())
    await host.reverify(entry.spec.engine_id)
    cfg = entry.files_dir / "adapter_config.json"
    cfg.write_text(cfg.read_text().replace('"lora_alpha": 16', '"lora_alpha": 64'))
    with pytest.raises(DigestMismatch, match="adapter_config.json"):
        await host.reverify(entry.spec.engine_id)
    assert host.get(entry.spec.engine_id) is None and not entry.dir.exists()


async def test_restart_keeps_verified_entries_and_drops_bad_ones(
    make_adapter: MakeAdapter, host_factory: HostFactory, tmp_path: Path
) -> None:
    root = tmp_path / "host"
    host = host_factory(root=root)
    good, bad = make_adapter("good"), make_adapter("bad")
    await host.fetch(good)
    bad_entry, _ = await host.fetch(bad)
    (bad_entry.files_dir / "adapter_model.safetensors").write_bytes(b"garbage")
    (root / ".incoming" / "half-done").mkdir()
    (root / "stray-dir").mkdir()

    restarted = host_factory(root=root)
    result = await restarted.rescan()
    assert [e.spec.engine_id for e in result.kept] == [good.engine_id]
    dropped = dict(result.dropped)
    assert set(dropped) == {bad.dirname, "stray-dir"}
    assert "DigestMismatch" in dropped[bad.dirname]
    assert sorted(p.name for p in root.iterdir()) == [".incoming", ".trash", good.dirname]
    assert _leftovers(restarted) == []
    assert restarted.used_bytes == result.kept[0].size_bytes


async def test_without_declared_size_the_prefix_is_listed(
    make_adapter: MakeAdapter, host_factory: HostFactory
) -> None:
    spec = dataclasses.replace(make_adapter(), size_bytes=0)
    entry, timing = await host_factory().fetch(spec)
    assert entry.spec.size_bytes == 0 and timing.bytes_read == entry.size_bytes


async def test_missing_object_is_a_download_failure(
    make_adapter: MakeAdapter, host_factory: HostFactory, store: DirStore
) -> None:
    spec = make_adapter()
    key = spec.artifact_uri.removeprefix(f"s3://{BUCKET}/") + "model.sig"
    store.path(BUCKET, key).unlink()
    host = host_factory()
    with pytest.raises(DownloadFailed, match="model.sig"):
        await host.fetch(spec)
    assert _leftovers(host) == []


async def test_object_larger_than_declared_is_cut_off(
    make_adapter: MakeAdapter, host_factory: HostFactory
) -> None:
    spec = make_adapter()
    small = dataclasses.replace(spec, size_bytes=100)
    with pytest.raises(DownloadFailed, match="larger than"):
        await host_factory().fetch(small)


async def test_garbage_signature_bundle_is_refused_and_nothing_stays(
    make_adapter: MakeAdapter, host_factory: HostFactory, store: DirStore
) -> None:
    spec = make_adapter()
    key = spec.artifact_uri.removeprefix(f"s3://{BUCKET}/") + "model.sig"
    store.path(BUCKET, key).write_bytes(b'{"not": "a bundle"}')
    host = host_factory()
    with pytest.raises(DigestMismatch, match="unreadable bundle|not signed"):
        await host.fetch(spec)
    assert host.entries() == [] and _leftovers(host) == []
    assert [p.name for p in host.root.iterdir() if not p.name.startswith(".")] == []


async def test_a_download_failure_is_reported_before_a_bad_signature(
    make_adapter: MakeAdapter, host_factory: HostFactory, store: DirStore
) -> None:
    spec = make_adapter()
    prefix = spec.artifact_uri.removeprefix(f"s3://{BUCKET}/")
    store.path(BUCKET, prefix + "model.sig").write_bytes(b"garbage")
    store.path(BUCKET, prefix + "adapter_config.json").unlink()
    host = host_factory()
    with pytest.raises(DownloadFailed, match="adapter_config.json"):
        await host.fetch(spec)
    assert _leftovers(host) == []


def test_directory_sync_runs_after_every_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from loraplane.worker import host_tier

    synced: list[int] = []
    done = threading.Event()
    requested = [0]

    def fake_fsync(path: Path) -> None:
        assert path == tmp_path
        synced.append(requested[0])  # how many requests this fsync covers
        if requested[0] == 3:
            done.set()

    monkeypatch.setattr(host_tier, "_fsync_dir", fake_fsync)
    sync = host_tier._DirSync(tmp_path)
    for _ in range(3):
        requested[0] += 1
        sync.request()
    assert done.wait(30), f"no fsync covered the last request: {synced}"
    assert synced == sorted(synced) and 1 <= len(synced) <= 3


async def test_the_fetch_timing_splits_the_download_and_the_verification(
    make_adapter: MakeAdapter, host_factory: HostFactory
) -> None:
    import time

    t0 = time.perf_counter()
    _, t = await host_factory().fetch(make_adapter())
    wall = time.perf_counter() - t0
    steps = (t.dispatch_s, t.open_s, t.stream_s, t.tail_s)
    assert all(s >= 0 for s in steps), steps
    assert sum(steps) == pytest.approx(t.download_s, abs=1e-9)  # the file that ended last
    assert t.check_s >= 0 and t.place_s >= 0 and t.resume_s >= 0
    assert t.check_s + t.place_s == pytest.approx(t.verify_s, abs=1e-9)
    # disjoint parts of the fetch, one after the other
    assert t.list_s + t.prepare_s + t.download_s + t.verify_s + t.resume_s <= wall
    assert t.prepare_s >= 0 and t.list_s >= 0
    assert 0 < t.signature_s


def test_directory_sync_thread_serves_requests_in_a_row_then_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from loraplane.worker import host_tier

    synced = threading.Semaphore(0)
    monkeypatch.setattr(host_tier, "_fsync_dir", lambda path: synced.release())
    sync = host_tier._DirSync(tmp_path, linger_s=60.0)
    for _ in range(3):  # each waits for its fsync: the thread is idle between requests
        sync.request()
        assert synced.acquire(timeout=30)
    assert sync.threads_started == 1  # one thread served all three
    ending = host_tier._DirSync(tmp_path, linger_s=0.0)
    ending.request()
    assert synced.acquire(timeout=30)
    with ending._cond:  # the thread ends once it is idle for linger_s
        assert ending._cond.wait_for(lambda: not ending._running, timeout=30)
    ending.request()
    assert synced.acquire(timeout=30) and ending.threads_started == 2


async def test_a_cancelled_fetch_places_nothing_when_its_downloads_end_later(
    make_adapter: MakeAdapter, host_factory: HostFactory, store: DirStore,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio
    import threading
    from collections.abc import Iterator

    spec = make_adapter()
    entered, release, attempted = threading.Event(), threading.Event(), threading.Event()
    small_read = threading.Semaphore(0)
    real_stream = store.stream

    def slow_weights(bucket: str, key: str) -> Iterator[bytes]:
        chunks = real_stream(bucket, key)

        def small() -> Iterator[bytes]:
            yield from chunks
            small_read.release()  # read to its end: this download can no longer fail

        def held() -> Iterator[bytes]:
            entered.set()
            release.wait(30)
            yield from chunks
        return held() if key.endswith(".safetensors") else small()

    monkeypatch.setattr(store, "stream", slow_weights)
    host = host_factory()
    real_place = host._verify_and_place

    def place(*args: object, **kwargs: object) -> object:
        try:
            return real_place(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            attempted.set()

    monkeypatch.setattr(host, "_verify_and_place", place)
    task = asyncio.ensure_future(host.fetch(spec))
    assert await asyncio.to_thread(entered.wait, 30)
    for _ in range(2):  # the config and the bundle are in: the weights will end last
        assert await asyncio.to_thread(small_read.acquire, True, 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()  # the weights arrive after the fetch gave up; their thread ends last
    assert await asyncio.to_thread(attempted.wait, 30)
    assert host.entries() == [] and _leftovers(host) == []
    assert [p.name for p in host.root.iterdir() if not p.name.startswith(".")] == []


async def test_a_fetch_cancelled_after_its_placement_leaves_nothing(
    make_adapter: MakeAdapter, host_factory: HostFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio
    import threading

    spec = make_adapter()
    host = host_factory()
    renamed, release = threading.Event(), threading.Event()

    def held_sync() -> None:  # right after the rename, in the download's thread
        renamed.set()
        release.wait(30)

    monkeypatch.setattr(host._dir_sync, "request", held_sync)
    task = asyncio.ensure_future(host.fetch(spec))
    assert await asyncio.to_thread(renamed.wait, 30)
    assert (host.root / spec.dirname).is_dir()  # placed, the loop not told yet
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()
    assert host.entries() == [] and _leftovers(host) == []
    assert [p.name for p in host.root.iterdir() if not p.name.startswith(".")] == []
