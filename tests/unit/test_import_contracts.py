"""Import contracts of the product, read from the source (every import statement, also those
inside functions):

* ``policy`` imports no I/O library (it decides; services execute);
* the five services import only ``shared``, ``policy``, ``v1`` and themselves;
* ``shared``, ``policy``, ``v1`` and ``native`` (the compiled policy's builder and finder,
  imported by the package itself) import no service and no tooling room;
* nothing in the product imports ``tests``, ``benchmarks`` or ``devkit``.

No exception: an import statement anywhere in a file counts (inside a function too), and
so does ``importlib.import_module("...")`` / ``__import__("...")`` with a literal name.
The tooling rooms (``cli``, ``stack``, ``devkit``, ``sim``) may import the product.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SERVICES_DIR = Path(__file__).resolve().parents[2] / "services"
SERVICES = ("registry", "admission", "cache_manager", "worker", "gateway")
CORE = ("shared", "policy", "v1", "native")
TOOLING = ("cli", "stack", "devkit", "sim")
IO_LIBRARIES = frozenset({
    "aiokafka", "asyncpg", "grpc", "minio", "urllib3", "urllib", "http", "httpx", "requests",
    "aiohttp", "fastapi", "uvicorn", "starlette", "prometheus_client", "socket", "ssl",
    "subprocess", "asyncio", "sqlite3", "psycopg", "psycopg2", "boto3", "kafka", "vllm",
    "torch",
})
"""Libraries that reach a network, a process or an engine."""
DYNAMIC_IMPORTS = frozenset({"import_module", "__import__"})
"""Calls that import the module their first (literal) argument names."""


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
            if node.module == "loraplane":  # from loraplane import worker
                out.extend((node.lineno, f"loraplane.{a.name}") for a in node.names)
        elif isinstance(node, ast.Call) and node.args:
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            first = node.args[0]
            if (name in DYNAMIC_IMPORTS and isinstance(first, ast.Constant)
                    and isinstance(first.value, str)):
                out.append((node.lineno, first.value))
    return out


def _room(path: Path, root: Path = SERVICES_DIR) -> str:
    rel = path.relative_to(root)
    return rel.parts[0] if len(rel.parts) > 1 else ""


def _violations(path: Path, root: Path = SERVICES_DIR) -> list[tuple[str, str]]:
    """``(imported module, broken contract)`` for every import of ``path`` that breaks one."""
    room = _room(path, root)
    out: list[tuple[str, str]] = []
    for _, module in _imports(path):
        parts = module.split(".")
        top = parts[0]
        target = parts[1] if top == "loraplane" and len(parts) > 1 else ""
        if room in (*SERVICES, *CORE) and (top in ("tests", "benchmarks") or target == "devkit"):
            out.append((module, "the product imports no test, benchmark or devkit code"))
        elif room == "policy" and top in IO_LIBRARIES:
            out.append((module, "policy imports no I/O library"))
        elif room in SERVICES and target and target not in (*CORE, room):
            out.append((module, f"{room} imports only shared, policy, v1 and itself"))
        elif room in CORE and target and target not in CORE:
            out.append((module, f"{room} imports no service and no tooling"))
    return out


def _product_files() -> list[Path]:
    return sorted(p for p in SERVICES_DIR.rglob("*.py")
                  if _room(p) in (*SERVICES, *CORE) and _room(p) != "v1")


def test_every_room_is_classified() -> None:
    rooms = {p.name for p in SERVICES_DIR.iterdir()
             if p.is_dir() and not p.name.startswith((".", "_"))}
    assert rooms == {*SERVICES, *CORE, *TOOLING}, "a new room needs a place in the contracts"


@pytest.mark.parametrize("path", _product_files(),
                         ids=lambda p: str(p.relative_to(SERVICES_DIR)))
def test_imports_keep_the_contracts(path: Path) -> None:
    rel = str(path.relative_to(SERVICES_DIR))
    broken = [f"{module}: {rule}" for module, rule in _violations(path)]
    assert broken == [], f"{rel} breaks an import contract"


def test_the_checker_sees_what_it_forbids(tmp_path: Path) -> None:
    fake = tmp_path / "services"
    for room in ("policy", "worker", "shared"):
        (fake / room).mkdir(parents=True)
    (fake / "policy" / "x.py").write_text(
        "def f():\n    import aiokafka\n    from loraplane.worker import y\n", encoding="utf-8")
    (fake / "worker" / "y.py").write_text(
        "from loraplane import admission\nfrom tests.support import synth\n"
        "from loraplane.shared import codec\nfrom loraplane.worker.store import download\n"
        "def g():\n    from loraplane.devkit.builder import build_demo\n"
        "    importlib.import_module('benchmarks.gateway')\n    __import__('loraplane.v1')\n",
        encoding="utf-8")
    (fake / "shared" / "z.py").write_text("import loraplane.gateway.app\n", encoding="utf-8")
    assert [m for m, _ in _violations(fake / "policy" / "x.py", fake)] == [
        "aiokafka", "loraplane.worker"]
    assert [m for m, _ in _violations(fake / "worker" / "y.py", fake)] == [
        "loraplane.admission", "tests.support", "loraplane.devkit.builder",
        "benchmarks.gateway"]
    assert [m for m, _ in _violations(fake / "shared" / "z.py", fake)] == [
        "loraplane.gateway.app"]
