"""Version resolution: adapter name → one immutable version (stable or canary).

Pure code. The canary split is sticky: a request key (the caller's user or
session id, else the request id) is hashed with SHA-256 together with the adapter
id into one of :data:`BUCKETS` buckets; the first ``canary_percent`` % of the
buckets go to the canary. The same key always lands on the same side, in every
gateway process (never Python's ``hash()``, which is salted per process).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from loraplane.v1 import common_pb2

BUCKETS = 10_000
"""Resolution of the split: 0.01 %."""


@dataclass(frozen=True, slots=True)
class ReleaseView:
    """Release pointers of one adapter name as the gateway sees them."""

    tenant_id: str
    """Owning tenant."""
    name: str
    """Adapter name."""
    stable: str
    """Stable version ("" = none yet)."""
    canary: str = ""
    """Canary version ("" = none)."""
    canary_percent: int = 0
    """Share of traffic for the canary, 0..100."""
    canary_cleared: bool = True
    """The canary analysis cleared the canary for tenant traffic (its golden set passed);
    until then only canary-class (golden-set) requests reach it."""

    @property
    def adapter_id(self) -> str:
        """``tenant/name``."""
        return f"{self.tenant_id}/{self.name}"


@dataclass(frozen=True, slots=True)
class Resolution:
    """The version a request will use."""

    version: str
    """Resolved version label."""
    canary: bool
    """Whether it is the canary version."""
    canary_held_back: bool = False
    """The split chose the canary, but it is not warm yet: the stable version serves."""


def split_bucket(adapter_id: str, request_key: str) -> int:
    """Bucket in ``[0, BUCKETS)`` of ``request_key`` for ``adapter_id`` (stable hash)."""
    digest = hashlib.sha256(f"{adapter_id}\x00{request_key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


def in_canary(adapter_id: str, request_key: str, percent: int) -> bool:
    """Whether ``request_key`` falls into the canary share of ``adapter_id``."""
    if percent <= 0:
        return False
    if percent >= 100:
        return True
    return split_bucket(adapter_id, request_key) < percent * (BUCKETS // 100)


def resolve(
    release: ReleaseView,
    request_key: str,
    request_class: int,
    *,
    canary_warm: bool,
) -> Resolution | None:
    """Choose the version for one request; ``None`` when the name has no version to serve.

    * canary-class requests (shadow / golden set) go to the canary version when there
      is one, warm or not: they are what warms it;
    * other requests go to the canary for their sticky share, but only once the canary
      is cleared (its golden set passed) and warm (HOT or WARM on some worker); until then
      the stable version serves them (a canary without a stable version serves anyway:
      there is nothing else to serve).
    """
    has_canary = bool(release.canary) and release.canary != release.stable
    if request_class == common_pb2.REQUEST_CLASS_CANARY and has_canary:
        return Resolution(release.canary, True)
    if has_canary and in_canary(release.adapter_id, request_key, release.canary_percent):
        if (canary_warm and release.canary_cleared) or not release.stable:
            return Resolution(release.canary, True)
        return Resolution(release.stable, False, canary_held_back=True)
    if release.stable:
        return Resolution(release.stable, False)
    return None
