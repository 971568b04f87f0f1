"""``loraplane canary``: bad input is refused before any call, naming the problem."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from loraplane.cli.main import app

ENV = {"LORAPLANE_REGISTRY_ADDR": "127.0.0.1:1", "LORAPLANE_REGISTRY_OPERATOR_TOKEN": "x" * 20}


@pytest.mark.parametrize(("args", "needle"), [
    (["frobnicate", "acme/code"], ("expected TENANT/NAME or one of status, pause, resume, "
                                  "abort, promote")),
    (["acme/code", "v2", "150"], "percent 150 is outside 0..100"),
    (["acme/code", "v2"], "PERCENT is required"),
    (["pause"], "canary pause: TENANT/NAME is required"),
    (["abort", "acme"], "'acme': expected TENANT/NAME"),
    (["status", "acme/code", "10"], "canary status takes TENANT/NAME only"),
])
def test_bad_canary_input_is_refused(args: list[str], needle: str) -> None:
    r = CliRunner().invoke(app, ["canary", *args], env=ENV)
    assert r.exit_code == 2, (args, r.stdout, r.stderr)
    assert needle in " ".join((r.stdout + r.stderr).replace("│", " ").split())


def test_status_names_what_each_automated_step_changed() -> None:
    from loraplane.registry.release_cli import step_change

    assert step_change({"action": "advance", "from_percent": 10, "to_percent": 50}) \
        == "10 → 50 %"
    assert step_change({"action": "rollback", "stable": {"version": "v2"},
                        "to_version": "v1"}) == "stable v2 → v1"
    assert step_change({"action": "withdraw", "stable": {"version": "v2"},
                        "to_version": ""}) == "stable v2 → withdrawn from HOT"
