"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models.

Streaming uses OpenAI's exact SSE framing (`data: {json}\\n\\n` ... `data: [DONE]\\n\\n`),
sent through sse-starlette's `EventSourceResponse` for its keep-alive pings (a
request waiting for a slot or a long prompt writes nothing for a while; proxies
and clients must not time it out) and its disconnect listener. A client
disconnect cancels the engine request at once, streaming or not, so its slot is
free at the next engine step.

The per-request work before queueing (decoding the body, rendering the chat
template, converting tool schemas to a grammar, tokenizing) runs in a worker thread
when the body is larger than `INLINE_WORK_BYTES`, so /health and running streams
never wait behind a 4 MiB prompt; a small body is handled inline (faster than a
thread hop, and deterministic for tests).
Tool calls (`edge.api.tools`) become `tool_calls` in the message, or
`delta.tool_calls` chunks when streaming: id, type and name as soon as the name is decoded,
then the arguments in pieces as they decode (`edge.toolcalls`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from edge import __version__
from edge.api.generation import (
    PRIORITY_HEADER,
    Generation,
    Job,
    failure,
    grammar_for,
    openai_finish,
    parse_priority,
    prepare_job,
    sampling_for,
    template_info,
)
from edge.api.logprobs import chat_logprobs, completion_logprobs
from edge.api.reasoning import ask_openai, plan_thinking, usage_details
from edge.api.respond import INLINE_WORK_BYTES as INLINE_WORK_BYTES
from edge.api.respond import json_body as _json_body
from edge.api.routes import path_doc
from edge.api.schemas import ChatCompletionRequest, CompletionRequest, parse_body, request_body_doc
from edge.api.sse import error_chunk as _error_chunk
from edge.api.sse import respond as _respond
from edge.api.sse import sse as _sse
from edge.api.state import ApiState
from edge.api.tool_parse import call_delta, call_json
from edge.api.tools import ToolPlan, check_history, plan_tools, template_messages
from edge.runtime.text.chat_template import TemplateInfo, with_turn_stops
from edge.runtime.types import TokenLogprob, Usage

router = APIRouter()
FINGERPRINT = f"edge-{__version__}"


def _state(request: Request) -> ApiState:
    st: ApiState = request.app.state.edge
    return st


def _usage_json(u: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "completion_tokens_details": usage_details(u),
    }


# --- chat -------------------------------------------------------------------


def _prepare_chat(
    st: ApiState, body: ChatCompletionRequest, info: TemplateInfo | None
) -> tuple[Job, ToolPlan]:
    """Tool plan, template, grammar and tokens (in a worker thread for a big body)."""
    plan = plan_tools(body, info)
    think = plan_thinking(st, ask_openai(body.model, body.model_extra or {}), info, st.engine.n_ctx)
    messages = template_messages(body.messages)
    if plan.tools is not None:
        prompt = st.engine.render_chat(messages, tools=plan.tools, **think.render_kwargs)
    else:
        prompt = st.engine.render_chat(messages, **think.render_kwargs)
    sampling = sampling_for(body, plan.grammar or grammar_for(body.response_format))
    stop = with_turn_stops(body.stop_tuple(), info)
    job = prepare_job(st, prompt, add_bos=False, requested_max_tokens=body.requested_max_tokens(),
                      sampling=sampling, stop=stop, logprobs=body.logprobs_n(),
                      speculative=body.speculative, n_draft=body.n_draft)
    return think.attach(job, prompt), plan


@router.post("/v1/chat/completions", openapi_extra=request_body_doc(ChatCompletionRequest))
async def chat_completions(request: Request) -> Response:
    st = _state(request)
    t0_s = st.clock()
    raw = await _json_body(request)
    body: ChatCompletionRequest = parse_body(ChatCompletionRequest, raw.data)
    priority = parse_priority(request.headers.get(PRIORITY_HEADER))
    st = await st.for_model(request, body.model)
    check_history(body.messages)
    job, plan = await raw.run(partial(_prepare_chat, st, body, template_info(st.engine)))
    gen = Generation(st, [job], priority, t0_s, stream=bool(body.stream))
    answer = _ChatAnswer(body, plan)
    return await _respond(request, gen, answer.stream, answer.full)


class _ChatAnswer:
    """One chat completion's answer in OpenAI's shapes: the SSE chunks, or the whole object. A
    class rather than closures in the route so each shape reads (and is sized) on its own."""

    def __init__(self, body: ChatCompletionRequest, plan: ToolPlan) -> None:
        self.body, self.plan = body, plan
        self.head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": body.model,
                     "system_fingerprint": FINGERPRINT}
        self.n_calls = 0  # tool calls streamed so far

    def chunk(self, delta: dict[str, Any], finish: str | None,
              lps: Sequence[TokenLogprob] = ()) -> dict[str, Any]:
        c = {
            **self.head,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": chat_logprobs(lps) if lps else None,
                         "finish_reason": finish}],
        }
        if self.body.include_usage():
            c["usage"] = None
        return c

    def deltas(self, events: list[tuple[str, Any]]) -> list[dict[str, Any]]:
        """Scanner events -> message deltas (a finished call counts; its pieces were streamed)."""
        out: list[dict[str, Any]] = []
        for kind, value in events:
            if kind == "content":
                out.append({"content": value})
            elif kind == "call":
                self.n_calls += 1
            else:  # call_start, call_args: the call streams as it decodes
                out.append(call_delta(value))
        return out

    async def stream(self, g: Generation) -> AsyncIterator[bytes]:
        yield _sse(self.chunk({"role": "assistant", "content": ""}, None))
        scanner = self.plan.scanner(stream_calls=True) if self.plan.active else None
        owed: list[TokenLogprob] = []  # logprobs of tokens whose text is held back (a possible call)
        async for _, ev in g.events():
            owed.extend(ev.logprobs)
            if ev.reasoning:  # the think block (llama-server's field)
                yield _sse(self.chunk({"reasoning_content": ev.reasoning}, None))
            if not ev.text:
                continue
            pieces = self.deltas(scanner.feed(ev.text)) if scanner is not None else [{"content": ev.text}]
            for delta in pieces:
                yield _sse(self.chunk(delta, None, owed))
                owed = []
        err = _error_chunk(g)
        if err is not None:
            yield err
            return
        if scanner is not None:
            for delta in self.deltas(scanner.finish()):
                yield _sse(self.chunk(delta, None, owed))
                owed = []
        finish = "tool_calls" if self.n_calls else openai_finish(g.outcomes[0].finish_reason)
        yield _sse(self.chunk({}, finish, owed))
        if self.body.include_usage():
            yield _sse({**self.head, "object": "chat.completion.chunk", "choices": [],
                        "usage": _usage_json(g.usage())})
        yield b"data: [DONE]\n\n"

    def full(self, g: Generation) -> dict[str, Any]:
        out = g.outcomes[0]
        message: dict[str, Any] = {"role": "assistant", "content": out.text, "refusal": None}
        if out.reasoning:
            message["reasoning_content"] = out.reasoning
        finish = openai_finish(out.finish_reason)
        if self.plan.active:
            scanner = self.plan.scanner()
            events = scanner.feed(out.text) + scanner.finish()
            if scanner.calls:
                content = "".join(v for kind, v in events if kind == "content")
                message["content"] = content or None  # OpenAI: null when the reply is only calls
                message["tool_calls"] = [call_json(c) for c in scanner.calls]
                finish = "tool_calls"
        return {
            **self.head,
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": chat_logprobs(out.logprobs) if self.body.logprobs else None,
                    "finish_reason": finish,
                }
            ],
            "usage": _usage_json(g.usage()),
        }


# --- completions --------------------------------------------------------------


@router.post("/v1/completions", openapi_extra=request_body_doc(CompletionRequest))
async def completions(request: Request) -> Response:
    st = _state(request)
    t0_s = st.clock()
    raw = await _json_body(request)
    body: CompletionRequest = parse_body(CompletionRequest, raw.data)
    priority = parse_priority(request.headers.get(PRIORITY_HEADER))
    st = await st.for_model(request, body.model)
    prompts = body.prompts()

    def prepare() -> list[Job]:  # grammar conversion and tokenizing can be slow
        sampling = sampling_for(body, grammar_for(body.response_format))
        return [
            prepare_job(st, p, add_bos=True, requested_max_tokens=body.requested_max_tokens(),
                        sampling=sampling, stop=body.stop_tuple(), logprobs=body.logprobs_n(),
                        speculative=body.speculative, n_draft=body.n_draft)
            for p in prompts
        ]

    jobs = await raw.run(prepare)
    gen = Generation(st, jobs, priority, t0_s, stream=bool(body.stream))
    answer = _CompletionAnswer(body, len(jobs))
    return await _respond(request, gen, answer.stream, answer.full)


class _CompletionAnswer:
    """One legacy completion's answer (one choice per prompt): the SSE chunks, or the whole object."""

    def __init__(self, body: CompletionRequest, n_choices: int) -> None:
        self.body = body
        self.head = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.model,
            "system_fingerprint": FINGERPRINT,
        }
        self.offsets = [0] * n_choices  # characters streamed per choice (text_offset continues from there)

    def chunk(self, index: int, text: str, finish: str | None,
              lps: Sequence[TokenLogprob] = ()) -> dict[str, Any]:
        lp = None
        if self.body.logprobs is not None:
            lp = completion_logprobs(lps, self.offsets[index])
            self.offsets[index] += sum(len(t.token) for t in lps)
        choice = {"text": text, "index": index, "logprobs": lp, "finish_reason": finish}
        c = {**self.head, "choices": [choice]}
        if self.body.include_usage():
            c["usage"] = None
        return c

    async def stream(self, g: Generation) -> AsyncIterator[bytes]:
        async for index, ev in g.events():
            if ev.finish_reason is not None:
                if failure(g.outcomes[index]) is None:
                    yield _sse(self.chunk(index, ev.text, openai_finish(ev.finish_reason), ev.logprobs))
            elif ev.text:
                yield _sse(self.chunk(index, ev.text, None, ev.logprobs))
        err = _error_chunk(g)
        if err is not None:
            yield err
            return
        if self.body.include_usage():
            yield _sse({**self.head, "choices": [], "usage": _usage_json(g.usage())})
        yield b"data: [DONE]\n\n"

    def full(self, g: Generation) -> dict[str, Any]:
        return {
            **self.head,
            "choices": [
                {
                    "text": o.text,
                    "index": i,
                    "logprobs": completion_logprobs(o.logprobs) if self.body.logprobs is not None else None,
                    "finish_reason": openai_finish(o.finish_reason),
                }
                for i, o in enumerate(g.outcomes)
            ],
            "usage": _usage_json(g.usage()),
        }


# --- models -------------------------------------------------------------------


def _model_card(st: ApiState, loaded: bool = True) -> dict[str, Any]:
    """OpenAI's model object, plus which chat template renders chats (null until the model loaded)."""
    info = template_info(st.engine) if loaded else None
    return {"id": st.model_id, "object": "model", "created": int(st.started_unix_s), "owned_by": "edge",
            "chat_template": info.as_json() if info is not None else None}


def _cards(st: ApiState) -> list[dict[str, Any]]:
    """One card per servable model; a hosted model's template shows once it is resident."""
    if st.host is None:
        return [_model_card(st)]
    live = {h.ref.key: h.engine for h in st.host.resident() if h.engine is not None}
    return [_model_card(st.view_of(ref, live.get(ref.key)), ref.key in live) for ref in st.host.names.all()]


@router.get("/v1/models", response_model=None)
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": _cards(_state(request))}


@router.get("/v1/models/{model_id:path}", response_model=None,
            openapi_extra=path_doc("model_id", "a model name or alias"))
async def get_model(request: Request) -> dict[str, Any]:
    st = _state(request)
    model_id: str = request.path_params["model_id"]
    key = st.resolve_name(model_id)
    return next(c for c in _cards(st) if c["id"] == key)
