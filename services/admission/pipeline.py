"""Run every local check on a quarantined adapter and collect every problem.

This is the blocking half of admission (hashing, signature verification, header
parsing, NaN scan): the service calls :func:`check_quarantined` through
``asyncio.to_thread``. Nothing here does network I/O, so the same function re-checks
an adapter directory anywhere (a worker's host tier, a test corpus).

A check that raises is recorded as an ``INTERNAL`` problem: a bug in a check refuses
the artifact, it never admits it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from loraplane.admission.checks.compat import check_compatibility, resolve_base_model
from loraplane.admission.checks.config import (
    LoraConfigView,
    check_config_file,
    check_config_matches_release,
)
from loraplane.admission.checks.files import WEIGHTS_FILE, SizeLimits, check_files
from loraplane.admission.checks.finite import check_finite
from loraplane.admission.checks.safetensors import SafetensorsHeader, read_header
from loraplane.admission.checks.signature import SignatureResult, check_signature
from loraplane.admission.checks.tensors import check_tensors
from loraplane.admission.claim import ReleaseClaim
from loraplane.admission.problems import INTERNAL, CheckOutcome, Code, Problem, Verdict
from loraplane.admission.trust import TrustedKey
from loraplane.shared.catalogue import BaseModelSpec, Catalogue

REQUIRED_CHECKS = ("files", "signature", "config", "compatibility", "safetensors", "tensors",
                   "finite")
"""An adapter is admitted only when each of these ran and found nothing."""
MAX_PROBLEMS_PER_CODE = 12
"""Per check and code, further problems are folded into one summary line."""


@dataclass(frozen=True)
class CheckContext:
    """Everything the local checks need besides the files."""

    catalogue: Catalogue
    trusted_keys: Sequence[TrustedKey]
    limits: SizeLimits
    max_header_bytes: int


@dataclass
class LocalReport:
    """Outcome of :func:`check_quarantined`."""

    verdict: Verdict
    bytes_hashed: int = 0
    """Bytes hashed by the signature check."""
    bytes_scanned: int = 0
    """Bytes scanned for NaN/Inf."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds per check."""


def fold(problems: Sequence[Problem], limit: int = MAX_PROBLEMS_PER_CODE) -> list[Problem]:
    """Keep at most ``limit`` problems per code; summarise the rest in one problem."""
    kept: list[Problem] = []
    extra: dict[Code, int] = {}
    counts: dict[Code, int] = {}
    for p in problems:
        counts[p.code] = counts.get(p.code, 0) + 1
        if counts[p.code] <= limit:
            kept.append(p)
        else:
            extra[p.code] = extra.get(p.code, 0) + 1
    for code, n in extra.items():
        kept.append(Problem(code, f"... and {n} more problems of this kind"))
    return kept


class _Runner:
    """Times checks and turns exceptions into INTERNAL problems."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.outcomes: list[CheckOutcome] = []
        self.clock = clock

    def record(self, check: str, started: float, problems: Sequence[Problem]) -> None:
        self.outcomes.append(CheckOutcome(check, tuple(fold(problems)),
                                          self.clock() - started))

    def crashed(self, check: str, started: float, exc: BaseException) -> None:
        self.record(check, started, [Problem(INTERNAL, f"check {check} failed: "
                                             f"{type(exc).__name__}: {exc}")])


def check_quarantined(
    adapter_dir: Path,
    signature_path: Path,
    claim: ReleaseClaim,
    ctx: CheckContext,
    *,
    earlier: Sequence[CheckOutcome] = (),
    refused: Collection[str] = (),
    clock: Callable[[], float] = time.perf_counter,
) -> LocalReport:
    """Run every local check; ``earlier`` are outcomes of the source/download stages.

    ``refused`` names files refused before download (already reported in ``earlier``).
    """
    run = _Runner(clock)
    run.outcomes.extend(earlier)
    report = LocalReport(Verdict())

    t = clock()
    try:
        run.record("files", t, check_files(adapter_dir, ctx.limits, refused=refused))
    except Exception as exc:  # noqa: BLE001 - a crashing check refuses, never admits
        run.crashed("files", t, exc)

    # The signature check hashes every byte: it runs in its own thread beside the format
    # checks below, which only read the same files (hashlib and numpy release the GIL).
    def timed_signature() -> tuple[SignatureResult, float, float]:
        started = clock()
        result = check_signature(
            adapter_dir, signature_path,
            trusted=ctx.trusted_keys,
            registered_sha256=claim.sha256,
            registered_files=claim.files,
            registered_signer=claim.signer_identity,
            refused=refused,
        )
        return result, started, clock()

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="admission-signature")
    signature_future = pool.submit(timed_signature)
    pool.shutdown(wait=False)
    signature_slot = len(earlier) + 1  # right after "files"

    config: LoraConfigView | None = None
    t = clock()
    try:
        config, problems = check_config_file(adapter_dir / "adapter_config.json")
        if config is not None:
            problems = [*problems, *check_config_matches_release(
                config, rank=claim.rank, target_modules=claim.target_modules,
                lora_alpha=claim.lora_alpha, artifact_format=claim.artifact_format)]
        run.record("config", t, problems)
    except Exception as exc:  # noqa: BLE001
        run.crashed("config", t, exc)

    spec: BaseModelSpec | None = None
    t = clock()
    try:
        spec, problems = resolve_base_model(ctx.catalogue, claim.base_model)
        if spec is not None:
            problems = check_compatibility(
                spec,
                tokenizer_revision=claim.tokenizer_revision,
                config_base_model=config.base_model if config else None,
                rank=config.r if config else claim.rank,
                target_modules=config.target_modules if config else claim.target_modules,
            )
        run.record("compatibility", t, problems)
    except Exception as exc:  # noqa: BLE001
        run.crashed("compatibility", t, exc)

    header: SafetensorsHeader | None = None
    t = clock()
    try:
        weights = adapter_dir / WEIGHTS_FILE
        if weights.is_symlink() or WEIGHTS_FILE in refused:
            problems = []  # reported by the files check / download stage; never followed
        else:
            header, problems = read_header(weights, max_header_bytes=ctx.max_header_bytes)
        run.record("safetensors", t, problems)
    except Exception as exc:  # noqa: BLE001
        run.crashed("safetensors", t, exc)

    if header is not None and spec is not None and config is not None:
        t = clock()
        try:
            run.record("tensors", t, check_tensors(
                header.tensors.values(), rank=config.r,
                target_modules=config.target_modules, spec=spec))
        except Exception as exc:  # noqa: BLE001
            run.crashed("tensors", t, exc)

    if header is not None:
        t = clock()
        try:
            problems, report.bytes_scanned = check_finite(header)
            run.record("finite", t, problems)
        except Exception as exc:  # noqa: BLE001
            run.crashed("finite", t, exc)

    t = clock()
    try:
        sig, started, ended = signature_future.result()
        report.bytes_hashed = sig.bytes_hashed
        outcome = CheckOutcome("signature", tuple(fold(sig.problems)), ended - started)
    except Exception as exc:  # noqa: BLE001
        outcome = CheckOutcome("signature", (Problem(
            INTERNAL, f"check signature failed: {type(exc).__name__}: {exc}"),), clock() - t)
    run.outcomes.insert(signature_slot, outcome)

    ran = {o.check for o in run.outcomes}
    if all(o.passed for o in run.outcomes) and not ran.issuperset(REQUIRED_CHECKS):
        missing = ", ".join(c for c in REQUIRED_CHECKS if c not in ran)
        run.record("completeness", clock(), [Problem(INTERNAL, f"checks did not run: {missing}")])
    report.verdict = Verdict(tuple(run.outcomes))
    report.timings = {o.check: o.seconds for o in run.outcomes}
    return report
