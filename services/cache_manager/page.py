"""The placement page: workers × tiers, read-only, for operators (``/placement``).

Served on ``LORAPLANE_CACHE_MANAGER_PAGE_PORT`` (0 = off) by every instance; the data comes
from the leader's live core (a standby answers 503, like the read API's UNAVAILABLE).

* ``GET /placement``: one HTML page, no front-end build: a table with one row per worker
  and one column per tier (HOT, WARM), each version with its heat (the policy's HOT
  ranking score now), requests in flight, protection (pinned, canary or priority) and the
  reason of its last move (the newest decision on that worker). Inline JS polls
  ``placement.json`` every :data:`POLL_S` seconds and redraws; moves it sees between two
  polls are listed under the table.
* ``GET /placement.json``: the same data (:func:`placement_view`).

Both need the operator token (``LORAPLANE_REGISTRY_OPERATOR_TOKEN``, the one the registry's
admin API and the ``loraplane`` CLI use): ``Authorization: Bearer <token>``, or once
``/placement?token=<token>``, which answers with a cookie holding an HMAC of the token
(HttpOnly, SameSite=Strict; the token itself is never stored in the browser) and redirects
to ``/placement`` so the token leaves the address bar. Anything else is 401. The page
holds no secret: the cache manager knows no API key, and artifact locations and digests
are left out. Tenant-given names are drawn as text (``textContent``), never as HTML, and a
per-response CSP nonce is the only way a script runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from loraplane.cache_manager.core import CacheCore
from loraplane.cache_manager.planner import project
from loraplane.policy.predicates import protection_of
from loraplane.shared.vocab import Tier

POLL_S = 2.0
"""How often the page polls ``placement.json``."""
COOKIE = "loraplane_operator"
_COOKIE_CONTEXT = b"loraplane placement page"
PageCounter = Callable[[str, int], None]
"""Called with (path, status code) for every request (the page's request counter)."""


def _cookie_value(token: str) -> str:
    return hmac.new(token.encode(), _COOKIE_CONTEXT, hashlib.sha256).hexdigest()


def placement_view(core: CacheCore, now: float) -> dict[str, Any]:
    """Workers × tiers with each version's heat, in flight, protection and last move.

    Heat and protection come from a snapshot built the way a planning round builds it
    (the policy's HOT ranking score at ``now``); the last move is the newest decision of
    the version on that worker, if the decision log still holds one."""
    state = core.state
    planner = core.planner
    snapshot = planner.build_snapshot(state, project(state, core.tracker), now)
    last: dict[tuple[str, str], dict[str, Any]] = {}
    for e in core.decisions:
        last[(e.worker_id, e.ref.version_id)] = {
            "action": e.kind.value, "from": e.from_tier.name, "to": e.to_tier.name,
            "reason": e.reason if not e.detail else f"{e.reason}: {e.detail}",
            "by": e.policy, "at": e.at,
        }
    workers: list[dict[str, Any]] = []
    for wid in sorted(state.workers):
        w = state.workers[wid]
        tiers: dict[str, list[dict[str, Any]]] = {"HOT": [], "WARM": []}
        for vid, p in sorted(w.placements.items()):
            meta = snapshot.versions.get(vid)
            protection = protection_of(meta, planner.policy_config) if meta else None
            tiers["HOT" if p.tier is Tier.HOT else "WARM"].append({
                "version_id": vid, "tenant": p.ref.tenant_id, "adapter": p.ref.adapter_name,
                "version": p.ref.version, "base_model": p.ref.base_model,
                "heat": round(planner.heat_of(snapshot, vid, now), 4),
                "in_flight": p.in_flight, "pinned": p.pinned,
                "protection": protection.value if protection is not None else "",
                "priority": meta.priority.value if meta is not None else "",
                "last_move": last.get((wid, vid)),
            })
        for entries in tiers.values():
            entries.sort(key=lambda x: (-x["heat"], x["version_id"]))
        workers.append({
            "id": wid, "alive": w.alive, "synced": w.synced, "ready": w.ready,
            "base_models": [
                {"name": bm, "hot_capacity": cap.slots,
                 "hot_used": sum(1 for p in w.placements.values()
                                 if p.tier is Tier.HOT and p.ref.base_model == bm)}
                for bm, cap in sorted(w.capacities.items())
            ],
            "warm_bytes_capacity": w.warm_bytes_capacity,
            "warm_bytes_used": sum(p.size_bytes for p in w.placements.values()),
            "tiers": tiers,
        })
    return {"generated_at": now, "policy": core.policy_name, "workers": workers}


def create_page_app(
    core: Callable[[], CacheCore | None],
    *,
    token: str,
    instance: str,
    clock: Callable[[], float] = time.time,
    count: PageCounter | None = None,
) -> FastAPI:
    """The page's ASGI app; ``token``: the operator token (must not be empty)."""
    if not token:
        raise ValueError("the placement page needs the operator token "
                         "(LORAPLANE_REGISTRY_OPERATOR_TOKEN)")
    expected_cookie = _cookie_value(token)
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    def counted(path: str, response: Response) -> Response:
        response.headers["cache-control"] = "no-store"
        if count is not None:
            count(path, response.status_code)
        return response

    def authorized(request: Request) -> bool:
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(),
                                                              token.encode()):
            return True
        cookie = request.cookies.get(COOKIE, "")
        return bool(cookie) and hmac.compare_digest(cookie.encode(), expected_cookie.encode())

    def refused(path: str, json: bool) -> Response:
        message = ("operator token required: send 'Authorization: Bearer <token>' or open "
                   "/placement?token=<token> once")
        body: Response = (JSONResponse({"error": message}, status_code=401) if json
                          else HTMLResponse(f"<!doctype html><title>401</title><p>{message}</p>",
                                            status_code=401))
        body.headers["www-authenticate"] = 'Bearer realm="loraplane cache manager"'
        return counted(path, body)

    @app.get("/placement")
    async def page(request: Request) -> Response:
        given = request.query_params.get("token")
        if given is not None:
            if not hmac.compare_digest(given.encode(), token.encode()):
                return refused("page", json=False)
            response: Response = RedirectResponse("/placement", status_code=303)
            response.set_cookie(COOKIE, expected_cookie, httponly=True, samesite="strict",
                                path="/")
            return counted("page", response)
        if not authorized(request):
            return refused("page", json=False)
        nonce = secrets.token_urlsafe(16)
        html = PAGE_HTML.replace("{{nonce}}", nonce).replace("{{poll_ms}}",
                                                              str(int(POLL_S * 1000)))
        response = HTMLResponse(html.replace("{{instance}}", _escape(instance)))
        response.headers["content-security-policy"] = (
            f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
            "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
        return counted("page", response)

    @app.get("/placement.json")
    async def data(request: Request) -> Response:
        if not authorized(request):
            return refused("json", json=True)
        live = core()
        if live is None:
            return counted("json", JSONResponse(
                {"error": f"cache manager {instance} is a standby (not leading)",
                 "instance": instance}, status_code=503, headers={"retry-after": "1"}))
        view = placement_view(live, clock())
        view["instance"] = instance
        return counted("json", JSONResponse(view))

    return app


def _escape(text: str) -> str:
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


class PageServer(uvicorn.Server):
    """uvicorn inside the service's loop (the process's signal handling stays its own)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def page_server(app: FastAPI, host: str, port: int) -> PageServer:
    """A server for :func:`create_page_app` on ``host:port`` (run with ``await .serve()``)."""
    return PageServer(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                     lifespan="off", access_log=False))


PAGE_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>loraplane placement</title>
<style nonce="{{nonce}}">
body { font: 13px/1.4 system-ui, sans-serif; margin: 16px; color: #1d2330; background: #f6f7f9; }
h1 { font-size: 18px; margin: 0 0 4px; }
#status { color: #555; margin-bottom: 12px; }
#status.error { color: #b00020; font-weight: 600; }
table { border-collapse: collapse; width: 100%; background: #fff; }
th, td { border: 1px solid #d5d9e0; padding: 6px 8px; vertical-align: top; text-align: left; }
th { background: #e9ecf1; }
td.worker { width: 16%; }
td.worker .id { font-weight: 600; }
.muted { color: #667; }
.down { color: #b00020; font-weight: 600; }
.v { border: 1px solid #d5d9e0; border-radius: 4px; padding: 4px 6px; margin: 0 0 6px;
     background: #fbfcfd; }
.v.HOT { border-left: 4px solid #d9480f; }
.v.WARM { border-left: 4px solid #f2a900; }
.v .name { font-weight: 600; }
.tag { display: inline-block; border-radius: 3px; padding: 0 4px; margin-right: 4px;
       font-size: 11px; background: #e9ecf1; }
.tag.prot { background: #e3f2e1; color: #1e6b27; }
.tag.pin { background: #e6ecfb; color: #2749a8; }
.tag.busy { background: #fdecea; color: #8a1c12; }
.reason { color: #445; font-size: 12px; }
#moves { margin-top: 12px; }
#moves li { font-family: ui-monospace, monospace; font-size: 12px; }
</style>
</head>
<body>
<h1>loraplane placement <span class="muted">({{instance}})</span></h1>
<div id="status">loading…</div>
<table>
<thead><tr><th>worker</th><th>HOT</th><th>WARM</th></tr></thead>
<tbody id="rows"></tbody>
</table>
<div id="moves"><strong>moves seen on this page</strong><ul id="movelist"></ul></div>
<script nonce="{{nonce}}">
"use strict";
const POLL_MS = {{poll_ms}};
let polls = 0;
let previous = null;
const moves = [];

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = String(text);
  return e;
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}

function when(epoch) {
  return new Date(epoch * 1000).toISOString().substring(11, 19);
}

function version(v, tier) {
  const box = el("div", "v " + tier);
  box.dataset.version = v.version_id;
  box.appendChild(el("div", "name", v.version_id));
  const tags = el("div");
  tags.appendChild(el("span", "tag", "heat " + v.heat.toFixed(3)));
  tags.appendChild(el("span", "tag" + (v.in_flight ? " busy" : ""), "in flight " + v.in_flight));
  if (v.pinned) tags.appendChild(el("span", "tag pin", "pinned"));
  if (v.protection) tags.appendChild(el("span", "tag prot", "protected: " + v.protection +
                                        (v.protection === "priority" ? " (" + v.priority + ")" : "")));
  box.appendChild(tags);
  const m = v.last_move;
  box.appendChild(el("div", "reason", m
    ? "last move " + when(m.at) + ": " + m.action + " " + m.from + "→" + m.to + ", " + m.reason +
      " (" + m.by + ")"
    : "no decision of this cache manager (placed by the worker itself, or before it led)"));
  return box;
}

function render(data) {
  const rows = document.getElementById("rows");
  rows.replaceChildren();
  const now = {};
  for (const w of data.workers) {
    const tr = el("tr");
    tr.dataset.worker = w.id;
    const cell = el("td", "worker");
    cell.appendChild(el("div", "id", w.id));
    cell.appendChild(el("div", w.alive ? "muted" : "down",
                        (w.alive ? "alive" : "gone") + (w.synced ? ", synced" : "") +
                        (w.ready ? ", ready" : ", not ready")));
    for (const b of w.base_models) {
      cell.appendChild(el("div", "muted", b.name + ": HOT " + b.hot_used + "/" + b.hot_capacity));
    }
    cell.appendChild(el("div", "muted", "WARM " + bytes(w.warm_bytes_used) + " / " +
                        bytes(w.warm_bytes_capacity)));
    tr.appendChild(cell);
    for (const tier of ["HOT", "WARM"]) {
      const td = el("td");
      td.dataset.tier = tier;
      for (const v of w.tiers[tier]) {
        td.appendChild(version(v, tier));
        now[w.id + " " + v.version_id] = tier;
      }
      if (!w.tiers[tier].length) td.appendChild(el("span", "muted", "—"));
      tr.appendChild(td);
    }
    rows.appendChild(tr);
  }
  if (previous !== null) {
    const keys = new Set([...Object.keys(previous), ...Object.keys(now)]);
    for (const k of keys) {
      const a = previous[k] || "COLD", b = now[k] || "COLD";
      if (a !== b) {
        const [wid, vid] = k.split(" ");
        moves.unshift(when(data.generated_at) + " " + vid + " on " + wid + ": " + a + "→" + b);
      }
    }
    moves.splice(30);
  }
  previous = now;
  const list = document.getElementById("movelist");
  list.replaceChildren(...moves.map((m) => el("li", "", m)));
}

async function poll() {
  const status = document.getElementById("status");
  try {
    const r = await fetch("placement.json", {credentials: "same-origin", cache: "no-store"});
    const data = await r.json();
    if (!r.ok) throw new Error(r.status + ": " + (data.error || r.statusText));
    polls++;
    render(data);
    status.className = "";
    status.textContent = "policy " + data.policy + " · " + data.workers.length +
      " workers · updated " + when(data.generated_at) + " UTC · poll " + polls +
      " (every " + POLL_MS / 1000 + " s)";
    status.dataset.polls = String(polls);
  } catch (err) {
    status.className = "error";
    status.textContent = "not updated: " + err.message;
  }
  setTimeout(poll, POLL_MS);
}
poll();
</script>
</body>
</html>
"""
