"""API key, body limit, CORS, bind policy, generic 500s."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from edge.config import Settings
from edge.errors import ConfigError
from edge.service.launch import bind_api_key, is_loopback
from tests.fakes import CHAT, make_app


def test_api_key_required_when_configured() -> None:
    app, engine = make_app(api_key="s3cret")
    client = TestClient(app)
    r = client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error" and r.headers["WWW-Authenticate"] == "Bearer"
    assert (
        client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer wrong"}).status_code
        == 401
    )
    assert client.get("/metrics").status_code == 401
    assert client.get("/v1/status").status_code == 401
    assert engine.submitted == []
    ok = client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    assert client.get("/health").status_code == 200  # probes stay public
    assert client.get("/ready").status_code == 200


def test_api_key_from_settings_file(tmp_path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("filekey\n")
    from edge.api.app import create_app
    from tests.fakes import ScriptedEngine

    engine = ScriptedEngine()
    engine.start()
    app = create_app(Settings(api_key_file=key_file), engine)
    client = TestClient(app)
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer filekey"}).status_code == 200


def test_body_limit_by_content_length_and_by_stream() -> None:
    app, engine = make_app(max_body_bytes=2048)
    client = TestClient(app)
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
    r = client.post("/v1/chat/completions", json=big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"

    def chunks():
        for _ in range(10):
            yield b" " * 500

    r = client.post("/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert engine.submitted == []


def test_cors_off_by_default_and_on_when_configured() -> None:
    app, _ = make_app()
    r = TestClient(app).get("/v1/models", headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in r.headers
    app, _ = make_app(cors_origins=["http://ui.local"])
    r = TestClient(app).get("/v1/models", headers={"Origin": "http://ui.local"})
    assert r.headers["access-control-allow-origin"] == "http://ui.local"


def test_unexpected_exception_is_generic_500() -> None:
    app, engine = make_app()

    def boom(*a, **k):
        raise RuntimeError("db password is hunter2")

    engine.render_chat = boom  # type: ignore[method-assign]
    r = TestClient(app, raise_server_exceptions=False).post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 500
    assert r.json()["error"]["message"] == "internal server error"
    assert "hunter2" not in r.text and "Traceback" not in r.text


def test_prompts_not_logged_unless_enabled(caplog: pytest.LogCaptureFixture) -> None:
    secret = "mysecretprompt"
    body = {**CHAT, "messages": [{"role": "user", "content": secret}]}
    app, _ = make_app()
    with caplog.at_level("DEBUG"):
        TestClient(app).post("/v1/chat/completions", json=body)
    assert secret not in caplog.text and "request done" in caplog.text
    caplog.clear()
    app, _ = make_app(log_prompts=True)
    with caplog.at_level("INFO"):
        TestClient(app).post("/v1/chat/completions", json=body)
    assert secret in caplog.text and "tok0" in caplog.text


def test_bind_policy() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("127.0.0.2") and is_loopback("::1")
    assert is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")
    assert bind_api_key(Settings(host="127.0.0.1")) is None
    with pytest.raises(ConfigError) as exc:
        bind_api_key(Settings(host="0.0.0.0"))
    assert "--insecure" in str(exc.value)
    assert bind_api_key(Settings(host="0.0.0.0", insecure=True)) is None
    assert bind_api_key(Settings(host="0.0.0.0", api_key="k")) == "k"
