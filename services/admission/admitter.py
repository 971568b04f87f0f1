"""Decide one release: source → quarantine download → every check → one stored verdict.

:class:`Admitter` holds no Kafka code (the consumer in :mod:`.consumer` feeds it), so it is
tested with fakes as well as against the real stack. The blocking part
(:meth:`Admitter.evaluate`: download, hashing, signature, header parsing, NaN scan) runs
in a worker thread; the event loop only waits for it.

Idempotence: a verdict is stored (``admission_verdicts``) before it is published and is
looked up before anything is checked, so a redelivered release yields the stored verdict
again, byte for byte (same ``event_id``). A crash before the store admits nothing: the
release offset is not committed and the release is decided again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from loraplane.admission.checks.source import S3Location, check_source
from loraplane.admission.claim import ReleaseClaim
from loraplane.admission.fetch import fetch_artifact
from loraplane.admission.metrics import AdmissionMetrics
from loraplane.admission.pipeline import CheckContext, check_quarantined
from loraplane.admission.problems import (
    INTERNAL,
    SOURCE_NOT_ALLOWED,
    CheckOutcome,
    Problem,
    Verdict,
)
from loraplane.admission.settings import AdmissionSettings
from loraplane.admission.trust import TrustStore
from loraplane.admission.verdicts import VerdictKey, VerdictStore
from loraplane.shared.catalogue import Catalogue
from loraplane.shared.errors import Unavailable
from loraplane.shared.objectstore import ObjectStore
from loraplane.shared.topics import Clock, adapter_id, new_meta, utc_now
from loraplane.v1 import events_pb2

log = logging.getLogger(__name__)


class DependencyDown(Unavailable):
    """A dependency failed while deciding: nothing was stored, the release is retried."""

    def __init__(self, dependency: str, message: str) -> None:
        """``dependency``: ``s3``, ``postgres`` or ``disk`` (metrics label)."""
        super().__init__(f"{dependency}: {message}")
        self.dependency = dependency


DIGEST_SEGMENT_RE = re.compile(r"^[0-9a-f]{64}$")


def layout_problems(prefix: str, claim: ReleaseClaim, root: S3Location) -> list[Problem]:
    """The registry's layout: ``<prefix>/<tenant>/<name>/<version>/<content digest>/``.

    The last segment is the registry's content address of the uploaded files (it equals
    the manifest digest only when the signature covers exactly those files, so it is not
    compared with ``sha256`` here: the signature check does that).
    """
    base = [s for s in prefix.strip("/").split("/") if s]
    want = [*base, claim.tenant_id, claim.adapter_name, claim.version]
    parts = root.key.rstrip("/").split("/")
    if parts[:-1] == want and DIGEST_SEGMENT_RE.match(parts[-1]):
        return []
    return [Problem(SOURCE_NOT_ALLOWED, "artifact_uri is not the registry's location for "
                    f"this version (s3://{root.bucket}/{'/'.join(want)}/<sha256>/)",
                    "artifact_uri")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def verdict_key(release: events_pb2.AdapterReleased) -> VerdictKey:
    """The verdict record key of a release."""
    return VerdictKey(adapter_id(release.meta.adapter), release.meta.adapter.version,
                      release.sha256)


class Admitter:
    """Decides releases and remembers the decisions."""

    def __init__(
        self,
        *,
        settings: AdmissionSettings,
        store: ObjectStore,
        verdicts: VerdictStore,
        catalogue: Catalogue,
        trust: TrustStore,
        metrics: AdmissionMetrics,
        clock: Clock = utc_now,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        """Wire the dependencies (all injected; nothing is read from the environment)."""
        self.settings = settings
        self.store = store
        self.verdicts = verdicts
        self.catalogue = catalogue
        self.trust = trust
        self.metrics = metrics
        self.clock = clock
        self.timer = timer
        self.quarantine_root = Path(settings.admission_quarantine_dir) / f"proc-{os.getpid()}"

    def clear_quarantine(self) -> None:
        """Take this process's quarantine directory and remove what crashed processes left.

        Each process works in ``<quarantine_dir>/proc-<pid>/`` so that several admission
        processes (replicas, ``make run`` beside a test run) can share the parent.
        """
        root = Path(self.settings.admission_quarantine_dir)
        root.mkdir(parents=True, exist_ok=True)
        for child in root.glob("proc-*"):
            pid = child.name.removeprefix("proc-")
            if pid.isdigit() and (int(pid) == os.getpid() or not _alive(int(pid))):
                shutil.rmtree(child, ignore_errors=True)
        self.quarantine_root.mkdir(parents=True, exist_ok=True)

    async def decide(
        self, release: events_pb2.AdapterReleased
    ) -> tuple[events_pb2.AdmissionEvent, bool]:
        """The verdict for ``release`` and whether it was decided now (False: a replay).

        Raises :class:`Unavailable` when a dependency is down (nothing stored: retry).
        """
        key = verdict_key(release)
        try:
            existing = await self.verdicts.get(key)
        except Unavailable as exc:
            raise DependencyDown("postgres", exc.message) from exc
        if existing is not None:
            self.metrics.replays.inc()
            return existing, False
        event = await asyncio.to_thread(self.evaluate, release)
        try:
            stored, new = await self.verdicts.put(key, release.meta.event_id, event,
                                                  decided_by=self.settings.producer)
        except Unavailable as exc:
            raise DependencyDown("postgres", exc.message) from exc
        if not new:
            self.metrics.replays.inc()
            return stored, False
        arm = stored.WhichOneof("verdict")
        self.metrics.verdicts.labels(arm or "").inc()
        if arm == "rejected":
            for code in {r.code for r in stored.rejected.reasons}:
                name = events_pb2.RejectionCode.Name(code).removeprefix("REJECTION_CODE_")
                self.metrics.reasons.labels(name.lower()).inc()
        return stored, True

    # ------------------------------------------------------------------ blocking part

    def evaluate(self, release: events_pb2.AdapterReleased) -> events_pb2.AdmissionEvent:
        """Run every stage for ``release`` and build the verdict event (blocking)."""
        started = self.timer()
        claim = ReleaseClaim.from_event(release)
        verdict, bytes_verified = self._verdict(claim)
        seconds = self.timer() - started
        for outcome in verdict.outcomes:
            self.metrics.check_duration.labels(outcome.check).observe(outcome.seconds)
        self.metrics.check_duration.labels("total").observe(seconds)
        self.metrics.bytes_verified.inc(bytes_verified)
        return self._event(release, verdict, seconds * 1000.0)

    def _verdict(self, claim: ReleaseClaim) -> tuple[Verdict, int]:
        s = self.settings
        t = self.timer()
        root, sig, problems = check_source(
            claim.artifact_uri, claim.signature_uri, tenant_id=claim.tenant_id,
            bucket=s.artifact_bucket, prefix=s.admission_artifact_prefix)
        if root is not None and s.admission_exact_layout:
            problems = layout_problems(s.admission_artifact_prefix, claim, root)
        source = CheckOutcome("source", tuple(problems), self.timer() - t)
        if problems or root is None or sig is None:
            return Verdict((source,)), 0
        return self._check_fetched(claim, source, root, sig)

    def _check_fetched(self, claim: ReleaseClaim, source: CheckOutcome, root: S3Location,
                       sig: S3Location) -> tuple[Verdict, int]:
        s = self.settings
        self.quarantine_root.mkdir(parents=True, exist_ok=True)
        qdir = Path(tempfile.mkdtemp(prefix="q-", dir=self.quarantine_root))
        try:
            try:
                fetched = fetch_artifact(self.store, root, sig, qdir, s.limits)
            except Unavailable as exc:
                raise DependencyDown("s3", exc.message) from exc
            except OSError as exc:  # local disk trouble: not the artifact's fault
                raise DependencyDown("disk", f"quarantine: {exc}") from exc
            self.metrics.bytes_downloaded.inc(fetched.bytes_downloaded)
            earlier = (source, fetched.outcome)
            if fetched.stop:
                return Verdict(earlier), 0
            ctx = CheckContext(self.catalogue, self.trust.keys_for(claim.tenant_id), s.limits,
                               s.admission_max_header_bytes)
            report = check_quarantined(fetched.adapter_dir, fetched.signature_path, claim, ctx,
                                       earlier=earlier, refused=fetched.refused,
                                       clock=self.timer)
            return report.verdict, report.bytes_hashed
        except Unavailable:
            raise
        except Exception as exc:  # a bug refuses, it never admits
            log.exception("admission of %s@%s crashed", claim.adapter_id, claim.version)
            crash = CheckOutcome("internal", (Problem(INTERNAL, f"admission failed: "
                                                      f"{type(exc).__name__}: {exc}"),))
            return Verdict((source, crash)), 0
        finally:
            shutil.rmtree(qdir, ignore_errors=True)

    def _event(self, release: events_pb2.AdapterReleased, verdict: Verdict,
               duration_ms: float) -> events_pb2.AdmissionEvent:
        meta = new_meta(
            self.settings.producer, release.meta.adapter, clock=self.clock,
            causation_id=release.meta.event_id,
            correlation_id=release.meta.correlation_id or release.meta.event_id,
        )
        if verdict.admitted:
            return events_pb2.AdmissionEvent(admitted=events_pb2.AdapterAdmitted(
                meta=meta, engine_id=release.engine_id, sha256=release.sha256,
                checks_passed=list(verdict.checks_passed), duration_ms=duration_ms,
                artifact_uri=release.artifact_uri, size_bytes=release.size_bytes,
                rank=release.rank, priority=release.priority,
                target_modules=list(release.target_modules),
            ))
        problems = verdict.problems or (Problem(INTERNAL, "no check ran"),)
        return events_pb2.AdmissionEvent(rejected=events_pb2.AdapterRejected(
            meta=meta, reasons=[p.to_proto() for p in problems], engine_id=release.engine_id,
            sha256=release.sha256, duration_ms=duration_ms,
        ))
