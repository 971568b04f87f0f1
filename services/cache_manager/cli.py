"""``loraplane cache``: what the cache manager sees and decided (its read API).

``loraplane cache status`` lists every worker (alive, HOT slots, host bytes, what
it holds) and the most recent decisions with their reasons;
``loraplane cache placement acme/support@v3`` shows where one version is.
The address comes from ``--addr``, ``LORAPLANE_CACHE_MANAGER_ADDR``, or
``127.0.0.1:$LORAPLANE_CACHE_MANAGER_GRPC_PORT`` (the ``make run`` port by default).
"""

from __future__ import annotations

import json
import os
from datetime import UTC
from typing import Annotated

import grpc
import typer
from google.protobuf.json_format import MessageToDict
from rich.console import Console
from rich.table import Table
from rich.text import Text

from loraplane.cache_manager.settings import DEFAULT_GRPC_PORT
from loraplane.cache_manager.store import split_version_id
from loraplane.shared.settings import CommonSettings
from loraplane.shared.tls import CACHE_MANAGER, secure_or_insecure_channel
from loraplane.v1 import cache_pb2, cache_pb2_grpc, common_pb2

app = typer.Typer(help="Cache manager: placement of adapter versions on workers, decisions.",
                  no_args_is_help=True)

AddrOption = Annotated[str | None, typer.Option(
    "--addr", help="Cache manager host:port (default: LORAPLANE_CACHE_MANAGER_ADDR or "
    "127.0.0.1:$LORAPLANE_CACHE_MANAGER_GRPC_PORT).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]

_TIER = {common_pb2.TIER_HOT: "HOT", common_pb2.TIER_WARM: "WARM", common_pb2.TIER_COLD: "COLD",
         common_pb2.TIER_UNSPECIFIED: "-"}
_ACTION = {v.number: v.name.removeprefix("DECISION_ACTION_").lower()
           for v in cache_pb2.DecisionAction.DESCRIPTOR.values}


def _addr(addr: str | None) -> str:
    if addr:
        return addr
    env = os.environ.get("LORAPLANE_CACHE_MANAGER_ADDR")
    if env:
        return env
    return f"127.0.0.1:{os.environ.get('LORAPLANE_CACHE_MANAGER_GRPC_PORT', DEFAULT_GRPC_PORT)}"


def _stub(addr: str | None) -> tuple[grpc.Channel, cache_pb2_grpc.CacheManagerStub]:
    # mutual TLS when LORAPLANE_TLS_* name the operator's certificate (demo.env does)
    channel = secure_or_insecure_channel(_addr(addr), CommonSettings().tls_files(),
                                         server=CACHE_MANAGER)
    return channel, cache_pb2_grpc.CacheManagerStub(channel)


def _fail(exc: grpc.RpcError) -> typer.Exit:
    typer.echo(f"error: {exc.code().name}: {exc.details()}", err=True)
    return typer.Exit(1)


def _vid(ref: common_pb2.AdapterRef) -> str:
    return f"{ref.tenant_id}/{ref.adapter_name}@{ref.version}"


@app.command("status")
def status(
    addr: AddrOption = None,
    decisions: Annotated[int, typer.Option("--decisions", "-n", help="Recent decisions.")] = 15,
    worker: Annotated[str, typer.Option("--worker", help="Only this worker.")] = "",
    as_json: JsonOption = False,
) -> None:
    """Workers with their tiers, and the most recent decisions with their reasons."""
    channel, stub = _stub(addr)
    with channel:
        try:
            workers = stub.ListWorkers(cache_pb2.ListWorkersRequest(), timeout=5)
            recent = stub.ListDecisions(
                cache_pb2.ListDecisionsRequest(limit=decisions, worker_id=worker), timeout=5)
        except grpc.RpcError as exc:
            raise _fail(exc) from exc
    shown = [w for w in workers.workers if not worker or w.state.worker_id == worker]
    if as_json:
        typer.echo(json.dumps({
            "workers": [MessageToDict(w) for w in shown],
            "decisions": [MessageToDict(d) for d in recent.decisions],
        }, indent=2))
        return
    console = Console()
    for table in status_tables(shown, list(recent.decisions)):
        console.print(table)


def _bytes(n: int) -> str:
    """``1536`` → ``1.5 KiB`` (short, so the workers table fits 80 columns)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def status_tables(
    workers: list[cache_pb2.WorkerInfo], decisions: list[cache_pb2.Decision]
) -> list[Table]:
    """The three tables of ``loraplane cache status``, laid out for an 80-column terminal:
    workers (one line each), placements (one version per line, HOT first) and decisions
    (id over time, action over tiers, the version over its reason, heat and policy)."""
    wt = Table(title=f"workers ({len(workers)})", title_justify="left")
    for col in ("worker", "alive", "HOT registered used/cap (pinned) · GPU slots used/cap",
                "WARM bytes used/cap"):
        wt.add_column(col, overflow="fold")
    pt = Table(title="placements", title_justify="left")
    for col in ("worker", "tier", "version", "pin", "GPU slot", "in flight"):
        pt.add_column(col, overflow="fold")
    for w in workers:
        s = w.state
        slots = "\n".join(f"{c.base_model}: {c.hot_slots_used}/{c.hot_slots_capacity} "
                          f"({c.hot_slots_pinned})"
                          + (f" · {c.gpu_slots_used}/{c.gpu_slots}" if c.gpu_slots else "")
                          for c in s.capacities) or "-"
        wt.add_row(s.worker_id, "yes" if w.alive else "GONE", slots,
                   f"{_bytes(s.warm_bytes_used)} / {_bytes(s.warm_bytes_capacity)}")
        placed = sorted(s.placements, key=lambda p: (p.tier != common_pb2.TIER_HOT, _vid(p.adapter)))
        for p in placed:
            pt.add_row(s.worker_id, _TIER[p.tier], Text(_vid(p.adapter)),
                       "yes" if p.pinned else "", "yes" if p.slot_resident else "",
                       str(p.in_flight) if p.in_flight else "")
    dt = Table(title=f"recent decisions ({len(decisions)})", title_justify="left")
    for col in ("id / at UTC", "action", "version / reason", "worker"):
        dt.add_column(col, overflow="fold")
    for d in decisions:
        at = d.at.ToDatetime(tzinfo=UTC).strftime("%H:%M:%S")
        what = Text(_vid(d.adapter))
        what.append(f"\n{d.reason} · heat {d.heat_score:.2f} · {d.policy}", style="dim")
        dt.add_row(f"{d.id}\n{at}",
                   f"{_ACTION.get(d.action, '?')}\n{_TIER[d.from_tier]}→{_TIER[d.to_tier]}",
                   what, d.worker_id)
    return [wt, pt, dt]


@app.command("placement")
def placement(
    version: Annotated[str, typer.Argument(help="tenant/name@version")],
    base_model: Annotated[str, typer.Option("--base-model")] = "",
    addr: AddrOption = None,
    as_json: JsonOption = False,
) -> None:
    """Where one version is (HOT first)."""
    parts = split_version_id(version)
    if parts is None:
        raise typer.BadParameter("expected tenant/name@version")
    adapter_id, label = parts
    tenant, _, name = adapter_id.partition("/")
    ref = common_pb2.AdapterRef(tenant_id=tenant, adapter_name=name, version=label,
                                base_model=base_model)
    channel, stub = _stub(addr)
    with channel:
        try:
            resp = stub.GetPlacement(cache_pb2.GetPlacementRequest(adapter=ref), timeout=5)
        except grpc.RpcError as exc:
            raise _fail(exc) from exc
    if as_json:
        typer.echo(json.dumps(MessageToDict(resp), indent=2))
        return
    if not resp.placements:
        typer.echo(f"{version}: COLD everywhere")
        return
    for p in resp.placements:
        pl = p.placement
        typer.echo(f"{p.worker_id:<16} {_TIER[pl.tier]:<5} pinned={pl.pinned} "
                   f"gpu_slot={pl.slot_resident} in_flight={pl.in_flight} {p.grpc_address}")
