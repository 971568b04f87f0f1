"""Generate the Python protobuf/gRPC code of ``proto/loraplane/v1`` into ``services/v1``.

Run by ``make proto``. ``services/`` is the import package ``loraplane``, so the
generated modules import each other as ``loraplane.v1.<name>_pb2``.

Usage::

    .venv/bin/python scripts/gen_proto.py          # regenerate services/v1
    .venv/bin/python scripts/gen_proto.py --check  # exit 1 listing stale files

The output is reproducible: protoc runs on a sorted file list, nothing written
contains a timestamp, and ``services/v1`` is replaced as a whole (stale files
disappear).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE_DIR = Path("loraplane") / "v1"
OUT_DIR = ROOT / "services" / "v1"

INIT_TEXT = '''"""Generated protobuf and gRPC code for ``proto/loraplane/v1`` (do not edit).

Regenerate with ``make proto`` (``scripts/gen_proto.py``).
"""
'''


def proto_files(proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Return the .proto files of the package, sorted, relative to ``proto_root``."""
    return sorted(p.relative_to(proto_root) for p in (proto_root / PACKAGE_DIR).glob("*.proto"))


def generate(dest: Path, proto_root: Path = PROTO_ROOT) -> None:
    """Run protoc for every package proto and leave the modules flat in ``dest``.

    Raises ``RuntimeError`` (with protoc's exit code) when compilation fails.
    """
    import grpc_tools
    from grpc_tools import protoc  # imported lazily: only this script needs it

    well_known = Path(grpc_tools.__file__).resolve().parent / "_proto"
    files = proto_files(proto_root)
    if not files:
        raise RuntimeError(f"no .proto files under {proto_root / PACKAGE_DIR}")
    with tempfile.TemporaryDirectory(prefix="gen_proto_") as tmp:
        out = Path(tmp)
        args = [
            "grpc_tools.protoc",
            f"-I{proto_root}",
            f"-I{well_known}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            *(str(f) for f in files),
        ]
        code = protoc.main(args)
        if code != 0:
            raise RuntimeError(f"protoc failed with exit code {code}")
        dest.mkdir(parents=True, exist_ok=True)
        for produced in sorted((out / PACKAGE_DIR).iterdir()):
            shutil.copyfile(produced, dest / produced.name)
    (dest / "__init__.py").write_text(INIT_TEXT, encoding="utf-8")


def stale_files(current: Path, fresh: Path) -> list[str]:
    """Names that differ between ``current`` and ``fresh`` (missing, extra or changed)."""
    cur = {p.name for p in current.iterdir() if p.is_file()} if current.is_dir() else set()
    new = {p.name for p in fresh.iterdir() if p.is_file()}
    problems = [f"missing: {n}" for n in sorted(new - cur)]
    problems += [f"extra: {n}" for n in sorted(cur - new)]
    problems += [
        f"changed: {n}"
        for n in sorted(cur & new)
        if not filecmp.cmp(current / n, fresh / n, shallow=False)
    ]
    return problems


def check(out_dir: Path = OUT_DIR, proto_root: Path = PROTO_ROOT) -> list[str]:
    """Regenerate into a temporary directory and return the stale files of ``out_dir``."""
    with tempfile.TemporaryDirectory(prefix="gen_proto_check_") as tmp:
        fresh = Path(tmp) / "v1"
        generate(fresh, proto_root)
        return stale_files(out_dir, fresh)


def write(out_dir: Path = OUT_DIR, proto_root: Path = PROTO_ROOT) -> None:
    """Regenerate and replace ``out_dir`` as a whole."""
    with tempfile.TemporaryDirectory(prefix="gen_proto_new_", dir=out_dir.parent) as tmp:
        fresh = Path(tmp) / "v1"
        generate(fresh, proto_root)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        shutil.move(str(fresh), str(out_dir))


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="do not write; exit 1 and list the files of services/v1 that are stale",
    )
    ns = parser.parse_args(argv)
    if ns.check:
        problems = check()
        if problems:
            print("services/v1 is stale; run `make proto`:", file=sys.stderr)
            for line in problems:
                print(f"  {line}", file=sys.stderr)
            return 1
        print("services/v1 is up to date")
        return 0
    write()
    print(f"generated {OUT_DIR.relative_to(ROOT)} from {len(proto_files())} proto files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
