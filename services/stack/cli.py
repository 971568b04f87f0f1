"""``loraplane stack up|down|status``: the embedded local stack (no Docker)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from loraplane.stack.certs import COMPOSE_IDENTITIES, write_compose_pki
from loraplane.stack.settings import Profile, StackSettings
from loraplane.stack.stack import Stack, StackError
from loraplane.stack.supervisor import shell_assignments

app = typer.Typer(help="Embedded local stack: Tansu (Kafka), SeaweedFS (S3), PostgreSQL, Prometheus.",
                  no_args_is_help=True)

ProfileOpt = typer.Option("run", "--profile", help="run (make run) or test (make test)")
CertsOutOpt = typer.Option(Path("infra/pki"), "--out",
                           help="the directory docker-compose.yml mounts them from")
AclsOutOpt = typer.Option(None, "--out",
                          help="where to write it (default infra/kafka/init.sh, the file "
                          "docker-compose.yml's kafka-init service runs)")


def _stack(profile: str) -> Stack:
    if profile not in ("run", "test"):
        raise typer.BadParameter("profile must be run or test")
    p: Profile = "run" if profile == "run" else "test"
    return Stack(StackSettings(profile=p))


@app.command()
def up(profile: str = ProfileOpt) -> None:
    """Start every component and wait until each is healthy."""
    stack = _stack(profile)
    try:
        timings = stack.up(echo=True)
    except StackError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"stack up ({profile}) in {sum(timings.values()):.1f}s, data in {stack.settings.root}")


@app.command()
def down(profile: str = ProfileOpt) -> None:
    """Stop every component the stack started."""
    try:
        _stack(profile).down()
    except StackError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"stack down ({profile})")


@app.command()
def status(profile: str = ProfileOpt, as_json: bool = typer.Option(False, "--json")) -> None:
    """One line per component; exit 0 only when all are healthy."""
    health = _stack(profile).status()
    if as_json:
        typer.echo(json.dumps([h.__dict__ for h in health]))
    else:
        for h in health:
            typer.echo(f"{'ok  ' if h.healthy else 'DOWN'} {h.component:<11} {h.detail}")
    if not all(h.healthy for h in health):
        raise typer.Exit(1)


@app.command()
def env(profile: str = ProfileOpt) -> None:
    """Print the LORAPLANE_* variables that point clients at this stack, quoted for a
    shell (``eval "$(loraplane stack env)"``)."""
    typer.echo(shell_assignments(_stack(profile).settings.client_env()), nl=False)


@app.command()
def certs(out: Path = CertsOutOpt) -> None:
    """Write the CA and certificates docker-compose.yml mounts (Kafka, PostgreSQL, MinIO
    and every service; reused while valid for more than 7 days: run it again to renew)."""
    write_compose_pki(out)
    typer.echo(f"certificates for {', '.join(COMPOSE_IDENTITIES)} in {out}")


@app.command("kafka-acls")
def kafka_acls(out: Path | None = AclsOutOpt) -> None:
    """Write the script that creates the topics and each service's Kafka ACLs on
    docker-compose.yml's broker, from the one table loraplane.stack.kafka_acls.ACCESS."""
    from loraplane.stack.kafka_acls import INIT_SCRIPT, acls, write_init_script

    path = write_init_script(out or INIT_SCRIPT)
    typer.echo(f"{len(acls())} ACLs and the topics in {path}")
