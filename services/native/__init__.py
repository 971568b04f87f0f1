"""Compiled (mypyc) builds of the policy's hot modules, never shadowing an edited source.

The adaptive heat policy (:mod:`loraplane.policy.adaptive`) runs every simulated request and
every request the cache manager observes; compiled with mypyc it runs about twice as fast as
interpreted, with the same decisions (``tests/unit/policy/test_native.py``). The heat policy
(:mod:`loraplane.policy.heat`: the plan, most of a cache-manager round's CPU, and the plain
heat score online) is compiled with it; its classes take interpreted subclasses
(``mypyc_attr(allow_interpreted_subclasses=True)``: the tests' definitions and checked
variants), whose overrides of its methods run, but not of its static methods (a compiled
call of one is bound at compile time), and a compiled instance's methods cannot be replaced
(subclass instead). The build lives
outside the source tree, in ``<venv>/loraplane-native/<digest>/``, keyed by a digest of the
policy package's sources (every ``.py`` in it: mypyc reads the types of the modules the
compiled one imports), the Python version and mypyc's version. ``import loraplane`` calls
:func:`install`: when the build for the *current* sources exists, a finder placed first on
``sys.meta_path`` serves the compiled modules; otherwise (a source edited since the last
build, no build, ``LORAPLANE_NATIVE=0``) the interpreted modules load, unchanged. So an edit
can never run stale compiled code: it runs interpreted until the next build.

    python -m loraplane.native build    # what `make install` runs (a no-op when up to date)
    python -m loraplane.native status   # compiled or interpreted, and why

Every process that imports ``loraplane`` (the simulator, ``make bench-policy``, the cache
manager) takes the same choice, so they run the same code.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

COMPILED = ("loraplane.policy.adaptive", "loraplane.policy.heat")
"""Modules compiled with mypyc (the policy's hot loop online and the cache-manager's plan)."""
DIGESTED = ("policy",)
"""Sub-packages of ``loraplane`` whose sources key the build (the compiled modules' own)."""
ENV_SWITCH = "LORAPLANE_NATIVE"
"""``0`` / ``false`` / ``no``: never load compiled modules (the interpreted code runs)."""
ROOT_ENV = "LORAPLANE_NATIVE_DIR"
"""Overrides :func:`build_root`."""
_SOURCE = Path(__file__).resolve().parents[1]
"""The ``loraplane`` package directory (``services/`` in the checkout)."""
_KEEP = 3
"""Builds kept under the build root (older ones are removed after a build)."""
_DONE = "BUILT"
"""Marker written last into a complete build directory."""


def build_root() -> Path:
    """Where builds live: ``$LORAPLANE_NATIVE_DIR``, else inside the interpreter's prefix (the
    venv); never the sources."""
    where = os.environ.get(ROOT_ENV, "").strip()
    return Path(where) if where else Path(sys.prefix) / "loraplane-native"


def _mypyc_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mypy")
    except PackageNotFoundError:  # mypy not installed: no build can exist anyway
        return "none"


def digest(source: Path = _SOURCE, mypyc_version: str | None = None) -> str:
    """Key of the build for the sources under ``source`` (a ``loraplane`` package dir)."""
    h = hashlib.sha256()
    h.update(f"{sys.implementation.cache_tag} {mypyc_version or _mypyc_version()}\n".encode())
    h.update(("\n".join(COMPILED) + "\n").encode())
    for sub in DIGESTED:
        for path in sorted((source / sub).rglob("*.py")):
            h.update(path.relative_to(source).as_posix().encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:24]


def _disabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off")


def _extensions(directory: Path) -> dict[str, str]:
    """Module name -> extension file of every compiled module under ``directory``."""
    out: dict[str, str] = {}
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        for path in directory.rglob(f"*{suffix}"):
            rel = path.relative_to(directory).as_posix()[: -len(suffix)]
            out[rel.replace("/", ".")] = str(path)
    return out


class _Finder(importlib.abc.MetaPathFinder):
    """Serves the compiled modules of one build (first on ``sys.meta_path``)."""

    def __init__(self, modules: dict[str, str], build: Path) -> None:
        self.modules = modules
        self.build = build

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        where = self.modules.get(fullname)
        if where is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, where)
        return importlib.util.spec_from_file_location(fullname, where, loader=loader)


_state: dict[str, str] = {}


def install() -> bool:
    """Serve the compiled modules when the build for the current sources exists.

    Called by ``import loraplane``; True when compiled modules will load. Idempotent."""
    if _state:
        return _state["mode"] == "compiled"
    if _disabled():
        _state.update(mode="interpreted", why=f"{ENV_SWITCH}=0")
        return False
    key = digest()
    build = build_root() / key
    if not (build / _DONE).is_file():
        _state.update(
            mode="interpreted",
            why=f"no build for the current sources ({key}): make install builds it",
        )
        return False
    modules = _extensions(build)
    missing = [m for m in COMPILED if m not in modules]
    if missing:
        _state.update(mode="interpreted", why=f"build {key} lacks {', '.join(missing)}")
        return False
    sys.meta_path.insert(0, _Finder(modules, build))
    _state.update(mode="compiled", why=f"build {key}", build=str(build))
    return True


def status() -> str:
    """One line: which code runs in this process and why."""
    install()
    loaded = {m: sys.modules[m] for m in COMPILED if m in sys.modules}
    files = [
        f"{m}: {'compiled' if _is_compiled(mod) else 'interpreted'}" for m, mod in loaded.items()
    ]
    return f"{_state['mode']} ({_state['why']})" + (f"; {', '.join(files)}" if files else "")


def _is_compiled(module: ModuleType) -> bool:
    return str(getattr(module, "__file__", "")).endswith(
        tuple(importlib.machinery.EXTENSION_SUFFIXES)
    )


def is_compiled(name: str) -> bool:
    """Whether the loaded module ``name`` is a compiled build (imports it if needed)."""
    return _is_compiled(importlib.import_module(name))


def build(force: bool = False) -> Path:
    """Compile :data:`COMPILED` for the current sources into the build root (a no-op when that
    build exists); returns the build directory. Needs mypyc (mypy) and a C compiler."""
    key = digest()
    target = build_root() / key
    if (target / _DONE).is_file() and not force:
        return target
    from mypyc.build import mypycify  # the build only: mypy is a dev/test dependency
    from setuptools import setup  # type: ignore[import-untyped]

    build_root().mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=build_root()))
    try:
        # compile a snapshot of the sources: an edit during the build cannot slip in
        stage = work / "src" / "loraplane"
        stage.mkdir(parents=True)
        shutil.copy2(_SOURCE / "__init__.py", stage / "__init__.py")
        for sub in (*DIGESTED, "shared", "native"):
            shutil.copytree(
                _SOURCE / sub,
                stage / sub,
                ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"),
            )
        if digest(stage) != key:
            raise RuntimeError("the sources changed while they were copied: build again")
        out = work / "lib"
        files = [f"loraplane/{m.split('.', 1)[1].replace('.', '/')}.py" for m in COMPILED]
        cwd = os.getcwd()
        os.chdir(work / "src")
        try:
            setup(
                name="loraplane-native",
                ext_modules=mypycify(
                    [*files, "--follow-imports=silent"],
                    opt_level="3",
                    target_dir=str(work / "c"),
                    group_name="loraplane_native",
                ),
                script_args=[
                    "-q",
                    "build_ext",
                    "--build-lib",
                    str(out),
                    "--build-temp",
                    str(work / "tmp"),
                ],
            )
        finally:
            os.chdir(cwd)
        modules = _extensions(out)
        missing = [m for m in COMPILED if m not in modules]
        if missing:
            raise RuntimeError(f"mypyc built no {', '.join(missing)}")
        (out / _DONE).write_text(key + "\n", encoding="utf-8")
        try:
            out.rename(target)
        except OSError:
            if not (target / _DONE).is_file():  # not another build of the same sources
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _prune(keep=target)
    return target


def _prune(keep: Path) -> None:
    """Remove all but the newest :data:`_KEEP` complete builds (and never ``keep``)."""
    builds = sorted(
        (p for p in build_root().iterdir() if (p / _DONE).is_file() and p != keep),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in builds[_KEEP - 1 :]:
        shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m loraplane.native [build [--force] [--quiet] | status]``."""
    args = sys.argv[1:] if argv is None else argv
    command = args[0] if args else "status"
    if command == "build":
        fresh = not (build_root() / digest() / _DONE).is_file() or "--force" in args
        if fresh:
            print("loraplane.native: compiling the policy's hot modules with mypyc (~1 min)")
        where = build(force="--force" in args)
        if fresh or "--quiet" not in args:
            print(f"loraplane.native: {where}")
        return 0
    if command == "status":
        for m in COMPILED:
            importlib.import_module(m)
        print(status())
        return 0
    print("usage: python -m loraplane.native [build [--force] [--quiet] | status]", file=sys.stderr)
    return 2
