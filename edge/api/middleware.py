"""Pure ASGI middleware: API key, body size limit, JSON content type, request counting.

Pure ASGI (not BaseHTTPMiddleware) so streaming responses and disconnect
messages pass through untouched: cancel-on-disconnect depends on it.
"""

from __future__ import annotations

import hmac
import json
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import PlainTextResponse, Response

from edge.api.errors import error_body, is_ollama_path, to_http
from edge.api.metrics import ApiMetrics
from edge.errors import BodyTooLarge, EdgeError, Unauthorized

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Probes must work without a key (systemd, load balancers); they reveal nothing. Nor does
# the chat page at "/": its API calls carry the key the user types into it.
PUBLIC_PATHS: frozenset[str] = frozenset({"/health", "/ready", "/"})
KNOWN_PATHS: frozenset[str] = frozenset(
    {
        "/",
        "/health",
        "/ready",
        "/metrics",
        "/v1/status",
        "/v1/models",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/openapi.json",
        # Ollama's native API (edge/api/ollama.py, ollama_models.py)
        "/api/chat",
        "/api/generate",
        "/api/embed",
        "/api/embeddings",
        "/api/tags",
        "/api/show",
        "/api/ps",
        "/api/version",
        "/api/pull",
        "/api/delete",
    }
)


async def send_error(send: Send, err: EdgeError, path: str = "") -> None:
    status, body, headers = to_http(err, path)
    await send_json(send, status, body, headers)


async def send_json(
    send: Send, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> None:
    headers = headers or {}
    raw = json.dumps(body).encode()
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    hdrs += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": raw})


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", []):
        if k.lower() == name:
            return v.decode("latin-1")
    return None


class AuthMiddleware:
    """Bearer key check with a constant-time compare against every key (name -> key, several
    with a `name:key` key file); off when no key is configured. The name of the key that
    matched goes into the scope's state (`api_key_name`) for the audit trail."""

    def __init__(self, app: ASGIApp, api_key: str | None = None,
                 keys: Mapping[str, str] | None = None) -> None:
        self.app = app
        named = dict(keys) if keys else ({"default": api_key} if api_key else {})
        self.keys = [(name, key.encode()) for name, key in named.items()]

    def _match(self, token: bytes) -> str | None:
        found = None
        for name, key in self.keys:  # no early exit: the time taken says nothing of which key
            if hmac.compare_digest(token, key) and found is None:
                found = name
        return found

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or scope["path"] in PUBLIC_PATHS:
            return await self.app(scope, receive, send)
        if scope.get("method") == "OPTIONS":  # CORS preflight carries no credentials
            return await self.app(scope, receive, send)
        auth = _header(scope, b"authorization") or ""
        scheme, _, token = auth.partition(" ")
        name = self._match(token.strip().encode()) if scheme.lower() == "bearer" else None
        if name is None:
            return await send_error(send, Unauthorized(), scope["path"])
        scope.setdefault("state", {})["api_key_name"] = name
        return await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """413 when Content-Length says too much, or when a chunked body grows past the limit."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await send_error(send, BodyTooLarge(self.limit), scope["path"])
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        return await self.app(scope, limited_receive, send)


class JsonOnlyMiddleware:
    """415 for a POST to the API whose Content-Type is not `application/json` (parameters such as
    charset allowed). A browser sends text/plain (or no type, for a Blob) cross-site WITHOUT a CORS
    preflight; if such a body were parsed as JSON, any web page the user visits could drive this
    local server. Requiring application/json forces the preflight, which CORS then refuses.

    Ollama's API (`/api/`) is driven with `curl -d '{...}'` (a form content type) in Ollama's own
    docs, so there a request WITHOUT an Origin header (no web page: browsers send Origin on every
    cross-site POST) may have any content type; with an Origin the rule above holds."""

    def __init__(self, app: ASGIApp, prefixes: tuple[str, ...] = ("/v1/", "/api/")) -> None:
        self.app = app
        self.prefixes = prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # only POST: a cross-site DELETE is never a "simple" request, the browser preflights it
        post = scope["type"] == "http" and scope.get("method") == "POST"
        path = scope["path"] if post else ""
        if post and path.startswith(self.prefixes):
            if is_ollama_path(path) and _header(scope, b"origin") is None:
                return await self.app(scope, receive, send)
            ctype = (_header(scope, b"content-type") or "").split(";", 1)[0].strip().lower()
            if ctype != "application/json":
                shown = ctype or "none"
                return await send_json(send, 415, error_body(
                    path, 415, f"Content-Type must be application/json (got {shown})", param="Content-Type",
                    code="unsupported_media_type"))
        return await self.app(scope, receive, send)


class AllowListCORSMiddleware(CORSMiddleware):
    """Starlette's CORS, except that a refused preflight carries no Access-Control-Allow-* header
    at all (Starlette sends its allowed methods and headers even to an unlisted origin)."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 200:
            return PlainTextResponse(bytes(response.body).decode(), status_code=response.status_code,
                                     headers={"Vary": "Origin"})
        return response


class CountMiddleware:
    """edge_requests_total{endpoint,status}; unknown paths share one label value."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        endpoint = (
            path
            if path in KNOWN_PATHS
            else "/v1/models/{id}" if path.startswith("/v1/models/")
            else "/v1/responses/{id}" if path.startswith("/v1/responses/")
            else "other"
        )
        counted = False

        async def counting_send(message: Message) -> None:
            nonlocal counted
            if message["type"] == "http.response.start" and not counted:
                counted = True
                self.metrics.requests.labels(endpoint, str(message["status"])).inc()
            await send(message)

        return await self.app(scope, receive, counting_send)


_REQUEST_ID_MAX = 128


class RequestIdMiddleware:
    """Echo the client's or the balancer's `X-Request-ID` on the response (every status), so one
    id follows a request from HAProxy's log to the answer. Only visible ASCII, at most 128 chars.
    With `generate` (the audit trail is on) a request without one gets a fresh id, echoed too, so
    every audit line has an id the caller also holds. The id goes into the scope's state."""

    def __init__(self, app: ASGIApp, generate: bool = False) -> None:
        self.app = app
        self.generate = generate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rid = _header(scope, b"x-request-id") if scope["type"] == "http" else None
        if not rid or len(rid) > _REQUEST_ID_MAX or not all(33 <= ord(c) < 127 for c in rid):
            if not self.generate or scope["type"] != "http":
                return await self.app(scope, receive, send)
            rid = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        raw = rid.encode("ascii")

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", raw)]}
            await send(message)

        await self.app(scope, receive, send_with_id)
