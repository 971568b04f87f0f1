"""``python -m loraplane.gateway`` as the supervisor runs it: env ports, health,
/metrics, the HTTP API, and a clean exit on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from loraplane.shared.tls import GATEWAY
from loraplane.stack.stack import Stack
from tests.support.tls import (
    blocking_tenant_channel,
    blocking_tenant_http,
    edge_tls_env,
    tenant_url,
    tls_env,
)

from .conftest import free_port


def test_module_serves_health_metrics_http_and_stops_on_sigterm(stack: Stack) -> None:
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        **stack.settings.client_env(),
        "LORAPLANE_GATEWAY_GRPC_PORT": str(grpc_port),
        "LORAPLANE_GATEWAY_HTTP_PORT": str(http_port),
        "LORAPLANE_GATEWAY_METRICS_PORT": str(metrics_port),
        "LORAPLANE_REGISTRY_ADDR": f"127.0.0.1:{free_port()}",  # nobody there: retried
        "LORAPLANE_CACHE_MANAGER_GRPC_PORT": str(free_port()),
        **tls_env(stack, GATEWAY),  # its registry and cache-manager channels: mutual TLS
        **edge_tls_env(stack),  # its public ports: TLS with the dev CA's gateway certificate
    }
    proc = subprocess.Popen([sys.executable, "-m", "loraplane.gateway"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    public = tenant_url(stack, http_port)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            try:
                with blocking_tenant_http(stack, timeout=1) as http:
                    if http.get(f"{public}/healthz").status_code == 200:
                        break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "gateway did not come up"
            time.sleep(0.2)
        with blocking_tenant_channel(stack, f"127.0.0.1:{grpc_port}") as ch:
            resp = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service="loraplane.v1.Inference"), timeout=5)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                    timeout=5) as r:
            text = r.read().decode()
        assert "loraplane_gateway_requests_total" in text or "loraplane_gateway_refused" in text
        while True:  # ready: the key view replayed tenant.events (until then: 503, retry)
            try:
                with blocking_tenant_http(stack, timeout=1) as http:
                    if http.get(f"{public}/readyz").status_code == 200:
                        break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "gateway did not become ready"
            time.sleep(0.2)
        with blocking_tenant_http(stack, timeout=5) as http:
            refused = http.get(f"{public}/v1/models", headers={"authorization": "Bearer x"})
        assert refused.status_code == 401, "an unknown key must be refused"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        log = proc.stdout.read().decode() if proc.stdout else ""
        assert "event loop uvloop" in log, log  # the default: less CPU per request
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
