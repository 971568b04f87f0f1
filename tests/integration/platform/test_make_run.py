"""`loraplane run` (what `make run` calls): healthy status, demo.env, a crashed worker
restarted by the supervisor while the other one serves, a SIGKILLed gateway process while
the other one serves the shared ports (then restarted), and a clean Ctrl-C.

The supervisor runs on its own port block and data directory so that it neither
collides with the session's test stack nor with a developer's `make run`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from loraplane.stack.components import port_in_use
from loraplane.stack.services import existing_services
from loraplane.stack.settings import PORT_OFFSETS, StackSettings
from loraplane.stack.supervisor import ServiceProcess, service_env, service_processes
from tests.support.ports import side_port_base

REQUIRED_ENV = [
    "LORAPLANE_GATEWAY_GRPC", "LORAPLANE_GATEWAY_HTTP", "LORAPLANE_DEMO_API_KEY",
    "LORAPLANE_OTHER_TENANT_API_KEY", "LORAPLANE_DEMO_ADAPTERS", "LORAPLANE_BASE_MODEL",
    "LORAPLANE_BASE_MODEL_DIR", "LORAPLANE_SIGNING_KEY", "LORAPLANE_DEMO_TENANT",
]


def _cli() -> str:
    return str(Path(sys.executable).parent / "loraplane")


def _completion_codes(values: dict[str, str], n: int, *, fresh: bool = False) -> list[int]:
    """Status codes of ``n`` two-token completions of the first demo adapter over the public
    HTTP port, on one connection, or each on a connection of its own when ``fresh``."""
    url = f"{values['LORAPLANE_GATEWAY_HTTP']}/v1/completions"
    auth = {"Authorization": f"Bearer {values['LORAPLANE_DEMO_API_KEY']}"}
    body = {"model": values["LORAPLANE_DEMO_ADAPTERS"].split(",")[0], "prompt": "Hi",
            "max_tokens": 2}
    per_client = 1 if fresh else n  # a client's connection serves its requests
    codes: list[int] = []
    for _ in range(n // per_client):
        with httpx.Client(timeout=60) as client:
            codes.extend(client.post(url, headers=auth, json=body).status_code
                         for _ in range(per_client))
    return codes


def _restarted(env: dict[str, str], proc: ServiceProcess, old_pid: int, within_s: float) -> str:
    """``proc``'s line of ``loraplane status`` once it is healthy under a new pid."""
    deadline = time.monotonic() + within_s
    while True:
        status = subprocess.run([_cli(), "status"], env=env, capture_output=True, text=True,
                                timeout=60, check=False)
        line = next(x for x in status.stdout.splitlines() if f"{proc.name} " in x)
        if status.returncode == 0 and proc.pid() not in (None, old_pid):
            return line
        if time.monotonic() > deadline:
            raise AssertionError(f"{proc.name} was not restarted:\n{status.stdout}")
        time.sleep(2)


def test_run_status_and_ctrl_c_leave_nothing_behind(tmp_path: Path) -> None:
    base = side_port_base(7)  # the session's base + 840: a run on another base has its own
    env = dict(os.environ)
    env.update(
        LORAPLANE_STACK_PORT_BASE=str(base),
        LORAPLANE_STACK_DATA_DIR=str(tmp_path / "stack"),
        LORAPLANE_STACK_DEMO_ENV_FILE=str(tmp_path / "demo.env"),
    )
    settings = StackSettings(profile="run", port_base=base, data_dir=tmp_path / "stack")
    ports = [getattr(settings, name) for name in PORT_OFFSETS]
    for svc in existing_services():
        ports.extend(svc.all_ports(settings))
    busy = [p for p in ports if port_in_use(p)]
    assert not busy, f"ports {busy} of block {base} are busy before the test"

    log = open(tmp_path / "run.log", "w+b")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([_cli(), "run"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            log.seek(0)
            out = log.read().decode(errors="replace")
            if "serving; Ctrl-C stops everything" in out:
                break
            assert proc.poll() is None, f"loraplane run exited early:\n{out}"
            time.sleep(1)
        else:
            raise AssertionError(f"loraplane run never became ready:\n{out}")

        status = subprocess.run([_cli(), "status"], env=env, capture_output=True, text=True,
                                timeout=60, check=False)
        assert status.returncode == 0, status.stdout + status.stderr
        lines = status.stdout.strip().splitlines()
        procs = service_processes(settings, service_env(settings))
        assert sum(p.spec.name == "worker" for p in procs) == 2  # two workers by default
        assert sum(p.spec.name == "gateway" for p in procs) == 2  # and two gateways
        expected = 4 + len(procs)
        assert len(lines) == expected and all(line.startswith("ok") for line in lines), lines

        values = dict(line.split("=", 1) for line in
                      (tmp_path / "demo.env").read_text().splitlines() if "=" in line)
        missing = [k for k in REQUIRED_ENV if not values.get(k)]
        assert not missing, f"demo.env lacks {missing}"
        assert Path(values["LORAPLANE_BASE_MODEL_DIR"]).is_dir()

        # a worker crashes: the other keeps answering, the supervisor brings it back
        victim = next(p for p in procs if p.name == "svc-worker-1")
        pid = victim.pid()
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)
        time.sleep(3)  # > 2 failed probes: the gateway has routed around it
        codes = _completion_codes(values, 10)
        assert codes == [200] * 10, codes
        line = _restarted(env, victim, pid, within_s=240)
        assert line.startswith("ok") and "restarts 1" in line, line

        # two gateway processes serve the public ports: one SIGKILLed, the other serves
        # every new connection, and the supervisor brings the killed one back
        gateways = [p for p in procs if p.spec.name == "gateway"]
        assert [p.name for p in gateways] == ["svc-gateway", "svc-gateway-1"]
        gw_pid = gateways[1].pid()
        assert gw_pid is not None
        os.killpg(gw_pid, signal.SIGKILL)
        codes = _completion_codes(values, 20, fresh=True)  # the sibling takes each one
        assert codes == [200] * 20, codes
        line = _restarted(env, gateways[1], gw_pid, within_s=120)
        assert line.startswith("ok") and "restarts 1" in line, line
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        log.close()
    assert rc == 0
    time.sleep(0.5)
    still = [p for p in ports if port_in_use(p)]
    assert not still, f"ports still listening after Ctrl-C: {still}"
    pids = [f for f in (tmp_path / "stack" / "run").glob("*.pid")]
    assert not pids, f"pid files left behind: {pids}"
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True,
                               check=False)
    assert leftovers.stdout.strip() == "", f"processes left behind: {leftovers.stdout}"
