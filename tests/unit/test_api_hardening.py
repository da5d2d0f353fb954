"""Hostile bodies and browsers: nesting bound, JSON-only POSTs, CORS allow-list, 405 typing,
boolean token ids, heavy work off the event loop, and the OpenAPI document."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from edge.api.body import MAX_JSON_DEPTH, json_depth
from edge.api.openai import INLINE_WORK_BYTES
from tests.fakes import CHAT, ScriptedEngine, make_app

COMPLETION = {"model": "scripted-model", "prompt": "a b", "max_tokens": 2}


@pytest.fixture()
def client_engine() -> tuple[TestClient, ScriptedEngine]:
    app, engine = make_app()
    return TestClient(app), engine


# --- nesting ----------------------------------------------------------------------------------


def test_json_depth_skips_strings_and_escapes() -> None:
    assert json_depth(b"{}") == 1 and json_depth(b"1") == 0
    assert json_depth(b'{"a": [1, {"b": "[[[{{{"}]}') == 3
    assert json_depth(b'["\\"[[[", "\\\\", [[]]]') == 3  # an escaped quote does not end the string
    assert json_depth(b"[" * 100 + b"]" * 100) == 100


@pytest.mark.parametrize("where", ["body", "metadata", "messages"])
def test_deep_nesting_is_400_naming_the_limit(client_engine: tuple[TestClient, ScriptedEngine],
                                              where: str) -> None:
    client, engine = client_engine
    deep = "[" * 100_000 + "]" * 100_000
    raw = {
        "body": deep,
        "metadata": json.dumps(CHAT)[:-1] + f', "metadata": {{"x": {deep}}}}}',
        "messages": '{"model": "scripted-model", "messages": [{"role": "user", "content": "x", "extra": '
                    + "{\"a\": " * 50_000 + "1" + "}" * 50_000 + "}]}",
    }[where]
    r = client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and f"at most {MAX_JSON_DEPTH}" in err["message"]
    assert engine.submitted == []


def test_nesting_up_to_the_limit_is_fine(client_engine: tuple[TestClient, ScriptedEngine]) -> None:
    client, _ = client_engine
    inner = "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1)  # +1 for the body object itself
    raw = json.dumps(CHAT)[:-1] + f', "metadata": {inner}}}'
    assert json_depth(raw.encode()) == MAX_JSON_DEPTH
    r = client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


# --- content type and CORS ------------------------------------------------------------------------


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                   None])
def test_non_json_post_is_415(client_engine: tuple[TestClient, ScriptedEngine], ctype: str | None) -> None:
    client, engine = client_engine
    headers = {"content-type": ctype} if ctype else {}
    req = client.build_request("POST", "/v1/completions", content=json.dumps(COMPLETION), headers=headers)
    if ctype is None:
        req.headers.pop("content-type", None)
    r = client.send(req)
    assert r.status_code == 415
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == "unsupported_media_type"
    assert "application/json" in err["message"]
    assert engine.submitted == []


def test_json_with_charset_is_accepted(client_engine: tuple[TestClient, ScriptedEngine]) -> None:
    client, _ = client_engine
    r = client.post("/v1/completions", content=json.dumps(COMPLETION),
                    headers={"content-type": "Application/JSON; charset=utf-8"})
    assert r.status_code == 200


PREFLIGHT = {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "content-type"}


def _allow_headers(r: httpx.Response) -> list[str]:
    return [k for k in r.headers if k.lower().startswith("access-control-allow")]


def test_cors_closed_by_default_preflight_gets_no_allow_headers() -> None:
    app, _ = make_app()
    r = TestClient(app).options("/v1/chat/completions", headers=PREFLIGHT)
    assert r.status_code >= 400 and _allow_headers(r) == []


def test_cors_allow_list_answers_listed_origins_only() -> None:
    app, engine = make_app(cors_origins=["http://ui.local"])
    client = TestClient(app)
    ok = client.options("/v1/chat/completions", headers={**PREFLIGHT, "Origin": "http://ui.local"})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://ui.local"
    bad = client.options("/v1/chat/completions", headers=PREFLIGHT)
    assert bad.status_code == 400 and _allow_headers(bad) == []
    r = client.post("/v1/chat/completions", json=CHAT, headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in r.headers
    # the browser's preflight-free request is stopped by the content type, before any engine work
    before = len(engine.submitted)
    r = client.post("/v1/chat/completions", content=json.dumps(CHAT),
                    headers={"Origin": "http://evil.example", "content-type": "text/plain"})
    assert r.status_code == 415 and len(engine.submitted) == before


# --- typing of odd requests ------------------------------------------------------------------


def test_405_is_an_invalid_request_error(client_engine: tuple[TestClient, ScriptedEngine]) -> None:
    client, _ = client_engine
    r = client.get("/v1/chat/completions")
    assert r.status_code == 405
    assert r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("prompt", [[True], [1, False], [[1, True]], [[True]]])
def test_booleans_are_not_token_ids(client_engine: tuple[TestClient, ScriptedEngine], prompt: Any) -> None:
    client, engine = client_engine
    r = client.post("/v1/completions", json={**COMPLETION, "prompt": prompt})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("prompt")
    assert engine.submitted == []


# --- heavy work off the event loop --------------------------------------------------------------


class BlockingTokenizer(ScriptedEngine):
    """Tokenizing a long prompt blocks until the test releases it (no real time passes)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.in_tokenize = False

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        if len(text) > INLINE_WORK_BYTES:
            self.in_tokenize = True
            self.entered.set()
            self.release.wait(30.0)  # bounded only so that a regression fails instead of hanging
            self.in_tokenize = False
            return [5] * 10
        return super().tokenize(text, add_bos)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_health_answers_while_a_huge_prompt_is_tokenized(path: str) -> None:
    engine = BlockingTokenizer(n_ctx=4096)
    app, _ = make_app(engine)
    huge = "word " * (INLINE_WORK_BYTES // 4)
    payload = ({"model": "scripted-model", "messages": [{"role": "user", "content": huge}]}
               if path.endswith("chat/completions") else {**COMPLETION, "prompt": huge})

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://edge") as client:
            post = asyncio.create_task(client.post(path, json=payload))
            assert await asyncio.to_thread(engine.entered.wait, 30.0)
            health = await client.get("/health")
            assert health.status_code == 200
            assert engine.in_tokenize  # answered while the tokenizer was still busy
            engine.release.set()
            r = await post
            assert r.status_code == 200, r.text

    asyncio.run(main())


# --- OpenAPI --------------------------------------------------------------------------------------


def _resolve(doc: dict[str, Any], ref: str) -> dict[str, Any]:
    node: Any = doc
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def test_openapi_describes_the_request_bodies(client_engine: tuple[TestClient, ScriptedEngine]) -> None:
    client, _ = client_engine
    doc = client.get("/openapi.json").json()
    for path, fields in (("/v1/chat/completions", {"messages", "tools", "tool_choice", "max_tokens"}),
                         ("/v1/completions", {"prompt", "max_tokens", "stop"})):
        op = doc["paths"][path]["post"]
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        model = _resolve(doc, schema["$ref"])
        assert fields <= set(model["properties"]) and "model" in model["required"]
        assert {"400", "415"} <= set(op["responses"])
    refs = {m for m in json.dumps(doc).split('"$ref": "')[1:]}
    for ref in refs:  # every reference resolves inside the document
        _resolve(doc, ref.split('"', 1)[0])
    tool = _resolve(doc, "#/components/schemas/ToolDef")
    assert tool["properties"]["type"]["const"] == "function"


def test_openapi_needs_the_key_like_the_api() -> None:
    app, _ = make_app(api_key="k")
    client = TestClient(app)
    assert client.get("/openapi.json").status_code == 401
    doc = client.get("/openapi.json", headers={"Authorization": "Bearer k"}).json()
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert client.get("/docs").status_code in (401, 404)
