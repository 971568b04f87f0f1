"""`loraplane run` (what `make run` calls): healthy status, demo.env, TLS at the edge by
default (the public gRPC and HTTP ports refuse plaintext and serve TLS with the dev CA that
demo.env names; `loraplane generate` trusts it), a crashed worker restarted by the
supervisor while the other one serves, a SIGKILLed gateway process while the other one
serves the shared ports (then restarted), and a clean Ctrl-C.

The supervisor runs on its own port block and data directory so that it neither
collides with the session's test stack nor with a developer's `make run`.
"""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import openai
import pytest

from loraplane.stack.components import port_in_use
from loraplane.stack.services import existing_services
from loraplane.stack.settings import PORT_OFFSETS, StackSettings
from loraplane.stack.supervisor import (
    ServiceProcess,
    read_env_file,
    service_env,
    service_processes,
)
from loraplane.v1 import inference_pb2, inference_pb2_grpc
from tests.support.ports import side_port_base

REQUIRED_ENV = [
    "LORAPLANE_GATEWAY_GRPC", "LORAPLANE_GATEWAY_HTTP", "LORAPLANE_DEMO_API_KEY",
    "LORAPLANE_OTHER_TENANT_API_KEY", "LORAPLANE_DEMO_ADAPTERS", "LORAPLANE_BASE_MODEL",
    "LORAPLANE_BASE_MODEL_DIR", "LORAPLANE_SIGNING_KEY", "LORAPLANE_DEMO_TENANT",
]


def _cli() -> str:
    return str(Path(sys.executable).parent / "loraplane")


def _verify(values: dict[str, str]) -> ssl.SSLContext | bool:
    """What an HTTP client of the gateway trusts: the CA demo.env names (edge TLS)."""
    ca = values.get("LORAPLANE_GATEWAY_CA_FILE")
    return ssl.create_default_context(cafile=ca) if ca else True


def _completion_codes(values: dict[str, str], n: int, *, fresh: bool = False) -> list[int]:
    """Status codes of ``n`` two-token completions of the first demo adapter over the public
    HTTP port (HTTPS trusting demo.env's CA), on one connection, or each on a connection of
    its own when ``fresh``."""
    url = f"{values['LORAPLANE_GATEWAY_HTTP']}/v1/completions"
    auth = {"Authorization": f"Bearer {values['LORAPLANE_DEMO_API_KEY']}"}
    body = {"model": values["LORAPLANE_DEMO_ADAPTERS"].split(",")[0], "prompt": "Hi",
            "max_tokens": 2}
    per_client = 1 if fresh else n  # a client's connection serves its requests
    codes: list[int] = []
    for _ in range(n // per_client):
        with httpx.Client(timeout=60, verify=_verify(values)) as client:
            codes.extend(client.post(url, headers=auth, json=body).status_code
                         for _ in range(per_client))
    return codes


def _exited(pid: int, within_s: float) -> None:
    """Return once every thread of process ``pid`` has exited: its sockets are closed.

    ``os.killpg`` returns before the kernel has torn the process down, and a connection the
    kernel hashes to a dying ``SO_REUSEPORT`` listener in that window is reset with it. The
    main thread's state is not enough: after SIGKILL it can be a zombie while the other
    threads still run their exit and hold the shared descriptor table (the listening socket
    open) - a reset seen in two fresh-clone runs, the second after waiting for the zombie.
    Exited threads leave ``/proc/<pid>/task`` only after closing their descriptors, so the
    sockets are closed once the main thread is a zombie and alone there (or the process is
    gone)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return
        if tasks == [str(pid)] and stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return
        assert time.monotonic() < deadline, f"process {pid} still alive {within_s} s after SIGKILL"
        time.sleep(0.05)


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


def _edge_serves_tls_only(env: dict[str, str], values: dict[str, str]) -> None:
    """The public gRPC and HTTP ports serve TLS with the dev CA demo.env names and refuse
    plaintext (and a client that does not trust that CA)."""
    grpc_addr, https = values["LORAPLANE_GATEWAY_GRPC"], values["LORAPLANE_GATEWAY_HTTP"]
    ca = values.get("LORAPLANE_GATEWAY_CA_FILE", "")
    assert https.startswith("https://") and ca, (https, ca)  # on by default in make run
    assert Path(ca) == Path(env["LORAPLANE_STACK_DATA_DIR"]) / "pki" / "ca.pem"
    adapter = values["LORAPLANE_DEMO_ADAPTERS"].split(",")[0]

    # gRPC: loraplane generate, with demo.env's variables, trusts the CA and is answered
    cli_env = {**env, **values}
    gen = subprocess.run([_cli(), "generate", "--adapter", adapter, "--prompt", "Hi",
                          "--max-tokens", "2", "--class", "background", "--timeout", "60"],
                         env=cli_env, capture_output=True, text=True, timeout=90, check=False)
    assert gen.returncode == 0, gen.stdout + gen.stderr
    assert f"[{values['LORAPLANE_DEMO_TENANT']}/" in gen.stderr, gen.stderr  # resolved
    assert "output tokens" in gen.stderr, gen.stderr
    # plaintext gRPC, or TLS trusting only the system roots, is refused
    req = inference_pb2.GenerateRequest(adapter=adapter, prompt="Hi", max_tokens=2)
    auth = (("authorization", f"Bearer {values['LORAPLANE_DEMO_API_KEY']}"),)
    for channel in (grpc.insecure_channel(grpc_addr),
                    grpc.secure_channel(grpc_addr, grpc.ssl_channel_credentials())):
        with channel, pytest.raises(grpc.RpcError) as err:
            list(inference_pb2_grpc.InferenceStub(channel).Generate(req, metadata=auth,
                                                                    timeout=10))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value

    # HTTP: HTTPS trusting the CA answers; plaintext and an untrusting client are refused
    assert _completion_codes(values, 2) == [200, 200]
    with httpx.Client(verify=_verify(values)) as http:  # the README's openai snippet
        client = openai.OpenAI(base_url=f"{https}/v1", api_key=values["LORAPLANE_DEMO_API_KEY"],
                               http_client=http, timeout=60, max_retries=0)
        assert client.completions.create(model=adapter, prompt="Hi", max_tokens=2).choices
    plain = "http://" + https.removeprefix("https://")
    with httpx.Client(timeout=10) as client:
        with pytest.raises(httpx.HTTPError):
            client.get(f"{plain}/v1/models", headers=dict(auth))
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            client.get(f"{https}/v1/models", headers=dict(auth))


def test_run_status_and_ctrl_c_leave_nothing_behind(tmp_path: Path) -> None:
    base = side_port_base(7)  # the session's base + 840: a run on another base has its own
    env = dict(os.environ)
    env.pop("LORAPLANE_STACK_EDGE_TLS", None)  # the default: on with tls in make run
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

        values = read_env_file(tmp_path / "demo.env")  # as a shell sourcing it reads it
        missing = [k for k in REQUIRED_ENV if not values.get(k)]
        assert not missing, f"demo.env lacks {missing}"
        assert Path(values["LORAPLANE_BASE_MODEL_DIR"]).is_dir()
        _edge_serves_tls_only(env, values)

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
        _exited(gw_pid, within_s=10)
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
