"""Adapter names as tenants send them: validated before any lookup.

The grammar is the registry's (``adapters.name`` CHECK constraint in the
migrations): ``^[a-z0-9][a-z0-9._-]{0,62}$``. Anything path-like (``/``, ``\\``,
``..``, a URI scheme such as ``s3://`` or ``file:``) is refused first with its own
message, so a tenant can never make the platform read a location of its choosing.
"""

from __future__ import annotations

import re

from loraplane.shared.errors import InvalidArgument

ADAPTER_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
"""The registry's adapter-name grammar."""
BASE_MODEL_NAMES = frozenset({"", "base"})
"""Adapter names that mean "the base model itself"."""
_SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_PATH_MARKERS = ("/", "\\", "..", "~", "%2f", "%2e")


class InvalidAdapterName(InvalidArgument):
    """The adapter name is path-like or outside the registry grammar."""

    code = "invalid_adapter_name"


def is_base_model(name: str) -> bool:
    """Whether ``name`` asks for the base model (empty or ``"base"``)."""
    return name in BASE_MODEL_NAMES


def check_adapter_name(name: str) -> str:
    """Return ``name`` when it is a valid adapter name; raise :class:`InvalidAdapterName`."""
    if ADAPTER_NAME_RE.fullmatch(name) and ".." not in name:
        return name
    lowered = name.lower()
    if _SCHEME_RE.match(name) or any(m in lowered for m in _PATH_MARKERS):
        raise InvalidAdapterName(
            f"adapter must be a name, not a path or URI: {name[:80]!r}"
        )
    raise InvalidAdapterName(
        f"invalid adapter name {name[:80]!r}: expected {ADAPTER_NAME_RE.pattern}"
    )
