"""Late routes (api/late_routes.py): `edge serve`'s app includes the routers a first chat answer
does not need after its start, or as soon as a request asks for one of them."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
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


def test_the_routes_before_the_first_answer_build_no_pydantic_field() -> None:
    """A typed parameter or a response model makes FastAPI build a pydantic field at start, and
    the first one imports pydantic.v1: 30-35 ms of every `edge serve` start (api/routes.py)."""
    code = ("import sys; from edge.api.app import create_app; from edge.config import Settings; "
            "from tests.fakes import ScriptedEngine; e = ScriptedEngine(); e.start(); "
            "create_app(Settings(), e, api_key='', late_routes=True); print('pydantic.v1' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2], timeout=120)
    assert out.stdout.strip() == "False"


def test_the_parameters_read_from_the_request_are_documented_and_work() -> None:
    app = _late_app()
    client = TestClient(app)
    paths = client.get("/openapi.json").json()["paths"]
    model_param = paths["/v1/models/{model_id}"]["get"]["parameters"]
    assert [(p["name"], p["in"], p["required"]) for p in model_param] == [("model_id", "path", True)]
    probe_param = paths["/health/inference"]["get"]["parameters"]
    assert [(p["name"], p["in"], p["required"]) for p in probe_param] == [("model", "query", False)]
    assert client.get(f"/v1/models/{M}").json()["id"] == M
    missing = client.get("/health/inference", params={"model": "no-such-model"})
    assert missing.status_code == 404 and "no-such-model" in missing.json()["error"]["message"]


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
