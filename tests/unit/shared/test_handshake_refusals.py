"""Refused TLS handshakes are counted (issue 23): ``loraplane_grpc_tls_handshake_refusals_total``.

A real ``grpc.aio`` server with the internal mTLS credentials (``TlsFiles.server_credentials``,
a fresh dev CA from ``stack/certs.py``) and this process's stderr through
``shared/stderr_tee.py``: each refused handshake (no client certificate, one of another CA,
an expired one, plaintext with a tenant's API key) raises the counter by exactly one with
its reason; a good call raises nothing. The tee itself is checked in a child process: every
byte written to descriptor 2 (from threads, past a full pipe) reaches the original stderr,
even when the process is killed right after writing.

The tee is installed and removed inside each test body: pytest's descriptor capture
re-points descriptor 2 between a test's phases.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from loraplane.shared.stderr_tee import REASONS, StderrTee, classify, counting_possible
from loraplane.shared.tls import (
    GATEWAY,
    WORKER,
    count_handshake_refusals,
    secure_or_insecure_aio_channel,
    server_name_option,
)
from tests.support.tls import Pki, make_pki

# What gRPC core (grpcio 1.85.3) logged, server side, for each case (timestamps and
# thread ids as observed on the development machine).
OBSERVED = {
    "no_certificate": "I1205 01:07:43.472262   21651 ssl_transport_security.cc:2563] Handshake "
    "failed with error SSL_ERROR_SSL: error:100000c0:SSL routines:OPENSSL_internal:"
    "PEER_DID_NOT_RETURN_A_CERTIFICATE: Invalid certificate verification context",
    "unknown_ca": "I1205 01:07:43.983821   21650 ssl_transport_security.cc:2563] Handshake "
    "failed with error SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:"
    "CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate",
    "expired": "I1205 01:07:44.607590   21652 ssl_transport_security.cc:2563] Handshake "
    "failed with error SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:"
    "CERTIFICATE_VERIFY_FAILED: certificate has expired",
    "not_tls": "I1205 01:07:45.132656   21652 ssl_transport_security.cc:2563] Handshake "
    "failed with error SSL_ERROR_SSL: error:100000f7:SSL routines:OPENSSL_internal:"
    "WRONG_VERSION_NUMBER: Invalid certificate verification context",
}
TENANT_KEY = "lp_live_tenant_key_of_acme_0123456789"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("handshake-pki"), (GATEWAY, WORKER))


@pytest.fixture(scope="module")
async def address(pki: Pki) -> AsyncIterator[str]:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_secure_port("127.0.0.1:0", pki.ours[WORKER].server_credentials())
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(None)


def _channel(case: str, address: str, pki: Pki) -> grpc.aio.Channel:
    if case == "good":
        return secure_or_insecure_aio_channel(address, pki.ours[GATEWAY], server=WORKER)
    if case == "no_certificate":
        return grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(pki.ca),
                                       options=[server_name_option(WORKER)])
    if case == "unknown_ca":
        return secure_or_insecure_aio_channel(address, pki.foreign, server=WORKER)
    if case == "expired":
        return secure_or_insecure_aio_channel(address, pki.expired, server=WORKER)
    assert case == "not_tls"
    return grpc.aio.insecure_channel(address)


async def _call(case: str, address: str, pki: Pki) -> grpc.StatusCode:
    """One health check as ``case``'s caller, its channel closed at once (no reconnect)."""
    channel = _channel(case, address, pki)
    try:
        await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5,
            metadata=[("authorization", f"Bearer {TENANT_KEY}")])
        return grpc.StatusCode.OK
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    finally:
        await channel.close()


def _counts(registry: CollectorRegistry, service: str) -> dict[tuple[str, str], float]:
    got: dict[tuple[str, str], float] = {}
    for family in registry.collect():
        if family.name != "loraplane_grpc_tls_handshake_refusals":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels["service"] == service:
                got[(sample.labels["reason"], sample.labels["side"])] = sample.value
    return got


async def _settled(registry: CollectorRegistry, service: str, expect_total: float,
                   timeout_s: float = 5.0) -> dict[tuple[str, str], float]:
    """The counts once their sum reached ``expect_total`` (and stayed there 0.3 s more)."""
    deadline = time.monotonic() + timeout_s
    while (time.monotonic() < deadline
           and sum(_counts(registry, service).values()) < expect_total):
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.3)
    return _counts(registry, service)


@contextlib.contextmanager
def _counting(service: str, *, dials_tls: bool) -> Iterator[CollectorRegistry]:
    registry = CollectorRegistry()
    tee = count_handshake_refusals(service, dials_tls=dials_tls, registry=registry)
    assert tee is not None, "counting did not start"
    try:
        yield registry
    finally:
        tee.close()
    assert StderrTee.active() is None


@pytest.mark.parametrize("case", ["no_certificate", "unknown_ca", "expired", "not_tls"])
async def test_each_refused_handshake_counts_once_with_its_reason(
        case: str, address: str, pki: Pki) -> None:
    with _counting("worker", dials_tls=False) as registry:
        assert set(_counts(registry, "worker").values()) == {0.0}  # every series from 0
        assert await _call(case, address, pki) == grpc.StatusCode.UNAVAILABLE
        got = await _settled(registry, "worker", 1)
    assert got == {(reason, "server"): (1.0 if reason == case else 0.0)
                   for reason in REASONS}


async def test_a_good_call_and_the_counted_gauge(address: str, pki: Pki) -> None:
    with _counting("worker", dials_tls=False) as registry:
        assert await _call("good", address, pki) == grpc.StatusCode.OK
        got = await _settled(registry, "worker", 1, timeout_s=0.5)
        assert registry.get_sample_value(
            "loraplane_grpc_tls_handshake_refusals_counted", {"service": "worker"}) == 1
    assert set(got.values()) == {0.0}


async def test_several_refusals_count_one_each(address: str, pki: Pki) -> None:
    """Not rate-limited, not repeated: 5 callers without a certificate, 5 plaintext."""
    with _counting("registry", dials_tls=False) as registry:
        for _ in range(5):
            assert await _call("no_certificate", address, pki) == grpc.StatusCode.UNAVAILABLE
            assert await _call("not_tls", address, pki) == grpc.StatusCode.UNAVAILABLE
        got = await _settled(registry, "registry", 10)
    assert got[("no_certificate", "server")] == 5
    assert got[("not_tls", "server")] == 5
    assert sum(got.values()) == 10


async def test_a_process_that_dials_tls_marks_the_ambiguous_reasons(
        address: str, pki: Pki) -> None:
    """A client's own failed handshake logs the same text as a server's refusal of another
    CA's certificate (observed): in a process that also dials, only no_certificate is
    server-side for certain."""
    with _counting("cache-manager", dials_tls=True) as registry:
        await _call("no_certificate", address, pki)
        await _call("unknown_ca", address, pki)
        got = await _settled(registry, "cache-manager", 2)
    assert got[("no_certificate", "server")] == 1
    assert got[("unknown_ca", "server_or_client")] == 1
    assert sum(got.values()) == 2


def test_quiet_grpc_verbosity_turns_counting_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert counting_possible({})
    assert counting_possible({"GRPC_VERBOSITY": "info"})
    assert counting_possible({"GRPC_VERBOSITY": "DEBUG"})
    for quiet in ("ERROR", "warning", "NONE"):
        assert not counting_possible({"GRPC_VERBOSITY": quiet})
    monkeypatch.setenv("GRPC_VERBOSITY", "ERROR")
    registry = CollectorRegistry()
    assert count_handshake_refusals("worker", dials_tls=False, registry=registry) is None
    assert StderrTee.active() is None
    assert registry.get_sample_value(
        "loraplane_grpc_tls_handshake_refusals_counted", {"service": "worker"}) == 0


def test_classify_the_lines_grpc_core_logs() -> None:
    for reason, line in OBSERVED.items():
        assert classify(line) == reason
        assert classify("partial python output without newline" + line) == reason
    older = ("E0101 00:00:00.000000000 1 ssl_transport_security.cc:1455] Handshake failed "
             "with fatal error SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:"
             "CERTIFICATE_VERIFY_FAILED: certificate has expired")
    assert classify(older) == "expired"
    http = OBSERVED["not_tls"].replace("100000f7", "1000009c").replace(
        "WRONG_VERSION_NUMBER", "HTTP_REQUEST")
    assert classify(http) == "not_tls"
    assert classify(OBSERVED["expired"].replace("certificate has expired",
                                                "certificate is not yet valid")) == "other"
    # a client's RPC error quoting the handshake is not gRPC core's line
    assert classify("ERROR gateway: UNAVAILABLE: ipv4:10.0.0.1:50051: Tls handshake failed "
                    "(TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL routines:"
                    "OPENSSL_internal:CERTIFICATE_VERIFY_FAILED") is None
    assert classify("I1205 ssl_transport_security.cc:3238] No match found for server name: "
                    "registry") is None


TEE_SCRIPT = r"""
import json, os, signal, sys, threading
from loraplane.shared.stderr_tee import StderrTee
counts = {}
tee = StderrTee(lambda reason, n: counts.__setitem__(reason, counts.get(reason, 0) + n))
tee.start()
LINE = ("I1205 01:07:43.472262   21651 ssl_transport_security.cc:2563] Handshake failed "
        "with error SSL_ERROR_SSL: error:100000c0:SSL routines:OPENSSL_internal:"
        "PEER_DID_NOT_RETURN_A_CERTIFICATE: Invalid certificate verification context\n")
def raw(tag):  # native code writing to descriptor 2, many threads at once
    for i in range(4000):
        os.write(2, f"{tag} {i:05d} {'x' * 200}\n".encode())
threads = [threading.Thread(target=raw, args=(f"t{n}",)) for n in range(4)]
for t in threads: t.start()
for i in range(500):  # one write a line, as logging's StreamHandler does
    sys.stderr.write(f"py {i:05d}\n")
for _ in range(3):
    os.write(2, LINE.encode())
for t in threads: t.join()
sys.stderr.write("last words\n")
sys.stderr.flush()
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
tee.close()
print(json.dumps(counts))
"""


@pytest.mark.parametrize("ending", ["close", "kill"])
def test_the_tee_keeps_every_byte_past_a_full_pipe_and_a_kill(
        ending: str, tmp_path: Path) -> None:
    """~3.3 MB from four threads and Python's stderr (50 times a pipe's buffer): all of it
    reaches the original stderr in order per writer, also when the process is SIGKILLed
    right after writing (the child drains the pipe); closed normally, the three lines
    are counted."""
    err = tmp_path / "stderr"
    with err.open("wb") as sink:
        done = subprocess.run([sys.executable, "-c", TEE_SCRIPT, ending], stderr=sink,
                              stdout=subprocess.PIPE, timeout=60, check=False)
    deadline = time.monotonic() + 10
    while b"last words" not in err.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)  # killed: the child may still be forwarding
    lines = err.read_bytes().decode().splitlines()
    for tag in ("t0", "t1", "t2", "t3"):
        mine = [line for line in lines if line.startswith(f"{tag} ")]
        assert mine == [f"{tag} {i:05d} {'x' * 200}" for i in range(4000)]
    assert [line for line in lines if line.startswith("py ")] == [
        f"py {i:05d}" for i in range(500)]
    assert sum("Handshake failed" in line for line in lines) == 3
    assert lines[-1] == "last words"
    if ending == "close":
        assert done.returncode == 0
        assert json.loads(done.stdout) == {"no_certificate": 3}
    else:
        assert done.returncode == -9


EXIT_SCRIPT = r"""
import os, sys
from loraplane.shared.stderr_tee import StderrTee
tee = StderrTee(lambda reason, n: None)
tee.start()
print(tee._child.pid, flush=True)
for i in range(2000):
    sys.stderr.write(f"line {i:05d} {'y' * 100}\n")
sys.stderr.write("last words\n")
"""


def test_a_normal_exit_reaps_the_tee_after_it_forwarded_everything(tmp_path: Path) -> None:
    """No close(): the exit itself (atexit) puts stderr back and waits for the child, so
    the last line is on the original stderr as soon as the process is gone and no tee is
    left behind (an orphan for init to reap)."""
    err = tmp_path / "stderr"
    with err.open("wb") as sink:
        done = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], stderr=sink,
                              stdout=subprocess.PIPE, timeout=60, check=True)
    lines = err.read_bytes().decode().splitlines()  # at once: no waiting for a straggler
    assert lines[-1] == "last words" and len(lines) == 2001
    child = int(done.stdout.split()[0])
    assert not Path(f"/proc/{child}").exists(), "the tee child outlived its process"


LOST_SCRIPT = r"""
import json, os, signal, sys, time
from loraplane.shared.stderr_tee import StderrTee
lost = []
tee = StderrTee(lambda reason, n: None, lambda: lost.append(1))
tee.start()
sys.stderr.write("through the tee\n"); sys.stderr.flush()
time.sleep(0.2)
os.kill(tee._child.pid, signal.SIGKILL)
deadline = time.monotonic() + 10
while not lost and time.monotonic() < deadline:
    time.sleep(0.02)
sys.stderr.write("after the tee died\n"); sys.stderr.flush()
os.write(2, b"native after\n")
print(json.dumps({"lost": lost, "active": StderrTee.active() is not None,
                  "zombie": tee._child.returncode is None}))
"""


def test_a_dead_tee_gives_the_process_its_stderr_back(tmp_path: Path) -> None:
    """The child killed under a running process: stderr is the original again (the
    process's logs are not lost in a pipe nobody reads), on_lost is called, the child is
    reaped."""
    err = tmp_path / "stderr"
    with err.open("wb") as sink:
        done = subprocess.run([sys.executable, "-c", LOST_SCRIPT], stderr=sink,
                              stdout=subprocess.PIPE, timeout=60, check=True)
    assert json.loads(done.stdout) == {"lost": [1], "active": False, "zombie": False}
    assert err.read_bytes().decode().splitlines() == [
        "through the tee", "after the tee died", "native after"]
