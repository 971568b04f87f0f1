"""Prometheus metrics shared by every service (prometheus-client).

* :func:`start_metrics_server` serves ``/metrics`` on the service's metrics port
  (``LORAPLANE_<SERVICE>_METRICS_PORT``); the port table lives in
  :mod:`loraplane.stack.services`, which Prometheus scrapes.
* :class:`RpcMetrics`: per-RPC request counter and latency histogram, recorded by
  the interceptor of :mod:`loraplane.shared.grpcutil`.
* :class:`SeriesSweeper`: removes the label children of versions that are gone
  (retired, or no longer on a worker) ``grace_s`` after they went, so that version-labelled
  families hold the live versions, not every version ever seen (``infra/METRICS.md``).

Metric families are created once per :class:`~prometheus_client.CollectorRegistry`
(:meth:`for_registry`), so several servers in one process (tests) share them
instead of failing on duplicate registration. Names are prefixed ``loraplane_``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, ClassVar, Self

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

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


SERIES_GRACE_S = 60.0
"""How long the series of a gone version stay after it went: scrapers (up to 30 s apart,
two Prometheus replicas) read their last values, and requests still in flight when it went
are counted, before they are removed."""


class SeriesSweeper(Collector):
    """Removes the children of version-labelled families whose version is gone.

    ``key_labels`` name a version in ``families`` (each family has them all); ``live(keys)``
    returns those of the versions ``keys`` (their values, in that order) still live, and
    ``busy`` (optional) is a gauge with the same key labels whose children above 0 count as
    live too (requests in flight). A key seen not live is marked; once it has been not
    live for ``grace_s`` on the injected ``clock``, every child of it is removed from every
    family (``remove_by_labels``), and ``on_removed(key)`` is called. A key live again
    before that is unmarked.

    Registered in the registry *after* the families (it yields no metric), a sweep runs at
    every scrape once the families were read, so the last values were exported; call
    :meth:`sweep` directly where nothing scrapes. ``live`` returning None means "not known
    yet" (the process has no view to judge by): nothing is marked.
    """

    def __init__(
        self,
        families: Sequence[MetricWrapperBase],
        key_labels: Sequence[str],
        live: Callable[[set[tuple[str, ...]]], set[tuple[str, ...]] | None],
        *,
        busy: MetricWrapperBase | None = None,
        grace_s: float = SERIES_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
        on_removed: Callable[[tuple[str, ...]], None] | None = None,
    ) -> None:
        self.families = list(families)
        self.key_labels = tuple(key_labels)
        self.live = live
        self.busy = busy
        self.grace_s = grace_s
        self.clock = clock
        self.on_removed = on_removed
        self.removed = 0
        """Versions whose series were removed since the process started."""
        self._gone_since: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        self.sweep()
        return iter(())

    def _children(self, family: MetricWrapperBase) -> Iterable[tuple[tuple[str, ...], Any]]:
        """(key, child) of every child of ``family``. prometheus-client lists children
        only through ``collect()`` (every sample of every bucket, as costly as a scrape),
        so this reads its child table, ``_metrics`` keyed by label values in
        ``_labelnames`` order (stable since 0.4; pinned in pyproject.toml)."""
        names = list(family._labelnames)
        at = [names.index(k) for k in self.key_labels]
        with family._lock:
            table = list(family._metrics.items())
        for values, child in table:
            yield tuple(values[i] for i in at), child

    def sweep(self) -> list[tuple[str, ...]]:
        """Mark the keys that are not live, remove those not live for ``grace_s``;
        returns the keys removed."""
        with self._lock:
            now = self.clock()
            keys: set[tuple[str, ...]] = set()
            for family in self.families:
                keys.update(k for k, _ in self._children(family))
            busy = ({k for k, child in self._children(self.busy) if child._value.get() > 0}
                    if self.busy is not None else set())
            live = self.live(keys - busy)
            gone = set() if live is None else keys - busy - live
            for key in [k for k in self._gone_since if k not in gone]:
                del self._gone_since[key]
            removed: list[tuple[str, ...]] = []
            for key in gone:
                since = self._gone_since.setdefault(key, now)
                if now - since < self.grace_s:
                    continue
                labels = dict(zip(self.key_labels, key, strict=True))
                for family in self.families:
                    family.remove_by_labels(labels)
                del self._gone_since[key]
                removed.append(key)
            self.removed += len(removed)
        for key in removed:
            if self.on_removed is not None:
                self.on_removed(key)
        return removed


def families_with(owner: object, labels: Sequence[str]) -> list[MetricWrapperBase]:
    """The metric families among ``owner``'s attributes labelled with all of ``labels``."""
    want = set(labels)
    return [v for v in vars(owner).values()
            if isinstance(v, MetricWrapperBase)
            and want <= set(getattr(v, "_labelnames", ()))]


_PerRegistry = PerRegistry  # earlier name, kept for existing imports
