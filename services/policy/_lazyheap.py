"""A min-heap of members with lazily invalidated entries (shared by LFU, GDSF, Belady)."""

from __future__ import annotations

import heapq
from collections.abc import Callable


class LazyHeap:
    """Members with a key each; the key may change, old heap entries are skipped on pop.

    ``push(v, key)`` records the member's current key; ``pop_min(accept)`` returns
    the member with the smallest current key for which ``accept(v)`` is true,
    leaving it in the heap (the caller removes it with :meth:`discard`).
    Ties break on the member id, so the order is deterministic.
    """

    __slots__ = ("_heap", "_key")

    def __init__(self) -> None:
        self._heap: list[tuple[float, float, int]] = []
        self._key: dict[int, tuple[float, float]] = {}

    def __contains__(self, v: int) -> bool:
        return v in self._key

    def __len__(self) -> int:
        return len(self._key)

    def push(self, v: int, key: float, tie: float = 0.0) -> None:
        """Set the key of ``v`` (adding it when absent)."""
        k = (key, tie)
        self._key[v] = k
        heapq.heappush(self._heap, (key, tie, v))
        if len(self._heap) > 4 * len(self._key) + 64:
            self._compact()

    def discard(self, v: int) -> None:
        """Remove ``v`` (its heap entries become stale)."""
        self._key.pop(v, None)

    def members(self) -> list[int]:
        """Current members (any order)."""
        return list(self._key)

    def key(self, v: int) -> float:
        """Current key of ``v``."""
        return self._key[v][0]

    def pop_min(self, accept: Callable[[int], bool]) -> int | None:
        """Member with the smallest key that ``accept`` allows (None if none)."""
        heap = self._heap
        keys = self._key
        skipped: list[tuple[float, float, int]] = []
        found: int | None = None
        while heap:
            entry = heapq.heappop(heap)
            key, tie, v = entry
            if keys.get(v) != (key, tie):
                continue  # stale
            skipped.append(entry)
            if accept(v):
                found = v
                break
        for entry in skipped:
            heapq.heappush(heap, entry)
        return found

    def _compact(self) -> None:
        self._heap = [(k, t, v) for v, (k, t) in self._key.items()]
        heapq.heapify(self._heap)
