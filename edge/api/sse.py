"""SSE answers of the OpenAI-style routes (chat, completions, Responses): framing, the
disconnect-aware stream, and `respond` (stream, or one JSON body; a disconnect cancels both)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from fastapi import Request
from fastapi.responses import Response
from sse_starlette.sse import EventSourceResponse

from edge.api.errors import to_http
from edge.api.generation import Generation, failure
from edge.api.respond import stream_or_json


def warm_first_answer() -> None:
    """Load what a first streamed answer would load: anyio imports its asyncio backend on first
    use, the stream's task group (~18 ms of imports on a 2-core VM). The server calls this on its
    event loop while the model still loads, when that thread has nothing else to do."""
    anyio.get_cancelled_exc_class()


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


class DisconnectAwareStream(EventSourceResponse):
    """sse-starlette's stream (pings, a disconnect listener that runs even while a request waits
    for a slot and writes nothing); a disconnect calls `on_disconnect`, and `on_close` always
    runs, also when the body generator never started (client gone at once)."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        on_disconnect: Callable[[], None],
        on_close: Callable[[], Awaitable[None]],
        ping_s: float,
    ) -> None:
        async def gone(_message: Any) -> None:
            on_disconnect()

        super().__init__(content, sep="\n", ping=ping_s, client_close_handler_callable=gone,
                         headers={"Cache-Control": "no-cache"})
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            with contextlib.suppress(OSError):  # the peer went away mid-write
                await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.on_close()


async def respond(
    request: Request,
    gen: Generation,
    stream_fn: Callable[[Generation], AsyncIterator[bytes]],
    body_fn: Callable[[Generation], dict[str, Any]],
) -> Response:
    """Admit `gen`, then answer as SSE or one JSON body (`stream_or_json`); a disconnect cancels."""
    await gen.__aenter__()

    def stream(close: Callable[[], Awaitable[None]]) -> Response:
        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in stream_fn(gen):
                    yield chunk
            finally:
                await close()  # release the slot as soon as the last chunk is out

        return DisconnectAwareStream(body(), gen.cancel, close, gen.st.settings.sse_ping_s)

    return await stream_or_json(request, gen, stream, body_fn)


def error_chunk(gen: Generation) -> bytes | None:
    for out in gen.outcomes:
        err = failure(out)
        if err is not None:
            return sse(to_http(err)[1])
    return None
