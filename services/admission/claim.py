"""What a release event claims about a version (the registry's record), as plain data."""

from __future__ import annotations

from dataclasses import dataclass

from loraplane.admission.checks.signature import RegisteredFile
from loraplane.shared.topics import adapter_id
from loraplane.v1 import events_pb2


@dataclass(frozen=True, slots=True)
class ReleaseClaim:
    """The fields of an ``AdapterReleased`` event that admission checks against."""

    tenant_id: str
    adapter_name: str
    version: str
    base_model: str
    rank: int
    target_modules: tuple[str, ...]
    lora_alpha: float
    artifact_format: str
    artifact_uri: str
    signature_uri: str
    sha256: str
    size_bytes: int
    signer_identity: str
    tokenizer_revision: str
    files: tuple[RegisteredFile, ...] = ()

    @property
    def adapter_id(self) -> str:
        """``tenant/name``."""
        return f"{self.tenant_id}/{self.adapter_name}"

    @classmethod
    def from_event(cls, ev: events_pb2.AdapterReleased) -> ReleaseClaim:
        """Copy the claim out of a release event."""
        ref = ev.meta.adapter
        return cls(
            tenant_id=ref.tenant_id,
            adapter_name=ref.adapter_name,
            version=ref.version,
            base_model=ref.base_model,
            rank=ev.rank,
            target_modules=tuple(ev.target_modules),
            lora_alpha=ev.lora_alpha,
            artifact_format=ev.format,
            artifact_uri=ev.artifact_uri,
            signature_uri=ev.signature_uri,
            sha256=ev.sha256,
            size_bytes=ev.size_bytes,
            signer_identity=ev.signer_identity,
            tokenizer_revision=ev.tokenizer_revision,
            files=tuple(RegisteredFile(f.path, f.size_bytes, f.sha256) for f in ev.files),
        )


def release_adapter_id(ev: events_pb2.AdapterReleased) -> str:
    """Adapter id of a release event."""
    return adapter_id(ev.meta.adapter)
