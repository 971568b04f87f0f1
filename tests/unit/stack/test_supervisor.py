"""The supervisor's restart policy (fake components, monotonic time injected), replicas
and what `make status` reports."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from loraplane.stack.components import Component, Health
from loraplane.stack.services import REPLICA_PORT_STRIDE, SERVICES, scrape_targets
from loraplane.stack.settings import PORT_OFFSETS, StackSettings
from loraplane.stack.supervisor import (
    DEV_OPERATOR_TOKEN,
    Supervisor,
    backoff_s,
    placement_page,
    read_restarts,
    service_env,
    service_processes,
)
from tests.support.ports import side_port_base


class FakeComponent(Component):
    """Healthy while ``alive``; ``launch`` brings it back after ``boot_checks`` checks."""

    def __init__(self, settings: StackSettings, name: str, boot_checks: int = 1) -> None:
        self.name = name
        super().__init__(settings)
        self.alive = True
        self.launches = 0
        self.after_starts = 0
        self.boot_checks = boot_checks
        self._booting = 0
        self.pid_value: int | None = 1

    def health(self) -> Health:
        if not self.alive and self._booting:
            self._booting -= 1
            self.alive = self._booting == 0
        return Health(self.name, self.alive, "ok" if self.alive else "not running")

    def pid(self) -> int | None:
        return self.pid_value

    def launch(self) -> None:
        self.launches += 1
        self._booting = self.boot_checks

    def after_start(self) -> None:
        self.after_starts += 1

    def start_timeout_s(self) -> float:
        return 30.0


class FakeStack:
    def __init__(self, components: list[Component]) -> None:
        self.components = components


@pytest.fixture
def settings(tmp_path: Path) -> StackSettings:
    return StackSettings(profile="run", port_base=side_port_base(6), data_dir=tmp_path,
                         restart_backoff_s=1.0, restart_backoff_max_s=8.0,
                         restart_stable_s=60.0, restart_nice=0)


def _supervisor(settings: StackSettings, comps: list[Component]) -> Supervisor:
    sup = Supervisor(settings, echo=lambda _: None)
    sup.stack = FakeStack(comps)  # type: ignore[assignment]
    return sup


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [backoff_s(n, 1.0, 8.0) for n in range(6)] == [1, 2, 4, 8, 8, 8]


def test_crashed_component_is_restarted_counted_and_set_up_again(
    settings: StackSettings,
) -> None:
    comp = FakeComponent(settings, "tansu", boot_checks=2)
    sup = _supervisor(settings, [comp])
    sup._check(comp, 100.0)
    assert comp.launches == 0
    comp.alive, comp.pid_value = False, None  # the process is gone
    sup._check(comp, 101.0)  # found dead: restarted at once
    assert comp.launches == 1
    comp.pid_value = 2
    sup._check(comp, 101.5)  # coming up: not restarted again meanwhile
    sup._check(comp, 102.0)
    assert comp.launches == 1 and comp.alive and comp.after_starts == 1
    assert read_restarts(settings) == {"tansu": 1}
    assert sup.registry.get_sample_value(
        "loraplane_component_restarts_total", {"component": "tansu"}) == 1
    assert sup.registry.get_sample_value("loraplane_component_up", {"component": "tansu"}) == 1


def test_a_crash_loop_backs_off_and_stability_resets_it(settings: StackSettings) -> None:
    comp = FakeComponent(settings, "svc-worker-1")
    comp.pid_value = None  # the process dies at once after each launch
    sup = _supervisor(settings, [comp])
    comp.alive = False
    comp.boot_checks = 0
    launches_at = []
    t = 0.0
    while t < 40:
        before = comp.launches
        sup._check(comp, t)
        if comp.launches > before:
            launches_at.append(t)
        t += 0.5
    assert launches_at[:5] == [0.0, 1.0, 3.0, 7.0, 15.0]  # 1, 2, 4, 8, then 8 s apart
    assert launches_at[5] == 23.0
    # it comes up and stays up for restart_stable_s: the next crash restarts at once
    comp.boot_checks = 1
    sup._check(comp, 100.0)
    sup._check(comp, 100.5)
    assert comp.alive
    sup._check(comp, 200.0)
    comp.alive = False
    n = comp.launches
    sup._check(comp, 200.5)
    assert comp.launches == n + 1


class Sleeper(Component):
    """A real process (its own session) that is healthy when the test says so."""

    name = "sleeper"

    def __init__(self, settings: StackSettings) -> None:
        super().__init__(settings)
        self.ready = False

    def ports(self) -> dict[str, int]:
        return {}

    def command(self) -> list[str]:
        return [sys.executable, "-c", "import time; time.sleep(60)"]

    def healthy(self) -> bool:
        return self.ready


def test_a_restarted_process_runs_boosted_until_healthy(tmp_path: Path) -> None:
    settings = StackSettings(profile="run", port_base=side_port_base(6), data_dir=tmp_path, restart_nice=-5)
    comp = Sleeper(settings)
    sup = _supervisor(settings, [comp])
    try:
        sup._check(comp, 0.0)  # not running: restarted at once, boosted
        pid = comp.pid()
        assert pid is not None
        permitted = os.geteuid() == 0  # a negative niceness needs root (else: no boost)
        assert os.getpriority(os.PRIO_PROCESS, pid) == (-5 if permitted else 0)
        autogroup = Path(f"/proc/{pid}/autogroup")  # its session's weight (autogroup)
        if permitted and autogroup.exists():
            assert autogroup.read_text().split()[-1] == "-5"
        comp.ready = True
        sup._check(comp, 1.0)  # healthy: back to the default priority
        assert os.getpriority(os.PRIO_PROCESS, pid) == 0
        if autogroup.exists():
            assert autogroup.read_text().split()[-1] == "0"
    finally:
        comp.stop()
    assert comp.pid() is None


def test_component_restarted_by_someone_else_is_adopted(settings: StackSettings) -> None:
    comp = FakeComponent(settings, "seaweedfs")
    sup = _supervisor(settings, [comp])
    comp.alive = False
    comp.pid_value = None
    comp.launch = lambda: None  # type: ignore[method-assign]  # our restart fails to spawn
    sup._check(comp, 0.0)
    comp.alive, comp.pid_value = True, 4242  # `stack up` from another shell started it
    sup._check(comp, 0.5)
    assert sup.registry.get_sample_value("loraplane_component_up",
                                         {"component": "seaweedfs"}) == 1
    sup._check(comp, 100.0)
    assert read_restarts(settings) == {"seaweedfs": 1}  # nothing restarted after adoption


def test_two_workers_by_default_each_with_its_own_ports_id_and_state(
    settings: StackSettings,
) -> None:
    procs = service_processes(settings, service_env(settings))
    workers = [p for p in procs if p.spec.name == "worker"]
    assert [p.name for p in workers] == ["svc-worker", "svc-worker-1"]
    env0, env1 = workers[0].env(), workers[1].env()
    assert (env0["LORAPLANE_WORKER_ID"], env1["LORAPLANE_WORKER_ID"]) == ("worker-0", "worker-1")
    assert env0["LORAPLANE_WORKER_HOST_DIR"] != env1["LORAPLANE_WORKER_HOST_DIR"]
    p0, p1 = (int(e["LORAPLANE_WORKER_GRPC_PORT"]) for e in (env0, env1))
    assert p1 - p0 == REPLICA_PORT_STRIDE
    every = [port for p in procs for port in p.ports().values()]
    gateway = next(s for s in SERVICES if s.name == "gateway")
    public = {gateway.ports(settings)[k] for k in gateway.shared_ports}
    owned = [port for port in every if port not in public]
    assert len(owned) == len(set(owned)), "two service processes share a port"
    spec = next(s for s in SERVICES if s.name == "worker")
    assert scrape_targets(settings)["worker"] == [
        spec.ports(settings, i)["METRICS_PORT"] for i in range(2)]
    one = StackSettings(profile="run", port_base=side_port_base(6), data_dir=settings.root, workers=1)
    assert [p.name for p in service_processes(one, service_env(one))
            if p.spec.name == "worker"] == ["svc-worker"]


def test_two_gateways_share_the_public_ports_each_with_its_own_metrics_and_share(
    settings: StackSettings,
) -> None:
    procs = [p for p in service_processes(settings, service_env(settings))
             if p.spec.name == "gateway"]
    assert [p.name for p in procs] == ["svc-gateway", "svc-gateway-1"]  # two by default
    env0, env1 = procs[0].env(), procs[1].env()
    for var in ("LORAPLANE_GATEWAY_GRPC_PORT", "LORAPLANE_GATEWAY_HTTP_PORT"):
        assert env0[var] == env1[var]
    assert (int(env1["LORAPLANE_GATEWAY_METRICS_PORT"])
            - int(env0["LORAPLANE_GATEWAY_METRICS_PORT"])) == REPLICA_PORT_STRIDE
    assert [(e["LORAPLANE_GATEWAY_PROCESSES"], e["LORAPLANE_GATEWAY_PROCESS_INDEX"],
             e["LORAPLANE_GATEWAY_INSTANCE_ID"]) for e in (env0, env1)] == [
        ("2", "0", "gateway-0"), ("2", "1", "gateway-1")]
    from loraplane.gateway.settings import GatewaySettings

    for env in (env0, env1):  # what each process makes of it: half of every flow cap
        flow = GatewaySettings(processes=int(env["LORAPLANE_GATEWAY_PROCESSES"]),
                               process_index=int(env["LORAPLANE_GATEWAY_PROCESS_INDEX"]),
                               ).process_flow()
        assert flow.max_in_flight_per_worker == 4
    gateway = next(s for s in SERVICES if s.name == "gateway")
    targets = scrape_targets(settings)["gateway"]
    assert targets == [gateway.ports(settings, i)["METRICS_PORT"] for i in range(2)]
    one = StackSettings(profile="run", port_base=side_port_base(6), data_dir=settings.root, gateways=1)
    assert [p.name for p in service_processes(one, service_env(one))
            if p.spec.name == "gateway"] == ["svc-gateway"]


def test_a_gateway_replica_starts_beside_a_running_one_on_the_shared_ports(
    settings: StackSettings,
) -> None:
    import socket

    from loraplane.stack.components import StackError

    procs = [p for p in service_processes(settings, service_env(settings))
             if p.spec.name == "gateway"]
    grpc_port = int(procs[0].env()["LORAPLANE_GATEWAY_GRPC_PORT"])
    with socket.socket() as held:  # someone listens on the shared port
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", grpc_port))
        held.listen()
        with pytest.raises(StackError, match="already taken"):  # no sibling: not ours
            procs[1].check_ports_free()
        procs[0].pidfile.parent.mkdir(parents=True, exist_ok=True)
        procs[0].pidfile.write_text(str(os.getpid()))  # the sibling runs: it is its port
        try:
            procs[1].check_ports_free()
        finally:
            procs[0].pidfile.unlink()


MAX_WORKERS = next(m.le for m in StackSettings.model_fields["workers"].metadata
                   if getattr(m, "le", None) is not None)


@pytest.mark.parametrize("profile", ["run", "test"])
@pytest.mark.parametrize("workers", range(1, MAX_WORKERS + 1))
def test_port_plan_has_no_collisions(profile: str, workers: int, tmp_path: Path) -> None:
    # Every port of the stack's components and of every replica of every service, at every
    # worker count the settings allow: one owner each, all inside the port block.
    s = StackSettings(profile=profile, data_dir=tmp_path, workers=workers)  # type: ignore[arg-type]
    assert s.port_base is not None
    owners: dict[int, list[str]] = {}
    for name in PORT_OFFSETS:
        owners.setdefault(getattr(s, name), []).append(name)
    for spec in SERVICES:
        for i in range(spec.replicas(s)):
            for var, port in spec.ports(s, i).items():
                if i and var in spec.shared_ports:  # the gateways' public ports: replica 0's
                    assert port == spec.ports(s, 0)[var]
                    continue
                owners.setdefault(port, []).append(f"{spec.instance(i)}.{var}")
    shared = {port: names for port, names in owners.items() if len(names) > 1}
    assert not shared, f"ports with two owners: {shared}"
    assert all(s.port_base < port < s.port_base + 1000 for port in owners)


def test_the_placement_page_is_on_with_the_dev_token(settings: StackSettings) -> None:
    env = service_env(settings)
    assert settings.port_base is not None
    assert env["LORAPLANE_CACHE_MANAGER_PAGE_PORT"] == str(settings.port_base + 57)
    assert env["LORAPLANE_REGISTRY_OPERATOR_TOKEN"] == DEV_OPERATOR_TOKEN
    proc = next(p for p in service_processes(settings, env) if p.spec.name == "cache-manager")
    assert proc.env()["LORAPLANE_CACHE_MANAGER_PAGE_PORT"] == str(settings.port_base + 57)
    line = placement_page(settings, env)
    assert line is not None
    assert line.startswith(f"http://127.0.0.1:{settings.port_base + 57}/placement"
                           f"?token={DEV_OPERATOR_TOKEN}")
    # Any other operator token is never printed.
    own = service_env(settings, {"LORAPLANE_REGISTRY_OPERATOR_TOKEN": "an-operators-own-token"})
    line = placement_page(settings, own)
    assert line is not None and "an-operators-own-token" not in line
    assert line.startswith(f"http://127.0.0.1:{settings.port_base + 57}/placement ")


def test_a_busy_component_missing_checks_is_restarted_only_when_hung(
    settings: StackSettings,
) -> None:
    comp = FakeComponent(settings, "svc-worker")
    sup = _supervisor(settings, [comp])
    comp.alive = False  # process running, /metrics not answering
    comp.boot_checks = 0
    for t in (0.0, 5.0, 29.0):
        sup._check(comp, t)
    assert comp.launches == 0
    comp.alive = True  # it answers again: the clock starts over
    sup._check(comp, 29.5)
    comp.alive = False
    sup._check(comp, 40.0)
    sup._check(comp, 69.0)
    assert comp.launches == 0
    sup._check(comp, 70.5)  # failed every check for 30 s: hung, restarted
    assert comp.launches == 1


def test_a_launch_that_fails_is_retried_after_the_backoff_and_not_counted(
    settings: StackSettings,
) -> None:
    from loraplane.stack.components import StackError

    comp = FakeComponent(settings, "svc-worker-1")
    sup = _supervisor(settings, [comp])
    comp.alive, comp.pid_value = False, None
    real_launch, attempts = comp.launch, []

    def flaky_launch() -> None:
        attempts.append(1)
        if len(attempts) == 1:
            raise StackError("port 23074 is already taken")
        real_launch()

    comp.launch = flaky_launch  # type: ignore[method-assign]
    sup._check(comp, 0.0)  # the port is still held by the dead process: nothing spawned
    assert len(attempts) == 1 and read_restarts(settings) == {}
    sup._check(comp, 0.5)  # within the backoff: no new attempt
    assert len(attempts) == 1
    sup._check(comp, 1.0)
    assert len(attempts) == 2 and read_restarts(settings) == {"svc-worker-1": 1}


def test_stop_waits_for_a_check_in_progress_and_nothing_restarts_after(
    settings: StackSettings,
) -> None:
    import threading

    comp = FakeComponent(settings, "tansu")
    entered, release = threading.Event(), threading.Event()
    slow = comp.health

    def blocking_health() -> Health:
        entered.set()
        release.wait(5)
        return slow()

    comp.health = blocking_health  # type: ignore[method-assign]
    sup = _supervisor(settings, [comp])
    sup.stack.down = lambda: None  # type: ignore[attr-defined]
    checker = threading.Thread(target=sup.check_once)
    checker.start()
    assert entered.wait(5)
    stopped = threading.Event()
    stopper = threading.Thread(target=lambda: (sup.stop(), stopped.set()))
    stopper.start()
    assert not stopped.wait(0.3)  # stop waits for the check under way
    comp.alive, comp.pid_value = False, None  # stop took the component down meanwhile
    release.set()
    checker.join(5)
    stopper.join(5)
    assert stopped.is_set()
    sup.check_once()  # a later pass of the watch loop
    assert comp.launches == 0  # nothing restarted once stop had begun


def test_a_gateway_replica_s_own_ports_leave_out_the_shared_ones_while_a_sibling_runs(
    settings: StackSettings,
) -> None:
    """What a kill waits to see closed: with the sibling running, the shared public ports
    stay served by it, so a kill of one replica must not wait for them (the make-run wiring
    test's SIGKILL waited 30 s and failed); without a sibling they are its own."""
    procs = [p for p in service_processes(settings, service_env(settings))
             if p.spec.name == "gateway"]
    shared = {"loraplane_gateway_grpc_port", "loraplane_gateway_http_port"}
    assert shared <= set(procs[1].ports())
    assert set(procs[1].exclusive_ports()) == set(procs[1].ports())  # no sibling
    procs[0].pidfile.parent.mkdir(parents=True, exist_ok=True)
    procs[0].pidfile.write_text(str(os.getpid()))  # the sibling runs
    try:
        own = procs[1].exclusive_ports()
    finally:
        procs[0].pidfile.unlink()
    assert set(own) == set(procs[1].ports()) - shared
    assert own["loraplane_gateway_metrics_port"] == procs[1].ports()[
        "loraplane_gateway_metrics_port"]
