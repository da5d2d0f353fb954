"""GET / : the built-in chat page is self-contained, locked down by CSP, and public."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from edge.api.page import chat_html
from tests.fakes import make_app

KEY = "s3cret-key"


def test_page_is_html_with_csp_and_no_cache() -> None:
    app, _ = make_app()
    r = TestClient(app).get("/")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert r.headers["cache-control"] == "no-cache"
    csp = r.headers["content-security-policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'self'"
    assert directives["connect-src"] == "'self'"
    assert directives["script-src"] == "'unsafe-inline' 'self'"
    assert directives["style-src"] == "'unsafe-inline' 'self'"
    assert "<textarea" in r.text and "/v1/chat/completions" in r.text


def test_page_references_no_other_host() -> None:
    """Works offline: no CDN, no web font, no absolute or protocol-relative URL at all."""
    html = chat_html()
    assert re.findall(r"https?://", html, re.IGNORECASE) == []
    assert re.findall(r"""(?:src|href|action)\s*=\s*["']?//""", html, re.IGNORECASE) == []
    assert re.findall(r"url\(\s*['\"]?(?:https?:)?//", html, re.IGNORECASE) == []
    assert "@import" not in html
    # every fetch goes to this server's own API
    assert set(re.findall(r"fetch\('([^']*)'", html)) == {"/v1/models", "/v1/status", "/v1/chat/completions"}


def test_model_output_is_never_parsed_as_html() -> None:
    html = chat_html()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in html, sink


def test_page_is_public_but_the_api_still_needs_the_key() -> None:
    app, _ = make_app(api_key=KEY)
    client = TestClient(app)
    page = client.get("/")
    assert page.status_code == 200
    assert KEY not in page.text
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert client.post("/v1/chat/completions", json={"messages": []}).status_code == 401


def test_page_requests_are_counted_under_their_own_label() -> None:
    app, _ = make_app()
    client = TestClient(app)
    client.get("/")
    metrics = client.get("/metrics").text
    assert 'edge_requests_total{endpoint="/",status="200"} 1.0' in metrics
