"""Turn corpus cases into uploads and release events (the ``direct`` driver), and read
verdicts back from ``adapter.admissions``."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from minio import Minio

from loraplane.registry.grammar import artifact_prefix, artifact_uri, content_digest
from loraplane.shared.codec import decode_as, encode, kafka_headers
from loraplane.shared.signing import SIGNATURE_FILENAME, compute_manifest_digest, manifest_digest
from loraplane.shared.topics import ADAPTER_RELEASES, key_for, new_meta
from loraplane.v1 import common_pb2, events_pb2

from .corpus import Built, Case

FAST_GROUP = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 500,
              "rebalance_timeout_ms": 1000}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def local_files(d: Path | None) -> dict[str, bytes]:
    """Relative path → bytes of every file below ``d`` (links followed, like uploaders)."""
    if d is None:
        return {}
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file()}


@dataclass
class Planned:
    """A direct case: the objects to upload and the release to publish."""

    case: Case
    built: Built
    bucket: str
    objects: dict[str, bytes]
    """Full key → bytes."""
    release: events_pb2.AdapterReleased


def plan_direct(case: Case, built: Built, *, tenant_id: str, bucket: str, tiny: str,
                tokenizer_revision: str, version: str = "v1") -> Planned:
    """The upload and the release an honest registry would produce, then the case's tricks."""
    files = local_files(built.dir)
    files.update(built.objects)
    artifact = {p: b for p, b in files.items() if p != SIGNATURE_FILENAME}
    digest = content_digest((p, _sha(b)) for p, b in artifact.items())
    name = case.name
    prefix = artifact_prefix(tenant_id, name, version, digest)
    sig = built.dir / SIGNATURE_FILENAME if built.dir is not None else None
    try:
        sha = manifest_digest(sig) if sig is not None and sig.exists() else ""
    except Exception:  # noqa: BLE001 - a garbage bundle: fall back to the files' digest
        sha = ""
    sha = sha or (compute_manifest_digest(built.dir) if built.dir is not None else "0" * 64)
    cfg: dict[str, object] = {}
    if built.dir is not None and (built.dir / "adapter_config.json").is_file():
        try:
            cfg = json.loads((built.dir / "adapter_config.json").read_text())
        except ValueError:
            cfg = {}
    ref = common_pb2.AdapterRef(tenant_id=tenant_id, adapter_name=name, version=version,
                                base_model=built.base_model or tiny)
    target = built.bucket or bucket
    uri = artifact_uri(target, prefix)
    release = events_pb2.AdapterReleased(
        meta=new_meta("registry/corpus", ref), engine_id=0,
        rank=int(cfg.get("r", 8)) if isinstance(cfg.get("r", 8), int) else 8,
        format="peft", target_modules=[str(m) for m in cfg.get("target_modules", [])]  # type: ignore[attr-defined]
        if isinstance(cfg.get("target_modules"), list) else [],
        artifact_uri=built.uri(uri) if built.uri else uri,
        signature_uri=(built.uri(uri) if built.uri else uri) + SIGNATURE_FILENAME,
        sha256=sha, size_bytes=sum(len(b) for b in artifact.values()),
        tokenizer_revision=built.tokenizer_revision or tokenizer_revision,
        lora_alpha=float(cfg.get("lora_alpha", 0) or 0)  # type: ignore[arg-type]
        if isinstance(cfg.get("lora_alpha"), int | float) else 0.0,
        files=[events_pb2.ArtifactFile(path=p, size_bytes=len(b), sha256=_sha(b))
               for p, b in sorted(artifact.items())],
    )
    for k, v in built.release.items():
        setattr(release, k, v)
    objects = {prefix + p: b for p, b in files.items()} if built.upload else {}
    return Planned(case, built, target, objects, release)


def upload(s3: Minio, bucket: str, objects: dict[str, bytes]) -> None:
    """Put raw objects (blocking)."""
    if objects and not s3.bucket_exists(bucket):
        s3.make_bucket(bucket)
    for key, data in objects.items():
        s3.put_object(bucket, key, io.BytesIO(data), len(data))


async def publish_releases(bootstrap: str, releases: list[events_pb2.AdapterReleased],
                           topic: str = ADAPTER_RELEASES) -> None:
    """Publish release events with the codec headers, keyed by adapter id."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for release in releases:
            body, headers = encode(release)
            await producer.send_and_wait(topic, body, key=key_for(ADAPTER_RELEASES, release),
                                         headers=kafka_headers(headers))
    finally:
        await producer.stop()


async def read_verdicts(
    bootstrap: str, want: Callable[[dict[tuple[str, str], list[events_pb2.AdmissionEvent]]],
                                   bool],
    *, topic: str = "adapter.admissions", timeout: float = 120,
) -> dict[tuple[str, str], list[events_pb2.AdmissionEvent]]:
    """Read ``topic`` from the start until ``want(verdicts by (adapter id, version))``."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap,
                                group_id=f"verdict-reader-{uuid.uuid4().hex[:8]}",
                                auto_offset_reset="earliest", enable_auto_commit=False,
                                **FAST_GROUP)
    await consumer.start()
    got: dict[tuple[str, str], list[events_pb2.AdmissionEvent]] = {}
    try:
        async with asyncio.timeout(timeout):
            while not want(got):
                batch = await consumer.getmany(timeout_ms=300)
                for records in batch.values():
                    for r in records:
                        ev = decode_as(events_pb2.AdmissionEvent, r.value, r.headers)
                        verdict = getattr(ev, ev.WhichOneof("verdict") or "admitted")
                        ref = verdict.meta.adapter
                        key = (f"{ref.tenant_id}/{ref.adapter_name}", ref.version)
                        got.setdefault(key, []).append(ev)
    finally:
        await consumer.stop()
    return got


def codes(event: events_pb2.AdmissionEvent) -> frozenset[str]:
    """Code names of a verdict (empty for an admission)."""
    if event.WhichOneof("verdict") != "rejected":
        return frozenset()
    return frozenset(events_pb2.RejectionCode.Name(r.code).removeprefix("REJECTION_CODE_")
                     for r in event.rejected.reasons)
