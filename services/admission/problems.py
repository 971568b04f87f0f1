"""Problems found by admission checks, and the verdict that collects them.

Every check returns a list of :class:`Problem` (empty = passed). The verdict
collects every problem of every check; an adapter version is admitted only
when the list is empty. Codes are the protobuf ``RejectionCode`` values, so a
problem becomes a ``RejectionReason`` without translation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from loraplane.v1 import events_pb2

Code: TypeAlias = events_pb2.RejectionCode
"""A ``loraplane.v1.RejectionCode`` value."""

SOURCE_NOT_ALLOWED: Code = events_pb2.REJECTION_CODE_SOURCE_NOT_ALLOWED
DOWNLOAD_FAILED: Code = events_pb2.REJECTION_CODE_DOWNLOAD_FAILED
SIZE_LIMIT: Code = events_pb2.REJECTION_CODE_SIZE_LIMIT
SIGNATURE_INVALID: Code = events_pb2.REJECTION_CODE_SIGNATURE_INVALID
UNTRUSTED_SIGNER: Code = events_pb2.REJECTION_CODE_UNTRUSTED_SIGNER
DIGEST_MISMATCH: Code = events_pb2.REJECTION_CODE_DIGEST_MISMATCH
UNSIGNED_FILE: Code = events_pb2.REJECTION_CODE_UNSIGNED_FILE
MISSING_FILE: Code = events_pb2.REJECTION_CODE_MISSING_FILE
FORBIDDEN_FILE: Code = events_pb2.REJECTION_CODE_FORBIDDEN_FILE
SYMLINK: Code = events_pb2.REJECTION_CODE_SYMLINK
CONFIG_INVALID: Code = events_pb2.REJECTION_CODE_CONFIG_INVALID
SAFETENSORS_INVALID: Code = events_pb2.REJECTION_CODE_SAFETENSORS_INVALID
TENSOR_NAME: Code = events_pb2.REJECTION_CODE_TENSOR_NAME
TENSOR_SHAPE: Code = events_pb2.REJECTION_CODE_TENSOR_SHAPE
TENSOR_DTYPE: Code = events_pb2.REJECTION_CODE_TENSOR_DTYPE
NON_FINITE: Code = events_pb2.REJECTION_CODE_NON_FINITE
BASE_MODEL_MISMATCH: Code = events_pb2.REJECTION_CODE_BASE_MODEL_MISMATCH
TOKENIZER_MISMATCH: Code = events_pb2.REJECTION_CODE_TOKENIZER_MISMATCH
RANK_TOO_LARGE: Code = events_pb2.REJECTION_CODE_RANK_TOO_LARGE
TARGET_MODULE_UNSUPPORTED: Code = events_pb2.REJECTION_CODE_TARGET_MODULE_UNSUPPORTED
INTERNAL: Code = events_pb2.REJECTION_CODE_INTERNAL

MAX_MESSAGE_CHARS = 500
"""Messages are cut to this length (they may quote attacker-controlled text)."""


def code_name(code: Code) -> str:
    """Short lowercase name of a code, e.g. ``non_finite`` (metrics label, logs)."""
    return str(events_pb2.RejectionCode.Name(code)).removeprefix("REJECTION_CODE_").lower()


@dataclass(frozen=True, slots=True)
class Problem:
    """One reason to refuse an adapter version."""

    code: Code
    """Classification (a ``RejectionCode``)."""
    message: str
    """Human-readable explanation; never empty."""
    path: str = ""
    """File (or tensor name) concerned; empty for the whole artifact."""

    def __post_init__(self) -> None:
        if len(self.message) > MAX_MESSAGE_CHARS:
            object.__setattr__(self, "message", self.message[: MAX_MESSAGE_CHARS - 1] + "…")

    @property
    def name(self) -> str:
        """:func:`code_name` of the code."""
        return code_name(self.code)

    def to_proto(self) -> events_pb2.RejectionReason:
        """As a ``RejectionReason``."""
        return events_pb2.RejectionReason(code=self.code, message=self.message, path=self.path)

    def __str__(self) -> str:
        where = f" [{self.path}]" if self.path else ""
        return f"{self.name}{where}: {self.message}"


@dataclass(frozen=True)
class CheckOutcome:
    """What one named check found."""

    check: str
    """Check name, e.g. ``signature`` (listed in ``AdapterAdmitted.checks_passed``)."""
    problems: tuple[Problem, ...] = ()
    """Every problem found (empty = passed)."""
    seconds: float = 0.0
    """Wall time the check took."""

    @property
    def passed(self) -> bool:
        """No problem found."""
        return not self.problems


@dataclass(frozen=True)
class Verdict:
    """Every check's outcome; admitted only when no check found a problem."""

    outcomes: tuple[CheckOutcome, ...] = field(default_factory=tuple)

    @property
    def problems(self) -> tuple[Problem, ...]:
        """Every problem of every check, in check order, duplicates removed."""
        return dedupe(p for o in self.outcomes for p in o.problems)

    @property
    def admitted(self) -> bool:
        """True when every check passed (and at least one ran)."""
        return bool(self.outcomes) and not self.problems

    @property
    def checks_passed(self) -> tuple[str, ...]:
        """Names of the checks that found nothing."""
        return tuple(o.check for o in self.outcomes if o.passed)

    @property
    def codes(self) -> frozenset[Code]:
        """The distinct codes of the problems."""
        return frozenset(p.code for p in self.problems)


def dedupe(problems: Iterable[Problem]) -> tuple[Problem, ...]:
    """Problems in first-seen order without exact duplicates."""
    seen: set[Problem] = set()
    out: list[Problem] = []
    for p in problems:
        if p not in seen:
            seen.add(p)
            out.append(p)
    return tuple(out)


def codes_of(problems: Sequence[Problem]) -> frozenset[Code]:
    """The distinct codes of ``problems``."""
    return frozenset(p.code for p in problems)
