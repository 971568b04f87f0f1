"""services/v1 is exactly what scripts/gen_proto.py makes from proto/, reproducibly."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "gen_proto.py"


@pytest.fixture(scope="module")
def gen_proto() -> ModuleType:
    """scripts/gen_proto.py imported as a module."""
    spec = importlib.util.spec_from_file_location("gen_proto_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_is_fresh() -> None:
    """Fails when a .proto changed without `make proto` (runs the real --check mode)."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, f"stale generated code:\n{proc.stdout}{proc.stderr}"


def test_generation_is_byte_for_byte_reproducible(gen_proto: ModuleType, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    gen_proto.generate(a)
    gen_proto.generate(b)
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    expected = {"__init__.py"} | {
        f"{p.stem}{suffix}"
        for p in (ROOT / "proto" / "loraplane" / "v1").glob("*.proto")
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
    }
    assert set(names) == expected


def test_check_reports_changed_extra_and_missing(gen_proto: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "v1"
    shutil.copytree(ROOT / "services" / "v1", out, ignore=shutil.ignore_patterns("__pycache__"))
    assert gen_proto.check(out_dir=out) == []

    with (out / "events_pb2.py").open("a", encoding="utf-8") as fh:
        fh.write("# hand edit\n")
    (out / "old_pb2.py").write_text("# left over from a deleted proto\n", encoding="utf-8")
    (out / "cache_pb2.pyi").unlink()

    assert gen_proto.check(out_dir=out) == [
        "missing: cache_pb2.pyi",
        "extra: old_pb2.py",
        "changed: events_pb2.py",
    ]


def test_check_mode_exit_code_on_stale_tree(gen_proto: ModuleType, tmp_path: Path) -> None:
    """A .proto edit without regeneration makes --check fail and name the file."""
    proto_root = tmp_path / "proto"
    shutil.copytree(ROOT / "proto", proto_root)
    out = tmp_path / "v1"
    gen_proto.write(out_dir=out, proto_root=proto_root)
    assert gen_proto.check(out_dir=out, proto_root=proto_root) == []

    common = proto_root / "loraplane" / "v1" / "common.proto"
    common.write_text(
        common.read_text(encoding="utf-8") + "\n// A new message.\nmessage Added {}\n",
        encoding="utf-8",
    )
    stale = gen_proto.check(out_dir=out, proto_root=proto_root)
    assert "changed: common_pb2.py" in stale
    assert "changed: common_pb2.pyi" in stale

    gen_proto.write(out_dir=out, proto_root=proto_root)
    assert gen_proto.check(out_dir=out, proto_root=proto_root) == []


def test_broken_proto_fails_loudly(gen_proto: ModuleType, tmp_path: Path) -> None:
    proto_root = tmp_path / "proto"
    shutil.copytree(ROOT / "proto", proto_root)
    (proto_root / "loraplane" / "v1" / "broken.proto").write_text(
        'syntax = "proto3";\npackage loraplane.v1;\nmessage Broken { nonsense x = 1; }\n',
        encoding="utf-8",
    )
    with pytest.raises(RuntimeError, match="protoc failed"):
        gen_proto.generate(tmp_path / "out", proto_root)
