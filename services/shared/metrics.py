"""Prometheus metrics shared by every service (prometheus-client).

* :func:`start_metrics_server` serves ``/metrics`` on the service's metrics port
  (``LORAPLANE_<SERVICE>_METRICS_PORT``); the port table lives in
  :mod:`loraplane.stack.services`, which Prometheus scrapes.
* :class:`RpcMetrics`: per-RPC request counter and latency histogram, recorded by
  the interceptor of :mod:`loraplane.shared.grpcutil`.

Metric families are created once per :class:`~prometheus_client.CollectorRegistry`
(:meth:`for_registry`), so several servers in one process (tests) share them
instead of failing on duplicate registration. Names are prefixed ``loraplane_``.
"""

from __future__ import annotations

import threading
from typing import ClassVar, Self

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server

LATENCY_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)
"""Latency buckets (seconds) for RPCs and in-process operations: 0.5 ms .. 10 s."""


def start_metrics_server(
    port: int, *, addr: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY
) -> int:
    """Serve ``/metrics`` of ``registry`` on ``addr:port`` in a daemon thread.

    ``port == 0`` disables the server (returns 0); otherwise returns the port.
    """
    if port == 0:
        return 0
    start_http_server(port, addr=addr, registry=registry)
    return port


class PerRegistry:
    """Mixin: one instance per collector registry (``for_registry``)."""

    _instances: ClassVar[dict[int, tuple[CollectorRegistry, object]]]
    _lock: ClassVar[threading.Lock]

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        cls._instances = {}
        cls._lock = threading.Lock()

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    @classmethod
    def for_registry(cls, registry: CollectorRegistry = REGISTRY) -> Self:
        """The metric set of this class registered in ``registry`` (created on first use)."""
        with cls._lock:
            # Keyed by id(); the registry is kept alive with its entry so that an id is
            # never reused by a later registry while the entry exists.
            entry = cls._instances.get(id(registry))
            if entry is None or entry[0] is not registry:
                entry = (registry, cls(registry))
                cls._instances[id(registry)] = entry
            inst = entry[1]
            assert isinstance(inst, cls)
            return inst


class RpcMetrics(PerRegistry):
    """``loraplane_rpc_requests_total`` and ``loraplane_rpc_duration_seconds``.

    Labels: ``service`` (gRPC service, e.g. ``loraplane.v1.RegistryAdmin``),
    ``method`` (e.g. ``RegisterVersion``) and, for the counter, ``code``
    (gRPC status name, e.g. ``OK``, ``NOT_FOUND``).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.requests = Counter(
            "loraplane_rpc_requests",
            "gRPC requests handled, by final status code.",
            ["service", "method", "code"],
            registry=registry,
        )
        self.duration = Histogram(
            "loraplane_rpc_duration_seconds",
            "Server-side gRPC handling time.",
            ["service", "method"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )

    def observe(self, full_method: str, code: str, seconds: float) -> None:
        """Record one finished call of ``/package.Service/Method``."""
        service, method = split_method(full_method)
        self.requests.labels(service, method, code).inc()
        self.duration.labels(service, method).observe(seconds)


def split_method(full_method: str) -> tuple[str, str]:
    """``"/loraplane.v1.RegistryAdmin/GetTenant"`` → ``("loraplane.v1.RegistryAdmin", "GetTenant")``."""
    parts = full_method.strip("/").split("/", 1)
    if len(parts) != 2:
        return full_method, ""
    return parts[0], parts[1]


_PerRegistry = PerRegistry  # earlier name, kept for existing imports
