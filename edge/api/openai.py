"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models.

Streaming uses OpenAI's exact SSE framing (`data: {json}\\n\\n` ... `data: [DONE]\\n\\n`),
sent through sse-starlette's `EventSourceResponse` for its keep-alive pings (a
request waiting for a slot or a long prompt writes nothing for a while; proxies
and clients must not time it out) and its disconnect listener. A client
disconnect cancels the engine request at once, streaming or not, so its slot is
free at the next engine step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette.sse import EventSourceResponse

from edge import __version__
from edge.api.errors import to_http
from edge.api.generation import (
    PRIORITY_HEADER,
    Generation,
    failure,
    grammar_for,
    openai_finish,
    parse_priority,
    prepare_job,
    sampling_for,
)
from edge.api.schemas import ChatCompletionRequest, CompletionRequest, parse_body
from edge.api.state import ApiState
from edge.errors import InvalidRequest
from edge.runtime.types import Usage

router = APIRouter()
FINGERPRINT = f"edge-{__version__}"


def _state(request: Request) -> ApiState:
    st: ApiState = request.app.state.edge
    return st


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None


def _usage_json(u: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


def _sse(obj: Any) -> bytes:
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


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _respond(
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
        work = asyncio.ensure_future(_drain_events(gen))
        watch = asyncio.ensure_future(_wait_disconnect(request))
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


async def _drain_events(gen: Generation) -> None:
    async for _ in gen.events():
        pass


def _error_chunk(gen: Generation) -> bytes | None:
    for out in gen.outcomes:
        err = failure(out)
        if err is not None:
            return _sse(to_http(err)[1])
    return None


# --- chat -------------------------------------------------------------------


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    st = _state(request)
    t0_s = st.clock()
    body: ChatCompletionRequest = parse_body(ChatCompletionRequest, await _json_body(request))
    st.check_model(body.model)
    priority = parse_priority(request.headers.get(PRIORITY_HEADER))
    messages = [m.as_template_dict(i) for i, m in enumerate(body.messages)]
    prompt = st.engine.render_chat(messages)
    sampling = sampling_for(body, grammar_for(body.response_format))
    job = prepare_job(
        st,
        prompt,
        add_bos=False,
        requested_max_tokens=body.requested_max_tokens(),
        sampling=sampling,
        stop=body.stop_tuple(),
    )
    gen = Generation(st, [job], priority, t0_s, stream=bool(body.stream))
    cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    head = {"id": cid, "created": created, "model": body.model, "system_fingerprint": FINGERPRINT}

    def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        c = {
            **head,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if body.include_usage():
            c["usage"] = None
        return c

    async def stream(g: Generation) -> AsyncIterator[bytes]:
        yield _sse(chunk({"role": "assistant", "content": ""}, None))
        async for _, ev in g.events():
            if ev.text:
                yield _sse(chunk({"content": ev.text}, None))
        err = _error_chunk(g)
        if err is not None:
            yield err
            return
        yield _sse(chunk({}, openai_finish(g.outcomes[0].finish_reason)))
        if body.include_usage():
            yield _sse(
                {**head, "object": "chat.completion.chunk", "choices": [], "usage": _usage_json(g.usage())}
            )
        yield b"data: [DONE]\n\n"

    def full(g: Generation) -> dict[str, Any]:
        out = g.outcomes[0]
        return {
            **head,
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": out.text, "refusal": None},
                    "logprobs": None,
                    "finish_reason": openai_finish(out.finish_reason),
                }
            ],
            "usage": _usage_json(g.usage()),
        }

    return await _respond(request, gen, stream, full)


# --- completions --------------------------------------------------------------


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    st = _state(request)
    t0_s = st.clock()
    body: CompletionRequest = parse_body(CompletionRequest, await _json_body(request))
    st.check_model(body.model)
    priority = parse_priority(request.headers.get(PRIORITY_HEADER))
    sampling = sampling_for(body, grammar_for(body.response_format))
    jobs = [
        prepare_job(
            st,
            p,
            add_bos=True,
            requested_max_tokens=body.requested_max_tokens(),
            sampling=sampling,
            stop=body.stop_tuple(),
        )
        for p in body.prompts()
    ]
    gen = Generation(st, jobs, priority, t0_s, stream=bool(body.stream))
    cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    head = {
        "id": cid,
        "object": "text_completion",
        "created": created,
        "model": body.model,
        "system_fingerprint": FINGERPRINT,
    }

    def chunk(index: int, text: str, finish: str | None) -> dict[str, Any]:
        c = {**head, "choices": [{"text": text, "index": index, "logprobs": None, "finish_reason": finish}]}
        if body.include_usage():
            c["usage"] = None
        return c

    async def stream(g: Generation) -> AsyncIterator[bytes]:
        async for index, ev in g.events():
            if ev.finish_reason is not None:
                if failure(g.outcomes[index]) is None:
                    yield _sse(chunk(index, ev.text, openai_finish(ev.finish_reason)))
            elif ev.text:
                yield _sse(chunk(index, ev.text, None))
        err = _error_chunk(g)
        if err is not None:
            yield err
            return
        if body.include_usage():
            yield _sse({**head, "choices": [], "usage": _usage_json(g.usage())})
        yield b"data: [DONE]\n\n"

    def full(g: Generation) -> dict[str, Any]:
        return {
            **head,
            "choices": [
                {
                    "text": o.text,
                    "index": i,
                    "logprobs": None,
                    "finish_reason": openai_finish(o.finish_reason),
                }
                for i, o in enumerate(g.outcomes)
            ],
            "usage": _usage_json(g.usage()),
        }

    return await _respond(request, gen, stream, full)


# --- models -------------------------------------------------------------------


def _model_card(st: ApiState) -> dict[str, Any]:
    return {"id": st.model_id, "object": "model", "created": int(st.started_unix_s), "owned_by": "edge"}


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [_model_card(_state(request))]}


@router.get("/v1/models/{model_id:path}")
async def get_model(request: Request, model_id: str) -> dict[str, Any]:
    st = _state(request)
    st.check_model(model_id)
    return _model_card(st)
