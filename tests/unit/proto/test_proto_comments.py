"""Every message, field, enum, enum value, service and rpc in proto/ has a comment."""

from __future__ import annotations

from pathlib import Path

import grpc_tools
import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[3]
PROTO_ROOT = ROOT / "proto"

# FileDescriptorProto field numbers / DescriptorProto field numbers used in source paths
_MESSAGE, _ENUM, _SERVICE = 4, 5, 6
_FIELD, _NESTED, _NESTED_ENUM = 2, 3, 4
_ENUM_VALUE, _METHOD = 2, 2


def _descriptor_set(tmp: Path) -> descriptor_pb2.FileDescriptorSet:
    out = tmp / "set.pb"
    files = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    well_known = Path(grpc_tools.__file__).resolve().parent / "_proto"
    code = protoc.main(
        [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{well_known}",
            "--include_source_info",
            f"--descriptor_set_out={out}",
            *files,
        ]
    )
    assert code == 0
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def _elements(fd: descriptor_pb2.FileDescriptorProto) -> list[tuple[tuple[int, ...], str]]:
    """(source path, human name) of every element that must be commented."""
    items: list[tuple[tuple[int, ...], str]] = []

    def enum(path: tuple[int, ...], e: descriptor_pb2.EnumDescriptorProto, prefix: str) -> None:
        items.append((path, f"enum {prefix}{e.name}"))
        for i, v in enumerate(e.value):
            items.append(((*path, _ENUM_VALUE, i), f"value {prefix}{e.name}.{v.name}"))

    def message(path: tuple[int, ...], m: descriptor_pb2.DescriptorProto, prefix: str) -> None:
        items.append((path, f"message {prefix}{m.name}"))
        for i, f in enumerate(m.field):
            items.append(((*path, _FIELD, i), f"field {prefix}{m.name}.{f.name}"))
        for i, n in enumerate(m.nested_type):
            if n.options.map_entry:  # synthesized by protoc for a map field: the field has the comment
                continue
            message((*path, _NESTED, i), n, f"{prefix}{m.name}.")
        for i, e in enumerate(m.enum_type):
            enum((*path, _NESTED_ENUM, i), e, f"{prefix}{m.name}.")

    for i, m in enumerate(fd.message_type):
        message((_MESSAGE, i), m, "")
    for i, e in enumerate(fd.enum_type):
        enum((_ENUM, i), e, "")
    for i, s in enumerate(fd.service):
        items.append(((_SERVICE, i), f"service {s.name}"))
        for j, rpc in enumerate(s.method):
            items.append(((_SERVICE, i, _METHOD, j), f"rpc {s.name}.{rpc.name}"))
    return items


def test_every_element_is_commented(tmp_path: Path) -> None:
    fds = _descriptor_set(tmp_path)
    ours = [f for f in fds.file if f.package == "loraplane.v1"]
    assert {f.name for f in ours} >= {
        "loraplane/v1/common.proto",
        "loraplane/v1/events.proto",
        "loraplane/v1/inference.proto",
        "loraplane/v1/worker.proto",
        "loraplane/v1/registry.proto",
        "loraplane/v1/cache.proto",
    }
    missing: list[str] = []
    checked = 0
    for fd in ours:
        comments = {
            tuple(loc.path): loc.leading_comments.strip() + loc.trailing_comments.strip()
            for loc in fd.source_code_info.location
        }
        for path, name in _elements(fd):
            checked += 1
            if not comments.get(path):
                missing.append(f"{fd.name}: {name}")
    assert checked > 300  # the walk really covers the contracts
    assert missing == [], "uncommented:\n" + "\n".join(missing)


@pytest.mark.parametrize("proto", sorted(p.name for p in (PROTO_ROOT / "loraplane/v1").glob("*")))
def test_proto_files_are_proto3_in_loraplane_v1(proto: str) -> None:
    text = (PROTO_ROOT / "loraplane" / "v1" / proto).read_text(encoding="utf-8")
    assert 'syntax = "proto3";' in text
    assert "package loraplane.v1;" in text
