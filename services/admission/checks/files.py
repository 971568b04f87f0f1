"""File-set check: exactly a PEFT LoRA adapter, no pickle, no links, sizes under the limits.

An adapter directory holds ``adapter_config.json`` and ``adapter_model.safetensors``
(plus the signature ``model.sig`` when it is kept inside). Pickle files are refused by
name alone (:func:`classify_name` runs on object listings, before anything is
downloaded), symbolic links and special files by ``lstat`` without following them.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from loraplane.admission.problems import (
    FORBIDDEN_FILE,
    MISSING_FILE,
    SIZE_LIMIT,
    SYMLINK,
    Problem,
)
from loraplane.shared.signing import SIGNATURE_FILENAME

CONFIG_FILE = "adapter_config.json"
"""PEFT adapter configuration."""
WEIGHTS_FILE = "adapter_model.safetensors"
"""LoRA weights (safetensors only)."""
REQUIRED_FILES = (CONFIG_FILE, WEIGHTS_FILE)
"""Files every adapter must have."""
ALLOWED_FILES = frozenset({*REQUIRED_FILES, SIGNATURE_FILENAME})
"""The only names an adapter directory may hold."""
PICKLE_SUFFIXES = frozenset({
    ".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".dill", ".npy", ".npz",
    ".mar", ".pdparams",
})
"""Suffixes of formats that may execute code when loaded (refused unread)."""
SAFE_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
"""A file name that can be written into quarantine as is (no dots-only, no hidden files,
no separators, no escapes)."""


@dataclass(frozen=True, slots=True)
class SizeLimits:
    """Byte limits on an artifact (enforced while downloading and again on disk)."""

    max_file_bytes: int
    """Largest single file."""
    max_total_bytes: int
    """Largest sum of all files."""
    max_files: int = 8
    """Most objects an artifact root may list (anything more is refused unread)."""


def refuse_unread(name: str) -> Problem | None:
    """Refuse a relative file name that must never be fetched or opened, or return None.

    Pickle-format suffixes, nested paths and unsafe names (:data:`SAFE_NAME_RE`) are
    refused with ``FORBIDDEN_FILE`` by their text alone.
    """
    suffix = PurePosixPath(name).suffix.lower()
    if suffix in PICKLE_SUFFIXES:
        return Problem(FORBIDDEN_FILE, f"pickle-format file ({suffix}) refused unread", name)
    if "/" in name or "\\" in name:
        return Problem(FORBIDDEN_FILE, "nested path: an adapter is a flat directory", name)
    if not SAFE_NAME_RE.match(name):
        return Problem(FORBIDDEN_FILE, "unsafe file name", name[:128])
    return None


def classify_name(name: str) -> Problem | None:
    """Refuse a relative file name by its text alone (no I/O), or return None.

    :func:`refuse_unread` names, and any name outside :data:`ALLOWED_FILES`, are refused
    with ``FORBIDDEN_FILE``.
    """
    unread = refuse_unread(name)
    if unread is not None:
        return unread
    if name not in ALLOWED_FILES:
        return Problem(FORBIDDEN_FILE, "unexpected file (allowed: "
                       + ", ".join(sorted(ALLOWED_FILES)) + ")", name)
    return None


def check_sizes(sizes: dict[str, int], limits: SizeLimits) -> list[Problem]:
    """``SIZE_LIMIT`` problems for files (name → bytes) over the limits."""
    problems = [
        Problem(SIZE_LIMIT, f"{size} bytes > limit {limits.max_file_bytes}", name)
        for name, size in sorted(sizes.items())
        if size > limits.max_file_bytes
    ]
    total = sum(sizes.values())
    if total > limits.max_total_bytes:
        problems.append(Problem(SIZE_LIMIT, f"artifact totals {total} bytes > limit "
                                f"{limits.max_total_bytes}"))
    return problems


def check_files(
    adapter_dir: Path,
    limits: SizeLimits,
    *,
    refused: Collection[str] = (),
) -> list[Problem]:
    """Check the file set of ``adapter_dir`` without reading any file's content.

    ``refused`` names files that were refused before download (reported already, so
    not reported again as missing).
    """
    problems: list[Problem] = []
    sizes: dict[str, int] = {}
    adapter_dir = Path(adapter_dir)
    for dirpath, dirnames, filenames in os.walk(adapter_dir, followlinks=False):
        base = Path(dirpath)
        for name in sorted([*dirnames, *filenames]):
            path = base / name
            rel = PurePosixPath(path.relative_to(adapter_dir)).as_posix()
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                problems.append(Problem(SYMLINK, "symbolic link refused (not followed)", rel))
            elif stat.S_ISDIR(mode):
                problems.append(Problem(FORBIDDEN_FILE, "subdirectory in an adapter", rel))
            elif not stat.S_ISREG(mode):
                problems.append(Problem(FORBIDDEN_FILE, "not a regular file", rel))
            else:
                bad = classify_name(rel)
                if bad is not None:
                    problems.append(bad)
                sizes[rel] = path.lstat().st_size
        dirnames[:] = []  # nested directories are refused above, never entered
    for name in REQUIRED_FILES:
        if name not in sizes and name not in refused and not _is_link(adapter_dir / name):
            problems.append(Problem(MISSING_FILE, "required file is absent", name))
    problems.extend(check_sizes(sizes, limits))
    return problems


def _is_link(path: Path) -> bool:
    return path.is_symlink()
