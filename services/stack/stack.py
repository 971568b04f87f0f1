"""Bring the whole embedded stack up or down, in dependency order."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass

from loraplane.stack.components import (
    Component,
    Health,
    Postgres,
    Prometheus,
    SeaweedFS,
    StackError,
    Tansu,
)
from loraplane.stack.services import scrape_targets
from loraplane.stack.settings import StackSettings

__all__ = ["MARKER", "Stack", "StackError"]

MARKER = ".loraplane-stack"
"""File :meth:`Stack.up` writes in the data directory: :meth:`Stack.wipe` deletes only a
directory that holds it (or nothing at all)."""


@dataclass
class Stack:
    """SeaweedFS (S3) first, then Tansu (stores its log in S3), PostgreSQL, Prometheus;
    with ``tls`` PostgreSQL (and with ``s3_tls`` S3) serve TLS only, each component
    writing the dev CA and its certificate first when missing."""

    settings: StackSettings

    def __post_init__(self) -> None:
        s = self.settings
        self.seaweedfs = SeaweedFS(s)
        self.tansu = Tansu(s)
        self.postgres = Postgres(s)
        self.prometheus = Prometheus(s, scrape_targets(s))

    @property
    def components(self) -> list[Component]:
        return [self.seaweedfs, self.tansu, self.postgres, self.prometheus]

    def up(self, echo: bool = False) -> dict[str, float]:
        """Start every component (idempotent); returns seconds per component.

        On failure only the components this call started are stopped again: one that was
        already running (a serving ``make run``, say) is left running.
        """
        timings: dict[str, float] = {}
        started: list[Component] = []
        root = self.settings.root
        root.mkdir(parents=True, exist_ok=True)
        (root / MARKER).write_text("data directory of a loraplane embedded stack\n")
        try:
            for comp in self.components:
                t0 = time.monotonic()
                if comp.start():
                    started.append(comp)
                timings[comp.name] = time.monotonic() - t0
                if echo:
                    print(f"  {comp.name:<11} up in {timings[comp.name]:.1f}s", flush=True)
        except Exception:
            for comp in reversed(started):
                comp.stop()
            raise
        return timings

    def down(self) -> None:
        """Stop every component, reverse order (services left behind by a killed supervisor first)."""
        errors: list[str] = []
        self._stop_orphan_services()
        for comp in reversed(self.components):
            try:
                comp.stop()
            except Exception as exc:  # noqa: BLE001 - keep stopping the rest
                errors.append(f"{comp.name}: {exc}")
        if errors:
            raise StackError("; ".join(errors))

    def wipe(self) -> None:
        """Stop the stack and delete its data (a fresh start: the test session, the stress
        run). Refuses, naming it, a data directory that holds files but not :data:`MARKER`:
        ``LORAPLANE_STACK_DATA_DIR`` pointed at a folder the stack never made (a home, a
        checkout) is not deleted."""
        root = self.settings.root
        ours = (root / MARKER).exists() or all(  # or laid out by a stack before the marker
            (root / sub).is_dir() for sub in ("logs", "run"))
        if root.exists() and any(root.iterdir()) and not ours:
            raise StackError(
                f"refusing to wipe {root}: it holds files and is not a stack data directory "
                f"(no {MARKER}); set LORAPLANE_STACK_DATA_DIR to a new or empty directory")
        self.down()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(self.postgres.dir, ignore_errors=True)

    def _stop_orphan_services(self) -> None:
        run_dir = self.settings.root / "run"
        for pidfile in sorted(run_dir.glob("svc-*.pid")) if run_dir.is_dir() else []:
            orphan = Component(self.settings)
            orphan.name = pidfile.stem
            orphan.pidfile = pidfile
            orphan.stop()

    def status(self) -> list[Health]:
        return [comp.health() for comp in self.components]
