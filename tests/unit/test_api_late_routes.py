"""Late routes (api/late_routes.py): `edge serve`'s app includes the routers a first chat answer
does not need after its start, or as soon as a request asks for one of them."""

from __future__ import annotations

import threading
from typing import Any

from fastapi.testclient import TestClient

from edge.api.app import create_app
from edge.api.late_routes import late_routes_of
from edge.config import Settings
from tests.fakes import ScriptedEngine

M = "scripted-model"


def _late_app() -> Any:
    engine = ScriptedEngine()
    engine.start()
    return create_app(Settings(), engine, api_key="", late_routes=True)


def _routes(routes: Any) -> list[Any]:
    """Every route, through FastAPI's included routers (`original_router`)."""
    out: list[Any] = []
    for r in routes:
        inner = getattr(r, "original_router", None)
        out.extend(_routes(inner.routes) if inner is not None else [r])
    return out


def _paths(app: Any) -> set[str]:
    return {getattr(r, "path", "") for r in _routes(app.router.routes)}


def test_a_chat_answer_needs_no_late_route() -> None:
    app = _late_app()
    client = TestClient(app)
    assert "/api/chat" not in _paths(app) and "/v1/chat/completions" in _paths(app)
    hi = [{"role": "user", "content": "hi"}]
    r = client.post("/v1/chat/completions", json={"model": M, "messages": hi})
    assert r.status_code == 200 and client.get("/ready").status_code == 200
    assert not late_routes_of(app).done and "/api/chat" not in _paths(app)


def test_an_ollama_client_that_asks_at_once_is_answered() -> None:
    app = _late_app()
    client = TestClient(app)
    assert client.get("/api/version").status_code == 200  # included for this request
    assert late_routes_of(app).done
    hi = [{"role": "user", "content": "hi"}]
    r = client.post("/api/chat", json={"model": M, "messages": hi, "stream": False})
    assert r.status_code == 200 and r.json()["done"] is True
    assert client.get("/").status_code == 200  # the chat page


def test_the_openapi_document_describes_the_late_routes_too() -> None:
    app = _late_app()
    paths = TestClient(app).get("/openapi.json").json()["paths"]
    assert {"/api/chat", "/v1/responses", "/v1/embeddings", "/v1/chat/completions"} <= set(paths)


def test_include_from_two_threads_adds_each_route_once() -> None:
    app = _late_app()
    late = late_routes_of(app)
    threads = [threading.Thread(target=late.include) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    routes = [(r.path, tuple(sorted(getattr(r, "methods", None) or ()))) for r in _routes(app.router.routes)]
    assert len(routes) == len(set(routes)) and "/api/tags" in _paths(app)


def test_other_apps_get_every_route_at_once() -> None:
    engine = ScriptedEngine()
    engine.start()
    app = create_app(Settings(), engine, api_key="")
    assert late_routes_of(app) is None and {"/api/chat", "/v1/responses", "/"} <= _paths(app)
