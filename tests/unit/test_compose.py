"""docker-compose.yml stays in step with the services: names, modules, env vars and ports."""

from __future__ import annotations

import importlib
import inspect
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from pydantic import AliasChoices
from pydantic_settings import BaseSettings

from loraplane.shared.settings import CommonSettings
from loraplane.shared.tls import SPIFFE_PREFIX
from loraplane.stack.certs import KAFKA_KEYSTORE, write_compose_pki
from loraplane.stack.services import SERVICES, ServiceSpec

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
PROMETHEUS = yaml.safe_load((ROOT / "infra/prometheus/prometheus.yml").read_text())
SPECS = {spec.name: spec for spec in SERVICES}
APP_SERVICES = [name for name in COMPOSE["services"] if name in SPECS]


def _env_names(cls: type[BaseSettings]) -> set[str]:
    prefix = str(cls.model_config.get("env_prefix", "")).upper()
    names = set()
    for field_name, field in cls.model_fields.items():
        names.add(prefix + field_name.upper())
        if isinstance(field.alias, str):
            names.add(field.alias.upper())
        alias = field.validation_alias
        if isinstance(alias, str):
            names.add(alias.upper())
        elif isinstance(alias, AliasChoices):
            names |= {c.upper() for c in alias.choices if isinstance(c, str)}
    return names


def _settings_env(spec: ServiceSpec) -> set[str]:
    package = spec.module.removesuffix(".__main__")
    names: set[str] = set()
    found = False
    for mod_name in (f"{package}.settings", f"{package}.config"):
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError:
            continue
        for _, obj in inspect.getmembers(mod, inspect.isclass):
            if (issubclass(obj, BaseSettings) and obj.__module__ == mod.__name__
                    and "Client" not in obj.__name__):
                names |= _env_names(obj)
                found = True
    assert found, f"{package} has no settings class in {package}.settings"
    return names


def _container_ports(svc: dict[str, object]) -> set[int]:
    ports: set[int] = set()
    for p in svc.get("ports", []) or []:  # type: ignore[union-attr]
        ports.add(int(str(p).split(":")[-1].split("/")[0]))
    for p in svc.get("expose", []) or []:  # type: ignore[union-attr]
        ports.add(int(str(p)))
    return ports


def test_every_loraplane_service_is_in_compose() -> None:
    assert sorted(APP_SERVICES) == sorted(SPECS), "compose and the service table disagree"


@pytest.mark.parametrize("name", APP_SERVICES)
def test_service_exists_and_runs_its_module(name: str) -> None:
    spec = SPECS[name]
    assert spec.exists(), f"compose names {name} but {spec.module} does not exist"
    svc = COMPOSE["services"][name]
    package = spec.module.removesuffix(".__main__")
    command = svc.get("command") or []
    if command:
        assert command == [package], f"{name} runs {command}, expected [{package!r}]"
    else:  # the worker image's entrypoint runs the module
        dockerfile = ROOT / svc["build"]["dockerfile"]
        assert f'"-m", "{package}"' in dockerfile.read_text()


@pytest.mark.parametrize("name", APP_SERVICES)
def test_env_vars_are_settings_and_ports_match(name: str) -> None:
    spec = SPECS[name]
    svc = COMPOSE["services"][name]
    env = svc["environment"]
    known = _settings_env(spec)
    unknown = sorted(k for k in env if k not in known)
    assert not unknown, f"{name}: compose sets variables its settings do not read: {unknown}"
    expected_port_vars = {spec.env_prefix() + k for k in (*spec.port_offsets, "METRICS_PORT")}
    assert expected_port_vars <= set(env), f"{name}: missing port variables"
    exposed = _container_ports(svc)
    for var in expected_port_vars:
        assert int(env[var]) in exposed, f"{name}: {var}={env[var]} is not published/exposed"
    metrics = int(env[spec.env_prefix() + "METRICS_PORT"])
    jobs = {j["job_name"]: j for j in PROMETHEUS["scrape_configs"]}
    targets = jobs[name]["static_configs"][0]["targets"]
    assert targets == [f"{name}:{metrics}"]


def test_worker_names_a_catalogued_model_and_its_keys() -> None:
    """The worker has no default model: compose sets it, as the catalogue has it."""
    env = COMPOSE["services"]["worker"]["environment"]
    catalogue = yaml.safe_load((ROOT / "config/base_models.yaml").read_text())["base_models"]
    model = env["LORAPLANE_BASE_MODEL"]
    assert model in catalogue, f"{model} is not in config/base_models.yaml"
    assert env["LORAPLANE_TOKENIZER_REVISION"] == catalogue[model]["tokenizer_revision"]
    assert env["LORAPLANE_BASE_MODEL_DIR"].startswith("/models/")
    assert env["LORAPLANE_TRUSTED_KEYS"].startswith("/etc/loraplane/keys/")


def test_infra_services_are_pinned_images() -> None:
    for name, svc in COMPOSE["services"].items():
        if name in SPECS:
            continue
        assert ":" in svc["image"] and not svc["image"].endswith(":latest"), name


def test_prometheus_rules_are_valid() -> None:
    out = subprocess.run(["promtool", "check", "rules", str(ROOT / "infra/prometheus/rules.yml")],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


# --- TLS: every server serves it, every client uses it, the files come from one command ---

PKI_SOURCE = "./infra/pki/"
"""Where compose mounts certificates from (``loraplane stack certs --out infra/pki``)."""


@pytest.fixture(scope="module")
def compose_pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the documented command writes, in a scratch directory."""
    out = tmp_path_factory.mktemp("compose") / "pki"
    write_compose_pki(out)
    return out


def _mounts(svc: dict[str, Any]) -> dict[str, str]:
    """Container path -> host path of the service's bind mounts."""
    out: dict[str, str] = {}
    for volume in svc.get("volumes", []) or []:
        source, target, *_ = str(volume).split(":")
        if source.startswith("./"):
            out[target] = source
    return out


def _pki_file(mounts: dict[str, str], target: str, pki: Path) -> Path:
    """The generated file mounted at ``target`` (which must come from infra/pki)."""
    assert target in mounts, f"{target} is not mounted"
    source = mounts[target]
    assert source.startswith(PKI_SOURCE), f"{target} is mounted from {source}"
    path = pki / source.removeprefix(PKI_SOURCE)
    assert path.is_file(), f"`loraplane stack certs` writes no {source}"
    return path


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _dns_names(cert: x509.Certificate) -> list[str]:
    return cert.extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)


TLS_FILE_VARS = ("LORAPLANE_TLS_CA_FILE", "LORAPLANE_TLS_CERT_FILE", "LORAPLANE_TLS_KEY_FILE",
                 "LORAPLANE_KAFKA_CA_FILE", "LORAPLANE_KAFKA_CERT_FILE",
                 "LORAPLANE_KAFKA_KEY_FILE", "LORAPLANE_S3_CA_FILE",
                 "LORAPLANE_GATEWAY_EDGE_TLS_CERT_FILE", "LORAPLANE_GATEWAY_EDGE_TLS_KEY_FILE")


@pytest.mark.parametrize("name", APP_SERVICES)
def test_each_service_speaks_tls_with_its_own_mounted_certificate(
        name: str, compose_pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    svc = COMPOSE["services"][name]
    env = {k: str(v) for k, v in svc["environment"].items()}
    mounts = _mounts(svc)
    assert env["LORAPLANE_KAFKA_SECURITY_PROTOCOL"] == "SSL"
    files = {var: _pki_file(mounts, env[var], compose_pki) for var in TLS_FILE_VARS
             if var in env}
    assert {"LORAPLANE_TLS_CERT_FILE", "LORAPLANE_KAFKA_CERT_FILE"} <= set(files)
    for var in ("LORAPLANE_TLS_CERT_FILE", "LORAPLANE_KAFKA_CERT_FILE"):
        uris = _cert(files[var]).extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value.get_values_for_type(
            x509.UniformResourceIdentifier)
        assert uris == [SPIFFE_PREFIX + name], f"{name}: {var} is another identity's"
    if "LORAPLANE_POSTGRES_DSN" in env:
        dsn = env["LORAPLANE_POSTGRES_DSN"]
        assert "@postgres:5432/" in dsn and "sslmode=verify-full" in dsn
        _pki_file(mounts, dsn.split("sslrootcert=")[1], compose_pki)
        assert env["LORAPLANE_S3_SECURE"] == "true"
    # the services' own validation accepts them, the mounts resolved to the generated files
    # (the Kafka TLS context loads: each key is its certificate's)
    for var, value in env.items():
        monkeypatch.setenv(var, str(files.get(var, value)))
    settings = CommonSettings()
    assert settings.kafka().check().tls and settings.tls_files() is not None


def test_kafka_serves_tls_only_and_requires_client_certificates(compose_pki: Path) -> None:
    svc = COMPOSE["services"]["kafka"]
    env = {k: str(v) for k, v in svc["environment"].items()}
    protocol = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    advertised = env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    for listener in advertised:  # what clients reach: SSL only (the controller's stays inside)
        assert protocol[listener.split("://")[0]] == "SSL", listener
    # the image's configure script takes an "SSL://" listener for a JKS keystore with
    # password files and exits without them: the PEM listener must be named otherwise
    assert "SSL://" not in env["KAFKA_ADVERTISED_LISTENERS"]
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] in {a.split("://")[0] for a in advertised}
    assert env["KAFKA_SSL_CLIENT_AUTH"] == "required"
    assert env["KAFKA_SSL_KEYSTORE_TYPE"] == env["KAFKA_SSL_TRUSTSTORE_TYPE"] == "PEM"
    mounts = _mounts(svc)
    keystore = _pki_file(mounts, env["KAFKA_SSL_KEYSTORE_LOCATION"], compose_pki)
    assert keystore.name == KAFKA_KEYSTORE
    truststore = _pki_file(mounts, env["KAFKA_SSL_TRUSTSTORE_LOCATION"], compose_pki)
    key_pem, cert_pem = keystore.read_bytes().split(b"-----END PRIVATE KEY-----\n")
    assert key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8, as Kafka reads it
    key = serialization.load_pem_private_key(key_pem + b"-----END PRIVATE KEY-----\n", None)
    cert = x509.load_pem_x509_certificate(cert_pem)
    spki = (serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert key.public_key().public_bytes(*spki) == cert.public_key().public_bytes(*spki)
    assert cert.issuer == _cert(truststore).subject
    host = advertised[0].split("://")[1].split(":")[0]
    assert host in _dns_names(cert)  # clients check the broker's name
    bootstrap = {str(COMPOSE["services"][n]["environment"]["LORAPLANE_KAFKA_BOOTSTRAP"])
                 for n in APP_SERVICES}
    assert bootstrap == {advertised[0].split("://")[1]}


def test_postgres_serves_tls_only(compose_pki: Path) -> None:
    svc = COMPOSE["services"]["postgres"]
    script = " ".join(svc["command"])
    options = dict(o.split("=", 1) for o in script.split(" -c ")[1:])
    assert options["ssl"] == "on"
    mounts = _mounts(svc)
    cert = _cert(_pki_file(mounts, options["ssl_cert_file"], compose_pki))
    assert "postgres" in _dns_names(cert)
    key_target = script.split("install ")[1].split()[6]  # install -o -g -m SRC DST
    _pki_file(mounts, key_target, compose_pki)
    assert f"{key_target} {options['ssl_key_file'].split()[0]}" in script
    hba = ROOT / mounts[options["hba_file"]]
    kinds = {line.split()[0] for line in hba.read_text().splitlines()
             if line.strip() and not line.startswith("#")}
    assert kinds == {"local", "hostssl"}, "a plaintext TCP client must find no entry"
    migrate = COMPOSE["services"]["migrate"]
    url = migrate["environment"]["DATABASE_URL"]
    assert "sslmode=verify-full" in url
    _pki_file(_mounts(migrate), url.split("sslrootcert=")[1], compose_pki)


def test_minio_serves_https_with_its_certificate(compose_pki: Path) -> None:
    svc = COMPOSE["services"]["minio"]
    certs_dir = svc["command"].split("--certs-dir ")[1].split()[0]
    mounts = _mounts(svc)
    cert = _pki_file(mounts, f"{certs_dir}/public.crt", compose_pki)
    assert cert.name == "minio.pem" and "minio" in _dns_names(_cert(cert))
    assert _pki_file(mounts, f"{certs_dir}/private.key", compose_pki).name == "minio.key"
    assert "https://minio:9000" in COMPOSE["services"]["minio-init"]["command"][0]


def test_certificates_are_mounted_never_built_in(compose_pki: Path) -> None:
    assert "infra/pki/" in (ROOT / ".gitignore").read_text().split()
    for dockerfile in (ROOT / "infra/docker" / n for n in ("Dockerfile", "Dockerfile.worker")):
        copied = [line.split()[1:-1] for line in dockerfile.read_text().splitlines()
                  if line.startswith("COPY ") and "--from=" not in line]
        assert not [c for c in copied if any("infra" in s or "pki" in s for s in c)]
        ignore = dockerfile.with_name(dockerfile.name + ".dockerignore").read_text().split()
        assert "infra/pki" in ignore, f"{dockerfile.name}'s context may carry the keys"
    # the CA key is mounted nowhere; each container gets its own key alone
    for name, svc in COMPOSE["services"].items():
        sources = [s for s in _mounts(svc).values() if s.startswith(PKI_SOURCE)]
        assert PKI_SOURCE + "ca.key" not in sources, name
        keys = [s for s in sources if s.endswith(".key")]
        assert len(keys) <= 1, f"{name} gets several keys: {keys}"
    assert oct(compose_pki.stat().st_mode & 0o777) == "0o700"
