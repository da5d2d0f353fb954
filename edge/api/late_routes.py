"""The routes a server's first answer does not need, included after it (or when asked for).

`edge serve` answers its first request through the OpenAI routes and the probes; the Ollama API,
the Responses API, embeddings and the chat page are ~35-45 ms of imports (their schemas are
pydantic models, built at import) on the one Python thread that the first token of a 2-core
start waits for. With `create_app(..., late_routes=True)` those routers are included by
`LateRoutes.include`: serve calls it once its start is over (commands/serve.py, beside the
deployment record), and `LateRoutesMiddleware` calls it first for any request that the routes
already there do not serve, so an Ollama client that asks at once is answered as before (its
first request pays the imports). Other users of `create_app` (tests, tools) get every route at
once.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

from fastapi import FastAPI
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

LATE_ROUTERS = ("edge.api.responses", "edge.api.embeddings", "edge.api.page", "edge.api.ollama",
                "edge.api.ollama_models")


class LateRoutes:
    """Includes `LATE_ROUTERS` in an app once, from whichever thread asks first."""

    def __init__(self, app: FastAPI) -> None:
        self._app = app
        self._lock = threading.Lock()
        self.done = False

    def include(self) -> None:
        if self.done:
            return
        with self._lock:
            if self.done:
                return
            for name in LATE_ROUTERS:
                self._app.include_router(importlib.import_module(name).router)
            self.done = True

    def serves(self, scope: Scope) -> bool:
        """Whether a route already included takes this request (a path it has, any method)."""
        return any(route.matches(scope)[0] is not Match.NONE for route in self._app.router.routes)


class LateRoutesMiddleware:
    """Before routing: the late routers, when a request needs what is not included yet."""

    def __init__(self, app: ASGIApp, late: LateRoutes) -> None:
        self.app = app
        self.late = late

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.late.done and not self.late.serves(scope):
            self.late.include()
        await self.app(scope, receive, send)


def late_routes_of(app: Any) -> LateRoutes | None:
    """The app's `LateRoutes`, None where every route was included at once."""
    return getattr(app.state, "late_routes", None)
