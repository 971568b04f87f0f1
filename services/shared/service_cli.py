"""The command line of every service process: ``python -m loraplane.<service> [--help]``.

A service is configured by its environment (pydantic-settings, ``LORAPLANE_*``), not by
arguments; its command line only answers ``--help`` (what the service is, every variable
its settings class reads with its default, generated from that class, and where its
shipped config and migrations resolve: :mod:`loraplane.shared.resources`) and refuses
anything else with argparse's usage error (exit 2). Without arguments the service starts
as before: the ``make run`` supervisor, compose and Kubernetes pass none.

Only the standard library and pydantic are imported here (the worker imports this inside
its ``run``, see ``loraplane.worker.__main__``).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import re
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from pydantic import AliasChoices, BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

WIDTH = 92
"""Width of the generated help text."""


@dataclass(frozen=True)
class ShippedFile:
    """A default file or directory the service reads, as it resolves in this install."""

    label: str
    """What it is, e.g. ``policy``."""
    path: Path
    note: str = ""
    """When it is read, e.g. ``when LORAPLANE_WORKER_POLICY_FILE is unset``."""


def env_names(cls: type[BaseSettings], name: str, field: FieldInfo) -> list[str]:
    """The environment variables that set ``field`` (the first one is the preferred name)."""
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [c.upper() for c in alias.choices if isinstance(c, str)]
    if isinstance(alias, str):
        return [alias.upper()]
    if field.alias:
        return [field.alias.upper()]
    return [(str(cls.model_config.get("env_prefix", "")) + name).upper()]


def attribute_docs(cls: type) -> dict[str, str]:
    """The docstrings under the class attributes of ``cls`` and its bases (the style of
    every settings class here); a subclass's text wins."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__.split(".")[0] not in ("loraplane", "services"):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue  # no source (a zipped or compiled-only install): descriptions only
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in pairwise(body):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def _plain(text: str, names: Iterable[str]) -> str:
    """One paragraph of plain text: no reST roles or double backticks, and no leading
    ``LORAPLANE_X:`` that repeats the variable's name."""
    text = " ".join(text.split())
    text = _ROLE.sub(r"\1", text).replace("``", "")
    for name in names:
        if text.startswith(f"{name}:"):
            text = text[len(name) + 1:].lstrip()
            text = text[:1].upper() + text[1:]
    return text


_SECRET = ("secret", "password", "token")


def _default(name: str, field: FieldInfo) -> str:
    if field.default_factory is not None:
        try:
            value = field.default_factory()  # type: ignore[call-arg]
        except Exception:  # noqa: BLE001 - a factory that needs validated data
            return "(computed)"
    elif field.default is PydanticUndefined:
        return "(required)"
    else:
        value = field.default
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if any(word in name for word in _SECRET) and isinstance(value, str):
        return "(a dev default, not shown)" if value else "(unset)"
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, BaseModel):
        return json.dumps(value.model_dump(mode="json"))  # spaces: wraps between keys
    if isinstance(value, dict | list) and not value:
        return "{}" if isinstance(value, dict) else "[]"
    if value == "":
        return '""'
    return str(value)


def settings_help(cls: type[BaseSettings]) -> str:
    """Every variable ``cls`` reads, its default and its docstring, in field order."""
    docs = attribute_docs(cls)
    out: list[str] = []
    for name, field in cls.model_fields.items():
        names = env_names(cls, name, field)
        default = _default(name, field)
        head = f"  {' | '.join(names)} = {default}"
        text = _plain(docs.get(name) or field.description or "", names)
        if len(head) > WIDTH:  # a JSON default: after the text
            head = f"  {' | '.join(names)} = (below)"
            text = f"{text} Default: {default}".strip()
        out.append(head)
        if text:
            out += textwrap.wrap(text, WIDTH, initial_indent=" " * 6, subsequent_indent=" " * 6,
                                 break_on_hyphens=False)
    return "\n".join(out)


def files_help(files: Sequence[ShippedFile]) -> str:
    """One line per shipped file: label, resolved path, whether it is there, when read."""
    if not files:
        return "  (none)"
    width = max(len(f.label) for f in files) + 1
    lines = []
    for f in files:
        state = "" if f.path.exists() else "  [missing]"
        lines.append(f"  {f.label + ':':<{width}} {f.path}{state}")
        if f.note:
            lines.append(f"  {'':<{width}} ({f.note})")
    return "\n".join(lines)


def parse_service_args(
    argv: Sequence[str] | None,
    *,
    prog: str,
    summary: str,
    settings: type[BaseSettings],
    files: Sequence[ShippedFile] = (),
    notes: str = "",
) -> argparse.Namespace:
    """Parse a service's command line: ``--help`` prints the generated help and exits 0,
    any other argument exits 2 (argparse's message); no arguments return at once."""
    epilog = [
        *textwrap.wrap("The service takes no other argument: it is configured by its "
                       "environment (pydantic-settings; names are case-insensitive).", WIDTH),
        "",
        f"environment ({settings.__module__}.{settings.__name__}; NAME = default):",
        settings_help(settings),
        "",
        "shipped defaults (loraplane.shared.resources, as resolved in this install):",
        files_help(files),
    ]
    if notes:
        epilog += ["", *textwrap.wrap(" ".join(notes.split()), WIDTH)]
    parser = argparse.ArgumentParser(
        prog=prog, description=summary, epilog="\n".join(epilog),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser.parse_args(argv)
