"""Settings of the embedded local stack (no Docker).

Two profiles share one code path: ``run`` (what ``make run`` serves) and
``test`` (what ``make test`` starts), each with its own ports and data
directory so that both can run at once. Every port is pinned and can be
overridden with ``LORAPLANE_STACK_<NAME>`` environment variables.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from loraplane.shared.kafka_client import KafkaConnection
from loraplane.shared.resources import state_dir

if TYPE_CHECKING:
    from minio import Minio

Profile = Literal["run", "test"]

#: Port base per profile; component ports are offsets from it unless set explicitly.
PORT_BASES: dict[str, int] = {"run": 19000, "test": 29000}

#: Offsets from the port base (kept in one table so collisions are visible).
PORT_OFFSETS: dict[str, int] = {
    "postgres_port": 1,
    "kafka_port": 2,
    "s3_port": 3,
    "prometheus_port": 4,
    "supervisor_metrics_port": 5,
    "seaweed_master_port": 10,
    "seaweed_master_grpc_port": 11,
    "seaweed_volume_port": 12,
    "seaweed_volume_grpc_port": 13,
    "seaweed_filer_port": 14,
    "seaweed_filer_grpc_port": 15,
    "seaweed_s3_grpc_port": 16,
    "seaweed_admin_port": 17,
    "seaweed_admin_grpc_port": 18,
}


def repo_root() -> Path:
    """The repository root (the parent of ``services/``)."""
    return Path(__file__).resolve().parents[2]


class StackSettings(BaseSettings):
    """Where the local stack lives and which ports it binds (all on 127.0.0.1)."""

    model_config = SettingsConfigDict(env_prefix="LORAPLANE_STACK_", extra="ignore")

    profile: Profile = "run"
    """``run`` for ``make run``, ``test`` for the test session."""

    data_dir: Path | None = None
    """Data and logs of every component; default ``.loraplane/<profile>-stack``."""

    port_base: int | None = None
    """Base of the pinned port block; default 19000 (run) / 29000 (test)."""

    postgres_port: int = 0
    kafka_port: int = 0
    s3_port: int = 0
    prometheus_port: int = 0
    supervisor_metrics_port: int = 0
    """The supervisor's own ``/metrics`` (component health), scraped by Prometheus."""
    seaweed_master_port: int = 0
    seaweed_master_grpc_port: int = 0
    seaweed_volume_port: int = 0
    seaweed_volume_grpc_port: int = 0
    seaweed_filer_port: int = 0
    seaweed_filer_grpc_port: int = 0
    seaweed_s3_grpc_port: int = 0
    seaweed_admin_port: int = 0
    seaweed_admin_grpc_port: int = 0

    postgres_user: str = "loraplane"
    postgres_password: str = "loraplane-dev"
    postgres_db: str = "loraplane"

    s3_access_key: str = "loraplane"
    s3_secret_key: str = "loraplane-dev-secret"
    artifact_bucket: str = "loraplane-artifacts"
    """The allow-listed bucket where every adapter version lives (cold tier)."""
    kafka_bucket: str = "tansu"
    """Bucket holding Tansu's durable topic storage."""

    tls: bool = True
    """Mutual TLS on every internal gRPC API (worker, cache manager, registry): the stack
    writes a dev CA and one certificate per service under ``<data dir>/pki`` and points
    each service's ``LORAPLANE_TLS_*`` at its own; demo.env carries the operator's.
    PostgreSQL then serves TLS only, with a certificate of that CA (``hostssl`` lines
    alone in ``pg_hba.conf``), and :attr:`postgres_dsn` carries ``sslmode=verify-full``
    and ``sslrootcert``; the S3 gateway too unless ``s3_tls`` says otherwise.
    ``LORAPLANE_STACK_TLS=false``: plaintext everywhere, as compose without certificates."""
    s3_tls: bool | None = None
    """SeaweedFS's S3 port speaks HTTPS only (the dev CA's ``seaweedfs`` certificate; Tansu
    reaches its storage over it) and :meth:`client_env` says ``LORAPLANE_S3_SECURE`` /
    ``LORAPLANE_S3_CA_FILE``. Default: as ``tls``, in every profile (``make run``,
    ``make stress``, the test session, ``bench-cold``'s private store);
    ``LORAPLANE_STACK_S3_TLS=false`` keeps S3 plaintext beside TLS elsewhere. Every client
    of the stack's S3 takes its settings from :meth:`s3_connection` (:meth:`s3_client`,
    :meth:`s3_settings`, :meth:`s3_env`, :meth:`client_env`), so the tests run either
    way."""
    edge_tls: bool | None = None
    """TLS at the edge too: the gateway serves its public gRPC and HTTP ports with the dev
    CA's ``gateway`` certificate (no client certificate: tenants keep their API keys), and
    demo.env says ``https://`` and names the CA in ``LORAPLANE_GATEWAY_CA_FILE``, which
    every client of the gateway trusts (``loraplane generate``, ``loraplane golden record``,
    ``make stress``'s load; ``curl --cacert``, ``grpcurl -cacert``). Default: as ``tls``, in
    every profile (``make run``, ``make stress``, and the test session: the gateways its
    tests run serve this certificate and every tenant client of the suite trusts the dev CA
    and checks the name ``gateway``, ``tests/support/tls.py``).
    ``LORAPLANE_STACK_EDGE_TLS=false`` serves plaintext at the edge (demo.env then says
    ``http://`` and names no CA; the test suite's tenant clients dial plaintext); ``=true``
    needs ``tls``."""

    demo_env_file: Path | None = None
    """Where ``make run`` writes the demo environment; default ``.loraplane/demo.env``."""

    prometheus_scrape_interval: str = "5s"
    start_timeout_s: float = Field(default=60.0, gt=0)

    workers: int = Field(default=2, ge=1, le=4)
    """Inference workers ``make run`` starts (each its own vLLM engine, ~3 GB of memory)."""
    gateways: int = Field(default=2, ge=1, le=2)
    """Gateway processes ``make run`` starts on the public gRPC and HTTP ports (shared with
    ``SO_REUSEPORT``; each its own ``/metrics``: port base + 65 + 20 · i, and instance id
    ``gateway-<i>``), each with its share of the per-worker flow caps
    (``services/gateway/scale.py``). At most 2: the default flow caps split in two, not in
    three (``background_slots_with_interactive`` is 2)."""
    restart_backoff_s: float = Field(default=1.0, gt=0)
    """First delay before the supervisor restarts a crashed component or service; doubled
    after each restart that did not stay up, up to ``restart_backoff_max_s``."""
    restart_backoff_max_s: float = Field(default=30.0, gt=0)
    """Longest delay between restarts of one component."""
    restart_unhealthy_s: float = Field(default=30.0, gt=0)
    """A running process that fails every health check this long is restarted (a busy
    one can miss a check; a dead one is restarted at once)."""
    restart_stable_s: float = Field(default=60.0, gt=0)
    """Healthy this long after a restart, a component's backoff starts over."""
    restart_nice: int = Field(default=-10, ge=-20, le=19)
    """CPU niceness of a restarted process (and the children it spawns) until it is
    healthy again, then 0 (the idea of systemd's ``StartupCPUWeight``): a worker coming
    back beside a busy one gets the CPU first and serves again sooner. 0 = no boost; a
    negative value needs root or CAP_SYS_NICE and is skipped when not permitted."""

    @model_validator(mode="after")
    def _derive(self) -> StackSettings:
        if self.s3_tls is None:
            self.s3_tls = self.tls
        if self.s3_tls and not self.tls:
            raise ValueError("s3_tls needs tls (the certificates come from the stack's dev CA)")
        if self.edge_tls is None:
            self.edge_tls = self.tls
        if self.edge_tls and not self.tls:
            raise ValueError("edge_tls needs tls (the gateway's certificate comes from the "
                             "stack's dev CA)")
        if self.port_base is None:
            self.port_base = PORT_BASES[self.profile]
        for name, offset in PORT_OFFSETS.items():
            if not getattr(self, name):
                setattr(self, name, self.port_base + offset)
        if self.data_dir is None:
            self.data_dir = state_dir() / f"{self.profile}-stack"
        if self.demo_env_file is None:
            self.demo_env_file = state_dir() / "demo.env"
        ports = {name: getattr(self, name) for name in PORT_OFFSETS}
        seen: dict[int, str] = {}
        for name, port in ports.items():
            if port in seen:
                raise ValueError(f"port {port} is used twice: {seen[port]} and {name}")
            seen[port] = name
        return self

    @property
    def root(self) -> Path:
        assert self.data_dir is not None
        return self.data_dir

    @property
    def pki_dir(self) -> Path:
        """The dev CA and one certificate per identity (:mod:`loraplane.stack.certs`)."""
        return self.root / "pki"

    @property
    def ca_file(self) -> Path:
        """The dev CA's certificate: what every client of the stack trusts with ``tls``."""
        return self.pki_dir / "ca.pem"

    def dsn_for(self, db: str) -> str:
        """The DSN of database ``db`` on the stack's PostgreSQL; with ``tls`` it verifies
        the server's certificate against the dev CA (asyncpg and dbmate read both)."""
        dsn = (f"postgresql://{self.postgres_user}:{self.postgres_password}"
               f"@127.0.0.1:{self.postgres_port}/{db}")
        if self.tls:
            dsn += f"?sslmode=verify-full&sslrootcert={self.ca_file}"
        return dsn

    @property
    def postgres_dsn(self) -> str:
        return self.dsn_for(self.postgres_db)

    @property
    def kafka_bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    def kafka(self) -> KafkaConnection:
        """The stack's broker as every Kafka client takes it: PLAINTEXT, always (Tansu 0.6.0
        serves no TLS; README, "Security")."""
        return KafkaConnection(self.kafka_bootstrap)

    @property
    def s3_endpoint(self) -> str:
        return f"127.0.0.1:{self.s3_port}"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    def s3_connection(self) -> dict[str, Any]:
        """How a client reaches the stack's S3 gateway (HTTPS trusting the dev CA with
        ``s3_tls``), as the keyword arguments of ``shared.objectstore.minio_client`` and of
        both ``MinioStore`` classes: ``MinioStore(**stack.s3_connection())``. The one
        place that says it; :meth:`s3_client`, :meth:`s3_settings` and :meth:`s3_env`
        are this under other names."""
        return {"endpoint": self.s3_endpoint, "access_key": self.s3_access_key,
                "secret_key": self.s3_secret_key, "secure": bool(self.s3_tls),
                "ca_file": str(self.ca_file) if self.s3_tls else ""}

    def s3_client(self, access_key: str | None = None, secret_key: str | None = None) -> Minio:
        """A minio client of the stack's S3 gateway (:meth:`s3_connection`), with the
        stack's keys unless others are given."""
        from loraplane.shared.objectstore import minio_client

        conn = self.s3_connection()
        if access_key is not None:
            conn["access_key"] = access_key
        if secret_key is not None:
            conn["secret_key"] = secret_key
        client: Minio = minio_client(**conn)
        return client

    def s3_settings(self) -> dict[str, Any]:
        """The S3 fields of a service's settings on this stack's gateway
        (:meth:`s3_connection`): ``WorkerSettings(**stack.s3_settings(), ...)``."""
        return {f"s3_{name}": value for name, value in self.s3_connection().items()}

    def s3_env(self) -> dict[str, str]:
        """The ``LORAPLANE_S3_*`` variables of a process on this stack's gateway
        (:meth:`s3_connection`; ``_SECURE`` / ``_CA_FILE`` only with ``s3_tls``), for an
        environment that is not all of :meth:`client_env` (the CLI on a private registry)."""
        conn = self.s3_connection()
        env = {"LORAPLANE_S3_ENDPOINT": conn["endpoint"],
               "LORAPLANE_S3_ACCESS_KEY": conn["access_key"],
               "LORAPLANE_S3_SECRET_KEY": conn["secret_key"]}
        if conn["secure"]:
            env["LORAPLANE_S3_SECURE"] = "true"
            env["LORAPLANE_S3_CA_FILE"] = conn["ca_file"]
        return env

    def client_env(self) -> dict[str, str]:
        """``LORAPLANE_*`` variables that point every service and the CLI at this stack."""
        env = {
            "LORAPLANE_POSTGRES_DSN": self.postgres_dsn,
            "LORAPLANE_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            **self.s3_env(),
            "LORAPLANE_ARTIFACT_BUCKET": self.artifact_bucket,
            "LORAPLANE_PROMETHEUS_URL": self.prometheus_url,
        }
        return env
