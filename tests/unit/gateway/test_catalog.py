"""The adapter view: release pointers from lifecycle events, versions from admissions,
access rules (own, shared, other tenant's, unknown)."""

from __future__ import annotations

import grpc
import pytest

from loraplane.gateway.catalog import (
    AdapterCatalog,
    AdapterForbidden,
    AdapterNotFound,
    VersionInfo,
)
from loraplane.shared.errors import InvalidArgument
from loraplane.v1 import common_pb2

from .events import admitted, canary, key_revoked, promoted, retired, rolled_back, share_changed


def released(cat: AdapterCatalog) -> None:
    cat.apply_admission(admitted("acme", "support", "v1", 11))
    cat.apply_admission(admitted("acme", "support", "v2", 12))
    cat.apply_lifecycle(promoted("acme", "support", "v1", 11, at=100))


def test_admitted_then_promoted_is_routable() -> None:
    cat = AdapterCatalog()
    released(cat)
    entry = cat.lookup("acme", "support")
    assert entry.release.stable == "v1" and entry.base_model == "tiny"
    info = entry.versions["v1"]
    assert info.complete and info.engine_id == 11 and info.rank == 8
    assert info.artifact_uri.startswith("s3://")
    assert info.status == common_pb2.VERSION_STATUS_ACTIVE


def test_canary_rollback_and_retire() -> None:
    cat = AdapterCatalog()
    released(cat)
    cat.apply_lifecycle(canary("acme", "support", "v2", 10, 12, at=101))
    r = cat.lookup("acme", "support").release
    assert (r.stable, r.canary, r.canary_percent) == ("v1", "v2", 10)
    cat.apply_lifecycle(promoted("acme", "support", "v2", 12, at=102))
    r = cat.lookup("acme", "support").release
    assert (r.stable, r.canary, r.canary_percent) == ("v2", "", 0)  # promoted canary
    cat.apply_lifecycle(rolled_back("acme", "support", "v1", 11, at=103))
    assert cat.lookup("acme", "support").release.stable == "v1"
    cat.apply_lifecycle(canary("acme", "support", "v2", 5, 12, at=104))
    cat.apply_lifecycle(retired("acme", "support", "v2", 12, at=105))
    entry = cat.lookup("acme", "support")
    assert entry.release.canary == "" and entry.versions["v2"].retired


def test_old_events_never_move_pointers_back() -> None:
    cat = AdapterCatalog()
    released(cat)
    cat.set_release("acme", "support", stable="v2", at=200)  # bootstrap, newer
    cat.apply_lifecycle(promoted("acme", "support", "v1", 11, at=150))  # replayed, older
    assert cat.lookup("acme", "support").release.stable == "v2"
    assert not cat.set_release("acme", "support", stable="v1", at=199)


def test_status_only_moves_forward_and_records_merge() -> None:
    cat = AdapterCatalog()
    cat.apply_lifecycle(promoted("acme", "support", "v1", 11, at=1))
    assert cat.incomplete() == [("acme", "support", "v1")]
    cat.apply_admission(admitted("acme", "support", "v1", 11))  # late admission event
    info = cat.version("acme", "support", "v1")
    assert info is not None and info.complete
    assert info.status == common_pb2.VERSION_STATUS_ACTIVE
    assert cat.incomplete() == []


def test_other_tenants_adapter_is_forbidden_unknown_is_not_found() -> None:
    cat = AdapterCatalog()
    released(cat)
    with pytest.raises(AdapterForbidden) as info:
        cat.lookup("globex", "support")
    assert info.value.grpc_code == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(AdapterNotFound) as info2:
        cat.lookup("globex", "nothing")
    assert info2.value.grpc_code == grpc.StatusCode.NOT_FOUND


def test_shared_adapter_is_visible_by_name() -> None:
    cat = AdapterCatalog(shares={"globex": ["acme/support"]})
    released(cat)
    assert cat.lookup("globex", "support").release.tenant_id == "acme"
    assert [e.release.name for e in cat.visible_to("globex")] == ["support"]
    # its own adapter of the same name wins over the shared one
    cat.apply_admission(admitted("globex", "support", "g1", 21))
    cat.apply_lifecycle(promoted("globex", "support", "g1", 21, at=1))
    assert cat.lookup("globex", "support").release.tenant_id == "globex"


def test_registry_share_events_grant_and_end_access() -> None:
    cat = AdapterCatalog()
    released(cat)
    with pytest.raises(AdapterForbidden):
        cat.lookup("globex", "support")
    cat.apply_tenant_event(share_changed("acme", "support", "globex"))
    cat.apply_tenant_event(share_changed("acme", "support", "globex"))  # replayed: no change
    assert cat.lookup("globex", "support").release.tenant_id == "acme"
    assert [e.release.name for e in cat.visible_to("globex")] == ["support"]
    cat.apply_tenant_event(key_revoked("acme", "k1"))  # other arms belong to the auth view
    cat.apply_tenant_event(share_changed("acme", "support", "globex", shared=False))
    with pytest.raises(AdapterForbidden) as info:
        cat.lookup("globex", "support")
    assert info.value.grpc_code == grpc.StatusCode.PERMISSION_DENIED
    assert cat.visible_to("globex") == []
    cat.apply_tenant_event(share_changed("acme", "support", "globex", shared=False))  # idempotent
    assert cat.lookup("acme", "support").release.stable == "v1"  # the owner is unaffected


def test_an_unreleased_own_upload_does_not_break_a_working_share() -> None:
    cat = AdapterCatalog()
    released(cat)
    cat.apply_tenant_event(share_changed("acme", "support", "globex"))
    cat.apply_admission(admitted("globex", "support", "g1", 21))  # admitted, not released
    assert cat.lookup("globex", "support").release.tenant_id == "acme"
    assert [(e.release.tenant_id, e.release.name) for e in cat.visible_to("globex")] == [
        ("acme", "support")]
    cat.apply_lifecycle(promoted("globex", "support", "g1", 21, at=1))  # released: own wins
    assert cat.lookup("globex", "support").release.tenant_id == "globex"
    assert [(e.release.tenant_id, e.release.name) for e in cat.visible_to("globex")] == [
        ("globex", "support")]  # listed once


def test_a_registry_unshare_leaves_static_shares_alone() -> None:
    cat = AdapterCatalog(shares={"globex": ["acme/support"]})
    released(cat)
    cat.apply_tenant_event(share_changed("acme", "support", "globex"))
    cat.apply_tenant_event(share_changed("acme", "support", "globex", shared=False))
    assert cat.lookup("globex", "support").release.tenant_id == "acme"  # still shared


def test_ambiguous_share_is_invalid() -> None:
    cat = AdapterCatalog(shares={"initech": ["acme/support", "globex/support"]})
    released(cat)
    cat.apply_admission(admitted("globex", "support", "g1", 21))
    cat.apply_lifecycle(promoted("globex", "support", "g1", 21, at=1))
    with pytest.raises(InvalidArgument, match="several owners"):
        cat.lookup("initech", "support")


def test_visible_to_lists_only_released_adapters() -> None:
    cat = AdapterCatalog()
    released(cat)
    cat.apply_admission(admitted("acme", "draft", "d1", 31))  # admitted, never promoted
    assert [e.release.name for e in cat.visible_to("acme")] == ["support"]
    assert cat.visible_to("globex") == []


def test_upsert_version_merges_partial_records() -> None:
    cat = AdapterCatalog()
    cat.upsert_version(VersionInfo("acme", "a", "v1", engine_id=5))
    cat.upsert_version(VersionInfo("acme", "a", "v1", "tiny", sha256="ab", rank=8,
                                   artifact_uri="s3://b/p/"))
    info = cat.version("acme", "a", "v1")
    assert info is not None and info.complete and info.engine_id == 5
