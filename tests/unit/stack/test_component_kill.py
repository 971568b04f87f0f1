"""``Component.kill`` (the outage tests' SIGKILL): it returns once the component's ports
refuse connections, not merely once its pid stops counting as alive, so a ``start`` right
after finds them free. Real processes on loopback; the "socket outlives the pid" case is a
listener in another session, which the group kill does not reach (as a dying process's
last thread in disk I/O keeps its sockets after its leader is a zombie)."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from loraplane.stack.components import Component, StackError, port_in_use
from loraplane.stack.settings import StackSettings
from tests.support.ports import side_port_base

LISTEN = """
import os, socket, subprocess, sys, time
port, linger, pidfile = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
if linger > 0:  # the socket lives in another session, for `linger` seconds
    child = subprocess.Popen([sys.executable, "-c", sys.argv[4], str(port), str(linger)],
                             start_new_session=True)
    open(pidfile, "w").write(str(child.pid))
    time.sleep(3600)
s = socket.socket()
s.bind(("127.0.0.1", port))
s.listen()
time.sleep(3600)
"""

HOLD = """
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
time.sleep(float(sys.argv[2]))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Listener(Component):
    """A process listening on one port (``linger`` > 0: a process of another session
    holds the port for that long)."""

    name = "listener"

    def __init__(self, settings: StackSettings, port: int, linger_s: float = 0.0) -> None:
        super().__init__(settings)
        self.port, self.linger_s = port, linger_s
        self.holder_pidfile = settings.root / "holder.pid"

    def ports(self) -> dict[str, int]:
        return {"port": self.port}

    def command(self) -> list[str]:
        return [sys.executable, "-c", LISTEN, str(self.port), str(self.linger_s),
                str(self.holder_pidfile), HOLD]

    def healthy(self) -> bool:
        return port_in_use(self.port)

    def start_timeout_s(self) -> float:
        return 20.0

    def holder_pid(self) -> int | None:
        try:
            return int(self.holder_pidfile.read_text())
        except (OSError, ValueError):
            return None


@pytest.fixture
def settings(tmp_path: Path) -> StackSettings:
    return StackSettings(profile="test", port_base=side_port_base(4), data_dir=tmp_path)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def _ends_within(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _end_holder(comp: Listener) -> None:
    pid = comp.holder_pid()
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_kill_returns_with_the_port_closed_and_start_finds_it_free(
        settings: StackSettings) -> None:
    comp = Listener(settings, free_port())
    comp.start()
    try:
        assert comp.pid() is not None and port_in_use(comp.port)
        comp.kill()
        assert comp.pid() is None and not port_in_use(comp.port)
        assert comp.start()  # no "port already taken"
    finally:
        comp.stop()


def test_kill_waits_for_a_socket_that_outlives_the_pid(settings: StackSettings) -> None:
    comp = Listener(settings, free_port(), linger_s=5.0)
    comp.start()
    try:
        holder = comp.holder_pid()
        assert holder is not None and _alive(holder)  # serves the port past the group kill
        comp.kill()
        assert comp.pid() is None
        # it returned once the holder's socket was closed, not when the pid stopped counting
        assert not port_in_use(comp.port)
        # and that was the holder ending: it closes its files before the kernel marks it a
        # zombie, so a look at its state in between still sees it running; wait for it
        assert _ends_within(holder, 5.0)
    finally:
        _end_holder(comp)
        comp.stop()


def test_kill_names_a_port_still_served_after_its_bound(settings: StackSettings) -> None:
    comp = Listener(settings, free_port(), linger_s=60.0)
    comp.start()
    try:
        with pytest.raises(StackError, match=rf"{comp.port} \(port\) still accept"):
            comp.kill(ports_timeout_s=1.0)
    finally:
        _end_holder(comp)
        comp.stop()
