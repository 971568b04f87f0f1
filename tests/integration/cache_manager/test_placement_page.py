"""The placement page in headless Chromium (issue 17, item 6).

A cache-manager process (its page on a free port, the operator token set) commands two
workers (the worker service on the null engine: real Kafka loops, real S3 fetch and
signature checks, real reports; no model, because the page shows placement, not tokens).
Eight versions of this test's tenant are registered (one platinum, one canary) and heated
so that the policy places them HOT and WARM on both workers. Then:

* without the token (or with a wrong one) the page and its JSON are 401; with it, 200;
* Debian's ``chromium`` (headless, driven over ``--remote-debugging-pipe``: no extra
  package) opens ``/placement?token=…``, is redirected to ``/placement`` with a cookie,
  draws workers × tiers; a version heated while the page is open appears on it and in
  its list of moves without a reload (live refresh); the screenshot is kept as
  ``.loraplane/artifacts/placement-page.png``;
* neither the page (DOM) nor its JSON holds the operator token, the object store's secret
  or the versions' artifact locations and digests (the cache manager holds no API key).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from loraplane.cache_manager.model import Ref
from loraplane.devkit.builder import build_demo
from loraplane.shared.tls import WORKER
from loraplane.stack.stack import Stack
from loraplane.worker.app import WorkerApp
from loraplane.worker.null_engine import NullEngine
from loraplane.worker.settings import WorkerSettings
from tests.support import eventgen as ev
from tests.support.cache_manager import Bus, Launcher, Manager, Registry, free_port, reset_topics
from tests.support.tls import tls_settings

REPO = Path(__file__).resolve().parents[3]
ARTIFACT = REPO / ".loraplane" / "artifacts" / "placement-page.png"
TOKEN = "page-test-operator-token-0123456789"
HOT_SLOTS = 3
"""Per worker: min(max_loras 3, max_cpu_loras 4 - the all-zero adapter)."""


class Chromium:
    """Headless Chromium over the DevTools protocol on a pipe (fd 3 in, fd 4 out)."""

    def __init__(self, width: int = 1500, height: int = 1100) -> None:
        exe = shutil.which("chromium") or shutil.which("chromium-browser")
        assert exe, "chromium is not installed (scripts/install.sh installs Debian's package)"
        to_chrome_r, self._w = (_high(fd) for fd in os.pipe())
        self._r, from_chrome_w = (_high(fd) for fd in os.pipe())
        self.profile = tempfile.mkdtemp(prefix="lp-chromium-")
        self.log = Path(self.profile) / "chromium.log"
        self._log = self.log.open("wb")
        self.proc = subprocess.Popen(  # the shell moves the pipe ends onto fds 3 and 4
            ["bash", "-c", f'exec "$@" 3<&{to_chrome_r} 4>&{from_chrome_w}', "chromium",
             exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-extensions", "--remote-debugging-pipe", f"--window-size={width},{height}",
             f"--user-data-dir={self.profile}", "about:blank"],
            pass_fds=(to_chrome_r, from_chrome_w),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._id = 0
        self.session = ""

    def _send(self, method: str, params: dict[str, Any] | None = None,
              session: str = "") -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self._buf:
                chunk = os.read(self._r, 1 << 20)
                assert chunk, f"chromium closed its pipe: {self.log.read_text()[-3000:]}"
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                assert "error" not in reply, (method, reply["error"])
                return dict(reply.get("result", {}))

    def open(self, url: str) -> None:
        target = self._send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self._send("Target.attachToTarget",
                                  {"targetId": target, "flatten": True})["sessionId"]
        self._send("Page.enable", session=self.session)
        self._send("Page.navigate", {"url": url}, session=self.session)

    def eval(self, expression: str) -> Any:
        result = self._send("Runtime.evaluate", {"expression": expression,
                                                 "returnByValue": True}, session=self.session)
        return result.get("result", {}).get("value")

    def screenshot(self, path: Path) -> None:
        data = self._send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                          session=self.session)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._send("Browser.close")
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._w)
        os.close(self._r)
        self._log.close()
        shutil.rmtree(self.profile, ignore_errors=True)


def _high(fd: int) -> int:
    """``fd`` moved to 10 or above (the shell then puts the pipe ends on 3 and 4)."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return moved


def http(url: str, token: str | None = None) -> tuple[int, str, dict[str, str]]:
    req = urllib.request.Request(url)
    if token is not None:
        req.add_header("authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(), dict(err.headers)


def worker_settings(stack: Stack, tmp: Path, worker_id: str) -> WorkerSettings:
    s = stack.settings
    demo = build_demo()
    return WorkerSettings(
        worker_id=worker_id, worker_grpc_port=0, worker_metrics_port=0,
        kafka_bootstrap=s.kafka_bootstrap, **s.s3_settings(),
        artifact_bucket=s.artifact_bucket, base_model=demo.base_model.name,
        base_model_dir=demo.base_model.dir, trusted_keys=str(demo.keys.public_key),
        tokenizer_revision=demo.base_model.tokenizer_revision,
        worker_host_dir=tmp / worker_id, worker_max_loras=HOT_SLOTS, worker_max_cpu_loras=4,
        worker_max_lora_rank=16, worker_state_interval_s=1.0, worker_heat_flush_s=0.5,
        worker_drain_timeout_s=10.0, **tls_settings(stack, WORKER),
    )


@pytest.fixture
async def workers(stack: Stack, tmp_path: Path, unique: str) -> AsyncIterator[list[WorkerApp]]:
    apps: list[WorkerApp] = []
    try:
        for n in range(2):
            settings = worker_settings(stack, tmp_path, f"page-{unique}-w{n}")
            app = WorkerApp(settings, NullEngine(settings.limits, build_demo().base_model.dir),
                            registry=CollectorRegistry())
            await app.start()
            apps.append(app)
        yield apps
    finally:
        for app in apps:
            await app.stop(1)


async def eventually(check: Any, *, timeout_s: float = 40.0, every_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(every_s)
    raise AssertionError(f"not within {timeout_s}s; last: {last!r}")


def page_json(port: int) -> dict[str, Any]:
    code, body, _ = http(f"http://127.0.0.1:{port}/placement.json", TOKEN)
    return json.loads(body) if code == 200 else {}


def placed(view: dict[str, Any]) -> dict[str, set[str]]:
    """Tier → versions placed there (any worker)."""
    out: dict[str, set[str]] = {"HOT": set(), "WARM": set()}
    for w in view.get("workers", []):
        for tier, entries in w["tiers"].items():
            out[tier].update(e["version_id"] for e in entries)
    return out


def page_requests(m: Manager, path: str) -> float:
    total = 0.0
    code, body, _ = http(f"http://127.0.0.1:{m.metrics_port}/metrics")
    assert code == 200, body[-3000:]
    for line in body.splitlines():
        if not line.startswith("loraplane_cache_page_requests_total"):
            continue
        if f'path="{path}"' in line and 'code="200"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_placement_page_in_headless_chromium(
    stack: Stack, tmp_path: Path, unique: str, workers: list[WorkerApp]
) -> None:
    s = stack.settings
    await reset_topics(s.kafka_bootstrap)
    bus = Bus(s.kafka_bootstrap)
    await bus.start()
    tenant = f"page-{unique}"
    registry = Registry(s.postgres_dsn, tenant)
    await registry.tenant_row()
    demo = build_demo()
    s3 = s.s3_client()
    refs: list[Ref] = []
    uris: list[str] = []
    for i in range(9):  # eight placed by heat, the ninth heated while the page is open
        a = demo.adapters[i % len(demo.adapters)]
        prefix = f"adapters/{tenant}/{a.name}-{i}/v1/"
        for f in sorted(Path(a.dir).iterdir()):
            s3.fput_object(s.artifact_bucket, prefix + f.name, str(f))
        uris.append(f"s3://{s.artifact_bucket}/{prefix}")
        refs.append(await registry.version(
            f"{a.name}-{i}", "v1", status="canary" if i == 1 else "active",
            priority="platinum" if i == 0 else None, size=a.size_bytes, rank=a.rank,
            base_model=a.base_model, artifact_uri=uris[-1], sha256=a.manifest_digest))
    page_port = free_port()
    launcher = Launcher(s.client_env(), tmp_path, unique, tenants=tenant, stack=stack)
    chrome: Chromium | None = None
    try:
        m = launcher.start(LORAPLANE_CACHE_MANAGER_PAGE_PORT=str(page_port),
                           LORAPLANE_REGISTRY_OPERATOR_TOKEN=TOKEN)
        await m.wait_planning(60)
        base = f"http://127.0.0.1:{page_port}"

        # the operator token is required
        for path in ("/placement", "/placement.json"):
            code, body, headers = http(base + path)
            assert code == 401 and "operator token required" in body, (path, code, body)
            assert headers.get("www-authenticate", "").startswith("Bearer"), headers
            assert http(base + path, "wrong-token")[0] == 401
        assert http(base + "/placement?token=wrong-token")[0] == 401
        assert http(base + "/placement", TOKEN)[0] == 200

        # heat: the policy places eight versions HOT and WARM on the two workers
        now = time.time()
        await bus.publish(*[ev.heat(r, 40 - 4 * i, now) for i, r in enumerate(refs[:8])])

        seen: list[Any] = []

        async def spread() -> dict[str, Any] | None:
            view = page_json(page_port)
            tiers = placed(view)
            both = all(w["tiers"]["HOT"] for w in view.get("workers", []))
            ok = (len(view.get("workers", [])) == 2 and both and tiers["WARM"]
                  and len(tiers["HOT"] | tiers["WARM"]) >= 6)
            seen[:] = [{w["id"]: {t: [e["version_id"] for e in es]
                                  for t, es in w["tiers"].items()}
                        for w in view.get("workers", [])}]
            if not ok:  # keep the heat up while the policy places them
                await bus.publish(*[ev.heat(r, 4, time.time()) for r in refs[:8]])
            return view if ok else None

        try:
            view = await eventually(spread, timeout_s=90, every_s=1.0)
        except AssertionError:
            raise AssertionError(f"placement never spread: {seen}\n"
                                 f"{m.log.read_text()[-4000:]}") from None
        tiers = placed(view)
        print(f"\n[placement page] HOT {sorted(tiers['HOT'])}\n  WARM {sorted(tiers['WARM'])}")

        chrome = Chromium()
        await asyncio.to_thread(chrome.open, f"{base}/placement?token={TOKEN}")
        polls = ("(() => { const e = document.getElementById('status');"
                 " return e ? Number(e.dataset.polls || 0) : 0; })()")

        async def polled(n: int) -> bool:  # None while the navigation is under way
            got = await asyncio.to_thread(chrome.eval, polls)  # type: ignore[union-attr]
            return (got or 0) >= n

        await eventually(lambda: polled(2), timeout_s=30)
        assert await asyncio.to_thread(chrome.eval, "location.pathname") == "/placement"
        assert TOKEN not in await asyncio.to_thread(chrome.eval, "location.href")
        assert await asyncio.to_thread(chrome.eval, "document.cookie") == ""  # HttpOnly

        # live: a version heated now shows up on the open page, and in its moves
        new = refs[8].version_id
        await bus.publish(ev.heat(refs[8], 80, time.time()))

        async def appeared() -> bool:
            found = await asyncio.to_thread(chrome.eval, (  # type: ignore[union-attr]
                f"[...document.querySelectorAll('[data-version]')]"
                f".some(e => e.dataset.version === {json.dumps(new)}) && "
                f"[...document.querySelectorAll('#movelist li')]"
                f".some(li => li.textContent.includes({json.dumps(new)}))"))
            if not found:
                await bus.publish(ev.heat(refs[8], 10, time.time()))
            return bool(found)

        await eventually(appeared, timeout_s=60, every_s=1.0)
        await eventually(lambda: polled(4), timeout_s=30)

        dom = await asyncio.to_thread(chrome.eval, "document.documentElement.outerHTML")
        rows = await asyncio.to_thread(chrome.eval, (
            "[...document.querySelectorAll('#rows tr')].map(tr => ({worker: tr.dataset.worker,"
            " hot: tr.querySelectorAll('td[data-tier=HOT] [data-version]').length,"
            " warm: tr.querySelectorAll('td[data-tier=WARM] [data-version]').length}))"))
        assert len(rows) == 2, rows
        assert all(r["hot"] >= 1 for r in rows), rows
        assert sum(r["hot"] + r["warm"] for r in rows) >= 6, rows
        assert sum(r["warm"] for r in rows) >= 1, rows
        for text in ("heat ", "in flight ", "last move ", "protected: "):
            assert text in dom, text
        ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(chrome.screenshot, ARTIFACT)
        assert ARTIFACT.stat().st_size > 10_000

        # no secret anywhere: not in the page, not in its data
        data = json.dumps(page_json(page_port))
        for secret in (TOKEN, s.s3_secret_key, *uris, demo.adapters[0].manifest_digest):
            assert secret not in dom, secret
            assert secret not in data, secret
        print(f"[placement page] rows {rows}; screenshot {ARTIFACT.relative_to(REPO)} "
              f"({ARTIFACT.stat().st_size} bytes); page JSON polls served "
              f"{page_requests(m, 'json'):.0f}")
    finally:
        if chrome is not None:
            chrome.close()
        launcher.stop_all()
        await bus.stop()
