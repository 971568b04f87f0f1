"""A wheel built from the checkout, installed in a fresh venv outside it, finds its default
config and migrations (package resources, :mod:`loraplane.shared.resources`), starts every
service's ``--help`` (which names those files as they resolve in the venv) and holds no
test or bench code. Offline: the wheel is installed with ``--no-index --no-deps``; its
dependencies come from this venv's site-packages through a ``.pth`` file."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SERVICES = {  # module -> the shipped files its --help names
    "registry": {"migrations"},
    "admission": {"catalogue", "migrations"},
    "cache_manager": {"rules", "policy", "migrations"},
    "worker": {"policy"},
    "gateway": set(),
}
SHIPPED = re.compile(r"^  (\w+): +(/\S+)$", re.MULTILINE)

PROBE = """
import json, loraplane
from loraplane.admission.settings import AdmissionSettings
from loraplane.cache_manager.rules import DEFAULT_RULES_PATH, load_rules
from loraplane.policy.config import DEFAULT_CONFIG_PATH, load_config
from loraplane.registry.release_cli import default_catalogue
from loraplane.shared.migrations import MIGRATIONS_DIR, migration_files
load_rules(); load_config()
print(json.dumps({
    "package": loraplane.__file__,
    "policy": str(DEFAULT_CONFIG_PATH), "rules": str(DEFAULT_RULES_PATH),
    "catalogue": str(AdmissionSettings().admission_catalogue_path),
    "release_catalogue": str(default_catalogue()),
    "migrations": str(MIGRATIONS_DIR), "sql": len(migration_files()),
}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps",
                    "--no-build-isolation", "-q", "-w", str(work / "dist")],
                   check=True, cwd=work, timeout=300)
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    [wheel] = sorted((work / "dist").glob("loraplane-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-index", "--no-deps", str(wheel)], check=True, cwd=work, timeout=300)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([str(python), "-c", purelib], check=True, capture_output=True,
                               text=True).stdout.strip())
    (site / "zz_loraplane_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n",
                                                encoding="utf-8")
    return wheel


def test_the_installed_package_finds_its_config_and_migrations(installed: Path) -> None:
    venv = installed.parents[1] / "venv"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", PROBE], check=True,
                         capture_output=True, text=True, cwd=venv, timeout=120)
    found = json.loads(out.stdout)
    assert found["package"].startswith(str(venv)), found  # not the checkout's copy
    for key in ("policy", "rules", "catalogue", "release_catalogue", "migrations"):
        path = Path(found[key])
        assert path.is_relative_to(venv) and path.exists(), (key, found[key])
    assert found["sql"] == len(list((REPO / "migrations").glob("*.sql"))) > 0
    cli = subprocess.run([str(venv / "bin" / "python"), "-m", "loraplane.cli.main", "--help"],
                         check=False, capture_output=True, text=True, cwd=venv, timeout=120)
    assert cli.returncode == 0 and "stack" in cli.stdout, cli.stderr[-2000:]


def test_the_wheel_holds_no_test_or_bench_code(installed: Path) -> None:
    names = zipfile.ZipFile(installed).namelist()
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/"))]
    moved = ("registry/testing.py", "cache_manager/testing.py", "cache_manager/eventgen.py",
             "gateway/echo_worker.py", "admission/synth.py", "gateway/bench.py",
             "worker/bench_cold.py", "admission/bench.py", "registry/bench.py",
             "cache_manager/bench.py")
    assert not [n for n in names if n.removeprefix("loraplane/") in moved]


def _run_in_venv(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("LORAPLANE_") and k != "PYTHONPATH"}
    return subprocess.run([str(venv / "bin" / "python"), *args], check=False,
                          capture_output=True, text=True, cwd=venv, env=env, timeout=120)


def test_every_installed_service_answers_help_with_its_files_in_the_venv(
        installed: Path) -> None:
    venv = installed.parents[1] / "venv"
    calls = [(name, flag) for name in SERVICES for flag in ("--help", "--no-such-flag")]
    with ThreadPoolExecutor(len(calls)) as pool:
        results = dict(zip(calls, pool.map(
            lambda c: _run_in_venv(venv, "-m", f"loraplane.{c[0]}", c[1]), calls), strict=True))
    for name, labels in SERVICES.items():
        out = results[(name, "--help")]
        assert out.returncode == 0, (name, out.stderr[-2000:])
        text = out.stdout
        assert text.startswith(f"usage: python -m loraplane.{name}"), (name, text[:200])
        assert "LORAPLANE_KAFKA_BOOTSTRAP" in text and " = " in text, name
        assert not out.stderr, (name, out.stderr[-2000:])  # nothing started, nothing logged
        shipped = text.split("shipped defaults", 1)[1]
        found = dict(SHIPPED.findall(shipped))
        assert set(found) == labels, (name, found)
        for label, path in found.items():
            assert Path(path).is_relative_to(venv) and Path(path).exists(), (name, label, path)
        assert "[missing]" not in shipped, (name, shipped)
        if "migrations" in found:
            assert len(list(Path(found["migrations"]).glob("*.sql"))) == len(
                list((REPO / "migrations").glob("*.sql")))
        bad = results[(name, "--no-such-flag")]
        assert bad.returncode == 2, (name, bad.returncode, bad.stdout[-500:])
        assert "unrecognized arguments: --no-such-flag" in bad.stderr, (name, bad.stderr[-2000:])
