"""``loraplane.v1.CacheManager``: the read API (placement, workers, decisions).

Served by every instance; a standby has no state and answers UNAVAILABLE
(retriable) naming itself, so clients retry or ask the leader.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc

from loraplane.cache_manager.core import CacheCore
from loraplane.cache_manager.messages import decision_proto, placement_proto, worker_info
from loraplane.cache_manager.model import Ref, Tier
from loraplane.shared.errors import InvalidArgument, NotFound, Unavailable
from loraplane.shared.tls import GATEWAY, OPERATOR, allow
from loraplane.shared.vocab import tier_to_proto
from loraplane.v1 import cache_pb2, cache_pb2_grpc, events_pb2

AUTHZ_RULES = {
    # the gateway's placement bootstrap; operators (loraplane cache status)
    "/loraplane.v1.CacheManager/": allow(GATEWAY, OPERATOR),
}
"""Who may read the cache manager's API (mutual TLS on, ``shared.tls``)."""
DEFAULT_DECISIONS = 50
MAX_DECISIONS = 2000


class CacheManagerApi(cache_pb2_grpc.CacheManagerServicer):
    """Answers from the leader's live core."""

    def __init__(self, core: Callable[[], CacheCore | None], instance: str, *,
                 cores: Callable[[], list[CacheCore]] | None = None) -> None:
        """``core``: the core workers and placements are read from (None: standby);
        ``cores``: every core the process leads (one per shard), whose decisions
        ``ListDecisions`` merges (default: ``core`` alone)."""
        self._core = core
        self._cores = cores
        self.instance = instance

    def _live(self) -> CacheCore:
        core = self._core()
        if core is None:
            raise Unavailable(f"cache manager {self.instance} is a standby (not leading)",
                              retry_after_s=1.0)
        return core

    async def GetPlacement(
        self, request: cache_pb2.GetPlacementRequest, context: grpc.aio.ServicerContext
    ) -> cache_pb2.GetPlacementResponse:
        core = self._live()
        a = request.adapter
        if not a.base_model and not a.adapter_name:
            raise InvalidArgument("adapter.base_model or adapter.adapter_name is required")
        out = cache_pb2.GetPlacementResponse()
        workers = sorted(core.state.workers.values(), key=lambda w: w.worker_id)
        if not a.adapter_name:
            for w in workers:
                if w.alive and w.serves(a.base_model):
                    out.placements.append(cache_pb2.WorkerPlacement(
                        worker_id=w.worker_id, grpc_address=w.grpc_address,
                        placement=events_pb2.AdapterPlacement(adapter=a, tier=tier_to_proto(Tier.HOT)),
                    ))
            return out
        vid = Ref.of(a).version_id
        held = [w for w in workers if w.alive and vid in w.placements]
        held.sort(key=lambda w: (w.placements[vid].tier is not Tier.HOT, w.worker_id))
        for w in held:
            out.placements.append(cache_pb2.WorkerPlacement(
                worker_id=w.worker_id, grpc_address=w.grpc_address,
                placement=placement_proto(w, vid),
            ))
        return out

    async def ListWorkers(
        self, request: cache_pb2.ListWorkersRequest, context: grpc.aio.ServicerContext
    ) -> cache_pb2.ListWorkersResponse:
        core = self._live()
        out = cache_pb2.ListWorkersResponse()
        for wid in sorted(core.state.workers):
            w = core.state.workers[wid]
            if request.base_model and not w.serves(request.base_model):
                continue
            out.workers.append(worker_info(w))
        return out

    async def GetWorker(
        self, request: cache_pb2.GetWorkerRequest, context: grpc.aio.ServicerContext
    ) -> cache_pb2.GetWorkerResponse:
        core = self._live()
        w = core.state.workers.get(request.worker_id)
        if w is None:
            raise NotFound(f"unknown worker {request.worker_id!r}")
        return cache_pb2.GetWorkerResponse(worker=worker_info(w))

    async def ListDecisions(
        self, request: cache_pb2.ListDecisionsRequest, context: grpc.aio.ServicerContext
    ) -> cache_pb2.ListDecisionsResponse:
        core = self._live()
        if request.limit < 0:
            raise InvalidArgument("limit must be >= 0")
        if request.adapter_name and not request.tenant_id:
            raise InvalidArgument("adapter_name needs tenant_id")
        limit = min(request.limit or DEFAULT_DECISIONS, MAX_DECISIONS)
        cores = self._cores() if self._cores is not None else [core]
        entries = [e for c in (cores or [core]) for e in c.decisions.recent(
            limit, worker_id=request.worker_id, tenant_id=request.tenant_id,
            adapter_name=request.adapter_name,
        )]
        if len(cores) > 1:  # several shards: newest first across them (ids are per shard)
            entries = sorted(entries, key=lambda e: e.at, reverse=True)[:limit]
        return cache_pb2.ListDecisionsResponse(decisions=[decision_proto(e) for e in entries])
