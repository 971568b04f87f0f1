"""demo.env and ``loraplane stack env`` read back by a real shell, value for value.

The README points a shell at the platform with ``set -a; . .loraplane/demo.env; set +a`` and
``scripts/with_stack.sh`` (``make bench-cache``, ``make bench-registry``) with
``eval "$(loraplane stack env)"``. The database DSN carries ``?sslmode=verify-full&
sslrootcert=...``: written unquoted, the shell ran ``LORAPLANE_POSTGRES_DSN=...`` in the
background at the ``&``, the variable never reached the environment, and the bench connected
to the default port of another stack (connection refused at 127.0.0.1:19001).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from loraplane.stack.settings import StackSettings
from loraplane.stack.supervisor import read_env_file, shell_assignments, write_env_file
from tests.support.ports import side_port_base

DUMP = "import json, os; print(json.dumps({k: v for k, v in os.environ.items() if k.startswith('LPT_') or k.startswith('LORAPLANE_')}))"

AWKWARD = {
    "LPT_DSN": "postgresql://u:p@127.0.0.1:1/db?sslmode=verify-full&sslrootcert=/a b/ca.pem",
    "LPT_PLAIN": "127.0.0.1:19002",
    "LPT_QUOTE": "it's \"quoted\"",
    "LPT_SHELL": "$HOME `id` $(id) ; | > < * ~ #",
    "LPT_EMPTY": "",
    "LPT_LINES": "two\nlines",
    "LPT_UNICODE": "modèle/ünï",
}


def _shell_env(script: str, *args: str) -> dict[str, str]:
    """The ``LPT_*`` / ``LORAPLANE_*`` environment a bash ``script`` leaves (args as $1...)."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("LPT_", "LORAPLANE_"))}
    out = subprocess.run(
        ["bash", "-c", f'{script}\nexec "$PYTHON" -c "$DUMP"', "bash", *args],
        env={**clean, "PYTHON": sys.executable, "DUMP": DUMP},
        capture_output=True, text=True, check=True, timeout=60,
    )
    values: dict[str, str] = json.loads(out.stdout)
    return values


def test_a_sourced_env_file_gives_the_shell_every_value_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "demo.env"
    write_env_file(path, AWKWARD)
    assert _shell_env('set -a; . "$1"; set +a', str(path)) == AWKWARD
    assert read_env_file(path) == AWKWARD  # the tests' reader agrees with the shell


def test_a_plain_value_stays_unquoted() -> None:
    assert shell_assignments({"A": "127.0.0.1:19002", "B": "/x/y.pem"}) == (
        "A=127.0.0.1:19002\nB=/x/y.pem\n")


def test_stack_env_evaluated_by_a_shell_points_at_that_stack(tmp_path: Path) -> None:
    """`eval "$(loraplane stack env)"`, as scripts/with_stack.sh runs it, exports the stack's
    TLS DSN whole (the CLI as a process: its own settings from the environment)."""
    port_base = side_port_base(7)
    env = {**os.environ, "LORAPLANE_STACK_PORT_BASE": str(port_base),
           "LORAPLANE_STACK_DATA_DIR": str(tmp_path)}
    cli = Path(sys.executable).with_name("loraplane")
    printed = subprocess.run([str(cli), "stack", "env"], env=env, capture_output=True,
                             text=True, check=True, timeout=120).stdout
    expected = StackSettings(profile="run", port_base=port_base,
                             data_dir=tmp_path).client_env()
    assert "&" in expected["LORAPLANE_POSTGRES_DSN"]  # the case that broke
    assert _shell_env('set -a; eval "$1"; set +a', printed) == expected
