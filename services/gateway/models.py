"""Model objects of the OpenAI API (``GET /v1/models``, ``GET /v1/models/{id}``).

Pure code over the views. A caller sees

* every served base model (``owned_by`` :data:`PLATFORM_OWNER`), by its served name;
* its adapters and the adapters shared with it that have a stable version (``owned_by``
  the owning tenant), own first, by name;

and every object says the version(s) it resolves to (``versions``: the stable version with
its share of traffic, the canary with its share; a base model resolves to itself).

Served base-model names are the deployment default (``LORAPLANE_GATEWAY_DEFAULT_BASE_MODEL``)
and every base model a worker has reported, ready or not: a request for a base model
whose workers are all down is a 503 (no worker), not a 400 (unknown name).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from loraplane.gateway.catalog import AdapterCatalog, AdapterEntry, AdapterNotFound
from loraplane.gateway.errors import NoReleasedVersion
from loraplane.gateway.names import ADAPTER_NAME_RE, BASE_MODEL_ALIAS, base_model_named
from loraplane.gateway.placement import ANSWERING, REPORTING, PlacementView
from loraplane.shared.errors import NotFound

PLATFORM_OWNER = "loraplane"
"""``owned_by`` of the served base models."""
OBJECT = "model"


class ModelNotFound(NotFound):
    """No model of that id is visible to the caller."""

    code = "model_not_found"


def served_base_models(placement: PlacementView, default: str = "") -> list[str]:
    """Names of the served base models (sorted): ``default`` and every base model of a
    live worker (answering its probes or reporting; ready or not, so a base model whose
    workers are busy starting is still a 503, not an unknown name). A worker that is
    silent or down no longer makes its base models served: the ``cache.state`` history
    of long-gone workers (replayed at start) must not list them."""
    names = {default} if default else set()
    for w in placement.workers():
        if placement.liveness(w) in (ANSWERING, REPORTING):
            names |= set(w.base_models)
    return sorted(names)


def default_base_model(served: Collection[str], default: str = "") -> str | None:
    """What the alias ``"base"`` names: ``default``, else the only served base model."""
    if default:
        return default
    return next(iter(served)) if len(served) == 1 else None


def base_model_object(name: str, *, model_id: str | None = None) -> dict[str, Any]:
    """The model object of a served base model (``model_id``: the id asked for)."""
    return {
        "id": model_id or name,
        "object": OBJECT,
        "created": 0,
        "owned_by": PLATFORM_OWNER,
        "parent": None,
        "base_model": name,
        "version": name,
        "canary_version": None,
        "canary_percent": 0,
        "versions": [{"version": name, "role": "base", "percent": 100}],
    }


def adapter_object(entry: AdapterEntry) -> dict[str, Any]:
    """The model object of a visible adapter."""
    rel = entry.release
    canary = rel.canary if rel.canary and rel.canary != rel.stable else ""
    percent = rel.canary_percent if canary else 0
    versions = [{"version": rel.stable, "role": "stable", "percent": 100 - percent}]
    if canary:
        # percent 0: only canary-class requests (golden set, shadow) reach it
        versions.append({"version": canary, "role": "canary", "percent": percent})
    return {
        "id": rel.name,
        "object": OBJECT,
        "created": 0,
        "owned_by": rel.tenant_id,
        "parent": entry.base_model or None,
        "base_model": entry.base_model,
        "version": rel.stable,
        "canary_version": canary or None,
        "canary_percent": percent,
        "versions": versions,
    }


def _adapters(catalog: AdapterCatalog, tenant_id: str,
              served: Collection[str]) -> Iterable[AdapterEntry]:
    # an adapter under a base-model name is shadowed: that name calls the base model
    return (e for e in catalog.visible_to(tenant_id)
            if base_model_named(e.release.name, served) is None)


def list_models(
    catalog: AdapterCatalog, tenant_id: str, served: Collection[str]
) -> list[dict[str, Any]]:
    """Every model object ``tenant_id`` may call: base models first, then adapters."""
    return [*(base_model_object(b) for b in sorted(served)),
            *(adapter_object(e) for e in _adapters(catalog, tenant_id, served))]


def retrieve_model(
    catalog: AdapterCatalog, tenant_id: str, served: Collection[str], model_id: str,
    *, default: str = "",
) -> dict[str, Any]:
    """The model object of ``model_id`` for ``tenant_id``.

    Raises :class:`ModelNotFound` (unknown id, any shape), the catalog's PermissionDenied
    for another tenant's adapter (as the request path does), or
    :class:`~loraplane.gateway.errors.NoReleasedVersion` (404) for an adapter without a
    stable version.
    """
    if model_id == BASE_MODEL_ALIAS:
        name = default_base_model(served, default)
        if name is None:
            raise ModelNotFound(
                f"model {BASE_MODEL_ALIAS!r} names no single base model; served: "
                f"{sorted(served)}")
        return base_model_object(name, model_id=model_id)
    if model_id in served:
        return base_model_object(model_id)
    if not ADAPTER_NAME_RE.fullmatch(model_id):
        raise ModelNotFound(f"model {model_id[:80]!r} not found")
    for entry in _adapters(catalog, tenant_id, served):
        if entry.release.name == model_id:
            return adapter_object(entry)
    try:
        catalog.lookup(tenant_id, model_id)  # another tenant's: PermissionDenied
    except AdapterNotFound:
        raise ModelNotFound(f"model {model_id!r} not found") from None
    raise NoReleasedVersion(f"adapter {model_id!r} has no stable version")
