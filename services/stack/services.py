"""The table of loraplane services: module to run and pinned ports per profile.

One table feeds the ``make run`` supervisor (what to start and with which
environment), Prometheus (what to scrape) and the docker-compose test (which
ports and variables each service uses).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field

from loraplane.stack.settings import StackSettings


@dataclass(frozen=True)
class ServiceSpec:
    """One service process."""

    name: str
    """Service name (also the Prometheus job and compose service name)."""
    module: str
    """Python module run with ``python -m``; a service exists once this module does."""
    port_offsets: dict[str, int] = field(default_factory=dict)
    """Env var suffix (e.g. ``GRPC_PORT``) -> offset from the stack's port base."""
    metrics_offset: int = 0
    start_timeout_s: float = 60.0
    """How long the supervisor waits for ``/metrics`` (the worker starts an engine first)."""
    replicated: bool = False
    """Whether ``make run`` starts several of it: ``StackSettings.<replicas_setting>``
    (replica ``i`` > 0 on ports shifted by ``REPLICA_PORT_STRIDE * i``, with its own id and
    state), except its ``shared_ports``."""
    replicas_setting: str = "workers"
    """The ``StackSettings`` field that says how many replicas."""
    shared_ports: tuple[str, ...] = ()
    """Ports every replica binds alike (``SO_REUSEPORT``: the gateway's public gRPC and
    HTTP ports); every other port, ``/metrics`` included, is the replica's own."""

    def env_prefix(self) -> str:
        return f"LORAPLANE_{self.name.upper().replace('-', '_')}_"

    def ports(self, s: StackSettings, replica: int = 0) -> dict[str, int]:
        assert s.port_base is not None
        shift = REPLICA_PORT_STRIDE * replica
        out = {k: s.port_base + v + (0 if k in self.shared_ports else shift)
               for k, v in self.port_offsets.items()}
        out["METRICS_PORT"] = s.port_base + self.metrics_offset + shift
        return out

    def env(self, s: StackSettings, replica: int = 0) -> dict[str, str]:
        return {self.env_prefix() + k: str(v) for k, v in self.ports(s, replica).items()}

    def replicas(self, s: StackSettings) -> int:
        """How many processes of this service the stack runs."""
        return int(getattr(s, self.replicas_setting)) if self.replicated else 1

    def instance(self, replica: int) -> str:
        """Process name of one replica: ``worker``, ``worker-1``, ..."""
        return self.name if replica == 0 else f"{self.name}-{replica}"

    def all_ports(self, s: StackSettings) -> list[int]:
        """Every port of every replica (a shared one once)."""
        return list(dict.fromkeys(
            p for i in range(self.replicas(s)) for p in self.ports(s, i).values()))

    def exists(self) -> bool:
        try:
            return importlib.util.find_spec(self.module) is not None
        except ModuleNotFoundError:
            return False


REPLICA_PORT_STRIDE = 20
"""Port shift between replicas of a service (offsets 51–65 + 20 · i stay clear of the
stack's own 1–18; the worker and the gateway are replicated, so the worker's 54 / 64 + 20 · i
and the gateway's own metrics port 65 + 20 · i must miss every other service's offset: 51,
53, 55–57, 61–63, 65; the gateway's public 55 / 56 are shared by its replicas)."""

SERVICES: tuple[ServiceSpec, ...] = (
    ServiceSpec("registry", "loraplane.registry.__main__", {"GRPC_PORT": 51}, 61),
    ServiceSpec("admission", "loraplane.admission.__main__", {}, 62),
    # PAGE_PORT: the placement page (/placement, operator token), on in every stack.
    ServiceSpec("cache-manager", "loraplane.cache_manager.__main__",
                {"GRPC_PORT": 53, "PAGE_PORT": 57}, 63),
    ServiceSpec("worker", "loraplane.worker.__main__", {"GRPC_PORT": 54}, 64, 300.0, True),
    # StackSettings.gateways processes serve the public ports together (SO_REUSEPORT)
    ServiceSpec("gateway", "loraplane.gateway.__main__", {"GRPC_PORT": 55, "HTTP_PORT": 56}, 65,
                replicated=True, replicas_setting="gateways",
                shared_ports=("GRPC_PORT", "HTTP_PORT")),
)


def existing_services() -> list[ServiceSpec]:
    """Services whose entry module exists in this checkout."""
    return [svc for svc in SERVICES if svc.exists()]


def scrape_targets(s: StackSettings) -> dict[str, list[int]]:
    """Prometheus job -> metrics ports for every existing service."""
    return {
        svc.name: [svc.ports(s, i)["METRICS_PORT"] for i in range(svc.replicas(s))]
        for svc in existing_services()
    }
