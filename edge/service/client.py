"""A small HTTP client for `edge chat --url` and `edge status` (stdlib only).

The opener is a parameter so tests can point it at an in-process app.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from edge.errors import EdgeError, InvalidRequest, ModelNotFound, ServerError, Unauthorized
from edge.errors import EngineStopped as ServerUnavailable


def _error_from(exc: urllib.error.HTTPError) -> EdgeError:
    try:
        body = json.loads(exc.read() or b"{}")
        message = body.get("error", {}).get("message") or body.get("reason") or exc.reason
    except (ValueError, AttributeError):
        message = str(exc.reason)
    if exc.code == 401:
        return Unauthorized(str(message))
    if exc.code == 404:
        return ModelNotFound(str(message))
    if exc.code == 400:
        return InvalidRequest(str(message))
    if exc.code in (429, 503):
        return ServerUnavailable(f"{message} (retry after {exc.headers.get('Retry-After', '?')} s)")
    return ServerError(exc.code, str(message))


class ApiClient:
    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        opener: Callable[..., Any] = urllib.request.urlopen,
        timeout_s: float = 600.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self._open = opener
        self.timeout_s = timeout_s

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            return self._open(req, timeout=self.timeout_s)
        except urllib.error.HTTPError as exc:
            raise _error_from(exc) from None
        except urllib.error.URLError as exc:
            raise ServerUnavailable(f"cannot reach {self.base_url}: {exc.reason}") from None

    def get_json(self, path: str) -> Any:
        with self._request("GET", path) as resp:
            return json.loads(resp.read())

    def model_id(self) -> str:
        return str(self.get_json("/v1/models")["data"][0]["id"])

    def stream_chat(self, messages: list[dict[str, str]], model: str, **params: Any) -> Iterator[str]:
        """Yield content deltas of a streamed chat completion."""
        body = {"model": model, "messages": messages, "stream": True, **params}
        with self._request("POST", "/v1/chat/completions", body) as resp:
            for raw in resp:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                chunk = json.loads(data)
                if "error" in chunk:
                    raise ServerError(500, chunk["error"].get("message", "stream failed"))
                for choice in chunk.get("choices", []):
                    text = choice.get("delta", {}).get("content")
                    if text:
                        yield text
