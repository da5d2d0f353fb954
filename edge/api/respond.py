"""Request plumbing shared by the generating routes: bodies, disconnects.

- `json_body`: the decoded body (nesting bounded first); a body over `INLINE_WORK_BYTES`
  is decoded, and its heavy steps run, in a worker thread so the loop never waits on it.
- `run_unstreamed`: run a `Generation` to the end while watching for the client leaving
  (a disconnect cancels the engine work at once; the answer is then a 499 nobody reads).

SSE streaming (OpenAI's chat, completions and Responses) is in `edge.api.sse`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import anyio
from fastapi import Request

from edge.api.body import parse_json
from edge.api.generation import Generation, failure

# A request whose body is larger than this is decoded, rendered and tokenized in a worker thread;
# smaller ones take microseconds, less than the thread hop, and stay on the loop.
INLINE_WORK_BYTES = 64 << 10


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
