"""1,000 versions churned through one gateway and one worker: the live series stay within
infra/METRICS.md's bound (issue 17, item 5).

A gateway (views fed by the test stack's Kafka) and a worker (the worker service, its
WARM tier on the test stack's S3, commands from Kafka, ``cache.state`` to Kafka) run in
this loop; the worker's engine is the null engine, because what is counted here is the
services' metric series, not tokens. The registry's and admission's events are published
by the test (as in ``tests/integration/gateway``): 20 adapters, 50 versions each. In
each round every adapter gets a new version (admitted, promoted), a background request
through the gateway loads it COLD on the worker and is served, then the previous version
of each adapter is retired (``adapter.lifecycle``) and evicted to COLD by a cache command
(``cache.commands``), without waiting for either (the next rounds overlap; a version
leaves the live set when it is seen retired by the gateway and gone from the worker).
After each round ``/metrics`` of both (``generate_latest``, what the
HTTP handler serves; the sweeper runs there) is read and its version-labelled children
counted against the bound: the live versions plus those gone within the sweeper's grace
and two scrape intervals (shortened to ``GRACE_S`` here, 60 s by default). After the churn
and one grace, exactly the live versions' series are left.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from loraplane.devkit.builder import AdapterArtifact, build_demo
from loraplane.gateway.app import GatewayApp
from loraplane.gateway.auth import key_hash
from loraplane.gateway.emit import KafkaPublisher
from loraplane.gateway.settings import GatewaySettings
from loraplane.shared import topics
from loraplane.shared.tls import GATEWAY
from loraplane.shared.topics import new_meta
from loraplane.stack.stack import Stack
from loraplane.v1 import common_pb2, events_pb2, inference_pb2, inference_pb2_grpc
from loraplane.worker.app import WorkerApp
from loraplane.worker.null_engine import NullEngine
from tests.support.tls import edge_tls_settings, tenant_channel, tls_settings

sys.path.insert(0, str(Path(__file__).parents[1] / "worker"))
sys.path.insert(0, str(Path(__file__).parent))
from support import eventually, free_port, worker_settings
from worker_support import BUCKET, upload

VERSIONS = 1_000
ADAPTERS = 20
"""Adapters; each has one live (stable) version at a time."""
GRACE_S = 1.0
"""The sweeper's grace in this test (60 s in production)."""
CLASSES = 3  # METRICS.md: C

GATEWAY_BOUND = {  # children per version (infra/METRICS.md): C, C × O, C × 4 ...
    "loraplane_gateway_requests": CLASSES * 19, "loraplane_gateway_ttft_seconds": CLASSES,
    "loraplane_gateway_request_seconds": CLASSES, "loraplane_gateway_routed": CLASSES * 4,
    "loraplane_gateway_degraded": CLASSES, "loraplane_gateway_budget_exceeded": CLASSES,
}
WORKER_BOUND = {
    "loraplane_worker_adapter_loads": 3, "loraplane_worker_adapter_load_seconds": 3,
    "loraplane_worker_adapter_load_bytes": 1, "loraplane_worker_adapter_load_failures": 19,
    "loraplane_worker_adapter_evictions": 3, "loraplane_worker_requests": 4 * 17,
    "loraplane_worker_requests_in_flight": 1, "loraplane_worker_ttft_seconds": 4,
    "loraplane_worker_tokens": 2,
}


@dataclass
class Scrape:
    """One read of ``/metrics``: children per family, versions per family, samples."""

    at: float
    children: dict[str, int]
    versions: set[str]
    samples: int


def scrape(registry: CollectorRegistry, families: dict[str, int]) -> Scrape:
    text = generate_latest(registry).decode()
    children: dict[str, int] = {}
    versions: set[str] = set()
    samples = 0
    for fam in text_string_to_metric_families(text):
        if fam.name not in families:
            continue
        combos = {tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                  for s in fam.samples if not s.name.endswith("_created")}
        children[fam.name] = len(combos)
        versions.update(s.labels["version"] for s in fam.samples)
        samples += sum(1 for s in fam.samples)
    return Scrape(time.monotonic(), children, versions, samples)


@dataclass
class Ledger:
    """When each version stopped being live (the test's own record of the churn), and the
    scrapes of one service checked against the bound."""

    live: set[str] = field(default_factory=set)
    gone_at: dict[str, float] = field(default_factory=dict)
    scrapes: dict[str, list[Scrape]] = field(default_factory=dict)
    worst: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per service: (versions exported, versions the bound allowed) at its fullest scrape."""

    def check(self, service: str, s: Scrape, bound: dict[str, int]) -> None:
        """The bound: the versions exported are live, or gone within the grace and two
        scrape intervals; every family has at most its per-version children for each."""
        seen = self.scrapes.setdefault(service, [])
        gap = max([b.at - a.at for a, b in itertools.pairwise(seen)]
                  + ([s.at - seen[-1].at] if seen else [0.0]))
        allowed = self.live | {v for v, t in self.gone_at.items()
                               if t >= s.at - GRACE_S - 2 * gap}
        assert s.versions <= allowed, (service, sorted(s.versions - allowed)[:10])
        for name, per_version in bound.items():
            assert s.children.get(name, 0) <= per_version * len(allowed), (service, name, s)
        if len(s.versions) > self.worst.get(service, (0, 0))[0]:
            self.worst[service] = (len(s.versions), len(allowed))
        seen.append(s)


@pytest.fixture
async def platform(stack: Stack, unique: str, tmp_path: Path
                   ) -> AsyncIterator[tuple[GatewayApp, WorkerApp, KafkaPublisher]]:
    demo = build_demo()
    w_settings = worker_settings(stack, demo, tmp_path, f"series-{unique}",
                                 worker_max_loras=ADAPTERS, worker_max_cpu_loras=ADAPTERS + 1,
                                 worker_state_interval_s=0.5)
    worker = WorkerApp(w_settings, NullEngine(w_settings.limits, demo.base_model.dir),
                       registry=CollectorRegistry())
    await worker.start()
    gateway = GatewayApp(GatewaySettings(
        kafka_bootstrap=stack.settings.kafka_bootstrap, grpc_port=free_port(),
        http_port=free_port(), metrics_port=0, bootstrap=False, heat_flush_interval_s=0.5,
        instance_id=f"series-{unique}", default_base_model=demo.base_model.name,
        cache_manager_addr=f"127.0.0.1:{free_port()}", **tls_settings(stack, GATEWAY),
        **edge_tls_settings(stack),
    ), registry=CollectorRegistry(), serve_metrics=False)
    await gateway.start()
    pub = KafkaPublisher(stack.settings.kafka(), client_id=f"series-{unique}")
    await pub.start()
    try:
        await gateway.wait_ready(60)
        yield gateway, worker, pub
    finally:
        await pub.stop()
        await gateway.stop(1)
        await worker.stop(1)


def ref(tenant: str, name: str, version: str, base: str) -> common_pb2.AdapterRef:
    return common_pb2.AdapterRef(tenant_id=tenant, adapter_name=name, version=version,
                                 base_model=base)


@pytest.mark.timeout(1200)  # a hang guard: 1,000 real cold loads (fetch + signature check
# each) took 5-7 min on the shared 2-core machine; no speed is asserted here
async def test_live_series_stay_within_the_bound_while_1000_versions_churn(
    stack: Stack, unique: str,
    platform: tuple[GatewayApp, WorkerApp, KafkaPublisher],
) -> None:
    gateway, worker, pub = platform
    gateway.metrics.sweeper.grace_s = GRACE_S
    worker.metrics.sweeper.grace_s = GRACE_S
    demo = build_demo()
    art: AdapterArtifact = demo.adapters[0]
    base = art.base_model
    tenant = f"series-{unique}"
    s3 = stack.settings.s3_client()
    prefix = f"adapters/{tenant}/churn/{uuid.uuid4().hex[:8]}/"
    upload(s3, prefix, art.dir)  # every version is these files (the worker checks them)
    uri = f"s3://{BUCKET}/{prefix}"
    first_id = random.randint(100_000, 1_000_000_000)
    secret = f"lp_{unique}_series"
    await pub.publish(topics.TENANT_EVENTS, events_pb2.TenantEvent(
        meta=new_meta("registry/itest"),
        api_key_created=events_pb2.ApiKeyCreated(tenant_id=tenant, key_id=f"k-{unique}",
                                                 prefix="k-", key_hash=key_hash(secret))))
    auth = (("authorization", f"Bearer {secret}"),)
    ledger = Ledger()
    command_ids = 0

    async def serve(stub: inference_pb2_grpc.InferenceStub, name: str, version: str) -> None:
        """A background request on ``name`` until it is answered by ``version``."""
        req = inference_pb2.GenerateRequest(
            adapter=name, prompt="hi", max_tokens=2,
            request_class=common_pb2.REQUEST_CLASS_BACKGROUND)
        deadline = time.monotonic() + 60
        while True:
            try:
                msgs = [m async for m in stub.Generate(req, metadata=auth, timeout=30)]
                if msgs and msgs[0].resolved.adapter.version == version:
                    return
                last = msgs[0].resolved if msgs else None
            except grpc.aio.AioRpcError as err:  # views not caught up yet: retried
                last = err
            assert time.monotonic() < deadline, (name, version, last)
            await asyncio.sleep(0.05)

    leaving: dict[int, tuple[str, str]] = {}
    """Retired and sent an eviction, not seen gone from both yet: engine id → name, version."""

    def observe_gone() -> dict[int, tuple[str, str]]:
        """Versions seen retired by the gateway and gone from the worker leave the live set
        (at the time seen: no earlier than they went, so the bound is never tighter than
        the truth); returns those still leaving."""
        now = time.monotonic()
        for engine_id, (name, version) in list(leaving.items()):
            info = gateway.gateway.catalog.version(tenant, name, version)
            if engine_id in worker.manager.placements or info is None or not info.retired:
                continue
            del leaving[engine_id]
            ledger.live.discard(version)
            ledger.gone_at[version] = now
        return leaving

    async with tenant_channel(stack, f"127.0.0.1:{gateway.grpc_port}") as ch:
        stub = inference_pb2_grpc.InferenceStub(ch)
        previous: dict[str, tuple[str, int]] = {}
        for round_ in range(VERSIONS // ADAPTERS):
            current: dict[str, tuple[str, int]] = {}
            for a in range(ADAPTERS):
                i = round_ * ADAPTERS + a
                name, version, engine_id = f"a{a}", f"v{i}", first_id + i
                r = ref(tenant, name, version, base)
                await pub.publish(topics.ADAPTER_ADMISSIONS, events_pb2.AdmissionEvent(
                    admitted=events_pb2.AdapterAdmitted(
                        meta=new_meta("admission/itest", r), engine_id=engine_id,
                        sha256=art.manifest_digest, rank=art.rank, size_bytes=art.size_bytes,
                        artifact_uri=uri)))
                await pub.publish(topics.ADAPTER_LIFECYCLE, events_pb2.LifecycleEvent(
                    promoted=events_pb2.AdapterPromoted(meta=new_meta("registry/itest", r),
                                                        engine_id=engine_id)))
                current[name] = (version, engine_id)
            await asyncio.gather(*(serve(stub, n, v) for n, (v, _) in current.items()))
            ledger.live |= {v for v, _ in current.values()}
            for name, (version, engine_id) in previous.items():
                r = ref(tenant, name, version, base)
                await pub.publish(topics.ADAPTER_LIFECYCLE, events_pb2.LifecycleEvent(
                    retired=events_pb2.AdapterRetired(meta=new_meta("registry/itest", r),
                                                      engine_id=engine_id)))
                command_ids += 1
                await pub.publish(topics.CACHE_COMMANDS, events_pb2.CacheCommand(
                    meta=new_meta("cache-manager/itest", r), worker_id=worker.settings.worker_id,
                    command_id=f"{unique}-{command_ids}",
                    evict=events_pb2.EvictAdapter(to_tier=common_pb2.TIER_COLD,
                                                  reason="retired", engine_id=engine_id)))
            for name, (version, engine_id) in previous.items():
                leaving[engine_id] = (name, version)
            observe_gone()  # what already went: no wait for it, the next rounds overlap
            previous = current
            ledger.check("gateway", scrape(gateway.metrics.registry, GATEWAY_BOUND),
                         GATEWAY_BOUND)
            ledger.check("worker", scrape(worker.metrics.registry, WORKER_BOUND), WORKER_BOUND)
        await eventually(lambda: not observe_gone(), timeout_s=60)

        # one grace later (and the scrape that exports the last values), only the live ones
        final: dict[str, Scrape] = {}
        both = (("gateway", gateway.metrics.registry, GATEWAY_BOUND),
                ("worker", worker.metrics.registry, WORKER_BOUND))
        for _, registry, bound in both:
            scrape(registry, bound)  # marks the last ones gone
        await asyncio.sleep(GRACE_S + 0.1)
        for label, registry, bound in both:
            scrape(registry, bound)  # exports their last values, then removes them
            final[label] = scrape(registry, bound)
    live = {v for v, _ in previous.values()}
    assert final["gateway"].versions == live, final["gateway"]
    assert final["worker"].versions == live, final["worker"]
    for name in ("loraplane_gateway_ttft_seconds", "loraplane_gateway_request_seconds",
                 "loraplane_gateway_degraded", "loraplane_gateway_budget_exceeded"):
        assert final["gateway"].children[name] == ADAPTERS, (name, final["gateway"])
    for name, per_version in GATEWAY_BOUND.items():
        assert ADAPTERS <= final["gateway"].children[name] <= per_version * ADAPTERS, name
    for name in ("loraplane_worker_adapter_load_bytes", "loraplane_worker_requests_in_flight"):
        assert final["worker"].children[name] == ADAPTERS, (name, final["worker"])
    assert gateway.metrics.sweeper.removed == VERSIONS - ADAPTERS
    assert worker.metrics.sweeper.removed == VERSIONS - ADAPTERS
    g, w = final["gateway"], final["worker"]
    print(f"\nseries bound, {VERSIONS} versions churned through one gateway and one worker:"
          f"\n  fullest scrape during the churn: gateway {ledger.worst['gateway'][0]} versions"
          f" exported / {ledger.worst['gateway'][1]} allowed by the bound, worker "
          f"{ledger.worst['worker'][0]} / {ledger.worst['worker'][1]}"
          f"\n  after the churn: gateway {sum(g.children.values())} children "
          f"({g.samples} samples) of {len(g.versions)} versions, bound "
          f"{sum(GATEWAY_BOUND.values()) * ADAPTERS} children (Vg = {ADAPTERS}); worker "
          f"{sum(w.children.values())} children ({w.samples} samples) of {len(w.versions)}"
          f" versions, bound {sum(WORKER_BOUND.values()) * ADAPTERS} (Vw = {ADAPTERS});"
          f" without removal: {VERSIONS} versions each")
