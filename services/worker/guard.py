"""Engine safety: a wrapper that makes vLLM's known failure modes unreachable.

:class:`SafeEngine` wraps any :class:`~loraplane.worker.engine.Engine` and enforces, before
the engine sees anything:

* **rank**: an adapter whose rank exceeds ``max_lora_rank`` is refused
  (:class:`~loraplane.worker.errors.RankTooLarge`) at registration and on the generate
  path (vLLM dies with ``EngineDeadError`` when such an adapter reaches ``generate``);
* **pins**: at most ``max_loras - 1`` adapters are pinned
  (:class:`~loraplane.worker.errors.PinLimit`): with every slot pinned, the next new
  adapter makes vLLM fail with "All items are pinned" and die;
* **slots**: the adapters with requests running in the engine, together with the pinned
  ones, never exceed ``max_loras`` (:class:`SlotGate`; a request waits for a slot). vLLM's
  scheduler counts distinct adapters per batch but ignores pinned slots, so without this
  a batch can need more slots than are unpinned;
* **registrations**: at most ``max_cpu_loras`` adapters are registered
  (:class:`~loraplane.worker.errors.NoCapacity`): beyond it vLLM silently evicts one;
* **no unregistered adapter on the generate path** and **no unregister while a request
  uses the adapter** (vLLM would then load it by itself from its path, bypassing all of
  the above);
* **no request without an adapter**: on the CPU a no-LoRA request batched with LoRA
  requests gets an adapter's output, so the base model is served through a registered
  all-zero adapter (:func:`loraplane.worker.app.write_zero_adapter`); ``EngineRequest.adapter`` is
  never ``None``.

HOT has two levels in vLLM: *registered* (``add_lora``: in the engine's host memory, at most
``max_cpu_loras``) and *slot-resident* (its weights copied into one of the ``max_loras`` GPU
slots a batch reads; the engine moves them itself). :class:`SlotResidency` follows the
second level as vLLM keeps it, so the worker can report both.
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator
from pathlib import Path

from loraplane.worker.engine import (
    Engine,
    EngineAdapter,
    EngineChunk,
    EngineLimits,
    EngineRequest,
)
from loraplane.worker.errors import (
    BadRequest,
    InUse,
    NoCapacity,
    NotPresent,
    PinLimit,
    RankTooLarge,
)

PIN_WAIT_S = 30.0
"""How long a pin waits for a free slot before it is refused."""


def check_rank(rank: int, limits: EngineLimits) -> None:
    """Raise :class:`RankTooLarge` (naming both numbers) if ``rank`` exceeds the engine's max."""
    if rank > limits.max_lora_rank:
        raise RankTooLarge(f"LoRA rank {rank} > max_lora_rank {limits.max_lora_rank} of the engine")
    if rank < 1:
        raise BadRequest(f"LoRA rank {rank} is not a positive integer")


def max_pins(limits: EngineLimits) -> int:
    """Most adapters that may be pinned at once: every slot but one."""
    return limits.max_loras - 1


class SlotGate:
    """Admission of adapters into the engine's ``max_loras`` slots.

    An adapter *occupies* a slot while it is pinned or has at least one request running.
    :meth:`enter` waits until the adapter already occupies a slot or a slot is free.
    Releasing (:meth:`leave`, :meth:`release_pin`) never awaits, so it is safe in
    ``finally`` blocks of cancelled tasks.
    """

    def __init__(self, slots: int) -> None:
        """``slots``: the engine's ``max_loras``."""
        self.slots = slots
        self._running: Counter[int] = Counter()
        self._pinned: set[int] = set()
        self._waiters: list[asyncio.Future[None]] = []

    def occupied(self) -> set[int]:
        """Adapters holding a slot now."""
        return set(self._running) | self._pinned

    def running(self, engine_id: int) -> int:
        """Requests of ``engine_id`` inside the engine."""
        return self._running.get(engine_id, 0)

    @property
    def pinned(self) -> frozenset[int]:
        """Pinned adapters."""
        return frozenset(self._pinned)

    def fits(self, engine_id: int) -> bool:
        """Whether ``engine_id`` holds a slot or one is free."""
        occupied = self.occupied()
        return engine_id in occupied or len(occupied) < self.slots

    async def _wait_until_fits(self, engine_id: int) -> None:
        loop = asyncio.get_running_loop()
        while not self.fits(engine_id):
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def enter(self, engine_id: int) -> None:
        """Wait for a slot for ``engine_id`` and count one running request on it."""
        await self._wait_until_fits(engine_id)
        self._running[engine_id] += 1

    def leave(self, engine_id: int) -> None:
        """Count one request of ``engine_id`` as finished."""
        self._running[engine_id] -= 1
        if self._running[engine_id] <= 0:
            del self._running[engine_id]
        self._wake()

    async def reserve_pin(self, engine_id: int, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) for a slot, then mark ``engine_id`` pinned."""
        try:
            await asyncio.wait_for(self._wait_until_fits(engine_id), timeout_s)
        except TimeoutError:
            raise NoCapacity(
                f"no engine slot for pinning adapter {engine_id} within {timeout_s:.0f}s"
            ) from None
        self._pinned.add(engine_id)

    def release_pin(self, engine_id: int) -> None:
        """Mark ``engine_id`` unpinned."""
        self._pinned.discard(engine_id)
        self._wake()


class SlotResidency:
    """Which registered adapters sit in the engine's ``max_loras`` slots, modelled on vLLM's
    ``LRUCacheLoRAModelManager._active_adapters`` (vllm/lora/model_manager.py): an LRU of
    ``max_loras`` entries whose pinned ones are never removed.

    vLLM *activates* an adapter (copies its weights into a free slot, first removing the
    least recently activated unpinned one when every slot is taken) when it is added
    (``add_lora`` → ``LRUCacheWorkerLoRAManager.add_adapter`` → ``activate_adapter``), for
    every adapter of each batch (``set_active_adapters``) and when it is pinned; removing an
    adapter frees its slot. The worker sees each of those moments but the per-step touches
    between a request's start and its end, which only reorder adapters that all stay
    resident meanwhile (:class:`SlotGate` keeps the running ones within the slots), so a
    request touches its adapter when it enters the engine and when it leaves.
    """

    def __init__(self, slots: int) -> None:
        """``slots``: the engine's ``max_loras``."""
        self.slots = slots
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._pinned: set[int] = set()
        self.activations = 0
        """Moves registered → slot so far (each one a copy of the adapter's weights)."""

    @property
    def resident(self) -> frozenset[int]:
        """Engine ids in a slot now."""
        return frozenset(self._lru)

    def touch(self, engine_id: int) -> bool:
        """``engine_id`` is used by the engine now; True when that moved it into a slot."""
        if engine_id in self._lru:
            self._lru.move_to_end(engine_id)
            return False
        if len(self._lru) >= self.slots:
            oldest = next((e for e in self._lru if e not in self._pinned), None)
            if oldest is not None:
                del self._lru[oldest]
        self._lru[engine_id] = None
        self.activations += 1
        return True

    def pin(self, engine_id: int) -> None:
        """vLLM's ``pin_lora``: activated if needed, then never removed from its slot."""
        self.touch(engine_id)
        self._pinned.add(engine_id)

    def unpin(self, engine_id: int) -> None:
        """The worker's unpin (vLLM has none: remove, then add again, which activates)."""
        self._pinned.discard(engine_id)
        self.remove(engine_id)
        self.touch(engine_id)

    def remove(self, engine_id: int) -> None:
        """Unregistered: its slot is free."""
        self._lru.pop(engine_id, None)
        self._pinned.discard(engine_id)


class SafeEngine:
    """An :class:`Engine` that refuses every operation known to kill or corrupt vLLM.

    The worker only talks to the engine through this class; it holds the authoritative
    view of what is registered and pinned.
    """

    def __init__(self, inner: Engine, *, pin_wait_s: float = PIN_WAIT_S) -> None:
        """Wrap ``inner`` (freshly started: nothing registered)."""
        self.inner = inner
        self.pin_wait_s = pin_wait_s
        self.gate = SlotGate(inner.limits.max_loras)
        self.slots = SlotResidency(inner.limits.max_loras)
        """The second HOT level: which registered adapters sit in GPU slots."""
        self._registered: dict[int, EngineAdapter] = {}
        self._lock = asyncio.Lock()
        self._pending_pins = 0

    # ------------------------------------------------------------------ properties

    @property
    def limits(self) -> EngineLimits:
        """Limits of the wrapped engine."""
        return self.inner.limits

    @property
    def base_model_dir(self) -> Path:
        """Base model of the wrapped engine."""
        return self.inner.base_model_dir

    @property
    def dead(self) -> bool:
        """Whether the wrapped engine died."""
        return self.inner.dead

    @property
    def registered(self) -> dict[int, EngineAdapter]:
        """Registered adapters by engine id (a copy)."""
        return dict(self._registered)

    @property
    def pinned(self) -> frozenset[int]:
        """Pinned engine ids."""
        return self.gate.pinned

    # ------------------------------------------------------------------ operations

    async def register(self, adapter: EngineAdapter) -> None:
        """Register ``adapter`` unless its rank or the registration count forbids it."""
        check_rank(adapter.rank, self.limits)
        if adapter.engine_id < 1:
            raise BadRequest(f"engine id {adapter.engine_id} must be > 0")
        async with self._lock:
            known = self._registered.get(adapter.engine_id)
            if known is not None:
                if known.path != adapter.path or known.name != adapter.name:
                    raise BadRequest(
                        f"engine id {adapter.engine_id} is already registered as {known.name}"
                    )
                return
            if len(self._registered) >= self.limits.max_cpu_loras:
                raise NoCapacity(
                    f"{len(self._registered)} adapters registered = max_cpu_loras "
                    f"{self.limits.max_cpu_loras}; evict one first"
                )
            await self.inner.register(adapter)
            self._registered[adapter.engine_id] = adapter
            self.slots.touch(adapter.engine_id)

    async def unregister(self, engine_id: int) -> None:
        """Unregister ``engine_id``; refused while a request runs on it."""
        async with self._lock:
            if engine_id not in self._registered:
                return
            if self.gate.running(engine_id):
                raise InUse(f"adapter {engine_id} has {self.gate.running(engine_id)} requests")
            await self.inner.unregister(engine_id)
            del self._registered[engine_id]
            self.gate.release_pin(engine_id)
            self.slots.remove(engine_id)

    async def pin(self, engine_id: int) -> None:
        """Pin a registered adapter, keeping at least one slot unpinned.

        Waits (at most ``pin_wait_s``) for a free slot when every slot is busy.
        """
        async with self._lock:
            if engine_id not in self._registered:
                raise NotPresent(f"adapter {engine_id} is not registered in the engine")
            pinned = self.gate.pinned
            if engine_id in pinned:
                return
            if len(pinned) + self._pending_pins >= max_pins(self.limits):
                raise PinLimit(
                    f"{len(pinned) + self._pending_pins} of {self.limits.max_loras} engine "
                    f"slots are pinned; pinning adapter {engine_id} would leave no unpinned slot"
                )
            self._pending_pins += 1
        try:
            await self.gate.reserve_pin(engine_id, self.pin_wait_s)
        finally:
            self._pending_pins -= 1
        try:
            async with self._lock:
                if engine_id not in self._registered:
                    raise NotPresent(f"adapter {engine_id} was unregistered while pinning")
                await self.inner.pin(engine_id)
                self.slots.pin(engine_id)
        except BaseException:
            self.gate.release_pin(engine_id)
            raise

    async def unpin(self, adapter: EngineAdapter) -> None:
        """Release the pin of ``adapter`` (no-op if it is not pinned).

        Allowed while requests run on it: vLLM has no unpin, so the engine removes and
        re-adds the adapter; both happen between two engine steps and a running request's
        adapter is re-added by the next step, so no output changes.
        """
        async with self._lock:
            if adapter.engine_id not in self.gate.pinned:
                return
            await self.inner.unpin(self._registered.get(adapter.engine_id, adapter))
            self.gate.release_pin(adapter.engine_id)
            self.slots.unpin(adapter.engine_id)

    async def list(self) -> set[int]:
        """What the wrapped engine reports as registered."""
        return await self.inner.list()

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        """Stream ``request`` once its (registered) adapter has a slot."""
        adapter = request.adapter
        check_rank(adapter.rank, self.limits)
        if adapter.engine_id not in self._registered:
            raise NotPresent(f"adapter {adapter.engine_id} is not registered in the engine")
        await self.gate.enter(adapter.engine_id)
        try:
            if adapter.engine_id not in self._registered:  # unregistered while we waited
                raise NotPresent(f"adapter {adapter.engine_id} was unregistered")
            self.slots.touch(adapter.engine_id)
            async for chunk in self.inner.generate(request):
                yield chunk
        finally:
            if adapter.engine_id in self._registered:
                self.slots.touch(adapter.engine_id)
            self.gate.leave(adapter.engine_id)

    async def abort(self, request_id: str) -> None:
        """Abort a running request."""
        await self.inner.abort(request_id)

    def unfinished_requests(self) -> int:
        """Requests still running in the wrapped engine."""
        return self.inner.unfinished_requests()

    async def close(self) -> None:
        """Close the wrapped engine."""
        await self.inner.close()
