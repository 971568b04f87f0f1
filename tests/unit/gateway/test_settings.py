"""Gateway settings read the supervisor's environment (shared and gateway names)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loraplane.gateway.budget import ColdPolicy
from loraplane.gateway.settings import GatewaySettings


def test_environment_names(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("interactive: {budget_ms: 100, on_cold: fail_fast}\n")
    for k, v in {
        "LORAPLANE_KAFKA_BOOTSTRAP": "127.0.0.1:29002",
        "LORAPLANE_GATEWAY_GRPC_PORT": "29055",
        "LORAPLANE_GATEWAY_HTTP_PORT": "29056",
        "LORAPLANE_GATEWAY_METRICS_PORT": "29065",
        "LORAPLANE_REGISTRY_ADDR": "127.0.0.1:29051",
        "LORAPLANE_REGISTRY_OPERATOR_TOKEN": "tok",
        "LORAPLANE_CACHE_MANAGER_GRPC_PORT": "29053",
        "LORAPLANE_GATEWAY_BUDGETS_FILE": str(budgets),
        "LORAPLANE_GATEWAY_SHARES": '{"globex": ["acme/support"]}',
    }.items():
        monkeypatch.setenv(k, v)
    s = GatewaySettings()
    assert s.kafka_bootstrap == "127.0.0.1:29002"
    assert (s.grpc_port, s.http_port, s.metrics_port) == (29055, 29056, 29065)
    assert (s.registry_addr, s.registry_token) == ("127.0.0.1:29051", "tok")
    assert s.cache_manager_addr == "127.0.0.1:29053"
    assert s.budgets.interactive.on_cold is ColdPolicy.FAIL_FAST
    assert s.shares == {"globex": ["acme/support"]}
    assert s.producer_id == "gateway/gateway-0"


def test_gateway_specific_kafka_name_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LORAPLANE_KAFKA_BOOTSTRAP", "a:1")
    monkeypatch.setenv("LORAPLANE_GATEWAY_KAFKA_BOOTSTRAP", "b:2")
    assert GatewaySettings().kafka_bootstrap == "b:2"
    assert GatewaySettings(kafka_bootstrap="c:3").kafka_bootstrap == "c:3"
