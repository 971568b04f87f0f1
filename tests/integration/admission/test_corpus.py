"""The hostile corpus through the real stack: every case refused with exactly its reasons,
the well-formed adapters admitted, one verdict per version.

Registry cases go the operator's way (``release_adapter``, the function behind
``loraplane release`` → registry outbox → Kafka → admission → Kafka → registry status);
direct cases are uploaded and published by the test (see ``corpus.py``). Admission and the
registry run in the session loop; the corpus is built, released and decided in one pass.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import asyncpg
from minio import Minio

from loraplane.admission.app import AdmissionApp
from loraplane.admission.checks.files import SizeLimits
from loraplane.admission.claim import ReleaseClaim
from loraplane.admission.pipeline import CheckContext, check_quarantined
from loraplane.admission.trust import TrustStore
from loraplane.registry.app import RegistryApp
from loraplane.registry.client import RegistryClient, release_adapter, wait_for_verdict
from loraplane.shared.catalogue import BaseModelSpec, load_catalogue
from loraplane.shared.signing import compute_manifest_digest
from loraplane.shared.tls import OPERATOR, TlsFiles
from loraplane.stack.stack import Stack
from loraplane.v1 import common_pb2, events_pb2
from tests.support.registry import TOKEN
from tests.support.tls import tls_files

from .conftest import REPO, Keys
from .corpus import ALL_CASES, HOSTILE, WELL_FORMED, Built, Case, Env
from .drive import codes, plan_direct, publish_releases, read_verdicts, upload

VERSION = "v1"


def test_corpus_size_and_table() -> None:
    """At least 30 hostile cases, covering the required reasons, each in the README table."""
    assert len(HOSTILE) >= 30
    required = {"UNTRUSTED_SIGNER", "DIGEST_MISMATCH", "UNSIGNED_FILE", "SIGNATURE_INVALID",
                "FORBIDDEN_FILE", "SOURCE_NOT_ALLOWED", "SIZE_LIMIT", "SAFETENSORS_INVALID",
                "TENSOR_NAME", "TENSOR_SHAPE", "RANK_TOO_LARGE", "BASE_MODEL_MISMATCH",
                "TOKENIZER_MISMATCH", "NON_FINITE", "TENSOR_DTYPE", "CONFIG_INVALID",
                "MISSING_FILE", "TARGET_MODULE_UNSUPPORTED", "DOWNLOAD_FAILED"}
    assert required <= set().union(*(c.expected for c in HOSTILE))
    assert len({c.name for c in ALL_CASES}) == len(ALL_CASES)
    readme = (REPO / "services" / "admission" / "README.md").read_text()
    row = re.compile(r"^\| `([a-z0-9-]+)` \| (registry|direct) \| [^|]+ \| ([^|]+) \|$",
                     re.MULTILINE)
    rows = {m[0]: (m[1], frozenset(re.findall(r"[A-Z_]{4,}", m[2])))
            for m in row.findall(readme)}
    table = {c.name: (c.driver, c.expected) for c in ALL_CASES}
    assert rows == table


def _registry_release(reg_addr: str, tls: TlsFiles | None, s3: Minio, case: Case, built: Built,
                      tenant_id: str,
                      tiny: BaseModelSpec) -> None:
    assert built.dir is not None
    reg = RegistryClient(reg_addr, TOKEN, actor="tests/admission-corpus", tls=tls)
    try:
        release_adapter(
            reg, s3, directory=built.dir, tenant=tenant_id, name=case.name, version=VERSION,
            base_model=built.base_model or tiny.name, signing_key=None,
            tokenizer_revision=built.tokenizer_revision or tiny.tokenizer_revision,
        )
    finally:
        reg.close()


def _status(reg_addr: str, tls: TlsFiles | None, tenant_id: str, name: str
            ) -> tuple[int, frozenset[str]]:
    reg = RegistryClient(reg_addr, TOKEN, tls=tls)
    try:
        v = wait_for_verdict(reg, tenant_id, name, VERSION, timeout_s=60, poll_s=0.3)
    finally:
        reg.close()
    assert v is not None, f"{tenant_id}/{name}: no verdict in the registry"
    reasons = frozenset(events_pb2.RejectionCode.Name(r.code).removeprefix("REJECTION_CODE_")
                        for r in v.reasons)
    return v.status, reasons


async def test_hostile_corpus_through_the_stack(
    stack: Stack, registry_app: RegistryApp, admission: AdmissionApp, s3: Minio,
    corpus_env: Env, tenants: dict[str, str], tiny: BaseModelSpec, session_id: str,
) -> None:
    reg_addr = registry_app.address
    operator = tls_files(stack, OPERATOR)  # the release pipeline's (the CLI's) certificate
    reg = RegistryClient(reg_addr, TOKEN, tls=operator)
    try:
        for tenant_id in tenants.values():
            await asyncio.to_thread(reg.ensure_tenant, tenant_id)
    finally:
        reg.close()

    built: dict[str, Built] = {}
    for case in ALL_CASES:
        built[case.name] = await asyncio.to_thread(case.build, corpus_env,
                                                   corpus_env.work / case.name)

    direct = []
    for case in ALL_CASES:
        b = built[case.name]
        tenant_id = tenants[b.tenant]
        if case.driver == "registry":
            await asyncio.to_thread(_registry_release, reg_addr, operator, s3, case, b, tenant_id,
                                    tiny)
        else:
            if b.bucket:
                b.bucket = f"{b.bucket}-{session_id}"
            planned = plan_direct(case, b, tenant_id=tenant_id,
                                  bucket=stack.settings.artifact_bucket, tiny=tiny.name,
                                  tokenizer_revision=tiny.tokenizer_revision, version=VERSION)
            await asyncio.to_thread(upload, s3, planned.bucket, planned.objects)
            direct.append(planned.release)
    await publish_releases(stack.settings.kafka_bootstrap, direct,
                           topic=admission.settings.admission_releases_topic)

    wanted = {(f"{tenants[built[c.name].tenant]}/{c.name}", VERSION): c for c in ALL_CASES}
    verdicts = await read_verdicts(stack.settings.kafka_bootstrap,
                                   lambda got: set(wanted) <= set(got),
                                   topic=admission.settings.admission_admissions_topic,
                                   timeout=180)

    failures: list[str] = []
    for key, case in wanted.items():
        events = verdicts[key]
        ids = {getattr(e, e.WhichOneof("verdict") or "admitted").meta.event_id for e in events}
        if len(ids) != 1:
            failures.append(f"{case.name}: {len(ids)} different verdicts")
        got = codes(events[0])
        if got != case.expected:
            reasons = [f"{events_pb2.RejectionCode.Name(r.code)} {r.path} {r.message}"
                       for r in events[0].rejected.reasons]
            failures.append(f"{case.name}: got {sorted(got)}, expected "
                            f"{sorted(case.expected)}: {reasons}")
        if case in HOSTILE and any(e.WhichOneof("verdict") == "admitted" for e in events):
            failures.append(f"{case.name}: ADMITTED")
    assert not failures, "\n".join(failures)

    # The registry applied every verdict of a version it knows: status and the same reasons.
    for case in ALL_CASES:
        if case.driver != "registry":
            continue
        status, reasons = await asyncio.to_thread(
            _status, reg_addr, operator, tenants[built[case.name].tenant], case.name)
        want = common_pb2.VERSION_STATUS_ADMITTED if not case.expected else \
            common_pb2.VERSION_STATUS_REJECTED
        assert (status, reasons) == (want, case.expected), case.name

    # ... and wrote one audit row per verdict (actor: the admission service).
    conn = await asyncpg.connect(stack.settings.postgres_dsn)
    try:
        rows = await conn.fetch(
            "SELECT subject, action FROM audit_log WHERE action IN ('version.admit', "
            "'version.reject') AND (subject LIKE $1 OR subject LIKE $2)",
            f"{tenants['acme']}/%", f"{tenants['globex']}/%")
    finally:
        await conn.close()
    audited = sorted((r["subject"], r["action"]) for r in rows)
    assert audited == sorted(
        (f"{tenants[built[c.name].tenant]}/{c.name}@{VERSION}",
         "version.reject" if c.expected else "version.admit")
        for c in ALL_CASES if c.driver == "registry")

    m = admission.metrics
    assert m.verdicts.labels("rejected")._value.get() >= len(HOSTILE)
    assert m.verdicts.labels("admitted")._value.get() >= len(WELL_FORMED)
    assert m.reasons.labels("non_finite")._value.get() >= 4
    assert m.bytes_verified._value.get() > 0
    assert admission.admitter is not None
    assert list(admission.admitter.quarantine_root.iterdir()) == []  # nothing left behind


def test_symlink_at_the_quarantine_stage(corpus_env: Env, keys: Keys, tiny: BaseModelSpec,
                                         tmp_path: Path) -> None:
    """S3 has no links (an uploader follows them: see case ``symlink``); a link inside the
    directory admission checks (quarantine, or a worker's host tier) is refused unread."""
    import os
    import shutil

    src = corpus_env.demo.adapter("acme", "support", "2026-11-01.1")
    d = tmp_path / "linked"
    shutil.copytree(src.dir, d)
    (d / "adapter_model.safetensors").unlink()
    os.symlink(src.dir / "adapter_model.safetensors", d / "adapter_model.safetensors")
    catalogue = load_catalogue(REPO / "config" / "base_models.yaml")
    ctx = CheckContext(catalogue, TrustStore(keys.platform_dir, None).keys_for("acme"),
                       SizeLimits(1 << 24, 1 << 25), 1 << 20)
    claim = ReleaseClaim("acme", "support", "v1", tiny.name, 8, ("q_proj", "v_proj"), 16.0,
                         "peft", "", "", src.manifest_digest, 0, "", tiny.tokenizer_revision)
    report = check_quarantined(d, d / "model.sig", claim, ctx)
    assert [(p.code, p.path) for p in report.verdict.problems] == [
        (events_pb2.REJECTION_CODE_SYMLINK, "adapter_model.safetensors")]
    assert compute_manifest_digest(src.dir) == src.manifest_digest  # target untouched

