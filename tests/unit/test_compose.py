"""docker-compose.yml stays in step with the services: names, modules, env vars and ports."""

from __future__ import annotations

import importlib
import inspect
import subprocess
from pathlib import Path

import pytest
import yaml
from pydantic import AliasChoices
from pydantic_settings import BaseSettings

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
