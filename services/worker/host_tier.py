"""The WARM tier: verified adapter files on the worker's local disk, under a byte budget.

Layout under ``root``::

    <engine_id>-<sha256[:16]>/meta.json      what the entry is (ArtifactSpec + verification)
    <engine_id>-<sha256[:16]>/files/         adapter_config.json, adapter_model.safetensors,
                                             model.sig (exactly what object storage holds)
    .incoming/<uuid>/                        downloads in progress (deleted on restart)
    .trash/<uuid>/                           evicted entries being deleted

A fetch lists the artifact's objects, reserves their bytes in the budget, downloads them
into ``.incoming``, verifies the signature against the trusted keys and the manifest
digest against the admitted ``sha256`` (defence in depth: admission did it too), checks
the rank, writes ``meta.json`` and renames the directory into place in one step, so an
entry directory is either complete and verified or absent. Eviction renames the entry
into ``.trash`` first (atomic disappearance), then deletes it. After a restart,
:meth:`HostTier.rescan` re-verifies every entry before the worker reports it.

All file hashing and signature checks run in a thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from loraplane.shared.objectstore import SEGMENT_RE, check_location
from loraplane.shared.signing import SIGNATURE_FILENAME, SignatureError, verify_directory
from loraplane.worker.errors import (
    BadRequest,
    DigestMismatch,
    DownloadFailed,
    NoCapacity,
    RankTooLarge,
    SourceNotAllowed,
)
from loraplane.worker.lora_files import read_rank
from loraplane.worker.store import ObjectStore, Streamed, download, list_objects
from loraplane.worker.verify import check_streamed, signed_digests

log = logging.getLogger(__name__)

META_NAME = "meta.json"
FILES_DIR = "files"
MAX_OBJECTS = 16
"""An adapter artifact has 3 objects; more is refused before downloading anything."""
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
"""The files of a PEFT adapter artifact (besides its signature), as admission allows them."""
SIGNATURE_ALLOWANCE = 16 << 10
"""Bytes reserved for the signature bundle on top of the declared artifact size."""

Clock = Callable[[], datetime]


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class ArtifactSpec:
    """One adapter version to hold, as the cache command / request describes it."""

    engine_id: int
    """Registry's stable integer id (engine ``lora_int_id``)."""
    tenant_id: str
    adapter_name: str
    version: str
    base_model: str
    artifact_uri: str
    """``s3://bucket/prefix/`` of the artifact root."""
    sha256: str
    """Admitted manifest digest (lowercase hex)."""
    size_bytes: int = 0
    """Declared artifact size (0 = unknown)."""
    rank: int = 0
    """Declared LoRA rank (0 = unknown; the file's ``r`` is checked in any case)."""

    @property
    def name(self) -> str:
        """Unique engine name of the version: ``tenant/adapter@version``."""
        return f"{self.tenant_id}/{self.adapter_name}@{self.version}"

    @property
    def dirname(self) -> str:
        """Entry directory name."""
        return f"{self.engine_id}-{self.sha256[:16]}"


@dataclass(frozen=True, slots=True)
class HostEntry:
    """A verified adapter version on the host."""

    spec: ArtifactSpec
    dir: Path
    """Entry directory (holds ``meta.json`` and ``files/``)."""
    size_bytes: int
    """Bytes of the entry's files on disk (the budget charge)."""
    rank: int
    """``r`` read from the verified ``adapter_config.json``."""
    verified_at: datetime

    @property
    def files_dir(self) -> Path:
        """The adapter directory the engine loads."""
        return self.dir / FILES_DIR


@dataclass(frozen=True, slots=True)
class FetchTiming:
    """Where the time of one COLD→WARM fetch went."""

    list_s: float = 0.0
    download_s: float = 0.0
    """Wall time of the parallel downloads (GET, hash and write overlapped), until the
    last file is on disk."""
    verify_s: float = 0.0
    """Digests, rank and placement after the last file is on disk (in its thread)."""
    bytes_read: int = 0
    get_s: float = 0.0
    """Time the readers waited for the store (summed over the files)."""
    hash_s: float = 0.0
    """Time in sha256 (summed over the files; overlapped with the GET)."""
    write_s: float = 0.0
    """Time writing the files (summed over the files; overlapped with the GET)."""
    place_s: float = 0.0
    """Part of ``verify_s`` spent placing the entry (meta.json and the rename; the
    directory's fsync follows in the background)."""
    prepare_s: float = 0.0
    """Before the first GET, besides ``list_s``: the checks of the spec and the location,
    the byte reservation."""
    dispatch_s: float = 0.0
    """Part of ``download_s``: from the downloads' start until the thread of the file that
    finished last began (the executor's queue, the thread's wake-up)."""
    open_s: float = 0.0
    """Part of ``download_s``, that file: its directory and its GET until the response
    headers."""
    stream_s: float = 0.0
    """Part of ``download_s``, that file: first read to last byte read
    (:attr:`Streamed.stream_s <loraplane.worker.store.Streamed.stream_s>`)."""
    tail_s: float = 0.0
    """Part of ``download_s``, that file: last byte read to the file closed (the sink thread
    hashing and writing what it still held), plus the signature check when that file is
    the bundle."""
    resume_s: float = 0.0
    """After ``verify_s``: from the placement in that thread until the event loop resumed
    with the entry (the loop's wake-up)."""
    signature_s: float = 0.0
    """Authenticating the signature bundle, in its download's thread as soon as it has
    arrived (overlapped with the other files unless the bundle finished last)."""
    check_s: float = 0.0
    """Part of ``verify_s``: the streamed digests against the signed ones, the manifest
    digest against the admitted one, the rank."""


@dataclass(frozen=True, slots=True)
class _Ran:
    """When one file's download thread ran (``perf_counter`` instants) and the signature
    check it did after its download (the bundle's thread only)."""

    started: float
    ended: float
    signature_s: float = 0.0


@dataclass(frozen=True, slots=True)
class _Checked:
    """Where the verification's time went (:meth:`HostTier._verify_and_place`)."""

    check_s: float
    place_s: float


@dataclass(slots=True)
class _Landing:
    """The placement of one fetch, made in the thread of the download that ends last:
    the fetch that gives up sets ``abandoned`` under ``lock`` (no placement after it) and
    removes what ``placed`` renamed into place before."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    abandoned: bool = False
    placed: HostEntry | None = None


@dataclass(frozen=True, slots=True)
class RescanResult:
    """Outcome of :meth:`HostTier.rescan`."""

    kept: list[HostEntry] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    """``(directory name, reason)`` of every entry deleted because it failed."""


class HostTier:
    """Verified adapter files on local disk with a byte budget."""

    def __init__(
        self,
        root: Path,
        *,
        capacity_bytes: int,
        store: ObjectStore,
        trusted_keys: Sequence[Path],
        bucket: str,
        prefix: str,
        max_lora_rank: int,
        clock: Clock = _now,
    ) -> None:
        """``bucket``/``prefix``: the allow-listed artifact location (``s3://bucket/prefix/<tenant>/...``)."""
        if not trusted_keys:
            raise ValueError("the host tier needs at least one trusted public key")
        self.root = Path(root)
        self.capacity_bytes = capacity_bytes
        self.store = store
        self.trusted_keys = [Path(k) for k in trusted_keys]
        self.bucket = bucket
        self.prefix = prefix
        self.max_lora_rank = max_lora_rank
        self.clock = clock
        self._entries: dict[int, HostEntry] = {}
        self._reserved: dict[str, int] = {}
        self._dir_sync = _DirSync(self.root)
        for sub in (".incoming", ".trash"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ state

    @property
    def used_bytes(self) -> int:
        """Bytes of the held entries (reservations excluded)."""
        return sum(e.size_bytes for e in self._entries.values())

    @property
    def reserved_bytes(self) -> int:
        """Bytes reserved by downloads in progress."""
        return sum(self._reserved.values())

    def get(self, engine_id: int) -> HostEntry | None:
        """The entry of ``engine_id``, if held."""
        return self._entries.get(engine_id)

    def entries(self) -> list[HostEntry]:
        """Every held entry."""
        return list(self._entries.values())

    # ------------------------------------------------------------------ fetch

    def _reserve(self, token: str, size: int, name: str) -> None:
        free = self.capacity_bytes - self.used_bytes - self.reserved_bytes
        if size > free:
            raise NoCapacity(
                f"{name} needs {size} bytes on the host; {free} of {self.capacity_bytes} free"
            )
        self._reserved[token] = size

    async def fetch(self, spec: ArtifactSpec) -> tuple[HostEntry, FetchTiming]:
        """COLD→WARM: download, verify and place ``spec``; returns the entry and timings.

        With a declared ``size_bytes`` the artifact's files (``adapter_config.json``,
        ``adapter_model.safetensors``, ``model.sig``) are fetched in parallel without a
        listing, under a reservation of the declared size (+ the signature); otherwise the
        prefix is listed first. Every file is hashed while it is written and the digests
        are checked against the signed manifest (:mod:`loraplane.worker.verify`).

        Raises :class:`SourceNotAllowed`, :class:`NoCapacity`, :class:`DownloadFailed`,
        :class:`DigestMismatch` or :class:`RankTooLarge`; nothing is left on disk on failure.
        """
        t_start = time.perf_counter()
        if spec.rank > self.max_lora_rank:
            raise RankTooLarge(
                f"{spec.name}: LoRA rank {spec.rank} > max_lora_rank {self.max_lora_rank}"
            )
        existing = self._entries.get(spec.engine_id)
        if existing is not None:
            if existing.spec.sha256 != spec.sha256:
                raise DigestMismatch(
                    f"engine id {spec.engine_id} is held with sha256 {existing.spec.sha256}, "
                    f"asked for {spec.sha256}"
                )
            return existing, FetchTiming()
        location, problems = check_location(
            spec.artifact_uri, tenant_id=spec.tenant_id, bucket=self.bucket,
            prefix=self.prefix, directory=True,
        )
        if location is None:
            raise SourceNotAllowed("; ".join(problems))
        t0 = time.perf_counter()
        if spec.size_bytes > 0:
            rel_paths = [*ADAPTER_FILES, SIGNATURE_FILENAME]
            budget = spec.size_bytes + SIGNATURE_ALLOWANCE
        else:
            objects = await asyncio.to_thread(
                list_objects, self.store, location.bucket, location.key
            )
            rel_paths = self._relative_paths(spec, location.key, [o.key for o in objects])
            budget = sum(o.size for o in objects)
        list_s = time.perf_counter() - t0
        token = uuid.uuid4().hex
        self._reserve(token, budget, spec.name)
        incoming = self.root / ".incoming" / token
        landing = _Landing()

        def place(digests: dict[str, str], size: int,
                  signed: dict[str, str] | SignatureError) -> tuple[HostEntry, _Checked]:
            return self._verify_and_place(spec, incoming, digests, signed, size, landing)

        try:
            t1 = time.perf_counter()
            read, streamed, ran, last, (entry, checked, placed_at) = await self._download(
                location.bucket, location.key, rel_paths, incoming / FILES_DIR, budget,
                spec.size_bytes, place)
            t3 = time.perf_counter()
        except BaseException:
            await asyncio.to_thread(self._abandon, landing, incoming)
            raise
        finally:
            self._reserved.pop(token, None)
        self._entries[spec.engine_id] = entry
        # the critical path: the file whose thread ended last (and verified and placed)
        crit, own = streamed[last], ran[last]
        signature_s = next((r.signature_s for r in ran if r.signature_s), 0.0)
        return entry, FetchTiming(
            list_s, own.ended - t1, checked.check_s + checked.place_s, read,
            get_s=sum(x.get_s for x in streamed), hash_s=sum(x.hash_s for x in streamed),
            write_s=sum(x.write_s for x in streamed), place_s=checked.place_s,
            prepare_s=t1 - t_start - list_s, dispatch_s=own.started - t1,
            open_s=own.ended - own.started - crit.stream_s - crit.tail_s - own.signature_s,
            stream_s=crit.stream_s, tail_s=crit.tail_s + own.signature_s,
            resume_s=t3 - placed_at, signature_s=signature_s, check_s=checked.check_s)

    def _abandon(self, landing: _Landing, incoming: Path) -> None:
        """A fetch that failed or was cancelled: no placement from now on, and nothing of
        it stays (threads still downloading write into a deleted directory)."""
        with landing.lock:
            landing.abandoned = True
            placed, landing.placed = landing.placed, None
        if placed is not None:
            self._trash(placed.dir)
        shutil.rmtree(incoming, ignore_errors=True)

    def _relative_paths(self, spec: ArtifactSpec, root_key: str, keys: list[str]) -> list[str]:
        if not keys:
            raise DownloadFailed(f"{spec.name}: no objects under {spec.artifact_uri}")
        if len(keys) > MAX_OBJECTS:
            raise SourceNotAllowed(f"{spec.name}: {len(keys)} objects > {MAX_OBJECTS}")
        out: list[str] = []
        for key in keys:
            rel = key[len(root_key):]
            parts = rel.split("/")
            if not key.startswith(root_key) or not all(SEGMENT_RE.match(p) for p in parts):
                raise SourceNotAllowed(f"{spec.name}: object key {key!r} is not a plain file name")
            out.append(PurePosixPath(*parts).as_posix())
        if SIGNATURE_FILENAME not in out:
            raise DigestMismatch(f"{spec.name}: no {SIGNATURE_FILENAME} in {spec.artifact_uri}")
        return out

    async def _download(
        self, bucket: str, root_key: str, rel_paths: list[str], dest: Path, budget: int,
        declared: int,
        place: Callable[[dict[str, str], int, dict[str, str] | SignatureError],
                        tuple[HostEntry, _Checked]],
    ) -> tuple[int, list[Streamed], list[_Ran], int, tuple[HostEntry, _Checked, float]]:
        """Fetch every file in parallel, then verify and place them in the thread of the
        download that ends last (no hand-back to the event loop in between); returns
        ``(bytes, per file, when each file's thread ran, index of that last file,
        (entry, verification times, instant it was placed))``.

        The signature bundle is authenticated as soon as it has arrived, while the other
        files still stream: ``place`` gets the streamed ``{rel path: sha256}``, the bytes,
        and the bundle's ``{path: sha256}`` or the :class:`SignatureError` it failed with
        (judged once every download succeeded, so a download failure is reported first).
        ``declared`` > 0 caps the adapter files at that many bytes and the signature at
        :data:`SIGNATURE_ALLOWANCE`; a larger object is cut off (:class:`DownloadFailed`).
        """
        def cap(rel: str) -> int:
            if declared <= 0:
                return budget
            return SIGNATURE_ALLOWANCE if rel == SIGNATURE_FILENAME else declared

        signed: list[dict[str, str] | SignatureError] = []
        clock = time.perf_counter
        lock = threading.Lock()
        finished: dict[str, tuple[Streamed, _Ran]] = {}
        failed = [False]
        landed: list[tuple[str, tuple[HostEntry, _Checked, float]]] = []

        def finish() -> tuple[HostEntry, _Checked, float]:
            streamed = {rel: finished[rel][0] for rel in rel_paths}
            total = sum(r.size for r in streamed.values())
            content = total - streamed[SIGNATURE_FILENAME].size if SIGNATURE_FILENAME in \
                streamed else total
            if total > budget or (declared > 0 and content > declared):
                raise DownloadFailed(
                    f"{root_key}: {content} bytes of adapter files exceed the declared "
                    f"{declared}")
            digests = {rel: r.sha256 for rel, r in streamed.items() if rel != SIGNATURE_FILENAME}
            if not signed:
                raise DigestMismatch(f"{root_key}: no {SIGNATURE_FILENAME}")
            entry, checked = place(digests, total, signed[0])
            return entry, checked, clock()

        def fetch_one(rel: str) -> tuple[Streamed, _Ran]:
            started = clock()
            try:
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)  # in this thread
                streamed = download(self.store, bucket, root_key + rel, dest / rel,
                                    max_bytes=cap(rel))
                signature_s = 0.0
                if rel == SIGNATURE_FILENAME:
                    t0 = clock()
                    try:
                        signed.append(signed_digests(dest / rel, self.trusted_keys))
                    except SignatureError as exc:
                        signed.append(exc)
                    signature_s = clock() - t0
            except BaseException:
                with lock:
                    failed[0] = True
                raise
            ran = _Ran(started, clock(), signature_s)
            with lock:
                finished[rel] = (streamed, ran)
                last = len(finished) == len(rel_paths) and not failed[0]
            if last:  # every other file is on disk: verify and place here, at once
                landed.append((rel, finish()))
            return streamed, ran

        results = await asyncio.gather(
            *(asyncio.to_thread(fetch_one, rel) for rel in rel_paths), return_exceptions=True,
        )
        for r in results:
            if isinstance(r, BaseException):
                raise r
        done = [r for r in results if not isinstance(r, BaseException)]
        last_rel, outcome = landed[0]
        return (sum(r[0].size for r in done), [r[0] for r in done], [r[1] for r in done],
                rel_paths.index(last_rel), outcome)

    def _check_digest(self, spec: ArtifactSpec, files_dir: Path, manifest_digest: str) -> int:
        """Manifest digest = admitted sha256, rank within the engine's max; returns rank."""
        if manifest_digest != spec.sha256:
            raise DigestMismatch(
                f"{spec.name}: manifest digest {manifest_digest} != admitted {spec.sha256}"
            )
        try:
            rank = read_rank(files_dir)
        except ValueError as exc:
            raise DigestMismatch(f"{spec.name}: {exc}") from exc
        if rank > self.max_lora_rank:
            raise RankTooLarge(
                f"{spec.name}: LoRA rank {rank} > max_lora_rank {self.max_lora_rank}"
            )
        if spec.rank and rank != spec.rank:
            raise BadRequest(f"{spec.name}: adapter_config.json has r={rank}, declared {spec.rank}")
        return rank

    def _check_files(self, spec: ArtifactSpec, files_dir: Path) -> int:
        """Full check of files on disk (re-hashes them); returns the rank (blocking)."""
        try:
            verified = verify_directory(files_dir, self.trusted_keys)
        except SignatureError as exc:
            raise DigestMismatch(f"{spec.name}: {exc}") from exc
        return self._check_digest(spec, files_dir, verified.manifest_digest)

    def _verify_and_place(
        self, spec: ArtifactSpec, incoming: Path, digests: dict[str, str],
        signed: dict[str, str] | SignatureError, size: int, landing: _Landing,
    ) -> tuple[HostEntry, _Checked]:
        """Check the streamed digests against the signed ones and the manifest digest and
        rank against the spec, then write ``meta.json`` and rename the entry into place
        unless the fetch was abandoned (``landing``); ``size``: the bytes the download
        wrote (every file of the entry)."""
        t_check = time.perf_counter()
        files_dir = incoming / FILES_DIR
        try:
            if isinstance(signed, SignatureError):
                raise signed
            digest = check_streamed(signed, digests)
        except SignatureError as exc:
            raise DigestMismatch(f"{spec.name}: {exc}") from exc
        rank = self._check_digest(spec, files_dir, digest)
        t0 = time.perf_counter()
        now = self.clock()
        meta = {"spec": asdict(spec), "rank": rank, "size_bytes": size,
                "verified_at": now.isoformat()}
        (incoming / META_NAME).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        final = self.root / spec.dirname
        entry = HostEntry(spec=spec, dir=final, size_bytes=size, rank=rank, verified_at=now)
        with landing.lock:
            if landing.abandoned:
                raise DownloadFailed(f"{spec.name}: the fetch was abandoned")
            if final.exists():  # leftover of an entry we do not hold: replace it
                self._trash(final)
            os.rename(incoming, final)
            landing.placed = entry
        self._dir_sync.request()  # the rename's durability, off the load's path
        return entry, _Checked(t0 - t_check, time.perf_counter() - t0)

    # ------------------------------------------------------------------ verify / evict

    async def reverify(self, engine_id: int) -> HostEntry:
        """Check the entry's files again (before the engine loads them).

        A failing entry is deleted and :class:`DigestMismatch` raised.
        """
        entry = self._entries.get(engine_id)
        if entry is None:
            raise DownloadFailed(f"adapter {engine_id} is not on the host")
        try:
            await asyncio.to_thread(self._check_files, entry.spec, entry.files_dir)
        except DigestMismatch:
            await self.remove(engine_id)
            raise
        return entry

    async def remove(self, engine_id: int) -> HostEntry | None:
        """Delete the entry's files (no-op when absent); returns the removed entry."""
        entry = self._entries.pop(engine_id, None)
        if entry is not None:
            await asyncio.to_thread(self._trash, entry.dir)
        return entry

    def _trash(self, path: Path) -> None:
        target = self.root / ".trash" / uuid.uuid4().hex
        os.rename(path, target)
        shutil.rmtree(target, ignore_errors=True)

    # ------------------------------------------------------------------ restart

    async def rescan(self) -> RescanResult:
        """Re-verify every entry on disk; delete failures and unfinished downloads."""
        return await asyncio.to_thread(self._rescan)

    def _rescan(self) -> RescanResult:
        for sub in (".incoming", ".trash"):
            shutil.rmtree(self.root / sub, ignore_errors=True)
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        result = RescanResult()
        self._entries.clear()
        for path in sorted(self.root.iterdir()):
            if path.name.startswith(".") or not path.is_dir():
                continue
            try:
                meta = json.loads((path / META_NAME).read_text(encoding="utf-8"))
                spec = ArtifactSpec(**meta["spec"])
                if path.name != spec.dirname:
                    raise ValueError(f"directory name differs from {spec.dirname}")
                rank = self._check_files(spec, path / FILES_DIR)
            except Exception as exc:  # noqa: BLE001 - any failure drops the entry
                result.dropped.append((path.name, f"{type(exc).__name__}: {exc}"))
                log.warning("host tier: dropping %s after restart: %s", path.name, exc)
                self._trash(path)
                continue
            entry = HostEntry(
                spec=spec, dir=path, size_bytes=_tree_size(path / FILES_DIR), rank=rank,
                verified_at=self.clock(),
            )
            self._entries[spec.engine_id] = entry
            result.kept.append(entry)
        return result


def _tree_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class _DirSync:
    """fsyncs a directory in a background thread after its entries changed, coalescing
    requests: a placement's rename is made durable without the load waiting for it (a
    rename lost to a crash only costs a download again; every entry is re-verified on
    restart in any case). The thread waits ``linger_s`` for the next request before it
    ends, so loads in a row do not each start one (a thread start: 0.3-0.5 ms of the
    placement on this host)."""

    def __init__(self, path: Path, linger_s: float = 30.0) -> None:
        self.path = path
        self.linger_s = linger_s
        self._cond = threading.Condition(threading.Lock())
        self._wanted = False
        self._running = False
        self.threads_started = 0

    def request(self) -> None:
        with self._cond:
            self._wanted = True
            if self._running:
                self._cond.notify()
                return
            self._running = True
            self.threads_started += 1
        threading.Thread(target=self._run, name="lp-host-dirsync", daemon=True).start()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._wanted:
                    self._cond.wait(self.linger_s)
                if not self._wanted:  # nothing asked for within linger_s
                    self._running = False
                    self._cond.notify_all()
                    return
                self._wanted = False
            try:
                _fsync_dir(self.path)
            except OSError as exc:  # the directory is gone (tests) or the disk failed
                log.warning("host tier: fsync of %s failed: %s", self.path, exc)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
