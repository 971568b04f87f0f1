"""File-set check: exact set, pickle refused by name, links and subdirectories refused, sizes."""

from __future__ import annotations

import builtins
import io
import os
from pathlib import Path
from typing import Any

import pytest

from loraplane.admission.checks.files import SizeLimits, check_files, check_sizes, classify_name
from loraplane.admission.problems import (
    FORBIDDEN_FILE,
    MISSING_FILE,
    SIZE_LIMIT,
    SYMLINK,
    codes_of,
)

LIMITS = SizeLimits(max_file_bytes=1000, max_total_bytes=1500)


def _dir(tmp_path: Path, files: dict[str, bytes]) -> Path:
    d = tmp_path / "a"
    d.mkdir()
    for name, data in files.items():
        (d / name).write_bytes(data)
    return d


OK = {"adapter_config.json": b"{}", "adapter_model.safetensors": b"x" * 100}


def test_exact_set_passes(tmp_path: Path) -> None:
    assert check_files(_dir(tmp_path, {**OK, "model.sig": b"{}"}), LIMITS) == []


@pytest.mark.parametrize("name", ["adapter_model.bin", "weights.pt", "x.pth", "a.pkl",
                                  "a.PICKLE", "a.ckpt", "a.npz", "a.joblib"])
def test_pickle_refused_by_name(name: str) -> None:
    p = classify_name(name)
    assert p is not None and p.code == FORBIDDEN_FILE and "pickle" in p.message


def test_pickle_is_never_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _dir(tmp_path, OK)
    (d / "adapter_model.bin").write_bytes(b"\x80\x04 not read")
    real_open = io.open

    def guarded_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        assert not str(file).endswith(".bin"), "a pickle file was opened"
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(io, "open", guarded_open)
    monkeypatch.setattr(builtins, "open", guarded_open)
    problems = check_files(d, LIMITS)
    assert [(p.code, p.path) for p in problems] == [(FORBIDDEN_FILE, "adapter_model.bin")]


@pytest.mark.parametrize("name", ["README.md", "tokenizer.json", "adapter_model.py"])
def test_unexpected_files_refused(name: str) -> None:
    p = classify_name(name)
    assert p is not None and p.code == FORBIDDEN_FILE and "unexpected" in p.message


@pytest.mark.parametrize("name", ["sub/adapter_model.safetensors", "../x", "a\\b", "..", ".",
                                  "", ".hidden", "x\x00", "a b", "-rf"])
def test_nested_and_unsafe_names_refused(name: str) -> None:
    p = classify_name(name)
    assert p is not None and p.code == FORBIDDEN_FILE


def test_symlink_refused_and_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"y" * 10_000)  # would break the size limit if followed
    d = _dir(tmp_path, {"adapter_config.json": b"{}"})
    os.symlink(secret, d / "adapter_model.safetensors")
    problems = check_files(d, LIMITS)
    assert [(p.code, p.path) for p in problems] == [(SYMLINK, "adapter_model.safetensors")]


def test_dangling_symlink_and_subdirectory(tmp_path: Path) -> None:
    d = _dir(tmp_path, OK)
    os.symlink("/nonexistent", d / "model.sig")
    (d / "extra").mkdir()
    (d / "extra" / "adapter_model.bin").write_bytes(b"never looked at")
    problems = check_files(d, LIMITS)
    assert {(p.code, p.path) for p in problems} == {(SYMLINK, "model.sig"),
                                                   (FORBIDDEN_FILE, "extra")}


def test_missing_required_files(tmp_path: Path) -> None:
    problems = check_files(_dir(tmp_path, {"model.sig": b"{}"}), LIMITS)
    assert {(p.code, p.path) for p in problems} == {
        (MISSING_FILE, "adapter_config.json"), (MISSING_FILE, "adapter_model.safetensors")}


def test_refused_files_are_not_reported_missing_again(tmp_path: Path) -> None:
    d = _dir(tmp_path, {"adapter_config.json": b"{}"})
    assert check_files(d, LIMITS, refused={"adapter_model.safetensors"}) == []


def test_size_limits_per_file_and_total(tmp_path: Path) -> None:
    d = _dir(tmp_path, {"adapter_config.json": b"x" * 900,
                        "adapter_model.safetensors": b"x" * 1001})
    problems = check_files(d, LIMITS)
    assert codes_of(problems) == {SIZE_LIMIT}
    assert [p.path for p in problems] == ["adapter_model.safetensors", ""]


def test_check_sizes_at_the_limit_passes() -> None:
    assert check_sizes({"a": 1000, "b": 500}, LIMITS) == []
    assert check_sizes({"a": 1000, "b": 501}, LIMITS)[0].message.startswith("artifact totals")
