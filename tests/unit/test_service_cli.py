"""Every service's command line (:mod:`loraplane.shared.service_cli`): ``--help`` lists
every variable its settings class reads and exits 0 without starting anything, an unknown
argument exits 2 with argparse's message, and no argument starts the service as before
(the ``make run`` supervisor passes none)."""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pydantic import AliasChoices
from pydantic_settings import BaseSettings

from loraplane.admission.settings import AdmissionSettings
from loraplane.cache_manager.settings import CacheManagerSettings
from loraplane.gateway.settings import GatewaySettings
from loraplane.registry.settings import RegistrySettings
from loraplane.shared.service_cli import attribute_docs, parse_service_args
from loraplane.stack.services import SERVICES as SPECS
from loraplane.stack.settings import StackSettings
from loraplane.stack.supervisor import ServiceProcess
from loraplane.worker.settings import WorkerSettings

SERVICES: dict[str, tuple[str, type[BaseSettings]]] = {  # module -> entry point, settings
    "registry": ("main", RegistrySettings),
    "admission": ("main", AdmissionSettings),
    "cache_manager": ("main", CacheManagerSettings),
    "worker": ("run", WorkerSettings),
    "gateway": ("main", GatewaySettings),
}


def entry(name: str) -> Callable[..., Any]:
    module = importlib.import_module(f"loraplane.{name}.__main__")
    return getattr(module, SERVICES[name][0])  # type: ignore[no-any-return]


def expected_env(cls: type[BaseSettings]) -> set[str]:
    prefix = str(cls.model_config.get("env_prefix", "")).upper()
    names: set[str] = set()
    for field_name, field in cls.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            names |= {c.upper() for c in alias.choices if isinstance(c, str)}
        else:
            names.add(prefix + field_name.upper())
    return names


@pytest.fixture(autouse=True)
def _logging_levels() -> Iterator[None]:
    """The entry points quieten aiokafka; leave the session's levels as they were."""
    saved = {n: logging.getLogger(n).level for n in ("aiokafka", "")}
    yield
    for n, level in saved.items():
        logging.getLogger(n).setLevel(level)


@pytest.mark.parametrize("name", SERVICES)
def test_help_lists_every_setting_and_starts_nothing(
        name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[object] = []
    monkeypatch.setattr(asyncio, "run", started.append)
    with pytest.raises(SystemExit) as exit_:
        entry(name)(["--help"])
    assert exit_.value.code == 0 and not started
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m loraplane.{name} [-h]")
    missing = sorted(env for env in expected_env(SERVICES[name][1]) if env not in out)
    assert not missing, missing
    assert "shipped defaults" in out


@pytest.mark.parametrize("name", SERVICES)
def test_an_unknown_argument_exits_2(name: str, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[object] = []
    monkeypatch.setattr(asyncio, "run", started.append)
    with pytest.raises(SystemExit) as exit_:
        entry(name)(["--port", "1"])
    assert exit_.value.code == 2 and not started
    assert "unrecognized arguments: --port 1" in capsys.readouterr().err


@pytest.mark.parametrize("name", SERVICES)
def test_no_argument_starts_the_service_as_before(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LORAPLANE_CACHE_MANAGER_PAGE_PORT", raising=False)
    monkeypatch.setenv("LORAPLANE_REGISTRY_OPERATOR_TOKEN", "t" * 16)
    monkeypatch.setenv("LORAPLANE_GATEWAY_UVLOOP", "false")
    started: list[str] = []

    def fake_run(coro: Any) -> int:
        started.append(coro.__qualname__)
        coro.close()
        return 0

    monkeypatch.setattr(asyncio, "run", fake_run)
    entry(name)([])
    assert started == ["main" if name == "worker" else "serve"]


def test_the_supervisor_starts_each_service_without_arguments() -> None:
    s = StackSettings(profile="test")
    for spec in SPECS:
        command = ServiceProcess(s, spec, {}).command()
        assert command[1:] == ["-m", spec.module.removesuffix(".__main__")], command


def test_help_text_comes_from_the_attribute_docstrings() -> None:
    docs = attribute_docs(RegistrySettings)
    assert docs["registry_grpc_port"].startswith("``LORAPLANE_REGISTRY_GRPC_PORT``")
    assert docs["postgres_dsn"] == "PostgreSQL DSN (asyncpg)."  # from the base class
    assert parse_service_args([], prog="p", summary="s", settings=RegistrySettings) is not None
