"""Adapter names as tenants send them: validated before any lookup.

The grammar is the registry's (``adapters.name`` CHECK constraint in the
migrations): ``^[a-z0-9][a-z0-9._-]{0,62}$``. Anything path-like (``/``, ``\\``,
``..``, a URI scheme such as ``s3://`` or ``file:``) is refused first with its own
message, so a tenant can never make the platform read a location of its choosing.

The base model is asked for by the alias :data:`BASE_MODEL_ALIAS` (``"base"``: the
deployment's default base model) or by its served name (``loraplane/tiny-llama``, as
vLLM's OpenAI server names it). Those names always mean the base model: they are checked
before any adapter lookup, so an adapter can never shadow the base model (the registry
refuses to release an adapter under a reserved name; see the registry README). An empty
name is refused: a client that forgot the adapter must not get base-model text.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from loraplane.shared.errors import InvalidArgument
from loraplane.v1 import inference_pb2

ADAPTER_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
"""The registry's adapter-name grammar."""
BASE_MODEL_ALIAS = "base"
"""The adapter name that means "the deployment's default base model"."""
BASE_MODEL_NAMES = frozenset({BASE_MODEL_ALIAS})
"""Adapter names that mean "the base model itself" (besides the served base-model names)."""
_SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_PATH_MARKERS = ("/", "\\", "..", "~", "%2f", "%2e")


class InvalidAdapterName(InvalidArgument):
    """The adapter name is missing, path-like or outside the registry grammar."""

    code = "invalid_adapter_name"


class MissingAdapterName(InvalidAdapterName):
    """No adapter name was given (an empty one included)."""

    code = "adapter_required"


def is_base_model(name: str) -> bool:
    """Whether ``name`` is the base-model alias ``"base"`` (served names: :func:`base_model_named`)."""
    return name in BASE_MODEL_NAMES


def check_adapter_name(name: str, field: str = "adapter") -> str:
    """Return ``name`` when it is a valid adapter name; raise :class:`InvalidAdapterName`
    naming ``field`` (the request field that carried it: ``adapter`` on gRPC, ``model``
    on the OpenAI API)."""
    if ADAPTER_NAME_RE.fullmatch(name) and ".." not in name:
        return name
    if not name:
        raise MissingAdapterName(
            f"{field} is required: an adapter name, or {BASE_MODEL_ALIAS!r} (or the served "
            "base-model name) for the base model"
        )
    lowered = name.lower()
    if _SCHEME_RE.match(name) or any(m in lowered for m in _PATH_MARKERS):
        raise InvalidAdapterName(
            f"{field} must be a name, not a path or URI: {name[:80]!r}"
        )
    raise InvalidAdapterName(
        f"invalid {field} name {name[:80]!r}: expected {ADAPTER_NAME_RE.pattern}"
    )


def base_model_named(name: str, served: Collection[str]) -> str | None:
    """The base model ``name`` asks for: ``""`` for the alias ``"base"`` (the deployment's
    default), the name itself when it is a served base model; ``None`` when ``name`` is
    not a base-model name (an adapter name, or nothing valid)."""
    if name in BASE_MODEL_NAMES:
        return ""
    if name and name in served:
        return name
    return None


def route_base_model_name(
    req: inference_pb2.GenerateRequest, served: Collection[str], *, field: str = "adapter"
) -> None:
    """Rewrite ``req`` in place when its adapter is a served base-model name: the request
    path then sees the alias ``"base"`` with ``base_model`` set to that name. A
    ``base_model`` that names another model is refused (both fields named)."""
    named = base_model_named(req.adapter, served)
    if not named:
        return
    if req.base_model and req.base_model != named:
        raise InvalidArgument(
            f"{field} {named!r} is a base model, but base_model asks for {req.base_model!r}"
        )
    req.adapter = BASE_MODEL_ALIAS
    req.base_model = named
