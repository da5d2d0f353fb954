"""`create_app(settings, engine, scheduler)`: the HTTP app, with no module globals.

Middleware order (outermost first): request counting, CORS (only when
configured), API key, body size limit, then the routes. Every error leaves
through `edge.api.errors.to_http`; an unexpected exception is logged with its
stack and answered with a generic 500 that reveals nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from edge import __version__
from edge.api import openai, ops, page
from edge.api.errors import error_payload, to_http
from edge.api.metrics import ApiMetrics
from edge.api.middleware import AuthMiddleware, BodyLimitMiddleware, CountMiddleware
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

    app = FastAPI(title="edge", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
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
    )
    holder["st"] = st
    app.state.edge = st
    app.include_router(openai.router)
    app.include_router(ops.router)
    app.include_router(page.router)  # GET /: the built-in chat page
    _install_handlers(app)

    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(AuthMiddleware, api_key=api_key or None)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "X-Edge-Priority"],
        )
    app.add_middleware(CountMiddleware, metrics=metrics)
    return app


def _install_handlers(app: FastAPI) -> None:
    @app.exception_handler(EdgeError)
    async def edge_error(request: Request, exc: EdgeError) -> JSONResponse:
        status, body, headers = to_http(exc)
        if status == 500:  # a backend failure; 503s (loading, busy, hot) are expected states
            log.error("internal error on %s: %r", request.url.path, exc)
        elif status >= 500:
            log.info("%s on %s: %s", status, request.url.path, exc)
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        msg = "no such endpoint" if exc.status_code == 404 else str(exc.detail)
        return JSONResponse(
            error_payload(exc.status_code, msg),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_payload(400, "invalid request"), status_code=400)

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return JSONResponse(
            error_payload(500, "internal server error", code="internal_error"), status_code=500
        )
