"""The auth view: key hash → tenant, sticky revocation, disabled tenants."""

from __future__ import annotations

import grpc
import pytest

from loraplane.gateway.auth import AuthView, InvalidApiKey, MissingApiKey, TenantDisabled, key_hash

from .events import key_created, key_revoked, tenant


def test_key_authenticates_its_tenant() -> None:
    view = AuthView()
    view.apply(key_created("acme", "k1", key_hash("lp_secret_1")))
    p = view.authenticate("lp_secret_1")
    assert (p.tenant_id, p.key_id) == ("acme", "k1")


def test_key_hash_is_sha256_hex() -> None:
    assert key_hash("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


@pytest.mark.parametrize("token", [None, ""])
def test_missing_key(token: str | None) -> None:
    with pytest.raises(MissingApiKey) as info:
        AuthView().authenticate(token)
    assert info.value.grpc_code == grpc.StatusCode.UNAUTHENTICATED


def test_unknown_key() -> None:
    view = AuthView()
    view.apply(key_created("acme", "k1", key_hash("lp_secret_1")))
    with pytest.raises(InvalidApiKey):
        view.authenticate("lp_secret_2")


def test_revoked_key_is_refused_and_stays_revoked_on_replay() -> None:
    view = AuthView()
    created = key_created("acme", "k1", key_hash("s"))
    view.apply(created)
    view.apply(key_revoked("acme", "k1"))
    with pytest.raises(InvalidApiKey):
        view.authenticate("s")
    view.apply(created)  # replay of the topic from the beginning
    with pytest.raises(InvalidApiKey):
        view.authenticate("s")


def test_revocation_before_creation_wins() -> None:
    view = AuthView()
    view.apply(key_revoked("acme", "k1"))
    view.apply(key_created("acme", "k1", key_hash("s")))
    with pytest.raises(InvalidApiKey):
        view.authenticate("s")


def test_other_keys_of_the_tenant_keep_working() -> None:
    view = AuthView()
    view.apply(key_created("acme", "k1", key_hash("s1")))
    view.apply(key_created("acme", "k2", key_hash("s2")))
    view.apply(key_revoked("acme", "k1"))
    assert view.authenticate("s2").key_id == "k2"


def test_disabled_tenant_is_permission_denied_until_enabled() -> None:
    view = AuthView()
    view.apply(key_created("acme", "k1", key_hash("s")))
    view.apply(tenant("acme", disabled=True))
    with pytest.raises(TenantDisabled) as info:
        view.authenticate("s")
    assert info.value.grpc_code == grpc.StatusCode.PERMISSION_DENIED
    view.apply(tenant("acme", disabled=False))
    assert view.authenticate("s").tenant_id == "acme"
    assert view.tenants == {"acme"}


def test_unknown_key_while_the_view_loads_is_unavailable_with_a_hint() -> None:
    from loraplane.gateway.auth import KeysLoading

    view = AuthView(loaded=False)
    view.add_key("acme", "k1", key_hash("known"))
    assert view.authenticate("known").tenant_id == "acme"  # a key already seen works
    with pytest.raises(KeysLoading) as info:
        view.authenticate("not-yet-replayed")
    assert info.value.retry_after_s and info.value.grpc_code.name == "UNAVAILABLE"
    view.loaded = True
    with pytest.raises(InvalidApiKey):
        view.authenticate("not-yet-replayed")
