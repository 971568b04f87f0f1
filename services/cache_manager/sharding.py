"""Decisions sharded by base model: which shards a process may lead, and each shard's names.

A **shard** is one base model: its leader plans only that base model's versions on the
workers serving it (:attr:`State.base_models`), so a fleet of several base models has
several leaders deciding in parallel, and one process may lead several shards.

``LORAPLANE_CACHE_MANAGER_SHARDS`` (:func:`parse_shards`):

* empty (default): **no sharding**: one leader for every base model under the
  deployment's lock key (``LOCK_KEY``), what ``make run`` and a single-model fleet use;
* ``*``: every base model the registry has a version of (re-read every
  ``leader_poll_s``), one leader each;
* ``a,b``: only these base models (e.g. one Deployment per group of models).

Every shard leader holds, on its own database session (:class:`~.election.LeaderLock`):

* the deployment key in **shared** mode (``pg_try_advisory_lock_shared(LOCK_KEY)``), so an
  unsharded leader (which holds that key exclusively) and shard leaders never command at
  the same time, whichever mode each process was started in;
* its shard key exclusively (:func:`shard_lock_key`): 62 bits of the SHA-256 of
  ``"<LOCK_KEY>/<base model>"``. Stable across processes and releases (never Python's
  ``hash()``); two base models colliding has a probability of about 2⁻⁶² per pair.

Each shard commits its input offsets under its own group (:func:`shard_group`), so a shard's
new leader resumes where the previous one of *that shard* stopped, and keeps its canary
analysis runs under that group too (a shard forgets the runs it has no canary for); heat
statistics and the worker directory stay under the deployment (``CONSUMER_GROUP``), one row
per version / worker, each shard writing its own versions' rows.

A worker serving several base models is followed by each of their shards: HOT slots are
per base model (no overlap); its WARM bytes are one pool, each shard counting the other
shards' resident versions as taken. Two shards filling the last free WARM bytes in the same
instant get one ``NO_CAPACITY`` answer (retried after the backoff).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

EVERY = "*"
"""``LORAPLANE_CACHE_MANAGER_SHARDS`` value: every base model of the registry."""


@dataclass(frozen=True, slots=True)
class ShardSelection:
    """Which shards a process may lead."""

    every: bool
    """Every base model the registry knows (``*``)."""
    names: frozenset[str] = frozenset()
    """The listed base models (when not ``every``)."""

    def wanted(self, discovered: Iterable[str]) -> list[str]:
        """The shards to stand for, sorted: the discovered base models, or the listed ones."""
        if self.every:
            return sorted({bm for bm in discovered if bm})
        return sorted(self.names)


def parse_shards(text: str) -> ShardSelection | None:
    """``LORAPLANE_CACHE_MANAGER_SHARDS`` → a selection (None: not sharded). Raises
    ``ValueError`` naming every problem."""
    raw = [part.strip() for part in text.split(",")]
    if not text.strip():
        return None
    names = [p for p in raw if p]
    problems: list[str] = []
    if len(names) != len(raw):
        problems.append("empty name between commas")
    if EVERY in names and len(names) > 1:
        problems.append(f"{EVERY!r} stands alone (every base model), not in a list")
    bad = sorted({n for n in names if n != EVERY and any(c.isspace() for c in n)})
    if bad:
        problems.append(f"base model names with spaces: {bad}")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        problems.append(f"listed twice: {dup}")
    if problems:
        raise ValueError(f"LORAPLANE_CACHE_MANAGER_SHARDS={text!r}: " + "; ".join(problems))
    if names == [EVERY]:
        return ShardSelection(every=True)
    return ShardSelection(every=False, names=frozenset(names))


def shard_lock_key(deployment_key: int, base_model: str) -> int:
    """Advisory lock key of one shard: 62 bits of SHA-256(``"<deployment_key>/<base model>"``)
    (positive, so ``pg_locks``' classid/objid give it back unsigned)."""
    if not base_model:
        raise ValueError("a shard needs a base model name")
    digest = hashlib.sha256(f"{deployment_key}/{base_model}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 2


def shard_group(group: str, base_model: str) -> str:
    """Kafka group id under which a shard commits its input offsets."""
    return f"{group}.shard.{base_model}"
