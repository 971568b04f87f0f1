"""Download an artifact from object storage into quarantine, refusing while streaming.

Blocking (the minio SDK is synchronous): the service runs :func:`fetch_artifact` in a
thread. Every object under the artifact root is listed; names are judged before any byte
is fetched (pickle files, nested or unsafe names are refused unread), sizes are checked
against the listing and again while streaming (a download stops as soon as it passes the
limit, so an object that lies about its size never fills the disk).

Errors are classified by the store (:mod:`loraplane.shared.objectstore`): a missing object
or bucket is a property of the release (``DOWNLOAD_FAILED``); an unreachable or failing
store is an outage (:class:`~loraplane.shared.errors.Unavailable`), so the release is
retried later instead of being refused.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from loraplane.admission.checks.files import SizeLimits, refuse_unread
from loraplane.admission.checks.signature import MAX_BUNDLE_BYTES
from loraplane.admission.problems import (
    DOWNLOAD_FAILED,
    FORBIDDEN_FILE,
    SIGNATURE_INVALID,
    SIZE_LIMIT,
    CheckOutcome,
    Problem,
)
from loraplane.shared.objectstore import ObjectMissing, ObjectStore, S3Location
from loraplane.shared.signing import SIGNATURE_FILENAME


@dataclass
class Fetched:
    """Result of :func:`fetch_artifact`."""

    adapter_dir: Path
    signature_path: Path
    outcome: CheckOutcome
    """The ``download`` stage outcome (problems found before any content check)."""
    refused: set[str] = field(default_factory=set)
    """Artifact-relative names not downloaded on purpose."""
    bytes_downloaded: int = 0
    stop: bool = False
    """True when nothing useful was fetched (the content checks are skipped)."""


def _download(store: ObjectStore, bucket: str, key: str, dest: Path, limit: int) -> int | None:
    """Stream ``key`` into ``dest``; returns bytes written, or None if it passed ``limit``."""
    written = 0
    chunks = store.stream(bucket, key)
    try:
        with dest.open("xb") as out:
            for chunk in chunks:
                written += len(chunk)
                if written > limit:
                    break
                out.write(chunk)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    if written > limit:
        dest.unlink(missing_ok=True)
        return None
    return written


def fetch_artifact(
    store: ObjectStore,
    root: S3Location,
    signature: S3Location,
    dest: Path,
    limits: SizeLimits,
) -> Fetched:
    """Fetch the artifact at ``root`` and its ``signature`` into the empty dir ``dest``."""
    started = time.perf_counter()
    adapter_dir = dest / "artifact"
    sig_dir = dest / "signature"
    adapter_dir.mkdir(parents=True)
    sig_dir.mkdir()
    result = Fetched(adapter_dir, sig_dir / SIGNATURE_FILENAME, CheckOutcome("download"))
    problems: list[Problem] = []

    def done() -> Fetched:
        result.outcome = CheckOutcome("download", tuple(problems), time.perf_counter() - started)
        return result

    try:
        listing = store.list(root.bucket, root.key)
    except ObjectMissing as exc:
        problems.append(Problem(DOWNLOAD_FAILED, f"cannot list the artifact: {exc}"))
        result.stop = True
        return done()
    objects = [o for o in listing if o.key != root.key]  # a zero-byte "directory" marker
    sig_inside = signature.is_inside(root)
    files = [o for o in objects if not (sig_inside and o.key == signature.key)]
    if not files:
        problems.append(Problem(DOWNLOAD_FAILED, f"no objects under {root.uri}"))
        result.stop = True
        return done()
    if len(objects) > limits.max_files:
        problems.append(Problem(FORBIDDEN_FILE, f"{len(objects)} objects under the artifact "
                                f"root > limit {limits.max_files}; nothing downloaded"))
        result.stop = True
        return done()

    total = 0
    for obj in sorted(files, key=lambda o: o.key):
        rel = obj.key[len(root.key):]
        bad = refuse_unread(rel)
        if bad is not None:
            problems.append(bad)  # never fetched: pickle, nested or unsafe name
            result.refused.add(rel)
            continue
        if obj.size > limits.max_file_bytes:
            problems.append(Problem(SIZE_LIMIT, f"{obj.size} bytes > limit "
                                    f"{limits.max_file_bytes} (not downloaded)", rel))
            result.refused.add(rel)
            continue
        if total + obj.size > limits.max_total_bytes:
            problems.append(Problem(SIZE_LIMIT, f"artifact exceeds {limits.max_total_bytes} "
                                    f"bytes (not downloaded)", rel))
            result.refused.add(rel)
            continue
        try:
            n = _download(store, root.bucket, obj.key, adapter_dir / rel,
                          min(limits.max_file_bytes, limits.max_total_bytes - total))
        except ObjectMissing as exc:
            problems.append(Problem(DOWNLOAD_FAILED, f"vanished while fetching: {exc}", rel))
            result.refused.add(rel)
            continue
        if n is None:
            problems.append(Problem(SIZE_LIMIT, "grew past the size limit while streaming "
                                    "(download aborted)", rel))
            result.refused.add(rel)
            continue
        total += n
    result.bytes_downloaded = total

    try:
        n = _download(store, signature.bucket, signature.key, result.signature_path,
                      MAX_BUNDLE_BYTES)
        if n is None:
            problems.append(Problem(SIGNATURE_INVALID, f"bundle larger than {MAX_BUNDLE_BYTES} "
                                    "bytes (not downloaded)", SIGNATURE_FILENAME))
    except ObjectMissing:
        pass  # reported by the signature check ("signature bundle is missing")
    return done()
