"""``make run``: the embedded stack, every service that exists, the demo seed, until Ctrl-C.

The supervisor starts each service as its own process (``python -m
loraplane.<service>``) with the ``LORAPLANE_*`` environment pointing at the
stack, waits until its ``/metrics`` answers, writes ``.loraplane/demo.env``,
exports component health on its own ``/metrics`` (scraped by Prometheus), and
on SIGINT / SIGTERM stops everything it started, services first.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from loraplane.stack.components import Component, Health, StackError, port_in_use
from loraplane.stack.services import SERVICES, ServiceSpec, existing_services
from loraplane.stack.settings import StackSettings, repo_root
from loraplane.stack.stack import Stack

#: Operator token of the local stack's registry admin API.
DEV_OPERATOR_TOKEN = "loraplane-dev-operator-token"


def service_env(s: StackSettings, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment shared by every service process of a stack."""
    env = dict(s.client_env())
    for svc in SERVICES:
        env.update(svc.env(s))
    assert s.port_base is not None
    registry_port = SERVICES[0].ports(s)["GRPC_PORT"]
    env["LORAPLANE_REGISTRY_ADDR"] = f"127.0.0.1:{registry_port}"
    env.setdefault("LORAPLANE_REGISTRY_OPERATOR_TOKEN", DEV_OPERATOR_TOKEN)
    models = repo_root() / ".loraplane" / "models"
    env["LORAPLANE_MODELS_DIR"] = str(models)
    # Per-stack state of the services, so `make run` and the make-run test never share it.
    env["LORAPLANE_WORKER_HOST_DIR"] = str(s.root / "worker-host")
    env["LORAPLANE_ADMISSION_QUARANTINE_DIR"] = str(s.root / "admission-quarantine")
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    if extra:
        env.update(extra)
    return env


class ServiceProcess(Component):
    """One loraplane service process; healthy when its ``/metrics`` answers."""

    def __init__(self, settings: StackSettings, spec: ServiceSpec, env: dict[str, str]) -> None:
        self.name = f"svc-{spec.name}"
        super().__init__(settings)
        self.spec = spec
        self._env = env

    def ports(self) -> dict[str, int]:
        return {f"{self.spec.env_prefix()}{k}".lower(): v for k, v in self.spec.ports(self.s).items()}

    def start_timeout_s(self) -> float:
        return max(self.spec.start_timeout_s, self.s.start_timeout_s)

    def command(self) -> list[str]:
        module = self.spec.module.removesuffix(".__main__")
        return [sys.executable, "-m", module]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self._env)
        return env

    def healthy(self) -> bool:
        port = self.spec.ports(self.s)["METRICS_PORT"]
        if not port_in_use(port):
            return False
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return bool(r.status == 200)


def service_processes(s: StackSettings, env: dict[str, str]) -> list[ServiceProcess]:
    return [ServiceProcess(s, spec, env) for spec in existing_services()]


def full_status(s: StackSettings) -> list[Health]:
    """Health of every stack component and every service that exists (one entry each)."""
    stack = Stack(s)
    return stack.status() + [p.health() for p in service_processes(s, service_env(s))]


def write_env_file(path: Path, values: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    tmp.replace(path)


class Supervisor:
    """Runs the platform in the foreground until told to stop."""

    def __init__(self, settings: StackSettings, echo: Callable[[str], None] = print) -> None:
        self.s = settings
        self.echo = echo
        self.stack = Stack(settings)
        self.env = service_env(settings)
        self.procs: list[ServiceProcess] = []
        self._stop = threading.Event()
        self.registry = CollectorRegistry()
        self.up_gauge = Gauge("loraplane_component_up", "1 when the component is healthy",
                              ["component"], registry=self.registry)

    def request_stop(self, *_: object) -> None:
        self._stop.set()

    def start(self, prepare: Callable[[Supervisor], None] | None = None) -> dict[str, float]:
        t0 = time.monotonic()
        self.echo("starting the embedded stack")
        timings = self.stack.up(echo=True)
        from loraplane.shared.migrations import migrate_up

        migrate_up(self.s.postgres_dsn)
        self.echo("  migrations  applied")
        import asyncio

        from loraplane.shared.kafka_admin import ensure_topics

        created = asyncio.run(ensure_topics(self.s.kafka_bootstrap))
        self.echo(f"  topics      ready ({len(created)} created)")
        start_http_server(self.s.supervisor_metrics_port, addr="127.0.0.1", registry=self.registry)
        if prepare is not None:
            prepare(self)
        for spec in existing_services():
            proc = ServiceProcess(self.s, spec, self.env)
            t1 = time.monotonic()
            proc.start()
            self.procs.append(proc)
            timings[proc.name] = time.monotonic() - t1
            self.echo(f"  {spec.name:<13} up in {timings[proc.name]:.1f}s  "
                      + ", ".join(f"{k}={v}" for k, v in spec.ports(self.s).items()))
        missing = [svc.name for svc in SERVICES if not svc.exists()]
        if missing:
            self.echo(f"  (not built yet, not started: {', '.join(missing)})")
        timings["total"] = time.monotonic() - t0
        return timings

    def demo_env(self, seeded: dict[str, str]) -> dict[str, str]:
        s = self.s
        gateway = next(svc for svc in SERVICES if svc.name == "gateway").ports(s)
        values = dict(self.env)
        values.update({
            "LORAPLANE_GATEWAY_GRPC": f"127.0.0.1:{gateway['GRPC_PORT']}",
            "LORAPLANE_GATEWAY_HTTP": f"http://127.0.0.1:{gateway['HTTP_PORT']}",
        })
        values.update(seeded)
        return values

    def watch(self) -> None:
        """Export health until stopped; report services that died."""
        reported: set[str] = set()
        while not self._stop.wait(2.0):
            for comp in [*self.stack.components, *self.procs]:
                h = comp.health()
                self.up_gauge.labels(component=comp.name).set(1 if h.healthy else 0)
                if not h.healthy and comp.name not in reported:
                    reported.add(comp.name)
                    self.echo(f"warning: {comp.name} is unhealthy ({h.detail}); log: {comp.log}")

    def stop(self) -> None:
        self.echo("stopping")
        for proc in reversed(self.procs):
            proc.stop()
        self.stack.down()
        self.echo("stopped")


def run_foreground(
    prepare: Callable[[Supervisor], None] | None = None,
    seed: Callable[[Supervisor], dict[str, str]] | None = None,
) -> int:
    """Entry of ``loraplane run``: ``prepare`` runs before the services start (model
    build), ``seed`` after (tenants, keys, releases); its values go to demo.env."""
    sup = Supervisor(StackSettings(profile="run"))
    signal.signal(signal.SIGINT, sup.request_stop)
    signal.signal(signal.SIGTERM, sup.request_stop)
    try:
        timings = sup.start(prepare)
        seeded = seed(sup) if seed is not None else {}
        env_file = sup.s.demo_env_file
        assert env_file is not None
        write_env_file(env_file, sup.demo_env(seeded))
        sup.echo(f"platform up in {timings['total']:.1f}s; wrote {env_file}")
        sup.echo("  point clients at it:  set -a; . .loraplane/demo.env; set +a")
        sup.echo("  health:               make status")
        sup.echo("serving; Ctrl-C stops everything")
        sup.watch()
    except (StackError, RuntimeError) as exc:
        sup.echo(f"error: {exc}")
        sup.stop()
        return 1
    except BaseException:
        sup.stop()
        raise
    sup.stop()
    return 0
