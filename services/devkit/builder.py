"""Build (once, cached) the tiny base model, the demo adapters and the dev key.

``build_demo(root)`` is idempotent: when ``root`` already holds a complete
build whose build stamp (a hash of every builder parameter and the versions of
the libraries that write the files) matches, it returns that build's manifest
without touching anything. Otherwise it builds into a temporary sibling
directory and renames it into place, under an exclusive file lock, so readers
never see a half-written tree and concurrent builders do the work once.

Layout under ``root`` (default ``<repo>/.loraplane/models``)::

    demo-manifest.json                      the DemoManifest (paths relative to root)
    keys/dev-signing.key, dev-signing.pub   EC P-256 dev key pair (DEV ONLY)
    base/tiny-llama/                        config.json, model.safetensors, tokenizer*.json
    adapters/<tenant>/<name>/<version>/     adapter_config.json, adapter_model.safetensors,
                                            model.sig
    system/zero/                            the all-zero rank-8 adapter (signed)
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    PlainSerializer,
    SerializationInfo,
    ValidationInfo,
)

from loraplane.devkit.adapters import (
    DEMO_ADAPTERS,
    LORA_INIT_STD,
    ZERO_ADAPTER,
    AdapterSpec,
    build_adapter,
)
from loraplane.devkit.corpus import CORPUS
from loraplane.devkit.keys import write_dev_keys
from loraplane.devkit.model import MODEL_NAME, TinyLlamaShape, build_base_model
from loraplane.devkit.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS, VOCAB_SIZE
from loraplane.shared.resources import state_dir
from loraplane.shared.signing import sign_directory

BUILDER_VERSION = "1"
"""Bump when the builder's output changes for reasons the stamp cannot see."""
DEFAULT_SEED = 20261101
"""Seed of every random choice in the build."""
MANIFEST_NAME = "demo-manifest.json"
"""File (written last) that marks a complete build."""
_STAMPED_PACKAGES = ("torch", "transformers", "peft", "tokenizers", "safetensors", "model-signing")


def repo_root() -> Path:
    """The checkout this package lives in (``services/`` is the ``loraplane`` package)."""
    return Path(__file__).resolve().parents[2]


def default_root() -> Path:
    """``models/`` under the state root (:func:`loraplane.shared.resources.state_dir`)."""
    return state_dir() / "models"


# --------------------------------------------------------------------------- manifest


def _from_root(value: Path, info: ValidationInfo) -> Path:
    root = (info.context or {}).get("root")
    return Path(root) / value if root is not None and not value.is_absolute() else value


def _to_root(value: Path, info: SerializationInfo) -> str:
    root = (info.context or {}).get("root")
    if root is not None:
        with contextlib.suppress(ValueError):
            return value.relative_to(root).as_posix()
    return str(value)


RootPath = Annotated[Path, AfterValidator(_from_root), PlainSerializer(_to_root)]
"""A path stored relative to the build root and loaded as an absolute path."""


class KeyPair(BaseModel):
    """The dev signing key pair."""

    model_config = ConfigDict(frozen=True)

    private_key: RootPath
    """PEM PKCS#8 private key (DEV ONLY)."""
    public_key: RootPath
    """PEM public key: the trusted key for demo artifacts."""
    identity: str
    """Signer identity, ``key:sha256:<hex>``."""


class BaseModelArtifact(BaseModel):
    """The built base model."""

    model_config = ConfigDict(frozen=True)

    name: str
    """``loraplane/tiny-llama``."""
    dir: RootPath
    """Directory vLLM / transformers load (config, weights, tokenizer)."""
    tokenizer_revision: str
    """sha256 hex of ``tokenizer.json``."""
    size_bytes: int
    """Total size of the directory's files."""


class AdapterArtifact(BaseModel):
    """One built, signed adapter version."""

    model_config = ConfigDict(frozen=True)

    tenant: str
    name: str
    version: str
    base_model: str
    dir: RootPath
    """Directory with adapter_config.json, adapter_model.safetensors, model.sig."""
    rank: int
    alpha: int
    target_modules: tuple[str, ...]
    size_bytes: int
    """Size of the signed files (the signature excluded)."""
    manifest_digest: str
    """The registry's ``sha256`` (see ``loraplane.shared.signing.manifest_digest``)."""
    signature_path: RootPath
    signer_identity: str


class DemoManifest(BaseModel):
    """Everything ``build_demo`` produced, with absolute paths."""

    model_config = ConfigDict(frozen=True)

    root: Path
    """The build root (not stored in the file; set on load)."""
    build_stamp: str
    """sha256 of the builder parameters (see :func:`build_stamp`)."""
    build_seconds: float
    """Wall time the build took (0 when not measured)."""
    base_model: BaseModelArtifact
    adapters: tuple[AdapterArtifact, ...]
    """The demo adapter versions, in :data:`DEMO_ADAPTERS` order."""
    zero_adapter: AdapterArtifact
    """All-zero rank-8 adapter for serving the base model through the LoRA path."""
    keys: KeyPair

    def adapter(self, tenant: str, name: str, version: str | None = None) -> AdapterArtifact:
        """The adapter ``tenant/name`` at ``version`` (default: the latest version)."""
        found = [
            a
            for a in self.adapters
            if a.tenant == tenant and a.name == name and (version is None or a.version == version)
        ]
        if not found:
            raise KeyError(f"{tenant}/{name}@{version or 'latest'}")
        return max(found, key=lambda a: a.version)

    def files(self) -> list[Path]:
        """Every file the manifest names (for completeness checks)."""
        paths = [
            self.keys.private_key,
            self.keys.public_key,
            self.base_model.dir / "config.json",
            self.base_model.dir / "model.safetensors",
            self.base_model.dir / "tokenizer.json",
        ]
        for a in (*self.adapters, self.zero_adapter):
            paths += [
                a.dir / "adapter_config.json",
                a.dir / "adapter_model.safetensors",
                a.signature_path,
            ]
        return paths

    def write(self, root: Path) -> None:
        """Write to ``root/demo-manifest.json`` with paths relative to ``root``."""
        text = self.model_dump_json(indent=2, exclude={"root"}, context={"root": self.root})
        (root / MANIFEST_NAME).write_text(text + "\n", encoding="utf-8")

    @classmethod
    def read(cls, root: Path) -> DemoManifest:
        """Load ``root/demo-manifest.json``; paths become absolute under ``root``."""
        data = json.loads((root / MANIFEST_NAME).read_text(encoding="utf-8"))
        return cls.model_validate({**data, "root": str(root)}, context={"root": root})


# --------------------------------------------------------------------------- stamp


def build_parameters(seed: int = DEFAULT_SEED) -> dict[str, Any]:
    """Everything the build output depends on."""
    versions = {p: importlib.metadata.version(p) for p in _STAMPED_PACKAGES}
    return {
        "builder_version": BUILDER_VERSION,
        "seed": seed,
        "model_name": MODEL_NAME,
        "shape": TinyLlamaShape().as_dict(),
        "tokenizer": {
            "vocab_size": VOCAB_SIZE,
            "special_tokens": list(SPECIAL_TOKENS),
            "chat_template": CHAT_TEMPLATE,
            "corpus_sha256": hashlib.sha256("\n".join(CORPUS).encode()).hexdigest(),
        },
        "adapters": [s.as_dict() for s in DEMO_ADAPTERS],
        "zero_adapter": ZERO_ADAPTER.as_dict(),
        "lora_init_std": LORA_INIT_STD,
        "packages": versions,
    }


def build_stamp(seed: int = DEFAULT_SEED) -> str:
    """sha256 hex of :func:`build_parameters` (canonical JSON)."""
    canonical = json.dumps(build_parameters(seed), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


# --------------------------------------------------------------------------- build


def load_demo(root: Path | None = None, seed: int = DEFAULT_SEED) -> DemoManifest | None:
    """The existing build under ``root`` if it is complete and current, else None."""
    root = Path(root) if root else default_root()
    try:
        manifest = DemoManifest.read(root)
    except (OSError, ValueError):
        return None
    if manifest.build_stamp != build_stamp(seed):
        return None
    if not all(p.is_file() for p in manifest.files()):
        return None
    return manifest


def build_demo(
    root: Path | None = None, *, seed: int = DEFAULT_SEED, force: bool = False
) -> DemoManifest:
    """Build the demo tree under ``root`` unless a current build is already there.

    Blocking (a few seconds of CPU, plus importing torch/transformers/peft the
    first time); async callers use ``asyncio.to_thread``.
    """
    root = Path(root).resolve() if root else default_root()
    root.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(root.parent / f".{root.name}.lock"):
        if not force:
            existing = load_demo(root, seed)
            if existing is not None:
                return existing
        tmp = root.parent / f".{root.name}.building-{uuid.uuid4().hex[:8]}"
        try:
            _build_into(tmp, seed)
            old = root.parent / f".{root.name}.old-{uuid.uuid4().hex[:8]}"
            if root.exists():
                root.rename(old)
            tmp.rename(root)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        manifest = load_demo(root, seed)
        if manifest is None:
            raise RuntimeError(f"build under {root} is incomplete after building")
        return manifest


def _build_into(out: Path, seed: int) -> None:
    started = time.perf_counter()
    out.mkdir(parents=True)
    keys = write_dev_keys(out / "keys", seed)

    base_dir = out / "base" / MODEL_NAME.split("/")[-1]
    model = build_base_model(base_dir, seed=seed, shape=TinyLlamaShape())

    def make(spec: AdapterSpec, adapter_dir: Path) -> AdapterArtifact:
        build_adapter(model, spec, adapter_dir, base_seed=seed)
        _normalise_modes(adapter_dir)
        signed = sign_directory(adapter_dir, keys.private_key)
        return AdapterArtifact(
            tenant=spec.tenant,
            name=spec.name,
            version=spec.version,
            base_model=spec.base_model,
            dir=adapter_dir,
            rank=spec.rank,
            alpha=spec.lora_alpha,
            target_modules=spec.target_modules,
            size_bytes=signed.size_bytes,
            manifest_digest=signed.manifest_digest,
            signature_path=signed.signature_path,
            signer_identity=signed.signer_identity,
        )

    adapters = tuple(make(s, out / "adapters" / s.relpath) for s in DEMO_ADAPTERS)
    zero = make(ZERO_ADAPTER, out / "system" / ZERO_ADAPTER.name)
    _normalise_modes(base_dir)
    manifest = DemoManifest(
        root=out,
        build_stamp=build_stamp(seed),
        build_seconds=round(time.perf_counter() - started, 3),
        base_model=BaseModelArtifact(
            name=MODEL_NAME,
            dir=base_dir,
            tokenizer_revision=_sha256_file(base_dir / "tokenizer.json"),
            size_bytes=sum(p.stat().st_size for p in base_dir.iterdir() if p.is_file()),
        ),
        adapters=adapters,
        zero_adapter=zero,
        keys=KeyPair(
            private_key=keys.private_key, public_key=keys.public_key, identity=keys.identity
        ),
    )
    manifest.write(out)  # last: its presence marks a complete build


def _normalise_modes(directory: Path) -> None:
    """safetensors writes 0600 files; make artifacts world-readable like the rest."""
    for p in directory.iterdir():
        if p.is_file():
            p.chmod(0o644)


def _sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
