"""Registry metrics (prefix ``loraplane_registry_``), labelled by tenant and base model.

The outbox lag (rows waiting, oldest age) is exported by the relay
(:class:`loraplane.shared.outbox.OutboxMetrics`) with the same labels.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from loraplane.shared.metrics import PerRegistry


class RegistryMetrics(PerRegistry):
    """Counters of registrations, state changes and admission verdicts."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.registrations = Counter(
            "loraplane_registry_registrations",
            "Adapter versions registered (idempotent repeats not counted).",
            ["tenant", "base_model"], registry=registry,
        )
        self.state_changes = Counter(
            "loraplane_registry_state_changes",
            "State changes by action (version.admit, release.promote, tenant.create, ...).",
            ["action", "tenant", "base_model"], registry=registry,
        )
        self.verdicts = Counter(
            "loraplane_registry_admission_verdicts",
            "Admission verdicts consumed, by outcome (applied, duplicate, not_pending, ...).",
            ["outcome"], registry=registry,
        )
        self.consumer_restarts = Counter(
            "loraplane_registry_consumer_restarts",
            "Admission consumers recreated (broker loss, errors).",
            registry=registry,
        )
