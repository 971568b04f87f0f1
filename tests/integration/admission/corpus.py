"""The hostile corpus: malformed and malicious adapter artifacts built from the demo adapters.

Each :class:`Case` builds one artifact (a directory, plus raw objects where a directory
cannot express the trick) and names the exact set of rejection codes admission must
answer with. ``driver`` says how the case reaches admission:

* ``registry``: through the release path operators use — ``release_adapter`` (what
  ``loraplane release`` runs: RequestUpload → upload to the registry-chosen location →
  RegisterVersion) → registry outbox → ``adapter.releases`` → admission →
  ``adapter.admissions`` → registry status ``rejected`` with the reasons;
* ``direct``: cases the CLI or the registry refuse before admission sees them (invalid
  config, missing signature, source tricks the registry never produces, records that
  disagree with their files): the test uploads to S3 itself and publishes the
  ``AdapterReleased`` event that a compromised or buggy producer could send.

The table in ``services/admission/README.md`` lists every case (a test keeps both in sync).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loraplane.admission.checks.safetensors import read_header
from loraplane.devkit.builder import DemoManifest
from loraplane.shared.catalogue import BaseModelSpec
from loraplane.shared.signing import sign_directory
from tests.support.synth import (
    RawTensor,
    lora_name,
    lora_tensors,
    safetensors_bytes,
    to_raw,
    write_adapter,
)

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"


@dataclass(frozen=True)
class Env:
    """What case builders need."""

    demo: DemoManifest
    spec: BaseModelSpec
    work: Path
    trusted_key: Path
    """Platform (dev) private key: trusted for every tenant."""
    untrusted_key: Path
    """A key nobody trusts."""
    tenant_key: Path
    """The ``globex`` tenant's own key (trusted for globex only)."""


@dataclass
class Built:
    """A built case: what to upload and how the release differs from an honest one."""

    dir: Path | None
    """Files to upload (``model.sig`` included when present)."""
    tenant: str = "acme"
    """``acme`` or ``globex`` (mapped to unique tenant ids by the test)."""
    objects: dict[str, bytes] = field(default_factory=dict)
    """Extra raw objects (artifact-relative key → bytes), uploaded as is."""
    release: dict[str, Any] = field(default_factory=dict)
    """Overrides of the ``AdapterReleased`` fields (direct cases only)."""
    uri: Callable[[str], str] | None = None
    """Maps the honest ``artifact_uri`` to the one released (direct cases only)."""
    bucket: str | None = None
    """Upload into this bucket instead of the artifact bucket (direct cases only)."""
    upload: bool = True
    base_model: str | None = None
    """Released base model (default: the tiny model)."""
    tokenizer_revision: str | None = None
    """Released tokenizer revision (default: the catalogue's)."""


@dataclass(frozen=True)
class Case:
    """One corpus entry."""

    name: str
    driver: str
    """``registry`` or ``direct``."""
    expected: frozenset[str]
    """Rejection code names (``RejectionCode`` without the prefix); empty = admitted."""
    what: str
    """One line for the table."""
    build: Callable[[Env, Path], Built]


# --------------------------------------------------------------------------- helpers


def base_copy(env: Env, out: Path, which: str = "support") -> Path:
    """A copy of a demo adapter's two files (unsigned)."""
    src = {
        "support": env.demo.adapter("acme", "support", "2026-11-01.1"),
        "code": env.demo.adapter("acme", "code"),
        "legal": env.demo.adapter("globex", "legal"),
        "chat": env.demo.adapter("globex", "chat"),
    }[which].dir
    out.mkdir(parents=True)
    for name in (CONFIG, WEIGHTS):
        shutil.copyfile(src / name, out / name)
    return out


def signed(env: Env, d: Path, key: Path | None = None) -> Path:
    """Sign ``d`` (default: the trusted platform key)."""
    sign_directory(d, key or env.trusted_key)
    return d


def edit_config(d: Path, drop: tuple[str, ...] = (), **changes: Any) -> None:
    """Rewrite ``adapter_config.json`` with ``changes`` and without ``drop``."""
    cfg = json.loads((d / CONFIG).read_text())
    cfg.update(changes)
    for key in drop:
        cfg.pop(key, None)
    (d / CONFIG).write_text(json.dumps(cfg, indent=2))


def raw_tensors(path: Path) -> dict[str, RawTensor]:
    """The tensors of a safetensors file as raw bytes (for rewriting)."""
    header, problems = read_header(path)
    assert header is not None and not problems, problems
    data = path.read_bytes()
    return {n: RawTensor(t.dtype, t.shape, data[header.data_start + t.begin:
                                                header.data_start + t.end])
            for n, t in header.tensors.items()}


def write_weights(d: Path, tensors: dict[str, RawTensor]) -> None:
    """Replace the weights file."""
    (d / WEIGHTS).write_bytes(safetensors_bytes(tensors, {"format": "pt"}))


def poke_value(t: RawTensor, value: float) -> RawTensor:
    """``t`` (F32) with its first element replaced by ``value``."""
    arr = np.frombuffer(t.data, "<f4").copy()
    arr[0] = value
    return RawTensor(t.dtype, t.shape, arr.tobytes())


def flip_last_byte(path: Path) -> None:
    """Change one byte at the end of a file."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def weights_case(mutate: Callable[[dict[str, RawTensor]], None], which: str = "support"
                 ) -> Callable[[Env, Path], Built]:
    """A signed case whose weights are rewritten by ``mutate``."""
    def build(env: Env, out: Path) -> Built:
        d = base_copy(env, out, which)
        tensors = raw_tensors(d / WEIGHTS)
        mutate(tensors)
        write_weights(d, tensors)
        return Built(signed(env, d))
    return build


def config_case(drop: tuple[str, ...] = (), **changes: Any) -> Callable[[Env, Path], Built]:
    """A signed case whose config is rewritten."""
    def build(env: Env, out: Path) -> Built:
        d = base_copy(env, out)
        edit_config(d, drop, **changes)
        return Built(signed(env, d))
    return build


Q0A = lora_name(0, "q_proj", "A")


# --------------------------------------------------------------------------- builders


def _untrusted(env: Env, out: Path) -> Built:
    return Built(signed(env, base_copy(env, out), env.untrusted_key))


def _other_tenant_key(env: Env, out: Path) -> Built:
    return Built(signed(env, base_copy(env, out), env.tenant_key), tenant="acme")


def _tampered_weights(env: Env, out: Path) -> Built:
    d = signed(env, base_copy(env, out))
    flip_last_byte(d / WEIGHTS)
    return Built(d)


def _tampered_config(env: Env, out: Path) -> Built:
    d = signed(env, base_copy(env, out))
    with (d / CONFIG).open("a") as f:
        f.write("\n")  # still the same valid config, but not the signed bytes
    return Built(d)


def _forged_signature(env: Env, out: Path) -> Built:
    d = signed(env, base_copy(env, out))
    bundle = json.loads((d / "model.sig").read_text())
    sig = bundle["dsseEnvelope"]["signatures"][0]
    sig["sig"] = ("B" if sig["sig"][:1] != "B" else "C") + sig["sig"][1:]
    (d / "model.sig").write_text(json.dumps(bundle))
    return Built(d)


def _missing_signature(env: Env, out: Path) -> Built:
    return Built(base_copy(env, out))


def _garbage_signature(env: Env, out: Path) -> Built:
    d = base_copy(env, out)
    (d / "model.sig").write_text("this is not a sigstore bundle")
    return Built(d)


def _unsigned_extra(env: Env, out: Path) -> Built:
    d = signed(env, base_copy(env, out))
    (d / "README.md").write_text("added after signing\n")
    return Built(d)


def _signed_extra(env: Env, out: Path) -> Built:
    d = base_copy(env, out)
    (d / "tokenizer.json").write_text("{}")
    return Built(signed(env, d))


def _digest_differs(env: Env, out: Path) -> Built:
    d = signed(env, base_copy(env, out))
    other = env.demo.adapter("acme", "support", "2026-11-15.1").manifest_digest
    return Built(d, release={"sha256": other})


def _signer_differs(env: Env, out: Path) -> Built:
    from loraplane.shared.signing import key_identity

    d = signed(env, base_copy(env, out))
    return Built(d, release={"signer_identity": key_identity(env.untrusted_key)})


def _pickle_weights(env: Env, out: Path) -> Built:
    d = base_copy(env, out)
    (d / WEIGHTS).rename(d / "adapter_model.bin")
    return Built(signed(env, d))


def _pickle_beside(env: Env, out: Path) -> Built:
    d = base_copy(env, out)
    (d / "optimizer.pt").write_bytes(b"\x80\x04\x95 pickle payload")
    return Built(signed(env, d))


def _nested_file(env: Env, out: Path) -> Built:
    d = base_copy(env, out)
    (d / "extra").mkdir()
    shutil.copyfile(d / WEIGHTS, d / "extra" / WEIGHTS)
    return Built(signed(env, d))


def _symlink(env: Env, out: Path) -> Built:
    d = signed(env, base_copy(env, out))
    target = env.demo.adapter("acme", "support", "2026-11-15.1").dir / WEIGHTS
    (d / WEIGHTS).unlink()
    os.symlink(target, d / WEIGHTS)  # uploaders follow links: S3 gets the target's bytes
    return Built(d)


def _uri(transform: Callable[[str], str]) -> Callable[[Env, Path], Built]:
    def build(env: Env, out: Path) -> Built:
        return Built(signed(env, base_copy(env, out)), uri=transform)
    return build


def _replace_tenant(uri: str) -> str:
    parts = uri.split("/")
    parts[4] = parts[4].replace("acme", "globex")
    return "/".join(parts)


def _wrong_bucket(env: Env, out: Path) -> Built:
    return Built(signed(env, base_copy(env, out)), bucket="other")


def _oversize(env: Env, out: Path) -> Built:
    d = base_copy(env, out)
    tensors = raw_tensors(d / WEIGHTS)
    tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.padding"] = RawTensor(
        "U8", (5 << 20,), bytes(5 << 20))
    write_weights(d, tensors)
    return Built(signed(env, d))


def _huge_header(env: Env, out: Path) -> Built:
    d = base_copy(env, out)
    tensors = raw_tensors(d / WEIGHTS)
    (d / WEIGHTS).write_bytes(safetensors_bytes(tensors, {"pad": "x" * (2 << 20)}))
    return Built(signed(env, d))


def _header_length_lies(env: Env, out: Path) -> Built:
    d = base_copy(env, out)
    data = (d / WEIGHTS).read_bytes()
    (d / WEIGHTS).write_bytes(struct.pack("<Q", 1 << 40) + data[8:])
    return Built(signed(env, d))


def _truncated(env: Env, out: Path) -> Built:
    d = base_copy(env, out)
    data = (d / WEIGHTS).read_bytes()
    (d / WEIGHTS).write_bytes(data[:-4096])
    return Built(signed(env, d))


def _overlapping(env: Env, out: Path) -> Built:
    d = base_copy(env, out)
    data = (d / WEIGHTS).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    names = sorted(k for k in header if k != "__metadata__")
    a, b = header[names[0]], header[names[1]]
    shift = (a["data_offsets"][1] - a["data_offsets"][0]) // 2
    b["data_offsets"] = [b["data_offsets"][0] - shift, b["data_offsets"][1] - shift]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    (d / WEIGHTS).write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n:])
    return Built(signed(env, d))


def _pickle_named_safetensors(env: Env, out: Path) -> Built:
    d = base_copy(env, out)
    (d / WEIGHTS).write_bytes(b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00cos\nsystem\n")
    return Built(signed(env, d))


def _add_tensor(name: str, shape: tuple[int, int]) -> Callable[[dict[str, RawTensor]], None]:
    def mutate(t: dict[str, RawTensor]) -> None:
        t[name] = to_raw(np.zeros(shape, np.float32), "F32")
    return mutate


def _wrong_shape(t: dict[str, RawTensor]) -> None:
    t[Q0A] = to_raw(np.zeros((8, 128), np.float32), "F32")


def _missing_tensor(t: dict[str, RawTensor]) -> None:
    del t[lora_name(2, "v_proj", "B")]


def _nan(t: dict[str, RawTensor]) -> None:
    t[Q0A] = poke_value(t[Q0A], float("nan"))


def _inf(t: dict[str, RawTensor]) -> None:
    t[Q0A] = poke_value(t[Q0A], float("-inf"))


def _to_f64(t: dict[str, RawTensor]) -> None:
    for name, raw in list(t.items()):
        t[name] = to_raw(np.frombuffer(raw.data, "<f4").reshape(raw.shape), "F64")


def _synth(rank: int, targets: tuple[str, ...], dtype: str, *, poison: float | None = None,
           tenant: str = "acme", key: str = "trusted") -> Callable[[Env, Path], Built]:
    def build(env: Env, out: Path) -> Built:
        d = write_adapter(out, env.spec, rank=rank, target_modules=targets, dtype=dtype,
                          seed=rank)
        if poison is not None:
            tensors = lora_tensors(env.spec, rank, targets, dtype="F32", seed=rank)
            values = np.frombuffer(tensors[Q0A].data, "<f4").copy()
            values[5] = poison
            tensors = {n: to_raw(np.frombuffer(r.data, "<f4").reshape(r.shape)
                                 if n != Q0A else values.reshape(r.shape), dtype)
                       for n, r in tensors.items()}
            write_weights(d, tensors)
        signer = {"trusted": env.trusted_key, "tenant": env.tenant_key}[key]
        return Built(signed(env, d, signer), tenant=tenant)
    return build


def _rank_mismatch(env: Env, out: Path) -> Built:
    d = base_copy(env, out, "legal")  # rank 16 tensors
    edit_config(d, r=8, lora_alpha=16)
    return Built(signed(env, d))


def _invalid_json(env: Env, out: Path) -> Built:
    d = base_copy(env, out)
    (d / CONFIG).write_text('{"peft_type": "LORA", "r": 8,, }')
    return Built(signed(env, d), release={"rank": 8})


def _missing_config(env: Env, out: Path) -> Built:
    d = base_copy(env, out)
    (d / CONFIG).unlink()
    return Built(signed(env, d), release={"rank": 8})


def _wrong_base_model(env: Env, out: Path) -> Built:
    d = base_copy(env, out)
    edit_config(d, base_model_name_or_path="meta-llama/Llama-2-7b-hf")
    return Built(signed(env, d), base_model="meta-llama/Llama-2-7b-hf")


def _config_base_differs(env: Env, out: Path) -> Built:
    d = base_copy(env, out)
    edit_config(d, base_model_name_or_path="mistralai/Mistral-7B-v0.1")
    return Built(signed(env, d))


def _wrong_tokenizer(env: Env, out: Path) -> Built:
    return Built(signed(env, base_copy(env, out)), tokenizer_revision="0" * 64)


def _unsupported_module(env: Env, out: Path) -> Built:
    d = base_copy(env, out)
    edit_config(d, target_modules=["q_proj", "v_proj", "lm_head"])
    return Built(signed(env, d))


def _many_problems(env: Env, out: Path) -> Built:
    d = base_copy(env, out)
    tensors = raw_tensors(d / WEIGHTS)
    _nan(tensors)
    write_weights(d, tensors)
    signed(env, d)
    (d / "notes.txt").write_text("unsigned\n")
    return Built(d, tokenizer_revision="f" * 64)


def _nothing_uploaded(env: Env, out: Path) -> Built:
    return Built(signed(env, base_copy(env, out)), upload=False)


def _demo(tenant: str, name: str, version: str | None = None) -> Callable[[Env, Path], Built]:
    def build(env: Env, out: Path) -> Built:
        src = env.demo.adapter(tenant, name, version).dir
        shutil.copytree(src, out)
        return Built(out, tenant=tenant)
    return build


def _c(name: str, driver: str, expected: str, what: str,
       build: Callable[[Env, Path], Built]) -> Case:
    return Case(name, driver, frozenset(expected.split()), what, build)


R, D = "registry", "direct"

HOSTILE: tuple[Case, ...] = (
    # signature, digest, signer
    _c("untrusted-signer", R, "UNTRUSTED_SIGNER", "re-signed with a key nobody trusts",
       _untrusted),
    _c("other-tenant-key", R, "UNTRUSTED_SIGNER", "acme artifact signed with globex's "
       "tenant key", _other_tenant_key),
    _c("tampered-weights", R, "DIGEST_MISMATCH", "one byte of the weights changed after "
       "signing", _tampered_weights),
    _c("tampered-config", R, "DIGEST_MISMATCH", "config bytes changed after signing (still "
       "valid JSON)", _tampered_config),
    _c("forged-signature", R, "SIGNATURE_INVALID", "signature bytes altered, trusted key hint "
       "kept", _forged_signature),
    _c("missing-signature", D, "SIGNATURE_INVALID", "no model.sig uploaded",
       _missing_signature),
    _c("garbage-signature", D, "SIGNATURE_INVALID", "model.sig is not a Sigstore bundle",
       _garbage_signature),
    _c("unsigned-extra-file", R, "UNSIGNED_FILE FORBIDDEN_FILE", "README.md added after "
       "signing", _unsigned_extra),
    _c("signed-extra-file", R, "FORBIDDEN_FILE", "tokenizer.json added and signed",
       _signed_extra),
    _c("digest-differs-from-registry", D, "DIGEST_MISMATCH", "release sha256 is another "
       "version's manifest digest", _digest_differs),
    _c("signer-differs-from-registry", D, "UNTRUSTED_SIGNER", "registry recorded another "
       "signer identity", _signer_differs),
    # file set
    _c("pickle-weights", R, "FORBIDDEN_FILE MISSING_FILE", "adapter_model.bin instead of "
       "safetensors (signed)", _pickle_weights),
    _c("pickle-beside", R, "FORBIDDEN_FILE", "optimizer.pt beside valid files (signed)",
       _pickle_beside),
    _c("nested-file", R, "FORBIDDEN_FILE", "extra/adapter_model.safetensors (signed)",
       _nested_file),
    _c("symlink", D, "DIGEST_MISMATCH", "weights replaced by a symlink to another adapter's "
       "weights; the uploader follows it", _symlink),
    # location
    _c("path-traversal", D, "SOURCE_NOT_ALLOWED", "artifact_uri with /../ into another "
       "tenant", _uri(lambda u: u.replace("/adapters/", "/adapters/x/../", 1))),
    _c("percent-encoded-dots", D, "SOURCE_NOT_ALLOWED", "artifact_uri with %2e%2e",
       _uri(lambda u: u.replace("/adapters/", "/adapters/%2e%2e/", 1))),
    _c("backslash", D, "SOURCE_NOT_ALLOWED", "artifact_uri with backslash separators",
       _uri(lambda u: u.replace("/", "\\", 4).replace("s3:\\\\", "s3://"))),
    _c("wrong-scheme", D, "SOURCE_NOT_ALLOWED", "https:// instead of s3://",
       _uri(lambda u: u.replace("s3://", "https://"))),
    _c("wrong-bucket", D, "SOURCE_NOT_ALLOWED", "artifact in another bucket", _wrong_bucket),
    _c("other-tenant-prefix", D, "SOURCE_NOT_ALLOWED", "acme release pointing into globex's "
       "prefix", _uri(_replace_tenant)),
    _c("not-registry-location", D, "SOURCE_NOT_ALLOWED", "right tenant, another version's "
       "folder", _uri(lambda u: u.replace("/v1/", "/v0/"))),
    # sizes and safetensors structure
    _c("oversize-file", R, "SIZE_LIMIT", "weights of 5.1 MiB > 4 MiB test limit (never "
       "downloaded)", _oversize),
    _c("huge-header", R, "SAFETENSORS_INVALID", "2 MiB safetensors header > 1 MiB bound",
       _huge_header),
    _c("header-length-lies", R, "SAFETENSORS_INVALID", "header length field says 1 TiB",
       _header_length_lies),
    _c("truncated-safetensors", R, "SAFETENSORS_INVALID", "last 4 KiB cut off",
       _truncated),
    _c("overlapping-offsets", R, "SAFETENSORS_INVALID", "two tensors share bytes",
       _overlapping),
    _c("pickle-named-safetensors", R, "SAFETENSORS_INVALID", "pickle bytes under the "
       "safetensors name", _pickle_named_safetensors),
    # tensors
    _c("unknown-module-tensor", R, "TENSOR_NAME", "tensor for w_proj, which the model lacks",
       weights_case(_add_tensor(lora_name(0, "w_proj", "A"), (8, 256)))),
    _c("layer-out-of-range", R, "TENSOR_NAME", "tensor for layer 7 of a 4-layer model",
       weights_case(_add_tensor(lora_name(7, "q_proj", "A"), (8, 256)))),
    _c("missing-tensor", R, "TENSOR_NAME", "layer 2 v_proj lora_B absent",
       weights_case(_missing_tensor)),
    _c("wrong-shape", R, "TENSOR_SHAPE", "q_proj lora_A is (8, 128), not (8, 256)",
       weights_case(_wrong_shape)),
    _c("rank-mismatch", R, "TENSOR_SHAPE", "config r=8, tensors rank 16", _rank_mismatch),
    _c("rank-above-engine-max", R, "RANK_TOO_LARGE", "consistent rank-32 adapter, engine "
       "max 16", _synth(32, ("q_proj", "v_proj"), "F32")),
    _c("disallowed-dtype", R, "TENSOR_DTYPE", "F64 tensors", weights_case(_to_f64)),
    _c("nan", R, "NON_FINITE", "one NaN in an F32 tensor", weights_case(_nan)),
    _c("inf", R, "NON_FINITE", "one -Inf in an F32 tensor", weights_case(_inf)),
    _c("nan-bf16", R, "NON_FINITE", "one NaN in a BF16 adapter",
       _synth(4, ("q_proj", "v_proj"), "BF16", poison=float("nan"))),
    # config
    _c("invalid-json", D, "CONFIG_INVALID", "config is not JSON", _invalid_json),
    _c("missing-config", D, "MISSING_FILE", "adapter_config.json absent (signed without it)",
       _missing_config),
    _c("missing-fields", R, "CONFIG_INVALID", "config without peft_type and "
       "base_model_name_or_path", config_case(("peft_type", "base_model_name_or_path"))),
    _c("not-lora", R, "CONFIG_INVALID", "peft_type PREFIX_TUNING",
       config_case(peft_type="PREFIX_TUNING")),
    _c("dora", R, "CONFIG_INVALID", "use_dora true", config_case(use_dora=True)),
    _c("rank-differs-from-registry", D, "CONFIG_INVALID", "registry recorded rank 16, config "
       "says 8", lambda env, out: Built(signed(env, base_copy(env, out)),
                                        release={"rank": 16})),
    # compatibility
    _c("wrong-base-model", R, "BASE_MODEL_MISMATCH", "Llama-2-7b adapter (not served)",
       _wrong_base_model),
    _c("config-base-differs", R, "BASE_MODEL_MISMATCH", "released for tiny-llama, config "
       "names Mistral", _config_base_differs),
    _c("wrong-tokenizer-revision", R, "TOKENIZER_MISMATCH", "tokenizer revision 000…0",
       _wrong_tokenizer),
    _c("unsupported-target-module", R, "TARGET_MODULE_UNSUPPORTED", "targets lm_head too",
       _unsupported_module),
    # combined and absent
    _c("many-problems", R, "NON_FINITE TOKENIZER_MISMATCH UNSIGNED_FILE FORBIDDEN_FILE",
       "NaN + wrong tokenizer + unsigned extra file: every reason reported", _many_problems),
    _c("nothing-uploaded", D, "DOWNLOAD_FAILED", "release of an artifact that is not in S3",
       _nothing_uploaded),
)
"""Every hostile case (refused with exactly its ``expected`` codes)."""

WELL_FORMED: tuple[Case, ...] = (
    _c("demo-support-r8-qv", R, "", "demo acme/support, rank 8, q/v",
       _demo("acme", "support", "2026-11-01.1")),
    _c("demo-support-r8-qv-2", R, "", "demo acme/support second version",
       _demo("acme", "support", "2026-11-15.1")),
    _c("demo-code-r16-all", R, "", "demo acme/code, rank 16, all linear",
       _demo("acme", "code")),
    _c("demo-legal-r16-qv", R, "", "demo globex/legal, rank 16, q/v", _demo("globex", "legal")),
    _c("demo-chat-r8-all", R, "", "demo globex/chat, rank 8, all linear",
       _demo("globex", "chat")),
    _c("bf16-r4-qv", R, "", "synthetic BF16 rank 4, q/v", _synth(4, ("q_proj", "v_proj"),
                                                                 "BF16")),
    _c("f16-r2-mlp", R, "", "synthetic F16 rank 2, gate/up/down",
       _synth(2, ("gate_proj", "up_proj", "down_proj"), "F16")),
    _c("tenant-key-own-tenant", R, "", "globex artifact signed with globex's own key",
       _synth(8, ("q_proj", "v_proj"), "F32", tenant="globex", key="tenant")),
)
"""Adapters admission must admit (several ranks, target sets, dtypes, signers)."""

ALL_CASES = HOSTILE + WELL_FORMED

