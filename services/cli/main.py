"""The ``loraplane`` command: operator and CI entry point.

Each sub-command lives in its own module next to the code it drives; this file
only assembles them. Connection settings and credentials come from
``LORAPLANE_*`` environment variables (``set -a; . .loraplane/demo.env``).
"""

from __future__ import annotations

import typer

from loraplane.cache_manager.cli import app as cache_app
from loraplane.cli.db import app as db_app
from loraplane.cli.golden import app as golden_app
from loraplane.cli.run import run as run_cmd
from loraplane.cli.run import status as status_cmd
from loraplane.devkit.cli import app as demo_app
from loraplane.gateway.cli import generate as generate_cmd
from loraplane.registry.release_cli import app as registry_app
from loraplane.sim.cli import sim_cmd, trace_app
from loraplane.stack.cli import app as stack_app

app = typer.Typer(
    name="loraplane",
    help="loraplane: serve hundreds of LoRA adapters for many tenants on shared base models.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(stack_app, name="stack")
app.add_typer(demo_app, name="demo")
app.add_typer(db_app, name="db")
app.command("run")(run_cmd)
app.command("status")(status_cmd)
app.command("generate")(generate_cmd)
app.add_typer(registry_app)  # release, tenants, keys, adapters, promote, canary, ...
app.command("sim")(sim_cmd)
app.add_typer(trace_app, name="trace")
app.add_typer(cache_app, name="cache")
app.add_typer(golden_app, name="golden")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
