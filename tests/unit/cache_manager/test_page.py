"""The placement page's access rules and headers (no core: a standby's answers). The page
drawn from a live leader in headless Chromium: tests/integration/cache_manager/
test_placement_page.py."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from loraplane.cache_manager.page import COOKIE, create_page_app
from loraplane.cache_manager.settings import CacheManagerSettings

TOKEN = "unit-operator-token-0123456789"


def client(counted: list[tuple[str, int]] | None = None) -> TestClient:
    app = create_page_app(lambda: None, token=TOKEN, instance="cm-<1>",
                          count=(lambda p, c: counted.append((p, c))) if counted is not None
                          else None)
    return TestClient(app, follow_redirects=False)


@pytest.mark.parametrize("path", ["/placement", "/placement.json"])
@pytest.mark.parametrize("auth", [None, "Bearer wrong", "Basic " + TOKEN, "Bearer"])
def test_without_the_operator_token_it_is_401(path: str, auth: str | None) -> None:
    headers = {"authorization": auth} if auth else {}
    r = client().get(path, headers=headers)
    assert r.status_code == 401
    assert "operator token required" in r.text
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert TOKEN not in r.text


def test_a_wrong_cookie_or_query_token_is_401() -> None:
    c = client()
    c.cookies.set(COOKIE, TOKEN)  # the token itself is not the cookie
    assert c.get("/placement.json").status_code == 401
    assert client().get("/placement", params={"token": "nope"}).status_code == 401


def test_the_token_once_gives_a_cookie_and_the_page_without_it_in_the_address() -> None:
    counted: list[tuple[str, int]] = []
    c = client(counted)
    r = c.get("/placement", params={"token": TOKEN})
    assert r.status_code == 303 and r.headers["location"] == "/placement"
    cookie = r.headers["set-cookie"]
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
    assert TOKEN not in cookie
    page = c.get("/placement")
    assert page.status_code == 200
    assert "placement.json" in page.text and "cm-&lt;1&gt;" in page.text  # escaped
    csp = page.headers["content-security-policy"]
    nonce = csp.split("'nonce-", 1)[1].split("'", 1)[0]
    assert f'<script nonce="{nonce}">' in page.text and "default-src 'none'" in csp
    assert page.headers["cache-control"] == "no-store"
    data = c.get("/placement.json")  # a standby has no placement to show
    assert data.status_code == 503 and "standby" in data.json()["error"]
    assert counted == [("page", 303), ("page", 200), ("json", 503)]


def test_bearer_works_without_a_cookie() -> None:
    r = client().get("/placement.json", headers={"authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 503  # authorised; no core here


def test_the_page_needs_a_token() -> None:
    with pytest.raises(ValueError, match="operator token"):
        create_page_app(lambda: None, token="", instance="x")
    with pytest.raises(ValueError, match="LORAPLANE_REGISTRY_OPERATOR_TOKEN"):
        CacheManagerSettings(cache_manager_page_port=19057, registry_operator_token="")
    s = CacheManagerSettings(cache_manager_page_port=19057, registry_operator_token=TOKEN)
    assert s.registry_operator_token.get_secret_value() == TOKEN
