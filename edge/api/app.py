"""`create_app(settings, engine, scheduler)`: the HTTP app, with no module globals.

Middleware order (outermost first): request id, audit trail (with `--audit-log`), request
counting, CORS (only when
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
import weakref
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
from edge.api import openai, ops
from edge.api.audit import AuditLog, AuditMiddleware
from edge.api.errors import error_body, is_ollama_path, to_http
from edge.api.health_probe import ProbeCollector
from edge.api.host_metrics import HostCollector
from edge.api.late_routes import LateRoutes, LateRoutesMiddleware, late_routes_of
from edge.api.leases import LeaseMiddleware
from edge.api.metrics import ApiMetrics
from edge.api.middleware import (
    AllowListCORSMiddleware,
    AuthMiddleware,
    BodyLimitMiddleware,
    CountMiddleware,
    JsonOnlyMiddleware,
    RequestIdMiddleware,
)
from edge.api.response_store import ResponseStore
from edge.api.schemas import REQUEST_MODELS, openapi_components
from edge.api.state import ApiState
from edge.config import Settings
from edge.errors import EdgeError
from edge.host.models import ModelHost
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
    host: ModelHost | None = None,
    late_routes: bool = False,
) -> FastAPI:
    """Build the app. `admission` defaults to the scheduler's, else one without heat or memory checks.
    With a model `host`, `engine` is the host (the one engine the scheduler and /ready see) and each
    request runs on the engine of the model it names (`ApiState.for_model`).

    `api_key` None means "use settings" (api_key or api_key_file); pass "" to force no key.
    `late_routes`: the routers a first chat answer does not need come later (late_routes.py).
    """
    keys = _api_keys(settings, api_key)  # name -> key (several with a name:key key file)
    api_key = next(iter(keys.values()), "")
    if admission is None:
        admission = scheduler.admission if scheduler is not None else Admission(
            settings.max_queue, n_slots=engine.n_slots)
    model_id = model_id or engine.model_name
    names = frozenset({model_id, engine.model_name, *model_aliases})

    app = FastAPI(title="edge", version=__version__, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json")
    holder: dict[str, ApiState] = {}
    metrics = ApiMetrics(engine, lambda: len(holder["st"].in_flight), lambda: holder["st"].scheduler_status())
    st = holder["st"] = ApiState(
        settings=settings, engine=engine, admission=admission, metrics=metrics, model_id=model_id,
        model_names=names, api_key=api_key or None, scheduler=scheduler, plan=plan, clock=clock,
        responses=ResponseStore(settings.responses_store_max, settings.responses_store_max_bytes,
                                settings.responses_store_ttl_s),
        model_path=model_path, host=host)
    metrics.registry.register(ProbeCollector(st.probes))
    if host is not None:
        metrics.registry.register(HostCollector(host))
    app.state.edge = st
    _include_routes(app, late_routes)
    _install_handlers(app)
    app.openapi = partial(_openapi, app, bool(api_key))  # type: ignore[method-assign]
    _add_middleware(app, settings, keys, metrics)
    _add_audit(app, settings, lambda: st.model_id)
    app.add_middleware(LeaseMiddleware)  # outermost: model leases end after the whole response
    return app


def _add_audit(app: FastAPI, settings: Settings, served_model: Callable[[], str]) -> None:
    """The audit trail (with `--audit-log`) outside the key check and counting, and the request
    id outside it (generated when the trail is on, so every line has one)."""
    if settings.audit_log is not None:
        audit = AuditLog(settings.audit_log, settings.audit_log_max_mib << 20, settings.audit_log_backups)
        app.add_middleware(AuditMiddleware, log=audit, served_model=served_model)
        weakref.finalize(app, audit.close)
    app.add_middleware(RequestIdMiddleware, generate=settings.audit_log is not None)


def _api_keys(settings: Settings, api_key: str | None) -> dict[str, str]:
    """None: the settings' keys; "": none; a key: the settings' keys when they hold it (so every
    named key of the file works), else that key alone as "default"."""
    if api_key is None:
        return settings.resolved_api_keys()
    if not api_key:
        return {}
    held = settings.resolved_api_keys() if settings.api_key or settings.api_key_file else {}
    return held if api_key in held.values() else {"default": api_key}


def _include_routes(app: FastAPI, late: bool) -> None:
    """Every route module; each reads its state from `app.state.edge`, none holds a global. The
    OpenAI routes and the probes now; the rest (LATE_ROUTERS: /v1/responses, /v1/embeddings, the
    chat page at /, Ollama's /api/*) now too, or with `late` once the start is over or a request
    needs them."""
    app.include_router(openai.router)
    app.include_router(ops.router)
    routes = LateRoutes(app)
    if late:
        app.state.late_routes = routes
        app.add_middleware(LateRoutesMiddleware, late=routes)  # innermost: just before routing
    else:
        routes.include()


def _add_middleware(app: FastAPI, settings: Settings, keys: dict[str, str], metrics: ApiMetrics) -> None:
    """Added innermost first, so a request meets them in the order the module docstring lists
    (the audit trail and the request id, outermost, are added by `create_app`)."""
    app.add_middleware(JsonOnlyMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(AuthMiddleware, keys=keys)
    if settings.cors_origins:
        app.add_middleware(
            AllowListCORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "X-Edge-Priority"],
        )
    app.add_middleware(CountMiddleware, metrics=metrics)


def _openapi(app: FastAPI, keyed: bool) -> dict[str, Any]:
    """FastAPI's document plus the request-body schemas the routes declare, errors and auth."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    from edge.api.ollama_schemas import ollama_components
    from edge.api.responses_schemas import RESPONSES_MODELS

    late = late_routes_of(app)
    if late is not None:
        late.include()  # the document describes every route
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
