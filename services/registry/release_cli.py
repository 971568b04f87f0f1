"""``loraplane release`` and the registry admin commands.

Commands (all read ``LORAPLANE_REGISTRY_ADDR``, ``LORAPLANE_REGISTRY_OPERATOR_TOKEN``,
``LORAPLANE_REGISTRY_ACTOR`` and, for uploads, ``LORAPLANE_S3_*`` /
``LORAPLANE_ARTIFACT_BUCKET``)::

    loraplane release DIR --tenant T --name N --version V --base-model B \\
        --signing-key KEY.pem [--priority P] [--wait SECONDS] [--json]
    loraplane tenants create|show|list|set-priority|set-quota|quotas
    loraplane keys create|revoke|list
    loraplane adapters list|show|share|unshare|shares
    loraplane promote|canary|rollback|retire TENANT/NAME ...
    loraplane audit [--subject acme/] [--action release.promote]

Exit codes: 0 success (admitted with ``--wait``), 1 registry or input error,
2 usage error, 3 rejected by admission (every reason printed), 4 ``--wait`` timed out,
5 a component is unreachable or unavailable: the registry (``LORAPLANE_REGISTRY_ADDR``)
or the object store (``LORAPLANE_S3_ENDPOINT``), named with its address (retry later).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import grpc
import typer
from google.protobuf import json_format
from google.protobuf.message import Message
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from loraplane.registry.client import (
    ComponentUnavailable,
    LocalFile,
    RegistryClient,
    ReleaseError,
    iter_versions,
    release_adapter,
    s3_client,
    tokenizer_revision_for,
    wait_for_verdict,
)
from loraplane.registry.convert import PRIORITY_NAMES
from loraplane.registry.settings import RegistryClientSettings
from loraplane.shared.resources import config_file
from loraplane.v1 import common_pb2, events_pb2, registry_pb2

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_REJECTED = 3
EXIT_TIMEOUT = 4
EXIT_UNAVAILABLE = 5
"""The registry or the object store could not be reached, or said it is unavailable."""

app = typer.Typer(no_args_is_help=True)
tenants_app = typer.Typer(help="Tenants: create, show, list, set the default priority.",
                          no_args_is_help=True)
keys_app = typer.Typer(help="Tenant API keys: create (secret shown once), revoke, list.",
                       no_args_is_help=True)
adapters_app = typer.Typer(help="Adapter versions: list with filters, show one; share an "
                           "adapter with another tenant.",
                           no_args_is_help=True)
app.add_typer(tenants_app, name="tenants")
app.add_typer(keys_app, name="keys")
app.add_typer(adapters_app, name="adapters")

err = Console(stderr=True)
out = Console()

STATUS_NAMES = {
    "pending": common_pb2.VERSION_STATUS_PENDING,
    "admitted": common_pb2.VERSION_STATUS_ADMITTED,
    "rejected": common_pb2.VERSION_STATUS_REJECTED,
    "active": common_pb2.VERSION_STATUS_ACTIVE,
    "canary": common_pb2.VERSION_STATUS_CANARY,
    "retired": common_pb2.VERSION_STATUS_RETIRED,
}


def default_catalogue() -> Path:
    """``LORAPLANE_CATALOGUE`` or the packaged ``config/base_models.yaml``."""
    env = os.environ.get("LORAPLANE_CATALOGUE")
    return Path(env) if env else config_file("base_models.yaml")


# --------------------------------------------------------------------------- helpers


def _settings() -> RegistryClientSettings:
    return RegistryClientSettings()


@contextmanager
def _client() -> Iterator[RegistryClient]:
    s = _settings()
    if not s.registry_operator_token.get_secret_value() and not s.tls_ca_file:
        err.print("[red]error:[/] LORAPLANE_REGISTRY_OPERATOR_TOKEN is not set (nor an "
                  "operator certificate: LORAPLANE_TLS_CA_FILE / _CERT_FILE / _KEY_FILE)")
        raise typer.Exit(EXIT_ERROR)
    reg = RegistryClient.from_settings(s)
    try:
        yield reg
    except grpc.RpcError as exc:
        down = reg.unavailable(exc)
        if down is not None:
            _unavailable(down)
        err.print(f"[red]error:[/] {exc.code().name}: {exc.details()}")
        raise typer.Exit(EXIT_ERROR) from None
    except ComponentUnavailable as exc:
        _unavailable(exc)
    except ReleaseError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(EXIT_ERROR) from None
    finally:
        reg.close()


def _unavailable(exc: ComponentUnavailable) -> NoReturn:
    err.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
    raise typer.Exit(EXIT_UNAVAILABLE) from None


def to_dict(msg: Message) -> dict[str, Any]:
    """A message as JSON-able dict (proto field names, enums as names)."""
    d: dict[str, Any] = json_format.MessageToDict(msg, preserving_proto_field_name=True)
    return d


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    sys.stdout.flush()


def _priority(value: str | None) -> common_pb2.Priority:
    if not value:
        return common_pb2.PRIORITY_UNSPECIFIED
    try:
        return PRIORITY_NAMES[value.lower()]
    except KeyError:
        raise typer.BadParameter(f"{value!r}: one of {', '.join(PRIORITY_NAMES)}") from None


def _split_adapter(adapter: str) -> tuple[str, str]:
    tenant, sep, name = adapter.partition("/")
    if not sep or not tenant or not name:
        raise typer.BadParameter(f"{adapter!r}: expected TENANT/NAME")
    return tenant, name


def _enum_name(enum: Any, value: int, prefix: str) -> str:
    return str(enum.Name(value)).removeprefix(prefix).lower()


def status_name(value: int) -> str:
    """``VERSION_STATUS_ADMITTED`` → ``admitted``."""
    return _enum_name(common_pb2.VersionStatus, value, "VERSION_STATUS_")


def _reason_line(r: events_pb2.RejectionReason) -> str:
    code = _enum_name(events_pb2.RejectionCode, r.code, "REJECTION_CODE_")
    where = f" [{r.path}]" if r.path else ""
    return f"{code}{where}: {r.message}"


def _print_version(v: registry_pb2.AdapterVersion) -> None:
    out.print(f"[bold]{v.adapter_id}@{v.version}[/]  status={status_name(v.status)}  "
              f"engine_id={v.engine_id}")
    out.print(f"  base_model={v.base_model} rank={v.rank} modules={','.join(v.target_modules)}")
    out.print(f"  sha256={v.sha256} size={v.size_bytes}B")
    out.print(f"  artifact={v.artifact_uri}")
    for r in v.reasons:
        out.print(f"  [red]reason[/] {_reason_line(r)}")


class _RichUpload:
    """minio progress → one rich bar over every file of the release."""

    def __init__(self, progress: Progress, files: list[LocalFile]) -> None:
        self.progress = progress
        self.task = progress.add_task("upload", total=sum(f.size_bytes for f in files),
                                      name="")

    def set_meta(self, object_name: str, total_length: int) -> None:
        self.progress.update(self.task, name=object_name.rsplit("/", 1)[-1])

    def update(self, length: int) -> None:
        self.progress.advance(self.task, length)


# --------------------------------------------------------------------------- release


@app.command()
def release(
    directory: Annotated[Path, typer.Argument(help="PEFT adapter directory.", exists=True,
                                              file_okay=False, dir_okay=True)],
    tenant: Annotated[str, typer.Option(help="Owning tenant id.")],
    name: Annotated[str, typer.Option(help="Adapter name.")],
    version: Annotated[str, typer.Option(help="Version label (immutable).")],
    base_model: Annotated[str, typer.Option(help="Base model the adapter was trained for.")],
    signing_key: Annotated[Path, typer.Option(
        help="EC private key (PEM) used when DIR holds no model.sig.")],
    priority: Annotated[str | None, typer.Option(
        help="Priority override: platinum, gold, silver, bronze.")] = None,
    wait: Annotated[float | None, typer.Option(
        help="Wait up to SECONDS for the admission verdict (exit 0 admitted, 3 rejected, "
             "4 timeout; 5: the registry or the object store is unreachable).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the record as JSON.")] = False,
    tokenizer_revision: Annotated[str | None, typer.Option(
        help="Tokenizer revision; default: the base model's entry in the catalogue.")] = None,
    catalogue: Annotated[Path | None, typer.Option(
        help="Base-model catalogue (default LORAPLANE_CATALOGUE or config/base_models.yaml).")
    ] = None,
) -> None:
    """Sign (if needed), upload and register an adapter version; optionally wait for admission."""
    prio = _priority(priority)
    revision = tokenizer_revision if tokenizer_revision is not None else \
        tokenizer_revision_for(base_model, catalogue or default_catalogue())
    s = _settings()
    with _client() as reg:
        with Progress(TextColumn("[bold]{task.fields[name]}"), BarColumn(), DownloadColumn(),
                      TransferSpeedColumn(), TimeRemainingColumn(), console=err,
                      transient=json_out) as progress:
            result = release_adapter(
                reg, s3_client(s), directory=directory, tenant=tenant, name=name,
                version=version, base_model=base_model, signing_key=signing_key,
                priority=prio, tokenizer_revision=revision,
                progress=lambda files: _RichUpload(progress, files), s3_endpoint=s.s3_endpoint,
            )
        rec = result.version
        if not json_out:
            signed = "signed with the given key, " if result.signed else ""
            err.print(f"registered {rec.adapter_id}@{rec.version} ({signed}"
                      f"{result.uploaded_bytes} bytes uploaded) → {status_name(rec.status)}")
        if wait is None:
            if json_out:
                _print_json({"version": to_dict(rec)})
            else:
                _print_version(rec)
            return
        final = wait_for_verdict(reg, tenant, name, version, timeout_s=wait)
    code = _verdict_exit(final, rec, json_out, wait)
    raise typer.Exit(code)


def _verdict_exit(
    final: registry_pb2.AdapterVersion | None,
    rec: registry_pb2.AdapterVersion,
    json_out: bool,
    wait: float,
) -> int:
    if final is None:
        if json_out:
            _print_json({"version": to_dict(rec), "verdict": "timeout"})
        else:
            err.print(f"[yellow]timeout:[/] no admission verdict within {wait:g}s "
                      f"(still pending)")
        return EXIT_TIMEOUT
    rejected = final.status == common_pb2.VERSION_STATUS_REJECTED
    if json_out:
        _print_json({"version": to_dict(final),
                     "verdict": "rejected" if rejected else "admitted"})
    elif rejected:
        err.print(f"[red]rejected:[/] {final.adapter_id}@{final.version} "
                  f"({len(final.reasons)} reasons)")
        for r in final.reasons:
            err.print(f"  - {_reason_line(r)}")
    else:
        _print_version(final)
        err.print(f"[green]admitted:[/] {final.adapter_id}@{final.version}")
    if rejected:
        return EXIT_REJECTED
    if final.status == common_pb2.VERSION_STATUS_RETIRED:
        return EXIT_ERROR
    return EXIT_OK


# --------------------------------------------------------------------------- tenants


JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


@tenants_app.command("create")
def tenants_create(
    tenant_id: str,
    display_name: Annotated[str, typer.Option(help="Display name.")] = "",
    priority: Annotated[str | None, typer.Option(help="Default priority.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Create a tenant."""
    with _client() as reg:
        t = reg.create_tenant(tenant_id, display_name=display_name, priority=_priority(priority))
    if json_out:
        _print_json(to_dict(t))
    else:
        out.print(f"created tenant {t.tenant_id}")


@tenants_app.command("show")
def tenants_show(tenant_id: str) -> None:
    """Show one tenant (JSON)."""
    with _client() as reg:
        t = reg.call("GetTenant", registry_pb2.GetTenantRequest(tenant_id=tenant_id)).tenant
    _print_json(to_dict(t))


@tenants_app.command("list")
def tenants_list(json_out: JsonOpt = False) -> None:
    """List every tenant."""
    tenants: list[registry_pb2.Tenant] = []
    with _client() as reg:
        token = ""
        while True:
            resp = reg.call("ListTenants", registry_pb2.ListTenantsRequest(page_token=token))
            tenants.extend(resp.tenants)
            token = resp.next_page_token
            if not token:
                break
    if json_out:
        _print_json([to_dict(t) for t in tenants])
        return
    table = Table("tenant", "display name", "priority")
    for t in tenants:
        table.add_row(t.tenant_id, t.display_name,
                      _enum_name(common_pb2.Priority, t.default_priority, "PRIORITY_"))
    out.print(table)


@tenants_app.command("set-priority")
def tenants_set_priority(tenant_id: str, priority: str) -> None:
    """Change a tenant's default priority."""
    with _client() as reg:
        t = reg.call("SetTenantPriority", registry_pb2.SetTenantPriorityRequest(
            tenant_id=tenant_id, priority=_priority(priority))).tenant
    out.print(f"{t.tenant_id}: {_enum_name(common_pb2.Priority, t.default_priority, 'PRIORITY_')}")


@tenants_app.command("set-quota")
def tenants_set_quota(
    tenant_id: str,
    max_in_flight: Annotated[int, typer.Option(
        help="Requests queued or running at once at a gateway (0 = unlimited).")] = 0,
    tokens_per_s: Annotated[float, typer.Option(
        help="Output tokens per second (0 = unlimited).")] = 0.0,
    adapter: Annotated[str, typer.Option(
        help="Quota of this adapter of the tenant instead of the tenant-wide one.")] = "",
    clear: Annotated[bool, typer.Option(
        help="Remove the quota (the gateway's default applies again).")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Set a tenant's quota (or one adapter's); gateways refuse what is over it with 429."""
    with _client() as reg:
        q = reg.call("SetTenantQuota", registry_pb2.SetTenantQuotaRequest(
            tenant_id=tenant_id, adapter_name=adapter, max_in_flight=max_in_flight,
            tokens_per_s=tokens_per_s, clear=clear)).quota
    who = f"{tenant_id}/{adapter}" if adapter else tenant_id
    if json_out:
        _print_json(to_dict(q) if q.tenant_id else {"cleared": who})
    elif not q.tenant_id:
        out.print(f"{who}: quota cleared")
    else:
        out.print(f"{who}: max_in_flight={q.max_in_flight or 'unlimited'} "
                  f"tokens_per_s={q.tokens_per_s or 'unlimited'}")


@tenants_app.command("quotas")
def tenants_quotas(tenant_id: str, json_out: JsonOpt = False) -> None:
    """List a tenant's quotas (tenant-wide and per adapter)."""
    with _client() as reg:
        quotas = reg.call("ListTenantQuotas", registry_pb2.ListTenantQuotasRequest(
            tenant_id=tenant_id)).quotas
    if json_out:
        _print_json([to_dict(q) for q in quotas])
        return
    table = Table("scope", "max in flight", "tokens/s")
    for q in quotas:
        table.add_row(q.adapter_name or "(tenant)", str(q.max_in_flight or "unlimited"),
                      f"{q.tokens_per_s:g}" if q.tokens_per_s else "unlimited")
    out.print(table)


# --------------------------------------------------------------------------- keys


@keys_app.command("create")
def keys_create(
    tenant_id: str,
    description: Annotated[str, typer.Option(help="What the key is for.")] = "",
    json_out: JsonOpt = False,
) -> None:
    """Create an API key. The secret is printed once; store it now."""
    with _client() as reg:
        info, secret = reg.create_api_key(tenant_id, description)
    if json_out:
        _print_json({"key": to_dict(info), "secret": secret})
    else:
        err.print(f"key {info.key_id} ({info.prefix}…) for {tenant_id}; the secret is shown once:")
        out.print(secret)


@keys_app.command("revoke")
def keys_revoke(tenant_id: str, key_id: str) -> None:
    """Revoke an API key."""
    with _client() as reg:
        reg.call("RevokeApiKey", registry_pb2.RevokeApiKeyRequest(tenant_id=tenant_id,
                                                                  key_id=key_id))
    out.print(f"revoked {key_id}")


@keys_app.command("list")
def keys_list(
    tenant_id: str,
    include_revoked: Annotated[bool, typer.Option(help="Show revoked keys too.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """List a tenant's keys (prefixes only)."""
    with _client() as reg:
        keys = reg.call("ListApiKeys", registry_pb2.ListApiKeysRequest(
            tenant_id=tenant_id, include_revoked=include_revoked)).keys
    if json_out:
        _print_json([to_dict(k) for k in keys])
        return
    table = Table("key id", "prefix", "description", "revoked")
    for k in keys:
        table.add_row(k.key_id, k.prefix, k.description, "yes" if k.HasField("revoked_at") else "")
    out.print(table)


# --------------------------------------------------------------------------- adapters


@adapters_app.command("list")
def adapters_list(
    tenant: Annotated[str, typer.Option(help="Only this tenant.")] = "",
    name: Annotated[str, typer.Option(help="Only this adapter name.")] = "",
    base_model: Annotated[str, typer.Option(help="Only this base model.")] = "",
    status: Annotated[str, typer.Option(help="Only this status.")] = "",
    json_out: JsonOpt = False,
) -> None:
    """List adapter versions, newest first."""
    if status and status not in STATUS_NAMES:
        raise typer.BadParameter(f"--status: one of {', '.join(STATUS_NAMES)}")
    with _client() as reg:
        versions = list(iter_versions(reg, tenant_id=tenant, adapter_name=name,
                                      base_model=base_model,
                                      status=STATUS_NAMES.get(status, 0)))
    if json_out:
        _print_json([to_dict(v) for v in versions])
        return
    table = Table("adapter", "version", "status", "base model", "engine id", "size")
    for v in versions:
        table.add_row(v.adapter_id, v.version, status_name(v.status), v.base_model,
                      str(v.engine_id), str(v.size_bytes))
    out.print(table)


@adapters_app.command("show")
def adapters_show(
    adapter: Annotated[str, typer.Argument(help="TENANT/NAME")],
    version: Annotated[str | None, typer.Argument(help="Version (default: the release).")] = None,
) -> None:
    """Show one version, or the release pointers of an adapter name (JSON)."""
    tenant, name = _split_adapter(adapter)
    with _client() as reg:
        if version:
            _print_json(to_dict(reg.get_version(tenant, name, version)))
        else:
            rel = reg.call("GetRelease", registry_pb2.GetReleaseRequest(
                tenant_id=tenant, adapter_name=name)).release
            _print_json(to_dict(rel))


def _change_share(adapter: str, with_tenant: str, json_out: bool, *, share: bool) -> None:
    tenant, name = _split_adapter(adapter)
    fields = {"tenant_id": tenant, "adapter_name": name, "grantee_tenant_id": with_tenant}
    with _client() as reg:
        resp = (reg.call("ShareAdapter", registry_pb2.ShareAdapterRequest(**fields)) if share
                else reg.call("UnshareAdapter", registry_pb2.UnshareAdapterRequest(**fields)))
    if json_out:
        _print_json(to_dict(resp))
        return
    what = {(True, True): "shared", (True, False): "already shared",
            (False, True): "no longer shared", (False, False): "was not shared"}
    left = ", ".join(resp.grantee_tenant_ids) or "nobody"
    out.print(f"{tenant}/{name} {what[share, resp.changed]} with {with_tenant}; "
              f"shared with: {left}")


@adapters_app.command("share")
def adapters_share(
    adapter: Annotated[str, typer.Argument(help="TENANT/NAME (the owner's adapter)")],
    with_tenant: Annotated[str, typer.Option("--with", help="Tenant to share with.")],
    json_out: JsonOpt = False,
) -> None:
    """Let another tenant call an adapter by name (every version its release selects)."""
    _change_share(adapter, with_tenant, json_out, share=True)


@adapters_app.command("unshare")
def adapters_unshare(
    adapter: Annotated[str, typer.Argument(help="TENANT/NAME (the owner's adapter)")],
    with_tenant: Annotated[str, typer.Option("--with", help="Tenant whose share ends.")],
    json_out: JsonOpt = False,
) -> None:
    """End a share: the other tenant's calls are refused within seconds."""
    _change_share(adapter, with_tenant, json_out, share=False)


@adapters_app.command("shares")
def adapters_shares(
    target: Annotated[str, typer.Argument(help="TENANT or TENANT/NAME")],
    json_out: JsonOpt = False,
) -> None:
    """List the shares of one adapter, or of every adapter of a tenant."""
    tenant, _, name = target.partition("/")
    with _client() as reg:
        shares = reg.call("ListShares", registry_pb2.ListSharesRequest(
            tenant_id=tenant, adapter_name=name)).shares
    if json_out:
        _print_json([to_dict(x) for x in shares])
        return
    table = Table("adapter", "shared with", "since")
    for x in shares:
        table.add_row(f"{x.tenant_id}/{x.adapter_name}", x.grantee_tenant_id,
                      x.created_at.ToDatetime().isoformat(timespec="seconds"))
    out.print(table)


# --------------------------------------------------------------------------- release ops


ReasonOpt = Annotated[str, typer.Option(help="Why (audit log).")]


def _print_release(rel: registry_pb2.ReleasePointers, json_out: bool) -> None:
    if json_out:
        _print_json(to_dict(rel))
        return
    canary = f"{rel.canary_version} @ {rel.canary_percent}%" if rel.canary_version else "-"
    paused = " (analysis paused)" if rel.canary_paused else ""
    if rel.canary_version and not rel.canary_cleared:
        paused += " (not cleared for tenant traffic: golden set pending)"
    out.print(f"{rel.adapter_id}: stable={rel.stable_version or '-'} canary={canary}{paused} "
              f"rollback_to={rel.rollback_to or '-'}")


@app.command()
def promote(
    adapter: Annotated[str, typer.Argument(help="TENANT/NAME")],
    version: str,
    reason: ReasonOpt = "",
    json_out: JsonOpt = False,
) -> None:
    """Make an admitted version the stable version."""
    tenant, name = _split_adapter(adapter)
    with _client() as reg:
        rel = reg.call("Promote", registry_pb2.PromoteRequest(
            tenant_id=tenant, adapter_name=name, version=version, reason=reason)).release
    _print_release(rel, json_out)


CANARY_ACTIONS = ("status", "pause", "resume", "abort", "promote")
"""``loraplane canary ACTION TENANT/NAME``: the canary analysis' controls."""
ANALYSIS_ACTOR = "system/canary-analysis"
"""The actor of the automated steps (``loraplane.cache_manager.canary_runner.ACTOR``)."""
ANALYSIS_PREFIX = "canary-analysis "
"""Their audit reason: this prefix, then the decision's figures as JSON."""


@app.command()
def canary(
    target: Annotated[str, typer.Argument(
        metavar="TENANT/NAME|ACTION",
        help="TENANT/NAME to set a share, or an action: " + ", ".join(CANARY_ACTIONS))],
    version: Annotated[str, typer.Argument(
        metavar="VERSION|TENANT/NAME",
        help="Admitted version ('' with 0 clears); after an action: TENANT/NAME.")] = "",
    percent: Annotated[int | None, typer.Argument(help="Share of requests, 0..100.")] = None,
    reason: ReasonOpt = "",
    json_out: JsonOpt = False,
) -> None:
    """Set (or clear) the canary version and its traffic share, or control the canary
    analysis: ``canary status|pause|resume|abort|promote TENANT/NAME``.

    status: pointers, paused or not, and the analysis' automated steps (audit log) with
    the figures that decided them; pause / resume: stop / restart the automated advance
    and promote steps (failure rules still abort); abort: share to 0, stable unchanged;
    promote: make the canary stable now."""
    if target in CANARY_ACTIONS:
        if percent is not None:
            raise typer.BadParameter(f"canary {target} takes TENANT/NAME only "
                                     f"(got an extra {percent!r})")
        if not version:
            raise typer.BadParameter(f"canary {target}: TENANT/NAME is required")
        _canary_action(target, *_split_adapter(version), reason, json_out)
        return
    if "/" not in target:
        raise typer.BadParameter(f"{target!r}: expected TENANT/NAME or one of "
                                 f"{', '.join(CANARY_ACTIONS)}")
    tenant, name = _split_adapter(target)
    if percent is None:
        raise typer.BadParameter("PERCENT is required to set a canary (0..100)")
    if not 0 <= percent <= 100:
        raise typer.BadParameter(f"percent {percent} is outside 0..100")
    with _client() as reg:
        rel = reg.call("SetCanary", registry_pb2.SetCanaryRequest(
            tenant_id=tenant, adapter_name=name, version=version, percent=percent,
            reason=reason)).release
    _print_release(rel, json_out)


def _analysis_steps(reg: RegistryClient, tenant: str, name: str) -> list[dict[str, Any]]:
    entries = reg.call("ListAudit", registry_pb2.ListAuditRequest(
        subject_prefix=f"{tenant}/{name}", actor=ANALYSIS_ACTOR, page_size=50)).entries
    steps: list[dict[str, Any]] = []
    for e in entries:
        if e.subject != f"{tenant}/{name}":
            continue  # another adapter whose name starts the same
        after = json.loads(e.after_json or "{}")
        text = str(after.get("reason", ""))
        figures = json.loads(text[len(ANALYSIS_PREFIX):]) \
            if text.startswith(ANALYSIS_PREFIX) else {}
        steps.append({"at": e.at.ToDatetime().isoformat(timespec="seconds"),
                      "action": e.action, "figures": figures})
    return steps


def step_change(figures: dict[str, Any]) -> str:
    """What an automated step changed, for the status table: a canary's share, or (a
    failing stable version taken out) the stable pointer."""
    if "to_version" in figures:  # a stable step (rollback / withdraw)
        stable = figures.get("stable", {}).get("version", "?")
        return f"stable {stable} → {figures['to_version'] or 'withdrawn from HOT'}"
    return f"{figures.get('from_percent', '?')} → {figures.get('to_percent', '?')} %"


def _canary_action(action: str, tenant: str, name: str, reason: str, json_out: bool) -> None:
    with _client() as reg:
        rel = reg.call("GetRelease", registry_pb2.GetReleaseRequest(
            tenant_id=tenant, adapter_name=name)).release
        if action == "status":
            steps = _analysis_steps(reg, tenant, name)
            if json_out:
                _print_json({"release": to_dict(rel), "analysis_steps": steps})
                return
            _print_release(rel, False)
            out.print(f"analysis: {'paused' if rel.canary_paused else 'running'}"
                      if rel.canary_version else "analysis: no canary")
            table = Table("at", "step", "reason", "change", "detail")
            for st in steps:
                f = st["figures"]
                table.add_row(st["at"], str(f.get("action", st["action"])),
                              str(f.get("reason", "")), step_change(f),
                              str(f.get("detail", ""))[:80])
            out.print(table)
            return
        if not rel.canary_version:
            err.print(f"[red]error:[/] {tenant}/{name} has no canary to {action}")
            raise typer.Exit(EXIT_ERROR)
        why = reason or f"manual canary {action}"
        if action in ("pause", "resume"):
            rel = reg.call("PauseCanary", registry_pb2.PauseCanaryRequest(
                tenant_id=tenant, adapter_name=name, paused=action == "pause",
                reason=why)).release
        elif action == "abort":
            rel = reg.call("SetCanary", registry_pb2.SetCanaryRequest(
                tenant_id=tenant, adapter_name=name, version="", percent=0,
                reason=why)).release
        else:
            rel = reg.call("Promote", registry_pb2.PromoteRequest(
                tenant_id=tenant, adapter_name=name, version=rel.canary_version,
                reason=why)).release
    _print_release(rel, json_out)


@app.command()
def rollback(
    adapter: Annotated[str, typer.Argument(help="TENANT/NAME")],
    to: Annotated[str, typer.Option("--to", help="Version (default: rollback_to).")] = "",
    reason: ReasonOpt = "",
    json_out: JsonOpt = False,
) -> None:
    """Move the stable pointer back."""
    tenant, name = _split_adapter(adapter)
    with _client() as reg:
        rel = reg.call("Rollback", registry_pb2.RollbackRequest(
            tenant_id=tenant, adapter_name=name, to_version=to, reason=reason)).release
    _print_release(rel, json_out)


@app.command()
def retire(
    adapter: Annotated[str, typer.Argument(help="TENANT/NAME")],
    version: str,
    reason: ReasonOpt = "",
) -> None:
    """Retire a version (never the stable one)."""
    tenant, name = _split_adapter(adapter)
    with _client() as reg:
        v = reg.call("Retire", registry_pb2.RetireRequest(
            tenant_id=tenant, adapter_name=name, version=version, reason=reason)).version
    out.print(f"{v.adapter_id}@{v.version}: {status_name(v.status)}")


@app.command()
def audit(
    subject: Annotated[str, typer.Option(help="Subject prefix, e.g. acme/.")] = "",
    actor: Annotated[str, typer.Option(help="Only this actor.")] = "",
    action: Annotated[str, typer.Option(help="Only this action.")] = "",
    limit: Annotated[int, typer.Option(help="Most entries to show.")] = 50,
    json_out: JsonOpt = False,
) -> None:
    """Show the audit log, newest first."""
    with _client() as reg:
        entries = reg.call("ListAudit", registry_pb2.ListAuditRequest(
            subject_prefix=subject, actor=actor, action=action, page_size=limit)).entries
    if json_out:
        _print_json([to_dict(e) for e in entries])
        return
    table = Table("at", "actor", "action", "subject", "after")
    for e in entries:
        table.add_row(e.at.ToDatetime().isoformat(timespec="seconds"), e.actor, e.action,
                      e.subject, e.after_json[:80])
    out.print(table)
