"""The stack's S3 settings: HTTPS by default with ``tls`` in the ``run`` profile (in
``test`` when asked), one source (``StackSettings.s3_connection``) for every client shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from loraplane.stack.settings import StackSettings


@pytest.fixture(autouse=True)
def _no_stack_tls_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The defaults, not the caller's ``LORAPLANE_STACK_TLS`` / ``_S3_TLS``."""
    monkeypatch.delenv("LORAPLANE_STACK_TLS", raising=False)
    monkeypatch.delenv("LORAPLANE_STACK_S3_TLS", raising=False)


def test_s3_tls_defaults_on_with_tls_in_every_profile(tmp_path: Path) -> None:
    assert StackSettings(profile="run", data_dir=tmp_path).s3_tls is True
    assert StackSettings(profile="test", data_dir=tmp_path).s3_tls is True
    assert StackSettings(profile="test", data_dir=tmp_path, tls=False).s3_tls is False


@pytest.mark.parametrize("profile", ["run", "test"])
def test_https_s3_in_every_client_shape(profile: str, tmp_path: Path) -> None:
    s = StackSettings(profile=profile, data_dir=tmp_path, s3_tls=True)  # type: ignore[arg-type]
    assert s.tls and s.s3_tls
    assert s.s3_connection() == {"endpoint": s.s3_endpoint, "access_key": s.s3_access_key,
                                 "secret_key": s.s3_secret_key, "secure": True,
                                 "ca_file": str(s.ca_file)}
    assert s.s3_settings() == {"s3_endpoint": s.s3_endpoint, "s3_access_key": s.s3_access_key,
                               "s3_secret_key": s.s3_secret_key, "s3_secure": True,
                               "s3_ca_file": str(s.ca_file)}
    env = s.client_env()
    assert {k: v for k, v in env.items() if k.startswith("LORAPLANE_S3_")} == s.s3_env()
    assert env["LORAPLANE_S3_SECURE"] == "true"
    assert env["LORAPLANE_S3_CA_FILE"] == str(s.ca_file)
    client = s.s3_client()
    assert client._base_url.is_https


@pytest.mark.parametrize("over", [{"tls": False}, {"s3_tls": False}])
def test_plaintext_s3_when_tls_or_s3_tls_is_off(over: dict[str, bool], tmp_path: Path) -> None:
    s = StackSettings(profile="test", data_dir=tmp_path, **over)
    assert not s.s3_tls
    assert s.s3_connection()["secure"] is False and s.s3_connection()["ca_file"] == ""
    assert s.s3_settings()["s3_secure"] is False
    env = s.client_env()
    assert "LORAPLANE_S3_SECURE" not in env and "LORAPLANE_S3_CA_FILE" not in env
    assert env["LORAPLANE_S3_ENDPOINT"] == s.s3_endpoint
    assert not s.s3_client()._base_url.is_https


def test_env_turns_tls_off_everywhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LORAPLANE_STACK_TLS", "false")
    s = StackSettings(profile="test", data_dir=tmp_path)
    assert not s.tls and not s.s3_tls
    assert "sslmode" not in s.postgres_dsn


def test_s3_tls_needs_tls(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="s3_tls needs tls"):
        StackSettings(profile="test", data_dir=tmp_path, tls=False, s3_tls=True)
