"""``loraplane run`` and ``loraplane status``: the whole platform on the embedded stack."""

from __future__ import annotations

import typer

from loraplane.stack.settings import StackSettings
from loraplane.stack.supervisor import Supervisor, full_status, run_foreground

_seeded: dict[str, object] = {}


def _prepare(sup: Supervisor) -> None:
    from loraplane.stack.seed import seed_models

    _seeded["manifest"], _seeded["values"] = seed_models(sup.echo)


def _seed(sup: Supervisor) -> dict[str, str]:
    from loraplane.devkit.builder import DemoManifest
    from loraplane.stack.seed import seed_platform

    manifest = _seeded["manifest"]
    values = dict(_seeded["values"])  # type: ignore[call-overload]
    assert isinstance(manifest, DemoManifest)
    values.update(seed_platform(manifest, sup.env, sup.echo))
    return values


def run() -> None:
    """Start the stack and every service, seed the demo, serve until Ctrl-C / SIGTERM."""
    raise typer.Exit(run_foreground(_prepare, _seed))


def status(profile: str = typer.Option("run", "--profile")) -> None:
    """One line per component and service; exit 0 only when every one is healthy."""
    s = StackSettings(profile="test" if profile == "test" else "run")
    health = full_status(s)
    for h in health:
        typer.echo(f"{'ok  ' if h.healthy else 'DOWN'} {h.component:<18} {h.detail}")
    if not all(h.healthy for h in health):
        raise typer.Exit(1)
