"""``loraplane db migrate|rollback|status``: schema migrations with dbmate."""

from __future__ import annotations

import os

import typer

from loraplane.shared.migrations import MigrationError, dbmate, migration_files
from loraplane.stack.settings import StackSettings

app = typer.Typer(help="Database schema migrations (plain SQL, dbmate).", no_args_is_help=True)


def _dsn(profile: str) -> str:
    env = os.environ.get("LORAPLANE_POSTGRES_DSN")
    if env:
        return env
    return StackSettings(profile="test" if profile == "test" else "run").postgres_dsn


ProfileOpt = typer.Option("run", "--profile", help="stack profile used when LORAPLANE_POSTGRES_DSN is unset")


def _run(profile: str, *args: str) -> None:
    try:
        typer.echo(dbmate(_dsn(profile), *args))
    except MigrationError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc


@app.command()
def migrate(profile: str = ProfileOpt) -> None:
    """Apply every pending migration."""
    _run(profile, "up")


@app.command()
def rollback(
    profile: str = ProfileOpt,
    steps: int = typer.Option(1, min=1, help="how many migrations to roll back"),
    all_: bool = typer.Option(False, "--all", help="roll back every migration"),
) -> None:
    """Roll back the latest migration(s)."""
    n = len(migration_files()) if all_ else steps
    for _ in range(n):
        _run(profile, "rollback")


@app.command()
def status(profile: str = ProfileOpt) -> None:
    """Show applied and pending migrations."""
    _run(profile, "status")
