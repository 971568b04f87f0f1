"""Command tracking: one command in flight per (worker, version), timeouts, backoff (pure).

Rules the tracker enforces:

* **No contradictory commands.** At most one command is in flight for a given
  (worker, version): a load and an evict (or a pin and an unpin) for the same
  version on the same worker can never be outstanding together. The planner
  asks :meth:`CommandTracker.can_issue` before every command.
* **Tracking until confirmed.** A command is pending until the worker answers
  with a report carrying its ``command_id`` (:meth:`resolve`) or its deadline
  passes (:meth:`expire`; the worker ignores a command past its deadline, so a
  timed-out command cannot execute later).
* **Retries with backoff.** A failed or timed-out command blocks its (worker,
  version) for :func:`backoff_s` of the number of consecutive failures; the
  planner re-plans the action after that if it is still wanted (a retry is a
  fresh command, so a decision that became stale is never retried). A
  non-retriable failure blocks for ``max_backoff_s``.

Every method takes ``now``; nothing here reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from loraplane.cache_manager.model import CommandKind, CommandSpec


def backoff_s(failures: int, *, base_s: float, max_s: float, factor: float = 2.0) -> float:
    """Wait before retrying after ``failures`` consecutive failures: ``base·factor^(n-1)``, capped.

    ``failures <= 0`` → 0. Deterministic (no jitter): commands are already spread by
    the event flow and one cache manager commands at a time.
    """
    if failures <= 0:
        return 0.0
    exponent = min(failures - 1, 64)
    return float(min(max_s, base_s * math.pow(factor, exponent)))


class Key(NamedTuple):
    """(worker, version): the unit of mutual exclusion of commands."""

    worker_id: str
    version_id: str


@dataclass(frozen=True, slots=True)
class Pending:
    """A command sent and not yet answered."""

    command_id: str
    spec: CommandSpec
    issued_at: float
    deadline: float
    attempt: int
    """1 for the first try of this action on this key, 2 for the first retry, ..."""


@dataclass(frozen=True, slots=True)
class Resolution:
    """What happened to a pending command."""

    pending: Pending
    ok: bool
    result: str
    """``ok``, ``failed``, ``timeout`` or ``void`` (the worker restarted)."""
    retriable: bool = True
    code: str = ""
    latency_s: float = 0.0


@dataclass(slots=True)
class _Failures:
    count: int
    blocked_until: float
    last_error: str


class CommandTracker:
    """Pending commands and per-key failure backoff."""

    def __init__(self, *, timeout_s: float, base_backoff_s: float, max_backoff_s: float) -> None:
        if timeout_s <= 0 or base_backoff_s < 0 or max_backoff_s < base_backoff_s:
            raise ValueError("need timeout_s > 0 and 0 <= base_backoff_s <= max_backoff_s")
        self.timeout_s = timeout_s
        self.base_backoff_s = base_backoff_s
        self.max_backoff_s = max_backoff_s
        self._pending: dict[Key, Pending] = {}
        self._by_id: dict[str, Key] = {}
        self._failures: dict[Key, _Failures] = {}

    # ------------------------------------------------------------------ queries

    def pending(self) -> list[Pending]:
        """Every pending command, oldest first."""
        return sorted(self._pending.values(), key=lambda p: (p.issued_at, p.command_id))

    def pending_for(self, worker_id: str, vid: str) -> Pending | None:
        """The command in flight for (worker, version), if any."""
        return self._pending.get(Key(worker_id, vid))

    def blocked_until(self, worker_id: str, vid: str) -> float:
        """Until when (worker, version) is backing off (0 if not)."""
        f = self._failures.get(Key(worker_id, vid))
        return 0.0 if f is None else f.blocked_until

    def failures(self, worker_id: str, vid: str) -> int:
        """Consecutive failures of commands on (worker, version)."""
        f = self._failures.get(Key(worker_id, vid))
        return 0 if f is None else f.count

    def can_issue(self, worker_id: str, vid: str, now: float) -> bool:
        """No command in flight for the key and no backoff running."""
        key = Key(worker_id, vid)
        if key in self._pending:
            return False
        f = self._failures.get(key)
        return f is None or f.blocked_until <= now

    def __len__(self) -> int:
        return len(self._pending)

    # ------------------------------------------------------------------ changes

    def issue(self, spec: CommandSpec, command_id: str, now: float) -> Pending:
        """Record a command as sent; refuses when :meth:`can_issue` is false."""
        key = Key(spec.worker_id, spec.version_id)
        if not self.can_issue(spec.worker_id, spec.version_id, now):
            raise ValueError(f"command for {key} while another is pending or backing off")
        if command_id in self._by_id:
            raise ValueError(f"duplicate command id {command_id}")
        f = self._failures.get(key)
        p = Pending(command_id, spec, now, now + self.timeout_s, 1 if f is None else f.count + 1)
        self._pending[key] = p
        self._by_id[command_id] = key
        return p

    def resolve(
        self, command_id: str, *, ok: bool, now: float, retriable: bool = True, code: str = ""
    ) -> Resolution | None:
        """A worker answered ``command_id``; None when it is not pending (late or foreign)."""
        key = self._by_id.pop(command_id, None)
        if key is None:
            return None
        p = self._pending.pop(key)
        if ok:
            self._failures.pop(key, None)
        else:
            self._fail(key, retriable, code or "failed", now)
        return Resolution(p, ok, "ok" if ok else "failed", retriable, code, now - p.issued_at)

    def expire(self, now: float) -> list[Resolution]:
        """Time out every command past its deadline (counted as a retriable failure)."""
        out: list[Resolution] = []
        for key, p in sorted(self._pending.items(), key=lambda kv: kv[1].issued_at):
            if p.deadline <= now:
                del self._pending[key]
                self._by_id.pop(p.command_id, None)
                self._fail(key, True, "timeout", now)
                out.append(Resolution(p, False, "timeout", True, "timeout", now - p.issued_at))
        return out

    def forget_worker(self, worker_id: str, now: float) -> list[Resolution]:
        """Void every pending command of a worker that restarted or left (no backoff)."""
        out: list[Resolution] = []
        for key in [k for k in self._pending if k.worker_id == worker_id]:
            p = self._pending.pop(key)
            self._by_id.pop(p.command_id, None)
            out.append(Resolution(p, False, "void", True, "void", now - p.issued_at))
        for key in [k for k in self._failures if k.worker_id == worker_id]:
            del self._failures[key]
        return out

    def _fail(self, key: Key, retriable: bool, error: str, now: float) -> None:
        f = self._failures.get(key)
        count = 1 if f is None else f.count + 1
        wait = (
            backoff_s(count, base_s=self.base_backoff_s, max_s=self.max_backoff_s)
            if retriable
            else self.max_backoff_s
        )
        self._failures[key] = _Failures(count, now + wait, error)


def contradicts(a: CommandKind, b: CommandKind) -> bool:
    """Whether two command kinds undo each other (never both in flight on one key)."""
    adds = {CommandKind.LOAD_WARM, CommandKind.LOAD_HOT, CommandKind.PIN}
    removes = {CommandKind.DEMOTE, CommandKind.EVICT, CommandKind.UNPIN}
    return (a in adds and b in removes) or (a in removes and b in adds)
