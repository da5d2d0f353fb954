"""`create_app(settings, engine, scheduler)`: the HTTP app, with no module globals.

Middleware order (outermost first): request counting, CORS (only when
configured: `cors_origins` is the allow-list, and a preflight from any other origin
gets no Access-Control-Allow-* header), API key, body size limit, JSON-only POSTs
(415 otherwise), then the routes. Every error leaves through
`edge.api.errors.to_http`; an unexpected exception is logged with its stack and
answered with a generic 500 that reveals nothing.

`/openapi.json` describes the real request bodies (the pydantic models in
schemas.py) for clients and fuzzers. It sits behind the API key like every other
endpoint except the probes and the chat page: it reveals nothing secret, but one rule
("with a key configured, everything but /health, /ready and / needs it") is easier
to reason about than exceptions. No interactive docs pages are served.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from edge import __version__
from edge.api import embeddings, ollama, ollama_models, openai, ops, page, responses
from edge.api.errors import error_body, is_ollama_path, to_http
from edge.api.metrics import ApiMetrics
from edge.api.middleware import (
    AllowListCORSMiddleware,
    AuthMiddleware,
    BodyLimitMiddleware,
    CountMiddleware,
    JsonOnlyMiddleware,
    RequestIdMiddleware,
)
from edge.api.ollama_schemas import ollama_components
from edge.api.response_store import ResponseStore
from edge.api.responses_schemas import RESPONSES_MODELS
from edge.api.schemas import REQUEST_MODELS, openapi_components
from edge.api.state import ApiState
from edge.config import Settings
from edge.errors import EdgeError
from edge.runtime.types import EngineLike
from edge.scheduler.admission import Admission, AdmissionLike
from edge.scheduler.loop import SchedulerLike

log = logging.getLogger("edge.api")


def create_app(
    settings: Settings,
    engine: EngineLike,
    scheduler: SchedulerLike | None = None,
    *,
    admission: AdmissionLike | None = None,
    model_id: str | None = None,
    model_aliases: Iterable[str] = (),
    api_key: str | None = None,
    plan: Any = None,
    clock: Callable[[], float] = time.perf_counter,
    model_path: Path | None = None,
) -> FastAPI:
    """Build the app. `admission` defaults to the scheduler's, else one without heat or memory checks.

    `api_key` None means "use settings" (api_key or api_key_file); pass "" to force no key.
    """
    if api_key is None:
        api_key = settings.resolved_api_key()
    if admission is None:
        admission = scheduler.admission if scheduler is not None else Admission(
            settings.max_queue, n_slots=engine.n_slots)
    model_id = model_id or engine.model_name
    names = frozenset({model_id, engine.model_name, *model_aliases})

    app = FastAPI(title="edge", version=__version__, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json")
    holder: dict[str, ApiState] = {}
    metrics = ApiMetrics(engine, lambda: len(holder["st"].in_flight), lambda: holder["st"].scheduler_status())
    st = ApiState(
        settings=settings,
        engine=engine,
        admission=admission,
        metrics=metrics,
        model_id=model_id,
        model_names=names,
        api_key=api_key or None,
        scheduler=scheduler,
        plan=plan,
        clock=clock,
        responses=ResponseStore(settings.responses_store_max, settings.responses_store_max_bytes,
                                settings.responses_store_ttl_s),
        model_path=model_path,
    )
    holder["st"] = st
    app.state.edge = st
    _include_routes(app)
    _install_handlers(app)
    app.openapi = partial(_openapi, app, bool(api_key))  # type: ignore[method-assign]
    _add_middleware(app, settings, api_key or None, metrics)
    return app


def _include_routes(app: FastAPI) -> None:
    """Every route module; each reads its state from `app.state.edge`, none holds a global."""
    app.include_router(openai.router)
    app.include_router(responses.router)  # /v1/responses
    app.include_router(ops.router)
    app.include_router(embeddings.router)
    app.include_router(page.router)  # GET /: the built-in chat page
    app.include_router(ollama.router)  # Ollama's native API, /api/*
    app.include_router(ollama_models.router)


def _add_middleware(app: FastAPI, settings: Settings, api_key: str | None, metrics: ApiMetrics) -> None:
    """Added innermost first, so a request meets them in the order the module docstring lists."""
    app.add_middleware(JsonOnlyMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(AuthMiddleware, api_key=api_key)
    if settings.cors_origins:
        app.add_middleware(
            AllowListCORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "X-Edge-Priority"],
        )
    app.add_middleware(CountMiddleware, metrics=metrics)
    app.add_middleware(RequestIdMiddleware)


def _openapi(app: FastAPI, keyed: bool) -> dict[str, Any]:
    """FastAPI's document plus the request-body schemas the routes declare, errors and auth."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes,
                      description="OpenAI-compatible and Ollama-native API of edge (on-device LLM runtime).")
    doc.setdefault("components", {}).setdefault("schemas", {}).update(
        openapi_components((*REQUEST_MODELS, *RESPONSES_MODELS)))
    doc["components"]["schemas"].update(ollama_components())
    for path, item in doc.get("paths", {}).items():
        name = "OllamaError" if is_ollama_path(path) else "Error"  # each API's own error shape
        error = {"description": "error", "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{name}"}}}}
        for op in item.values():
            responses = op.setdefault("responses", {})
            for code in ("400", "404", "413", "415", "503") if "requestBody" in op else ("404",):
                responses.setdefault(code, error)
            if keyed:
                responses.setdefault("401", error)
    if keyed:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    app.openapi_schema = doc
    return doc


def _install_handlers(app: FastAPI) -> None:
    @app.exception_handler(EdgeError)
    async def edge_error(request: Request, exc: EdgeError) -> JSONResponse:
        status, body, headers = to_http(exc, request.url.path)
        if status == 500:  # a backend failure; 503s (loading, busy, hot) are expected states
            log.error("internal error on %s: %r", request.url.path, exc)
        elif status >= 500:
            log.info("%s on %s: %s", status, request.url.path, exc)
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        msg = "no such endpoint" if exc.status_code == 404 else str(exc.detail)
        return JSONResponse(
            error_body(request.url.path, exc.status_code, msg),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body(request.url.path, 400, "invalid request"), status_code=400)

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return JSONResponse(
            error_body(request.url.path, 500, "internal server error", code="internal_error"), status_code=500
        )
