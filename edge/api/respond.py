"""Request plumbing shared by the OpenAI and Ollama routes: bodies, disconnects, NDJSON streams.

- `json_body`: the decoded body (nesting bounded first); a body over `INLINE_WORK_BYTES`
  is decoded, and its heavy steps run, in a worker thread so the loop never waits on it.
- `run_unstreamed`: run a `Generation` to the end while watching for the client leaving
  (a disconnect cancels the engine work at once; the answer is then a 499 nobody reads).
- `stream_or_json`: the one answer of an admitted `Generation`, streamed (each API its own
  framing) or one JSON body, 499 on a disconnect, released exactly once either way.
- `NdjsonStream`: Ollama's streaming framing (one JSON object per line). Its disconnect
  listener runs from the first byte on, also while the request still waits for a slot and
  writes nothing, so a client that leaves frees its ticket and slot at the next engine step.

SSE streaming (OpenAI's chat, completions and Responses) is in `edge.api.sse`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from edge.api.body import parse_json
from edge.api.generation import Generation, failure

# A request whose body is larger than this is decoded, rendered and tokenized in a worker thread;
# smaller ones take microseconds, less than the thread hop, and stay on the loop.
INLINE_WORK_BYTES = 64 << 10
CLIENT_CLOSED = 499  # nginx's "client closed request": the unstreamed answer nobody reads


class JsonBody:
    """The decoded JSON body, and a way to run the request's heavy steps off the loop if it is big."""

    def __init__(self, data: Any, heavy: bool) -> None:
        self.data = data
        self.heavy = heavy

    async def run(self, fn: Callable[[], Any]) -> Any:
        return await anyio.to_thread.run_sync(fn) if self.heavy else fn()


async def json_body(request: Request) -> JsonBody:
    raw = await request.body()
    heavy = len(raw) > INLINE_WORK_BYTES
    return JsonBody(await anyio.to_thread.run_sync(parse_json, raw) if heavy else parse_json(raw), heavy)


async def wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def drain_events(gen: Generation) -> None:
    async for _ in gen.events():
        pass


async def run_unstreamed(request: Request, gen: Generation) -> bool:
    """Run an entered `gen` to its end; False when the client left first (the work is cancelled).
    Raises the first choice's error, if any."""
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
        return False
    work.result()
    for out in gen.outcomes:
        err = failure(out)
        if err is not None:
            raise err
    return True


async def stream_or_json(
    request: Request,
    gen: Generation,
    stream: Callable[[Callable[[], Awaitable[None]]], Response],
    whole: Callable[[Generation], dict[str, Any]],
    after: Callable[[], Awaitable[None]] | None = None,
) -> Response:
    """Answer an entered (admitted) `gen`. Streaming: `stream(close)` builds the response, which
    awaits `close` when it ends. Else run to the end and answer `whole(gen)` as JSON, or 499 when
    the client left first (the engine work is cancelled). `close` releases `gen`, then runs
    `after` (Ollama applies its keep-alive there); it does so once, however often it is awaited."""
    closed = False

    async def close() -> None:
        nonlocal closed
        if closed:
            return
        closed = True
        await gen.__aexit__(None, None, None)
        if after is not None:
            await after()

    if gen.stream:
        return stream(close)
    try:
        if not await run_unstreamed(request, gen):
            return Response(status_code=CLIENT_CLOSED)
        return JSONResponse(whole(gen))
    finally:
        await close()


def ndjson_line(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


class NdjsonStream(StreamingResponse):
    """`application/x-ndjson` from an async iterator of lines. A client disconnect (read by a
    listener that runs the whole time) calls `on_disconnect` and stops the body; `on_close`
    always runs, also when the body never started."""

    media_type = "application/x-ndjson"

    def __init__(self, content: AsyncIterator[bytes], on_disconnect: Callable[[], None],
                 on_close: Callable[[], Awaitable[None]], status_code: int = 200) -> None:
        super().__init__(content, status_code=status_code, headers={"Cache-Control": "no-cache"})
        self.content = content
        self.on_disconnect = on_disconnect
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            async with anyio.create_task_group() as tg:
                async def listen() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    self.on_disconnect()
                    tg.cancel_scope.cancel()

                async def write() -> None:
                    with contextlib.suppress(OSError):  # the peer went away mid-write
                        await send({"type": "http.response.start", "status": self.status_code,
                                    "headers": self.raw_headers})
                        async for chunk in self.content:
                            await send({"type": "http.response.body", "body": chunk, "more_body": True})
                        await send({"type": "http.response.body", "body": b"", "more_body": False})
                    tg.cancel_scope.cancel()

                tg.start_soon(listen)
                await write()
        finally:
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(Exception):
                    await self.content.aclose()  # type: ignore[attr-defined]
                await self.on_close()
