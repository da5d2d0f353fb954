"""The one mapping from edge errors to HTTP: status, error body, Retry-After.

OpenAI's shape is `{"error": {"message", "type", "param", "code"}}`. The status
comes from the error's `kind`; `code` is the error class in snake case so that
clients can branch on it without parsing messages. Ollama's native API
(`/api/*`) answers in Ollama's own shape, `{"error": "message"}`, with the same
status and headers: `error_body` picks the shape from the request path.
"""

from __future__ import annotations

import math
import re
from typing import Any

from edge.errors import EdgeError, ErrorKind

STATUS_BY_KIND: dict[ErrorKind, int] = {
    ErrorKind.INVALID_REQUEST: 400,
    ErrorKind.UNAUTHORIZED: 401,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.INSUFFICIENT_STORAGE: 507,
    ErrorKind.RATE_LIMITED: 429,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.INTERNAL: 500,
}
TYPE_BY_STATUS: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
    507: "insufficient_storage",
    500: "server_error",
}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def error_payload(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    default = "invalid_request_error" if 400 <= status < 500 else "server_error"  # the client's fault or ours
    return {
        "error": {
            "message": message,
            "type": TYPE_BY_STATUS.get(status, default),
            "param": param,
            "code": code,
        }
    }


OLLAMA_PREFIX = "/api/"


def is_ollama_path(path: str) -> bool:
    return path.startswith(OLLAMA_PREFIX)


def ollama_payload(message: str) -> dict[str, Any]:
    """Ollama's error body (its clients read `error` as a string)."""
    return {"error": message}


def error_body(path: str, status: int, message: str, *, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """The error body in the shape of the API `path` belongs to."""
    if is_ollama_path(path):
        return ollama_payload(message)
    return error_payload(status, message, param=param, code=code)


def to_http(err: EdgeError, path: str = "") -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, body, headers) for a deliberate error, in the shape of `path`'s API.
    INTERNAL errors get a generic message."""
    status = STATUS_BY_KIND.get(err.kind, 500)
    headers: dict[str, str] = {}
    if status in (429, 503):
        retry_after_s = err.retry_after_s if err.retry_after_s is not None else 1
        headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    message = str(err) if status != 500 else "internal server error"
    code = _snake(type(err).__name__)
    return status, error_body(path, status, message, param=err.param, code=code), headers
