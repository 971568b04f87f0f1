"""Python client of the registry admin API and the release workflow.

The ``loraplane`` CLI and the ``make run`` seeding use these functions::

    with RegistryClient.from_settings(RegistryClientSettings()) as reg:
        reg.create_tenant("acme", priority=common_pb2.PRIORITY_GOLD)
        key = reg.create_api_key("acme", "gateway demo")        # (info, secret)
        rec = release_adapter(reg, s3_client(settings), directory=Path("..."),
                              tenant="acme", name="support-bot", version="v1",
                              base_model="loraplane/tiny-llama", signing_key=Path("k.pem"))
        final = wait_for_verdict(reg, "acme", "support-bot", "v1", timeout_s=60)

The client is synchronous (plain ``grpc`` channel): it is meant for CLIs and scripts.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Self

import grpc
import urllib3
from google.protobuf.message import Message
from minio import Minio
from minio.error import MinioException, S3Error, ServerError

from loraplane.registry.auth import ACTOR_METADATA
from loraplane.registry.settings import RegistryClientSettings
from loraplane.shared.objectstore import minio_client
from loraplane.shared.settings import CommonSettings
from loraplane.shared.signing import (
    SIGNATURE_FILENAME,
    key_identity,
    manifest_digest,
    sign_directory,
)
from loraplane.shared.tls import REGISTRY_ID, TlsFiles, secure_or_insecure_channel
from loraplane.v1 import common_pb2, events_pb2, registry_pb2, registry_pb2_grpc

DECIDED = frozenset({
    common_pb2.VERSION_STATUS_ADMITTED,
    common_pb2.VERSION_STATUS_REJECTED,
    common_pb2.VERSION_STATUS_ACTIVE,
    common_pb2.VERSION_STATUS_CANARY,
    common_pb2.VERSION_STATUS_RETIRED,
})
"""Statuses that mean admission has decided (pending is the only undecided one)."""


class ReleaseError(RuntimeError):
    """The release cannot proceed (bad directory, unreadable adapter config)."""


REGISTRY = "registry"
OBJECT_STORE = "object store"


class ComponentUnavailable(ReleaseError):
    """A component the command needs could not be reached, or answered that it is
    unavailable: which one, where (and the setting that says where), and why."""

    def __init__(self, component: str, endpoint: str, setting: str, cause: str,
                 *, reached: bool = False) -> None:
        """``reached``: it answered (unavailable), rather than not being reachable at all."""
        self.component = component
        self.endpoint = endpoint
        self.setting = setting
        self.cause = cause
        self.reached = reached
        what = (f"the {component} at {endpoint} is unavailable" if reached
                else f"cannot reach the {component} at {endpoint}")
        super().__init__(f"{what} ({setting}): {cause}")


def connection_cause(exc: BaseException) -> str:
    """The innermost operating-system reason of a connection failure (``Connection
    refused``), else the exception's own text."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.strerror:
            return current.strerror
        current = getattr(current, "reason", None) or current.__cause__ or current.__context__
    return str(exc)


class RegistryClient:
    """Synchronous RegistryAdmin client; adds the operator token and actor to every call."""

    def __init__(
        self, addr: str, token: str, *, actor: str = "", timeout_s: float = 30.0,
        tls: TlsFiles | None = None,
    ) -> None:
        """``addr``: ``host:port``; ``token``: the operator token (may be empty when
        ``tls`` holds the ``operator`` certificate); ``tls``: mutual TLS files."""
        self.addr = addr
        self.timeout_s = timeout_s
        self.channel = secure_or_insecure_channel(addr, tls, server=REGISTRY_ID)
        self.stub = registry_pb2_grpc.RegistryAdminStub(self.channel)
        actor = actor or f"cli/{_user()}"
        self.metadata: tuple[tuple[str, str], ...] = (
            *((("authorization", f"Bearer {token}"),) if token else ()),
            (ACTOR_METADATA, actor),
        )

    @classmethod
    def from_settings(cls, s: RegistryClientSettings) -> RegistryClient:
        """A client for ``LORAPLANE_REGISTRY_ADDR`` with ``LORAPLANE_REGISTRY_OPERATOR_TOKEN``."""
        return cls(s.registry_addr, s.registry_operator_token.get_secret_value(),
                   actor=s.registry_actor, timeout_s=s.registry_timeout_s,
                   tls=s.tls_files())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()

    def call(self, method: str, request: Message) -> Any:
        """Call ``RegistryAdmin.<method>`` (its response message); raises ``grpc.RpcError``
        on failure."""
        fn = getattr(self.stub, method)
        return fn(request, metadata=self.metadata, timeout=self.timeout_s)

    def reachable(self, timeout_s: float = 1.0) -> bool:
        """Whether a connection to the registry can be made within ``timeout_s``."""
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            return False
        return True

    def unavailable(self, exc: grpc.RpcError) -> ComponentUnavailable | None:
        """What a failed call means when the registry is unreachable or unavailable
        (UNAVAILABLE, or no answer within the deadline); ``None`` for other errors."""
        code = exc.code()
        if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return None
        reached = self.reachable()
        cause = exc.details() or code.name
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            cause = f"no answer within {self.timeout_s:g}s"
        elif not reached:
            cause = "no connection (is it running?)"
        return ComponentUnavailable(REGISTRY, self.addr, "LORAPLANE_REGISTRY_ADDR", cause,
                                    reached=reached)

    # -- convenience -------------------------------------------------------------

    def create_tenant(
        self, tenant_id: str, *, display_name: str = "",
        priority: common_pb2.Priority = common_pb2.PRIORITY_UNSPECIFIED,
    ) -> registry_pb2.Tenant:
        """Create a tenant."""
        resp: registry_pb2.CreateTenantResponse = self.call(
            "CreateTenant", registry_pb2.CreateTenantRequest(
                tenant_id=tenant_id, display_name=display_name, default_priority=priority))
        return resp.tenant

    def ensure_tenant(
        self, tenant_id: str, *, display_name: str = "",
        priority: common_pb2.Priority = common_pb2.PRIORITY_UNSPECIFIED,
    ) -> registry_pb2.Tenant:
        """Create the tenant unless it exists (seeding is re-runnable)."""
        try:
            return self.create_tenant(tenant_id, display_name=display_name, priority=priority)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise
            resp: registry_pb2.GetTenantResponse = self.call(
                "GetTenant", registry_pb2.GetTenantRequest(tenant_id=tenant_id))
            return resp.tenant

    def create_api_key(
        self, tenant_id: str, description: str = ""
    ) -> tuple[registry_pb2.ApiKeyInfo, str]:
        """Create an API key; returns (info, secret). The secret is shown only now."""
        resp = self.call("CreateApiKey", registry_pb2.CreateApiKeyRequest(
            tenant_id=tenant_id, description=description))
        return resp.key, resp.secret

    def get_version(self, tenant_id: str, name: str, version: str) -> registry_pb2.AdapterVersion:
        """Read one version."""
        resp: registry_pb2.GetVersionResponse = self.call(
            "GetVersion", registry_pb2.GetVersionRequest(
                tenant_id=tenant_id, adapter_name=name, version=version))
        return resp.version

    def find_version(
        self, tenant_id: str, name: str, version: str
    ) -> registry_pb2.AdapterVersion | None:
        """Read one version; ``None`` if it does not exist."""
        try:
            return self.get_version(tenant_id, name, version)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


# =========================================================================== upload


class Progress(Protocol):
    """minio's progress protocol (``set_meta`` then ``update`` per chunk)."""

    def set_meta(self, object_name: str, total_length: int) -> None:
        """Start of one object."""

    def update(self, length: int) -> None:
        """``length`` more bytes sent."""


def s3_client(s: CommonSettings) -> Minio:
    """A minio client for ``LORAPLANE_S3_*`` (HTTPS trusting ``LORAPLANE_S3_CA_FILE`` when
    ``LORAPLANE_S3_SECURE``)."""
    client: Minio = minio_client(s.s3_endpoint, s.s3_access_key, s.s3_secret_key,
                                 secure=s.s3_secure, ca_file=s.s3_ca_file)
    return client


@dataclass(frozen=True)
class LocalFile:
    """One file of the adapter directory."""

    path: str
    """POSIX path relative to the directory."""
    size_bytes: int
    sha256: str
    local: Path


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def scan_directory(directory: Path) -> list[LocalFile]:
    """Every regular file below ``directory`` (sorted); symbolic links are refused."""
    files: list[LocalFile] = []
    for p in sorted(directory.rglob("*")):
        if p.is_symlink():
            raise ReleaseError(f"{p}: symbolic links are not allowed in an artifact")
        if p.is_file():
            rel = p.relative_to(directory).as_posix()
            files.append(LocalFile(rel, p.stat().st_size, _sha256(p), p))
    return files


@dataclass(frozen=True)
class PeftConfig:
    """What the record needs from ``adapter_config.json``."""

    rank: int
    lora_alpha: float
    target_modules: list[str]


def read_peft_config(directory: Path) -> PeftConfig:
    """Rank, alpha and target modules from a PEFT ``adapter_config.json``."""
    path = directory / "adapter_config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
        rank = int(cfg["r"])
        modules = cfg["target_modules"]
        if isinstance(modules, str):
            modules = [modules]
        return PeftConfig(rank, float(cfg.get("lora_alpha") or 0), sorted(str(m) for m in modules))
    except FileNotFoundError:
        raise ReleaseError(f"{path} not found: not a PEFT adapter directory") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ReleaseError(f"{path}: cannot read r / target_modules: {exc}") from exc


def tokenizer_revision_for(base_model: str, catalogue_path: Path | None) -> str:
    """The catalogue's tokenizer revision of ``base_model`` ("" if unknown)."""
    if catalogue_path is None or not catalogue_path.is_file():
        return ""
    from loraplane.shared.catalogue import load_catalogue

    catalogue = load_catalogue(catalogue_path)
    return catalogue.get(base_model).tokenizer_revision if base_model in catalogue else ""


@dataclass(frozen=True)
class ReleaseResult:
    """Outcome of :func:`release_adapter`."""

    version: registry_pb2.AdapterVersion
    """The stored record."""
    signed: bool
    """Whether the CLI signed the directory (it had no ``model.sig``)."""
    uploaded_bytes: int
    """Bytes uploaded (0 when the version was already registered with this digest)."""


def release_adapter(
    reg: RegistryClient,
    s3: Minio,
    *,
    directory: Path,
    tenant: str,
    name: str,
    version: str,
    base_model: str,
    signing_key: Path | None,
    priority: common_pb2.Priority = common_pb2.PRIORITY_UNSPECIFIED,
    tokenizer_revision: str = "",
    progress: Callable[[list[LocalFile]], Progress] | None = None,
    s3_endpoint: str = "",
) -> ReleaseResult:
    """Sign (if needed), upload to the registry-chosen location, register.

    * no ``model.sig`` in ``directory``: sign it with ``signing_key`` (written into the
      directory); otherwise the existing signature is used as it is;
    * RequestUpload returns the content-addressed keys in the allow-listed bucket;
    * every file and the signature are uploaded (skipped when the version is already
      registered with the same manifest digest);
    * RegisterVersion stores the record (status pending).

    An object store that cannot be reached (``s3_endpoint``: where, for the message) raises
    :class:`ComponentUnavailable`; one that refuses an upload, :class:`ReleaseError`.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ReleaseError(f"{directory} is not a directory")
    sig = directory / SIGNATURE_FILENAME
    signed = False
    if not sig.exists():
        if signing_key is None:
            raise ReleaseError(f"{directory} has no {SIGNATURE_FILENAME}; pass --signing-key")
        sign_directory(directory, signing_key)
        signed = True
    manifest = manifest_digest(sig)
    # The signer is known only when we signed; otherwise admission establishes it.
    signer = key_identity(signing_key) if signed and signing_key is not None else ""
    cfg = read_peft_config(directory)
    local = scan_directory(directory)
    artifact = [f for f in local if f.path != SIGNATURE_FILENAME]

    plan = reg.call("RequestUpload", registry_pb2.RequestUploadRequest(
        tenant_id=tenant, adapter_name=name, version=version, base_model=base_model,
        files=[registry_pb2.UploadFile(path=f.path, size_bytes=f.size_bytes, sha256=f.sha256)
               for f in local],
    ))
    existing = reg.find_version(tenant, name, version)
    uploaded = 0
    if existing is None or existing.sha256 != manifest:
        keys = {t.path: t.key for t in plan.targets}
        bar = progress(local) if progress is not None else None
        for f in local:
            upload_file(s3, plan.bucket, keys[f.path], f, bar, s3_endpoint or "its endpoint")
            uploaded += f.size_bytes
    record = registry_pb2.AdapterVersion(
        tenant_id=tenant, name=name, version=version, base_model=base_model,
        rank=cfg.rank, format="peft", target_modules=cfg.target_modules,
        artifact_uri=plan.artifact_uri, sha256=manifest,
        size_bytes=sum(f.size_bytes for f in artifact),
        signature_uri=plan.artifact_uri + SIGNATURE_FILENAME, signer_identity=signer,
        tokenizer_revision=tokenizer_revision, priority=priority, lora_alpha=cfg.lora_alpha,
        files=[events_pb2.ArtifactFile(path=f.path, size_bytes=f.size_bytes, sha256=f.sha256)
               for f in artifact],
    )
    stored = reg.call("RegisterVersion", registry_pb2.RegisterVersionRequest(version=record))
    return ReleaseResult(stored.version, signed, uploaded)


def upload_file(s3: Minio, bucket: str, key: str, f: LocalFile, bar: Progress | None,
                endpoint: str) -> None:
    """Upload one file; an object store that cannot be reached (or answers 5xx) raises
    :class:`ComponentUnavailable` naming it at ``endpoint``, one that refuses the upload
    (credentials, bucket) :class:`ReleaseError` with its S3 error code."""
    try:
        s3.fput_object(bucket, key, str(f.local), progress=bar,
                       content_type="application/octet-stream")
    except urllib3.exceptions.HTTPError as exc:  # no connection, reset, timed out
        raise ComponentUnavailable(OBJECT_STORE, endpoint, "LORAPLANE_S3_ENDPOINT",
                                   connection_cause(exc)) from None
    except ServerError as exc:  # it answered 5xx
        raise ComponentUnavailable(OBJECT_STORE, endpoint, "LORAPLANE_S3_ENDPOINT",
                                   f"HTTP {exc.status_code} uploading {f.path}",
                                   reached=True) from None
    except S3Error as exc:  # it refused: credentials, bucket
        raise ReleaseError(f"the object store at {endpoint} refused {f.path} "
                           f"(s3://{bucket}/{key}): {exc.code}: {exc.message}") from None
    except MinioException as exc:
        raise ReleaseError(f"the object store at {endpoint} failed {f.path}: {exc}") from None


def wait_for_verdict(
    reg: RegistryClient,
    tenant: str,
    name: str,
    version: str,
    *,
    timeout_s: float,
    poll_s: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> registry_pb2.AdapterVersion | None:
    """Poll GetVersion until admission decided; ``None`` on timeout."""
    deadline = clock() + timeout_s
    while True:
        rec = reg.get_version(tenant, name, version)
        if rec.status in DECIDED:
            return rec
        remaining = deadline - clock()
        if remaining <= 0:
            return None
        sleep(min(poll_s, remaining))


def iter_versions(reg: RegistryClient, **filters: Any) -> Iterator[registry_pb2.AdapterVersion]:
    """Every version matching ``filters`` (ListVersions fields), following pages."""
    token = ""
    while True:
        resp = reg.call("ListVersions", registry_pb2.ListVersionsRequest(page_token=token,
                                                                         **filters))
        yield from resp.versions
        token = resp.next_page_token
        if not token:
            return
