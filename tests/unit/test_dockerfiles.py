"""Every Dockerfile under infra/: multi-stage, pinned bases, non-root, nothing secret baked in.

Parsed here (no Docker needed): instructions with their continuation lines joined,
comments dropped, stages split at ``FROM``.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted(p for p in (ROOT / "infra").rglob("Dockerfile*")
                     if p.suffix != ".dockerignore")

EXACT_TAG = re.compile(r"^v?\d+\.\d+\.\d+")
"""A tag naming one release (``3.11.14-slim-bookworm``, ``v0.32.0``), not a moving line."""
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|PRIVATE|CREDENTIAL|_KEY$|_KEYS?_|DSN|API_KEY",
                         re.IGNORECASE)
DEV_DEFAULTS = ("loraplane-dev", "loraplane-minio-secret", "BEGIN ", "PRIVATE KEY",
                "://loraplane:loraplane@")
"""Values of the dev stack (settings defaults, compose) that must never be baked in."""
NEVER_COPIED = (".loraplane", "infra/keys", ".venv", ".git", ".env")
MUST_IGNORE = (".git", ".venv", ".loraplane", "infra/keys")


@dataclass
class Instruction:
    keyword: str
    args: str


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse(path: Path) -> tuple[list[Instruction], list[Stage]]:
    """Instructions before the first FROM (global ARGs) and the stages."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, f"{path.name}: dangling line continuation"
    preamble: list[Instruction] = []
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        ins = Instruction(keyword.upper(), args.strip())
        if ins.keyword == "FROM":
            words = [w for w in ins.args.split() if not w.startswith("--platform")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            assert len(words) in (1, 3), f"{path.name}: cannot read FROM {ins.args}"
            stages.append(Stage(words[0], name))
        elif stages:
            stages[-1].instructions.append(ins)
        else:
            preamble.append(ins)
    return preamble, stages


def split_image(image: str) -> tuple[str, str, str]:
    """``name:tag@digest`` -> (name, tag, digest); missing parts are ''."""
    ref, _, digest = image.partition("@")
    name, _, tag = ref.rpartition(":") if ":" in ref.rsplit("/", 1)[-1] else (ref, "", "")
    return name, tag, digest


def env_pairs(ins: Instruction) -> list[tuple[str, str]]:
    """``ENV A=1 B=2`` / ``ENV A 1`` / ``ARG A=1`` as (name, value) pairs."""
    words = shlex.split(ins.args)
    if ins.keyword == "ENV" and words and "=" not in words[0]:
        return [(words[0], " ".join(words[1:]))]
    return [(w.partition("=")[0], w.partition("=")[2]) for w in words]


@pytest.fixture(params=DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def dockerfile(request: pytest.FixtureRequest) -> Path:
    return request.param  # type: ignore[no-any-return]


def test_dockerfiles_found_and_compose_builds_only_them() -> None:
    assert DOCKERFILES, "no Dockerfile under infra/"
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    built = {(ROOT / s["build"]["dockerfile"]).resolve()
             for s in compose["services"].values() if "build" in s}
    assert built and built <= {p.resolve() for p in DOCKERFILES}, built


def test_multi_stage_and_the_last_stage_takes_from_an_earlier_one(dockerfile: Path) -> None:
    _, stages = parse(dockerfile)
    assert len(stages) >= 2, f"{dockerfile.name}: one stage"
    earlier = {s.name for s in stages[:-1] if s.name}
    sources = {m for ins in stages[-1].all("COPY")
               for m in re.findall(r"--from=(\S+)", ins.args)}
    assert sources and sources <= earlier, f"{dockerfile.name}: final stage copies {sources}"


def test_base_images_are_pinned_by_exact_tag(dockerfile: Path) -> None:
    _, stages = parse(dockerfile)
    names: set[str] = set()
    for stage in stages:
        if stage.image not in names:
            assert "$" not in stage.image, f"{dockerfile.name}: FROM {stage.image} (build arg)"
            _, tag, digest = split_image(stage.image)
            assert tag and tag != "latest" and EXACT_TAG.match(tag), (
                f"{dockerfile.name}: {stage.image} is not pinned to one release")
            assert not digest or DIGEST.match(digest), f"{dockerfile.name}: bad digest {digest}"
        if stage.name:
            names.add(stage.name)


def test_runs_as_a_numeric_non_root_user(dockerfile: Path) -> None:
    _, stages = parse(dockerfile)
    final = stages[-1]
    users = final.all("USER")
    assert users, f"{dockerfile.name}: the final stage sets no USER (runs as root)"
    user = users[-1].args.split(":")[0]
    # Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
    assert user.isdigit() and int(user) >= 1000, f"{dockerfile.name}: USER {users[-1].args}"
    last_user = max(i for i, ins in enumerate(final.instructions) if ins.keyword == "USER")
    after = [ins.keyword for ins in final.instructions[last_user:]]
    assert "RUN" not in after, f"{dockerfile.name}: RUN after the last USER runs as that user"


def test_no_secrets_or_dev_defaults_baked_in(dockerfile: Path) -> None:
    preamble, stages = parse(dockerfile)
    instructions = preamble + [ins for s in stages for ins in s.instructions]
    for ins in instructions:
        if ins.keyword in ("ENV", "ARG"):
            for name, value in env_pairs(ins):
                assert not SECRET_NAME.search(name), f"{dockerfile.name}: {ins.keyword} {name}"
                assert not any(d in value for d in DEV_DEFAULTS), (
                    f"{dockerfile.name}: {ins.keyword} {name}={value}")
        if ins.keyword in ("COPY", "ADD"):
            words = [w for w in ins.args.split() if not w.startswith("--")]
            for src in words[:-1]:
                assert src not in (".", "./", "*"), f"{dockerfile.name}: copies the whole context"
                assert not any(src.lstrip("./").startswith(n) for n in NEVER_COPIED), (
                    f"{dockerfile.name}: copies {src}")
                assert not src.endswith((".pem", ".key", ".pub")), f"{dockerfile.name}: {src}"
        if ins.keyword == "RUN":
            assert not any(d in ins.args for d in DEV_DEFAULTS), f"{dockerfile.name}: {ins.args}"


def test_context_ignores_local_state_and_keys(dockerfile: Path) -> None:
    ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
    assert ignore.exists(), f"{ignore.name} missing"
    patterns = {line.strip().rstrip("/") for line in ignore.read_text().splitlines()
                if line.strip() and not line.startswith("#")}
    missing = [p for p in MUST_IGNORE if p not in patterns]
    assert not missing, f"{ignore.name} lets {missing} into the build context"


def test_entrypoint_is_exec_form(dockerfile: Path) -> None:
    _, stages = parse(dockerfile)
    entry = stages[-1].all("ENTRYPOINT")
    assert entry, f"{dockerfile.name}: no ENTRYPOINT"
    # Exec form: the service is PID 1 and receives SIGTERM (graceful drain).
    assert isinstance(json.loads(entry[-1].args), list)


def test_parser_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim\nENV LORAPLANE_S3_SECRET_KEY=loraplane-dev-secret\n"
                   "COPY . /app\nUSER root\nENTRYPOINT python -m x\n")
    _, stages = parse(bad)
    assert len(stages) == 1
    _, tag, _ = split_image(stages[0].image)
    assert not EXACT_TAG.match(tag)  # "3.11-slim" names a moving line, not a release
    env = env_pairs(stages[0].all("ENV")[0])
    assert env == [("LORAPLANE_S3_SECRET_KEY", "loraplane-dev-secret")]
    assert SECRET_NAME.search(env[0][0])
    assert split_image("vllm/vllm-openai:v0.32.0") == ("vllm/vllm-openai", "v0.32.0", "")
    assert split_image("localhost:5000/x@sha256:" + "a" * 64)[1] == ""
