"""Model objects over the adapter view: base models first, shadowed adapters left out, the
alias ``base``, and the refusals of ``GET /v1/models/{id}``."""

from __future__ import annotations

import pytest

from loraplane.gateway.catalog import AdapterCatalog, AdapterForbidden
from loraplane.gateway.errors import NoReleasedVersion
from loraplane.gateway.models import ModelNotFound, default_base_model, list_models, retrieve_model

from . import events as ev

SERVED = ["gpt2", "loraplane/tiny-llama"]


def catalog() -> AdapterCatalog:
    c = AdapterCatalog(shares={"acme": ["globex/legal"]})
    for t, n, v, e in [("acme", "support", "v1", 11), ("acme", "gpt2", "g1", 12),
                       ("globex", "legal", "l1", 31), ("globex", "secret", "s1", 32),
                       ("acme", "draft", "d1", 41)]:
        c.apply_admission(ev.admitted(t, n, v, e))
    for t, n, v, e in [("acme", "support", "v1", 11), ("acme", "gpt2", "g1", 12),
                       ("globex", "legal", "l1", 31), ("globex", "secret", "s1", 32)]:
        c.apply_lifecycle(ev.promoted(t, n, v, e, at=1.0))
    return c


def test_base_models_first_then_own_then_shared_and_no_shadowed_adapter() -> None:
    ids = [(m["id"], m["owned_by"]) for m in list_models(catalog(), "acme", SERVED)]
    assert ids == [("gpt2", "loraplane"), ("loraplane/tiny-llama", "loraplane"),
                   ("support", "acme"), ("legal", "globex")]


@pytest.mark.parametrize(
    ("served", "default", "expected"),
    [(["a"], "", "a"), (["a", "b"], "", None), (["a", "b"], "b", "b"), ([], "c", "c")],
)
def test_what_base_names(served: list[str], default: str, expected: str | None) -> None:
    assert default_base_model(served, default) == expected


def test_retrieve() -> None:
    c = catalog()
    assert retrieve_model(c, "acme", SERVED, "loraplane/tiny-llama")["owned_by"] == "loraplane"
    assert retrieve_model(c, "acme", SERVED, "gpt2")["owned_by"] == "loraplane"  # base wins
    assert retrieve_model(c, "acme", SERVED, "legal")["owned_by"] == "globex"  # shared
    alias = retrieve_model(c, "acme", SERVED, "base", default="gpt2")
    assert (alias["id"], alias["base_model"]) == ("base", "gpt2")
    with pytest.raises(ModelNotFound, match="names no single base model"):
        retrieve_model(c, "acme", SERVED, "base")
    with pytest.raises(AdapterForbidden):
        retrieve_model(c, "acme", SERVED, "secret")
    with pytest.raises(NoReleasedVersion):
        retrieve_model(c, "acme", SERVED, "draft")  # admitted, never promoted
    for unknown in ("nope", "org/nope", "../x", ""):
        with pytest.raises(ModelNotFound):
            retrieve_model(c, "acme", SERVED, unknown)
