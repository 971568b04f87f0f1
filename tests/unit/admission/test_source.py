"""Source allow-list: only s3://<bucket>/<prefix>/<tenant>/... passes, every trick is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loraplane.admission.checks.source import check_location, check_source
from loraplane.admission.problems import SOURCE_NOT_ALLOWED

BUCKET = "loraplane-artifacts"
PREFIX = "adapters"


def _check(uri: str, tenant: str = "acme", directory: bool = True) -> list[str]:
    loc, problems = check_location(uri, tenant_id=tenant, bucket=BUCKET, prefix=PREFIX,
                                   directory=directory)
    assert (loc is None) == bool(problems)
    assert all(p.code == SOURCE_NOT_ALLOWED for p in problems)
    return [p.message for p in problems]


@pytest.mark.parametrize("uri", [
    "s3://loraplane-artifacts/adapters/acme/support/2026-11-01.1/",
    "s3://loraplane-artifacts/adapters/acme/support/2026-11-01.1",
    "s3://loraplane-artifacts/adapters/acme/" + "a" * 64 + "/",
])
def test_allowed_locations(uri: str) -> None:
    assert _check(uri) == []


def test_parsed_location_is_normalised() -> None:
    loc, _ = check_location("s3://loraplane-artifacts/adapters/acme/x/v1", tenant_id="acme",
                            bucket=BUCKET, prefix="/adapters/", directory=True)
    assert loc is not None
    assert (loc.bucket, loc.key) == (BUCKET, "adapters/acme/x/v1/")
    assert loc.uri == "s3://loraplane-artifacts/adapters/acme/x/v1/"


@pytest.mark.parametrize(("uri", "fragment"), [
    ("", "empty"),
    ("https://loraplane-artifacts/adapters/acme/x/", "s3:// scheme"),
    ("file:///etc/passwd", "s3:// scheme"),
    ("S3://loraplane-artifacts/adapters/acme/x/", "s3:// scheme"),
    ("/adapters/acme/x/", "s3:// scheme"),
    ("s3://other-bucket/adapters/acme/x/", "not the artifact bucket"),
    ("s3://loraplane-artifacts/adapters/globex/x/", "outside the tenant prefix"),
    ("s3://loraplane-artifacts/models/acme/x/", "outside the tenant prefix"),
    ("s3://loraplane-artifacts/adapters/acme/", "tenant prefix itself"),
    ("s3://loraplane-artifacts/adapters/acme/../globex/x/", "'..'"),
    ("s3://loraplane-artifacts/adapters/acme/./x/", "'..'"),
    ("s3://loraplane-artifacts/adapters//acme/x/", "empty"),
    ("s3://loraplane-artifacts/adapters/acme/%2e%2e/globex/", "percent"),
    ("s3://loraplane-artifacts/adapters/acme/x%2Fy/", "percent"),
    ("s3://loraplane-artifacts/adapters\\acme\\x/", "backslash"),
    ("s3://loraplane-artifacts/adapters/acme/x\x00/", "NUL"),
    ("s3://loraplane-artifacts/adapters/acme/x y/", "whitespace"),
    ("s3://loraplane-artifacts/adapters/acme/x/?versionId=1", "query"),
    ("s3://loraplane-artifacts/adapters/acme/x/#frag", "fragment"),
    ("s3://user:pw@loraplane-artifacts/adapters/acme/x/", "credentials"),
    ("s3://loraplane-artifacts:9000/adapters/acme/x/", "port"),
    ("s3://loraplane-artifacts/adapters/acme/\u0430pp/", "non-ASCII"),
    ("s3://loraplane-artifacts/adapters/acme/.hidden/", "disallowed path segment"),
    ("s3://loraplane-artifacts", "no object key"),
    ("s3://loraplane-artifacts/" + "a/" * 600, "longer than"),
])
def test_refused_locations(uri: str, fragment: str) -> None:
    messages = _check(uri)
    assert messages, uri
    assert any(fragment in m for m in messages), messages


def test_every_problem_is_reported() -> None:
    messages = _check("s3://other-bucket/adapters/globex/%2e%2e\\x/")
    assert len(messages) >= 3
    assert any("bucket" in m for m in messages)
    assert any("percent" in m for m in messages)
    assert any("backslash" in m for m in messages)


def test_invalid_tenant_id_is_refused() -> None:
    assert any("invalid tenant" in m for m in _check("s3://loraplane-artifacts/adapters/../x/",
                                                     tenant=".."))


def test_signature_defaults_inside_root_and_must_be_allowed_too() -> None:
    root, sig, problems = check_source(
        "s3://loraplane-artifacts/adapters/acme/x/v1/", "", tenant_id="acme", bucket=BUCKET,
        prefix=PREFIX)
    assert problems == [] and root is not None and sig is not None
    assert sig.key == "adapters/acme/x/v1/model.sig" and sig.is_inside(root)

    root, sig, problems = check_source(
        "s3://loraplane-artifacts/adapters/acme/x/v1/",
        "s3://loraplane-artifacts/adapters/globex/x/v1/model.sig",
        tenant_id="acme", bucket=BUCKET, prefix=PREFIX)
    assert root is None and sig is None
    assert [p.path for p in problems] == ["signature_uri"]


def test_signature_uri_must_name_an_object() -> None:
    assert any("directory" in m for m in _check(
        "s3://loraplane-artifacts/adapters/acme/x/v1/", directory=False))


@given(st.text(max_size=120))
def test_arbitrary_text_passes_only_in_canonical_form(uri: str) -> None:
    loc, problems = check_location(uri, tenant_id="acme", bucket=BUCKET, prefix=PREFIX,
                                   directory=True)
    if loc is not None:
        assert problems == []
        assert uri.startswith("s3://loraplane-artifacts/adapters/acme/")
        assert ".." not in uri and "%" not in uri and "\\" not in uri
        assert uri.isascii() and uri.isprintable()


@given(st.lists(st.sampled_from(["..", ".", "", "%2e", "acme", "x", "\\", "v1"]),
                min_size=1, max_size=6))
def test_segment_tricks_never_escape_the_tenant(segments: list[str]) -> None:
    uri = "s3://loraplane-artifacts/adapters/acme/" + "/".join(segments) + "/"
    loc, _ = check_location(uri, tenant_id="acme", bucket=BUCKET, prefix=PREFIX, directory=True)
    if loc is not None:
        parts = loc.key.rstrip("/").split("/")
        assert parts[:2] == ["adapters", "acme"] and len(parts) > 2
        assert not {"..", ".", ""} & set(parts)
