"""Stack control: health per component, clear errors for taken ports and missing binaries."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from loraplane.stack.components import Prometheus, SeaweedFS, StackError
from loraplane.stack.settings import StackSettings
from loraplane.stack.stack import MARKER, Stack
from tests.support.ports import side_port_base


def test_status_reports_every_component_healthy(stack: Stack) -> None:
    health = stack.status()
    assert [h.component for h in health] == ["seaweedfs", "tansu", "postgres", "prometheus"]
    assert all(h.healthy for h in health), health
    # what a later wipe needs to know the directory is the stack's own
    assert (stack.settings.root / MARKER).is_file()


def test_taken_port_names_the_component(tmp_path: Path) -> None:
    s = StackSettings(profile="test", port_base=side_port_base(1), data_dir=tmp_path)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", s.s3_port))
        sock.listen(1)
        with pytest.raises(StackError, match=rf"seaweedfs: port {s.s3_port} \(s3_port\) is already taken"):
            SeaweedFS(s).start()


def test_missing_binary_names_the_component(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = StackSettings(profile="test", port_base=side_port_base(2), data_dir=tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    comp = Prometheus(s)
    monkeypatch.setattr(comp, "command", lambda: [str(tmp_path / "no-such-prometheus")])
    with pytest.raises(StackError, match="prometheus: binary .*no-such-prometheus not found"):
        comp.start()


def test_duplicate_ports_are_refused() -> None:
    # the S3 port of the session's own port base (LORAPLANE_STACK_PORT_BASE may move it)
    taken = StackSettings(profile="test").s3_port
    with pytest.raises(ValueError, match=f"port {taken} is used twice"):
        StackSettings(profile="test", kafka_port=taken)


def test_failing_stack_up_leaves_running_components_running(tmp_path: Path) -> None:
    """`stack up` that fails (a taken port) stops only what it started itself."""
    s = StackSettings(profile="test", port_base=side_port_base(3), data_dir=tmp_path)
    st = Stack(s)
    try:
        for comp in (st.seaweedfs, st.tansu, st.postgres):
            assert comp.start() is True
        pids = {c.name: c.pid() for c in (st.seaweedfs, st.tansu, st.postgres)}
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", s.prometheus_port))
            sock.listen(1)
            with pytest.raises(StackError, match=r"prometheus: port \d+ \(prometheus_port\)"):
                st.up()
        after = {h.component: h for h in st.status()}
        for name, pid in pids.items():
            assert after[name].healthy, after[name]
            assert getattr(st, name).pid() == pid  # the very same process, not a restart
        assert not after["prometheus"].healthy
        assert st.seaweedfs.start() is False  # already running: nothing started
    finally:
        st.down()
    assert all(not h.healthy for h in st.status())
