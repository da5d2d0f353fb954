"""What every generating route shares: the body read (off the loop when big), SSE framing,
the disconnect-aware stream, and `respond` (stream or one JSON body; a disconnect cancels).

Split out of `openai.py` so /v1/responses (and other APIs) answer through the same code; the
names stay importable from `edge.api.openai`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from sse_starlette.sse import EventSourceResponse

from edge.api.body import parse_json
from edge.api.errors import to_http
from edge.api.generation import Generation, failure
from edge.api.state import ApiState


def api_state(request: Request) -> ApiState:
    st: ApiState = request.app.state.edge
    return st


# A request whose body is larger than this is decoded, rendered and tokenized in a worker thread;
# smaller ones take microseconds, less than the thread hop, and stay on the loop.
INLINE_WORK_BYTES = 64 << 10


class Body:
    """The decoded JSON body, and a way to run the request's heavy steps off the loop if it is big."""

    def __init__(self, data: Any, heavy: bool) -> None:
        self.data = data
        self.heavy = heavy

    async def run(self, fn: Callable[[], Any]) -> Any:
        return await anyio.to_thread.run_sync(fn) if self.heavy else fn()


async def json_body(request: Request) -> Body:
    raw = await request.body()
    heavy = len(raw) > INLINE_WORK_BYTES
    return Body(await anyio.to_thread.run_sync(parse_json, raw) if heavy else parse_json(raw), heavy)


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


async def wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def respond(
    request: Request,
    gen: Generation,
    stream_fn: Callable[[Generation], AsyncIterator[bytes]],
    body_fn: Callable[[Generation], dict[str, Any]],
) -> Response:
    """Run `gen` streaming or not; in both cases a disconnect cancels the generation."""
    if gen.stream:
        await gen.__aenter__()

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in stream_fn(gen):
                    yield chunk
            finally:
                await gen.__aexit__(None, None, None)

        return DisconnectAwareStream(body(), gen.cancel, partial(gen.__aexit__, None, None, None),
                                     gen.st.settings.sse_ping_s)
    async with gen:
        work = asyncio.ensure_future(drain_events(gen))
        watch = asyncio.ensure_future(wait_disconnect(request))
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
        if not work.done():
            gen.cancel()
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
            return Response(status_code=499)
        work.result()
        for out in gen.outcomes:
            err = failure(out)
            if err is not None:
                raise err
        return JSONResponse(body_fn(gen))


async def drain_events(gen: Generation) -> None:
    async for _ in gen.events():
        pass


def error_chunk(gen: Generation) -> bytes | None:
    for out in gen.outcomes:
        err = failure(out)
        if err is not None:
            return sse(to_http(err)[1])
    return None


