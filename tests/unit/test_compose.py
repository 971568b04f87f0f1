"""docker-compose.yml stays in step with the services: names, modules, env vars and ports."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from pydantic import AliasChoices
from pydantic_settings import BaseSettings

from loraplane.shared import topics
from loraplane.shared.settings import CommonSettings
from loraplane.shared.tls import SPIFFE_PREFIX
from loraplane.stack.certs import COMPOSE_IDENTITIES, KAFKA_KEYSTORE, write_compose_pki
from loraplane.stack.kafka_acls import (
    INIT_SCRIPT,
    PRINCIPAL_MAPPING_RULES,
    SUPER_USER,
    Acl,
    acls,
    render_init_script,
)
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


# --- Kafka ACLs: every service is a principal allowed what its code uses, nothing more ---

KAFKA_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
INIT_TARGET = "/etc/kafka/init.sh"
SERVICE_PACKAGES = {name: ROOT / "services" / SPECS[name].module.split(".")[1]
                    for name in APP_SERVICES}
"""Compose service (= certificate identity, = principal) -> its source package."""
TOPIC_CONSTANTS = {name: value for name, value in vars(topics).items()
                   if isinstance(value, str) and value in topics.TOPICS and name.isupper()}


def _kafka_env() -> dict[str, str]:
    return {k: str(v) for k, v in COMPOSE["services"]["kafka"]["environment"].items()}


def _uncompose(value: str) -> str:
    """What the container sees of a compose value (``$$`` is a literal ``$``)."""
    return value.replace("$$", "$")


def _map_principal(rules: str, dn: str) -> str:
    """Kafka's SslPrincipalMapper (clients/.../security/ssl/SslPrincipalMapper.java): the
    first rule whose pattern matches the whole DN rewrites it; DEFAULT keeps the DN."""
    rule_re = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
    for match in re.finditer(r"\s*(" + rule_re + r")\s*(,\s*|$)", rules.strip()):
        rule = re.fullmatch(rule_re, match.group(1))
        assert rule is not None, match.group(1)
        if rule.group(1):
            return dn
        if rule.group(2) is None:
            continue  # an empty rule
        pattern, replacement, case = rule.group(2), rule.group(4), rule.group(6)
        if re.fullmatch(pattern, dn):
            name = re.sub(pattern, re.sub(r"\$(\d)", r"\\\1", replacement), dn)
            return name.lower() if case == "L" else name.upper() if case == "U" else name
    raise AssertionError(f"no rule maps {dn}")


def _script_acls(script: str) -> set[Acl]:
    """The ACLs the script's ``acls`` lines add (``kafka-acls.sh --add`` options)."""
    out: set[Acl] = set()
    for line in script.splitlines():
        if not line.startswith("acls "):
            continue
        words = shlex.split(line)[1:]
        opts: dict[str, list[str]] = {}
        for flag, value in zip(words[::2], words[1::2], strict=True):
            opts.setdefault(flag, []).append(value)
        assert set(opts) <= {"--allow-principal", "--operation", "--resource-pattern-type",
                             "--topic", "--group"}, line  # no deny, no host, no cluster
        (principal,), (operation,) = opts["--allow-principal"], opts["--operation"]
        pattern = opts.get("--resource-pattern-type", ["literal"])[0]
        for kind in ("topic", "group"):
            out |= {Acl(principal, operation, kind, name, pattern)  # type: ignore[arg-type]
                    for name in opts.get(f"--{kind}", [])}
    return out


def _calls(package: Path) -> list[ast.Call]:
    return [node for path in sorted(package.rglob("*.py"))
            for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)]


def _topic_of(node: ast.expr) -> str | None:
    """The topic a ``topics.X`` / imported ``X`` constant names."""
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
    return TOPIC_CONSTANTS.get(name) if isinstance(name, str) else None


def _first_arg_topics(package: Path, func: str) -> set[str]:
    """Topics passed first to calls of ``func`` (``x.publish(topics.CACHE_STATE, ...)``)."""
    out: set[str] = set()
    for call in _calls(package):
        name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(
            call.func, "id", None)
        if name == func and call.args and (topic := _topic_of(call.args[0])):
            out.add(topic)
    return out


def _code_uses() -> dict[str, tuple[set[str], set[str], set[tuple[str, str]], bool]]:
    """Per principal, read from the code (not from the ACL table): topics written, topics
    read, groups (name, pattern type) and whether it lists every topic at start."""
    from loraplane.admission.settings import AdmissionSettings
    from loraplane.cache_manager.kafka_io import INPUT_TOPICS, CommandSink
    from loraplane.cache_manager.settings import CacheManagerSettings
    from loraplane.cache_manager.sharding import shard_group
    from loraplane.registry.admissions import AdmissionConsumer
    from loraplane.registry.settings import RegistrySettings

    def default(cls: Any, name: str) -> str:
        return str(cls.model_fields[name].default)

    # the registry writes what its outbox carries: the topic messages it builds
    registry_events = {call.func.attr for call in _calls(SERVICE_PACKAGES["registry"])
                       if isinstance(call.func, ast.Attribute)
                       and isinstance(call.func.value, ast.Name)
                       and call.func.value.id == "events_pb2"}
    registry_writes = {spec.name for spec in topics.TOPICS.values()
                       if spec.message_type.DESCRIPTOR.name in registry_events}
    views = next(call for call in _calls(SERVICE_PACKAGES["gateway"])
                 if getattr(call.func, "id", None) == "ViewFeeder")
    gateway_reads = {t for arg in views.args if isinstance(arg, ast.Dict)
                     for key in arg.keys if key is not None and (t := _topic_of(key))}
    worker_group = re.search(r'group_id=f"([^"{]*)\{settings\.worker_id\}"',
                             (SERVICE_PACKAGES["worker"] / "app.py").read_text())
    assert worker_group is not None
    cm_group = default(CacheManagerSettings, "cache_manager_consumer_group")
    uses = {
        "registry": (registry_writes,
                     {inspect.signature(AdmissionConsumer).parameters["topic"].default},
                     {(default(RegistrySettings, "registry_consumer_group"), "literal")}),
        "admission": ({default(AdmissionSettings, "admission_admissions_topic")},
                      {default(AdmissionSettings, "admission_releases_topic")},
                      {(default(AdmissionSettings, "admission_consumer_group"), "literal")}),
        "cache-manager": ({inspect.signature(CommandSink.publish).parameters["topic"].default},
                          set(INPUT_TOPICS),
                          {(cm_group, "literal"), (shard_group(cm_group, ""), "prefixed")}),
        "worker": (_first_arg_topics(SERVICE_PACKAGES["worker"], "publish"),
                   _first_arg_topics(SERVICE_PACKAGES["worker"], "group_consumer"),
                   {(worker_group.group(1), "prefixed")}),
        "gateway": (_first_arg_topics(SERVICE_PACKAGES["gateway"], "publish"), gateway_reads,
                    set()),
    }
    return {name: (*use, any(getattr(c.func, "id", None) == "ensure_topics"
                             for c in _calls(SERVICE_PACKAGES[name])))
            for name, use in uses.items()}


def test_kafka_authorizes_every_request() -> None:
    """ACLs decide, nobody passes without one, only the broker itself is a super user, and
    every listener (the controller's too) wants a client certificate."""
    env = _kafka_env()
    assert env["KAFKA_AUTHORIZER_CLASS_NAME"] == KAFKA_AUTHORIZER
    assert env["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    assert env["KAFKA_SUPER_USERS"] == f"User:{SUPER_USER}"
    protocol = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    listeners = {entry.split("://")[0] for entry in env["KAFKA_LISTENERS"].split(",")}
    assert listeners == set(protocol) and set(protocol.values()) == {"SSL"}
    assert env["KAFKA_SSL_CLIENT_AUTH"] == "required"
    # no listener loosens what the broker-wide settings say
    assert not [k for k in env if k.startswith("KAFKA_LISTENER_NAME_")]
    assert _uncompose(env["KAFKA_SSL_PRINCIPAL_MAPPING_RULES"]) == PRINCIPAL_MAPPING_RULES


def test_each_certificate_maps_to_the_principal_its_acls_name(compose_pki: Path) -> None:
    rules = _uncompose(_kafka_env()["KAFKA_SSL_PRINCIPAL_MAPPING_RULES"])
    for identity in COMPOSE_IDENTITIES:  # the subject `loraplane stack certs` writes
        dn = _cert(compose_pki / f"{identity}.pem").subject.rfc4514_string()
        assert dn == f"CN={identity}"
        assert _map_principal(rules, dn) == identity
    keystore = (compose_pki / KAFKA_KEYSTORE).read_bytes()
    broker = x509.load_pem_x509_certificate(keystore[keystore.index(b"-----BEGIN CERT"):])
    assert _map_principal(rules, broker.subject.rfc4514_string()) == SUPER_USER
    # a subject that is not one service name keeps its DN: no ACL names it
    assert _map_principal(rules, "CN=cache-manager,O=elsewhere") == "CN=cache-manager,O=elsewhere"
    assert _map_principal(rules, "CN=Cache-Manager") == "CN=Cache-Manager"
    # each principal with ACLs is the compose service dialling Kafka with that certificate
    for principal in {acl.principal for acl in acls()}:
        name = principal.removeprefix("User:")
        svc = COMPOSE["services"][name]
        cert = _pki_file(_mounts(svc), svc["environment"]["LORAPLANE_KAFKA_CERT_FILE"],
                         compose_pki)
        assert _map_principal(rules, _cert(cert).subject.rfc4514_string()) == name


def test_kafka_init_runs_the_generated_script_before_every_service(compose_pki: Path) -> None:
    script = ROOT / INIT_SCRIPT
    assert script.read_text() == render_init_script(), (
        "infra/kafka/init.sh is stale: run `loraplane stack kafka-acls`")
    init = COMPOSE["services"]["kafka-init"]
    assert init["image"] == COMPOSE["services"]["kafka"]["image"]
    assert init["depends_on"] == {"kafka": {"condition": "service_healthy"}}
    assert init["entrypoint"] == ["/bin/bash", INIT_TARGET]
    mounts = _mounts(init)
    assert mounts[INIT_TARGET] == f"./{INIT_SCRIPT}"
    # as the broker's own certificate (the super user), at the paths the script names
    assert _pki_file(mounts, "/etc/kafka/pki/keystore.pem", compose_pki).name == KAFKA_KEYSTORE
    assert _pki_file(mounts, "/etc/kafka/pki/ca.pem", compose_pki).name == "ca.pem"
    text = script.read_text()
    assert "ssl.keystore.location=/etc/kafka/pki/keystore.pem" in text
    assert "ssl.truststore.location=/etc/kafka/pki/ca.pem" in text
    for name in APP_SERVICES:
        depends = COMPOSE["services"][name]["depends_on"]
        assert depends.get("kafka-init") == {"condition": "service_completed_successfully"}, name
    # idempotent: topics only if missing, ACLs only added (adding an existing one is a no-op)
    created = {}
    for line in text.splitlines():
        if line.startswith("topics "):
            words = shlex.split(line)
            assert words[1:3] == ["--create", "--if-not-exists"], line
            opts = dict(zip(words[3::2], words[4::2], strict=True))
            created[opts["--topic"]] = (int(opts["--partitions"]), opts.get("--config"))
    assert created == {spec.name: (spec.partitions, ",".join(
        f"{k}={v}" for k, v in spec.configs.items()) or None) for spec in topics.TOPICS.values()}
    assert "--remove" not in text and '--add "$@"' in text


def test_acls_grant_what_the_code_uses_and_nothing_more() -> None:
    granted = _script_acls((ROOT / INIT_SCRIPT).read_text())
    assert granted == set(acls())
    expected: set[Acl] = set()
    for name, (writes, reads, groups, lists_topics) in _code_uses().items():
        user = f"User:{name}"
        expected |= {Acl(user, "Write", "topic", t) for t in writes}
        expected |= {Acl(user, "Read", "topic", t) for t in reads}
        expected |= {Acl(user, "Read", "group", g, p) for g, p in groups}  # type: ignore[arg-type]
        if lists_topics:  # ensure_topics lists them all: each must be visible (DESCRIBE)
            expected |= {Acl(user, "Describe", "topic", t) for t in topics.TOPICS
                         if t not in writes | reads}
    assert granted == expected
    # every topic a service's code names is one it is granted something on
    by_principal: dict[str, set[str]] = {}
    for acl in granted:
        if acl.resource_type == "topic":
            by_principal.setdefault(acl.principal, set()).add(acl.name)
    for name, package in SERVICE_PACKAGES.items():
        named = {t for path in package.rglob("*.py") for node in ast.walk(ast.parse(
            path.read_text())) if isinstance(node, ast.Attribute | ast.Name)
            and (t := _topic_of(node))}
        assert named <= by_principal[f"User:{name}"], (name, named - by_principal[f"User:{name}"])

    def who(operation: str, topic: str) -> set[str]:
        return {a.principal for a in granted
                if a.operation == operation and a.resource_type == "topic" and a.name == topic}

    assert who("Write", topics.CACHE_COMMANDS) == {"User:cache-manager"}
    assert who("Read", topics.CACHE_COMMANDS) == {"User:worker"}
    for topic in (topics.ADAPTER_RELEASES, topics.ADAPTER_LIFECYCLE, topics.TENANT_EVENTS):
        assert who("Write", topic) == {"User:registry"}, topic
    assert who("Write", topics.ADAPTER_ADMISSIONS) == {"User:admission"}
    # only the services: the operator's certificate, the super user and any wildcard get
    # nothing; topics are named one by one
    assert {a.principal for a in granted} == {f"User:{n}" for n in APP_SERVICES}
    assert all(a.pattern == "literal" for a in granted if a.resource_type == "topic")
    assert not [a for a in granted if "*" in a.principal + a.name]
