"""Test doubles for the worker's unit tests (never used by integration tests).

* :class:`VllmModel`: an in-memory engine that models vLLM's LoRA bookkeeping (a CPU
  LRU cache of ``max_cpu_loras`` registrations, ``max_loras`` slots with LRU
  activation, pins) and records every situation that kills or corrupts the real engine
  as a *violation* instead of dying: the unit tests assert that the worker's guard never
  causes one, and that the same operations without the guard do.
* :class:`DirStore`: an :class:`~loraplane.shared.objectstore.ObjectStore` over a local
  directory (``root/<bucket>/<key>``).
"""

from __future__ import annotations

import asyncio
import shutil
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from loraplane.shared.errors import Unavailable
from loraplane.shared.objectstore import ObjectInfo, ObjectMissing
from loraplane.worker.engine import EngineAdapter, EngineChunk, EngineLimits, EngineRequest
from loraplane.worker.errors import EngineFailure
from loraplane.worker.guard import SafeEngine
from loraplane.worker.host_tier import ArtifactSpec, HostTier
from loraplane.worker.lora_files import LlamaDims
from loraplane.worker.manager import AdapterManager
from loraplane.worker.metrics import WorkerMetrics

BUCKET = "loraplane-artifacts"
PREFIX = "adapters"
BASE = "loraplane/tiny-llama"
DIMS = LlamaDims(num_layers=2, hidden=32, heads=4, kv_heads=2, head_dim=8, intermediate=64)
LIMITS = EngineLimits(max_loras=3, max_cpu_loras=5, max_lora_rank=16)

MakeAdapter = Callable[..., ArtifactSpec]
"""``make_adapter(name, *, tenant, version, rank, key, base_model) -> ArtifactSpec``."""


class VllmModel:
    """Engine double with vLLM's LoRA cache semantics and its failure modes as records."""

    def __init__(self, limits: EngineLimits, *, step_delay_s: float = 0.0) -> None:
        self._limits = limits
        self.step_delay_s = step_delay_s
        self.registered: OrderedDict[int, EngineAdapter] = OrderedDict()
        self.active: OrderedDict[int, None] = OrderedDict()
        self.pinned: set[int] = set()
        self.running: dict[str, int] = {}
        self.violations: list[str] = []
        self.calls: list[tuple[str, int]] = []
        self.aborted: list[str] = []
        self._abort: set[str] = set()

    # -- Engine protocol ---------------------------------------------------------------
    @property
    def limits(self) -> EngineLimits:
        return self._limits

    @property
    def base_model_dir(self) -> Path:
        return Path("/nonexistent/base")

    @property
    def dead(self) -> bool:
        return self.died

    died = False
    """Set by a test to simulate the engine dying."""

    def _violate(self, what: str) -> None:
        self.violations.append(what)

    def _activate(self, engine_id: int, batch: set[int]) -> None:
        if engine_id in self.active:
            self.active.move_to_end(engine_id)
            return
        if len(self.active) >= self._limits.max_loras:
            victims = [i for i in self.active if i not in self.pinned]
            if not victims:
                self._violate(f"all slots pinned when activating {engine_id} (engine dies)")
                return
            # between two engine steps this is harmless: the next step activates its
            # batch's adapters again (checked in _step)
            del self.active[victims[0]]
        self.active[engine_id] = None

    def _add(self, adapter: EngineAdapter, batch: set[int]) -> None:
        if adapter.rank > self._limits.max_lora_rank:
            raise EngineFailure(f"rank {adapter.rank} > max_lora_rank")
        if adapter.engine_id not in self.registered:
            if len(self.registered) + 1 > self._limits.max_cpu_loras:
                victims = [i for i in self.registered if i not in self.pinned]
                if not victims:
                    self._violate("all CPU cache entries pinned (engine dies)")
                    return
                self._violate(f"silently evicted registration {victims[0]}")
                del self.registered[victims[0]]
                self.active.pop(victims[0], None)
            self.registered[adapter.engine_id] = adapter
        else:
            self.registered.move_to_end(adapter.engine_id)
        self._activate(adapter.engine_id, batch)

    def _batch(self) -> set[int]:
        return set(self.running.values())

    def _step(self) -> None:
        """One engine step: every adapter of the batch must sit in a slot at once."""
        batch = self._batch()
        if len(batch | self.pinned) > self._limits.max_loras:
            self._violate(f"batch {sorted(batch)} + pinned {sorted(self.pinned)} > slots "
                          "(an adapter of the batch loses its slot: wrong output)")
        for engine_id in sorted(batch):
            adapter = self.registered.get(engine_id)
            if adapter is None:
                self._violate(f"adapter {engine_id} of the batch is not registered")
                continue
            self._activate(engine_id, batch)

    async def register(self, adapter: EngineAdapter) -> None:
        self.calls.append(("register", adapter.engine_id))
        self._add(adapter, self._batch())

    async def unregister(self, engine_id: int) -> None:
        self.calls.append(("unregister", engine_id))
        if engine_id in self._batch():
            self._violate(f"unregistered {engine_id} while a request uses it")
        self.registered.pop(engine_id, None)
        self.active.pop(engine_id, None)
        self.pinned.discard(engine_id)

    async def pin(self, engine_id: int) -> None:
        self.calls.append(("pin", engine_id))
        if engine_id not in self.registered:
            raise EngineFailure(f"Pinning failed. LoRA {engine_id} is not registered.")
        self._activate(engine_id, self._batch())
        self.pinned.add(engine_id)

    async def unpin(self, adapter: EngineAdapter) -> None:
        # vLLM: remove + add between two engine steps; a running request of the adapter
        # is re-added by the next step from its path, so this is not a violation.
        self.calls.append(("unpin", adapter.engine_id))
        self.pinned.discard(adapter.engine_id)
        self._add(adapter, self._batch())

    async def list(self) -> set[int]:
        return set(self.registered)

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        a = request.adapter
        if a.rank > self._limits.max_lora_rank:
            self._violate(f"rank {a.rank} reached generate (EngineDeadError)")
            return
        self.running[request.request_id] = a.engine_id
        try:
            for i in range(request.sampling.max_tokens):
                self._step()
                await asyncio.sleep(self.step_delay_s)
                if request.request_id in self._abort:
                    yield EngineChunk("", (), True, "abort", 3)
                    return
                last = i == request.sampling.max_tokens - 1
                token = a.engine_id % 1000
                yield EngineChunk(f"t{token} ", (token,), last, "length" if last else None, 3)
        finally:
            self.running.pop(request.request_id, None)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self._abort.add(request_id)

    def unfinished_requests(self) -> int:
        return len(self.running)

    async def close(self) -> None:
        pass


class DirStore:
    """Object store over ``root/<bucket>/<key>``; ``fail`` makes every read fail."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.fail = False
        self.downloads = 0

    def put_dir(self, bucket: str, prefix: str, src: Path) -> None:
        dest = self.root / bucket / prefix
        dest.mkdir(parents=True, exist_ok=True)
        for f in sorted(Path(src).iterdir()):
            shutil.copyfile(f, dest / f.name)

    def path(self, bucket: str, key: str) -> Path:
        return self.root / bucket / key

    def list(self, bucket: str, prefix: str) -> list[ObjectInfo]:
        if self.fail:
            raise Unavailable("store is down")
        base = self.root / bucket
        return [
            ObjectInfo(p.relative_to(base).as_posix(), p.stat().st_size)
            for p in sorted(base.rglob("*"))
            if p.is_file() and p.relative_to(base).as_posix().startswith(prefix)
        ]

    def stream(self, bucket: str, key: str) -> Iterator[bytes]:
        if self.fail:
            raise Unavailable("store is down")
        if not self.path(bucket, key).is_file():
            raise ObjectMissing(f"no object {key}")
        self.downloads += 1
        return iter([self.path(bucket, key).read_bytes()])


@dataclass
class Rig:
    """A manager over the engine double, with everything it uses."""

    model: VllmModel
    engine: SafeEngine
    host: HostTier
    manager: AdapterManager
    metrics: WorkerMetrics
    events: list[object]
