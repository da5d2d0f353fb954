"""The audit trail (`--audit-log FILE`): one JSON line per HTTP request, never its text.

Who used an unattended box, and how much, is a question asked weeks later, so each request
leaves a line: UTC time, request id (`X-Request-ID` as given, else generated), client address,
the name of the API key that authenticated it, method, path, model, status, prompt and
completion tokens, duration in ms. Prompts and answers are never written (they may be private;
`log_prompts` is the debug switch for those). The file is appended to across restarts and
rotated by size with the standard library's `RotatingFileHandler` (FILE.1 .. FILE.N).

Token counts reach the line through a per-request tally (a context variable the middleware
opens): the token counters of `metrics.py` and the embeddings route add to it, so the routes
report usage in the one place they already count it. The probes (`/health`, `/ready`) are not
audited: a balancer polls them every few seconds and they carry no caller.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from datetime import datetime, timezone
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import Any

from edge.errors import ConfigError

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

UNAUDITED_PATHS: frozenset[str] = frozenset({"/health", "/ready"})
STATUS_CLIENT_GONE = 499  # the request ended (cancelled) before any response started

_tally: ContextVar[dict[str, Any] | None] = ContextVar("edge_audit_tally", default=None)


def tally(*, model: str | None = None, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
    """Count toward the current request's audit line (nothing outside an audited request)."""
    rec = _tally.get()
    if rec is None:
        return
    if model is not None:
        rec["model"] = model
    rec["prompt_tokens"] += int(prompt_tokens)
    rec["completion_tokens"] += int(completion_tokens)


class AuditLog:
    """The audit file: JSON lines, size-rotated, appended to (each line flushed as written)."""

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._handler = RotatingFileHandler(path, maxBytes=max_bytes, backupCount=backups,
                                                encoding="utf-8")
        except OSError as exc:  # at start, not at the first request
            raise ConfigError("audit_log", f"cannot append to {path}: {exc.strerror or exc}") from exc
        self._handler.setFormatter(logging.Formatter("%(message)s"))

    def write(self, entry: dict[str, Any]) -> None:
        """Append one line; a write error is reported by logging's handler, never to the client."""
        line = json.dumps(entry, separators=(",", ":"), ensure_ascii=True)
        self._handler.handle(logging.makeLogRecord({"msg": line, "levelno": logging.INFO}))

    def close(self) -> None:
        self._handler.close()


def _utc(t_s: float) -> str:
    return datetime.fromtimestamp(t_s, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class AuditMiddleware:
    """Writes the line once the response is complete (a stream's end included), whatever the status.

    Sits inside `RequestIdMiddleware` (which puts the id in the scope's state) and outside the
    API key check (which names the key there), so refused requests are audited too."""

    def __init__(self, app: ASGIApp, log: AuditLog, served_model: Callable[[], str],
                 clock: Callable[[], float] = time.time,
                 timer: Callable[[], float] = time.perf_counter) -> None:
        self.app, self.log, self.served_model = app, log, served_model
        self.clock, self.timer = clock, timer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNAUDITED_PATHS:
            return await self.app(scope, receive, send)
        state = scope.setdefault("state", {})
        record: dict[str, Any] = {"model": None, "prompt_tokens": 0, "completion_tokens": 0}
        reset = _tally.set(record)
        started_s, t0 = self.clock(), self.timer()
        status = 0

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except BaseException as exc:
            if status == 0:
                status = 500 if isinstance(exc, Exception) else STATUS_CLIENT_GONE
            raise
        finally:
            _tally.reset(reset)
            self.log.write(self._entry(scope, state, record, status, started_s, self.timer() - t0))

    def _model(self, state: dict[str, Any], record: dict[str, Any]) -> str | None:
        """The model named by the route or leased from the model host (`tally`), else the served
        model when tokens were counted; None otherwise."""
        if record["model"]:
            return str(record["model"])
        return self.served_model() if record["prompt_tokens"] or record["completion_tokens"] else None

    def _entry(self, scope: Scope, state: dict[str, Any], record: dict[str, Any], status: int,
               started_s: float, elapsed_s: float) -> dict[str, Any]:
        client = scope.get("client")
        return {
            "time": _utc(started_s),
            "request_id": state.get("request_id"),
            "client": client[0] if client else None,
            "key": state.get("api_key_name"),
            "method": scope.get("method"),
            "path": scope["path"],
            "model": self._model(state, record),
            "status": status,
            "prompt_tokens": record["prompt_tokens"],
            "completion_tokens": record["completion_tokens"],
            "duration_ms": round(elapsed_s * 1000.0, 1),
        }
