"""Ollama's native generation API: POST /api/chat, /api/generate, /api/embed, /api/embeddings.

Same engine, admission, auth and disconnect handling as the OpenAI routes
(`generation.py`, `respond.py`); only the wire format differs. Streaming is Ollama's
NDJSON (one JSON object per line, the last with `done: true` and the timings in
nanoseconds); `"stream": false` gives the last object with the whole text. Tool calls
are parsed by the same `CallScanner` as /v1 and streamed as soon as each call is
complete (as Ollama does), with `arguments` as an object.

`keep_alive` (a duration, seconds, 0 or negative) becomes the engine's keep-alive once the
request is over (`Engine.set_keep_alive`): the model then stays loaded that long. An
empty prompt (or no messages) only loads the model, or unloads it with `keep_alive: 0`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from edge.api.embeddings import embed_inputs
from edge.api.generation import (
    PRIORITY_HEADER,
    Generation,
    Job,
    parse_priority,
    prepare_job,
    template_info,
)
from edge.api.ollama_schemas import (
    ChatRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
    Message,
    Options,
    ollama_body_doc,
    parse_keep_alive,
)
from edge.api.ollama_support import (
    Timings,
    common,
    created_at,
    done_reason,
    finish_keep_alive,
    fit_num_ctx,
    grammar_of,
    hold_loaded,
    load_or_unload,
    max_tokens_of,
    ollama_call,
    on_model,
    respond,
    sampling_of,
    served_name,
    state_of,
    stream_error,
    untagged,
)
from edge.api.reasoning import ask_ollama, ollama_events, plan_thinking, with_thinking
from edge.api.respond import JsonBody, json_body
from edge.api.schemas import ChatCompletionRequest, ChatMessage, FunctionCall, ToolCall, parse_model
from edge.api.state import ApiState
from edge.api.tools import ToolPlan, plan_tools, template_messages
from edge.errors import InvalidRequest
from edge.runtime.text.chat_template import TemplateInfo, with_turn_stops

router = APIRouter()
_TRIVIAL_TEMPLATES = frozenset({"{{ .Prompt }}", "{{.Prompt}}"})
_NS = 1_000_000_000


# --- /api/chat ------------------------------------------------------------------------------------


def chat_messages(messages: list[Message]) -> list[ChatMessage]:
    """Ollama's messages as the OpenAI models the template code takes: assistant calls get ids
    (Ollama's have none), and each tool result answers the next unanswered call, in order."""
    out: list[ChatMessage] = []
    unanswered: list[str] = []
    for i, m in enumerate(messages):
        if m.images:
            raise InvalidRequest(f"messages[{i}].images: this model takes text only", f"messages[{i}].images")
        calls = None
        if m.tool_calls:
            if m.role != "assistant":
                raise InvalidRequest(f"messages[{i}].tool_calls: only assistant messages carry tool calls",
                                     f"messages[{i}].tool_calls")
            calls = []
            for j, c in enumerate(m.tool_calls):
                cid = c.id or f"call_{i}_{j}"
                calls.append(ToolCall(id=cid, function=FunctionCall(name=c.function.name,
                                                                   arguments=c.function.arguments)))
            unanswered = [c.id for c in calls]
        call_id = None
        if m.role == "tool":
            call_id = m.tool_call_id or (unanswered.pop(0) if unanswered else None)
        out.append(ChatMessage(role=m.role, content=m.content, tool_calls=calls, name=m.tool_name,
                               tool_call_id=call_id))
    return out


def _prepare_chat(st: ApiState, body: ChatRequest, opts: Options,
                  info: TemplateInfo | None) -> tuple[Job, ToolPlan]:
    msgs = chat_messages(body.messages)
    if body.tools and body.format not in (None, ""):
        raise InvalidRequest("format cannot be combined with tools (both constrain the output)", "format")
    plan = plan_tools(ChatCompletionRequest(model=body.model, messages=msgs, tools=body.tools or None,
                                            parallel_tool_calls=True), info)
    think = plan_thinking(st, ask_ollama(body.model, body.think, opts.reasoning_budget), info,
                          st.engine.n_ctx)
    rendered = template_messages(msgs)
    prompt = (st.engine.render_chat(rendered, tools=plan.tools, **think.render_kwargs)
              if plan.tools is not None else st.engine.render_chat(rendered, **think.render_kwargs))
    job = prepare_job(st, prompt, add_bos=False, requested_max_tokens=max_tokens_of(st, opts),
                      sampling=sampling_of(opts, plan.grammar or grammar_of(body.format)),
                      stop=with_turn_stops(opts.stops(), info))
    return think.attach(fit_num_ctx(job, opts), prompt), plan


@router.post("/api/chat", openapi_extra=ollama_body_doc(ChatRequest))
async def chat(request: Request) -> Response:
    st = state_of(request)
    timings = Timings(st, st.clock())
    raw: JsonBody = await json_body(request)
    body: ChatRequest = parse_model(ChatRequest, raw.data)
    opts, keep_alive_s = common(st, body)
    if not body.messages:
        return await load_or_unload(st, body.model, keep_alive_s,
                                    lambda text: {"message": {"role": "assistant", "content": text}})
    priority = parse_priority(request.headers.get(PRIORITY_HEADER))
    st = timings.st = await on_model(request, st, body.model, opts)
    job, plan = await raw.run(partial(_prepare_chat, st, body, opts, template_info(st.engine)))
    gen = Generation(st, [job], priority, timings.t0_s, stream=body.stream)
    head = {"model": body.model}

    def message(content: str, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        m: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            m["tool_calls"] = calls
        return m

    def final(g: Generation, msg: dict[str, Any]) -> dict[str, Any]:
        return {**head, "created_at": created_at(), "message": msg, "done_reason": done_reason(g),
                "done": True, **timings.final(g)}

    async def lines(g: Generation) -> AsyncIterator[dict[str, Any]]:
        scanner = plan.scanner() if plan.active else None
        n_calls = 0

        def chunk(kind: str, value: Any) -> dict[str, Any]:
            nonlocal n_calls
            if kind in ("content", "thinking"):  # thinking: edge.api.reasoning.ollama_events
                return {**head, "created_at": created_at(), "message": {**message(""), kind: value},
                        "done": False}
            n_calls += 1
            msg = message("", [ollama_call(value, n_calls - 1)])
            return {**head, "created_at": created_at(), "message": msg, "done": False}

        async for _, ev in g.events():
            for kind, value in ollama_events(ev, scanner):
                yield chunk(kind, value)
        err = stream_error(g)
        if err is not None:
            yield err
            return
        if scanner is not None:
            for kind, value in scanner.finish():
                yield chunk(kind, value)
        yield final(g, message(""))

    def whole(g: Generation) -> dict[str, Any]:
        text = g.outcomes[0].text
        if not plan.active:
            return final(g, message(text))
        scanner = plan.scanner()
        events = scanner.feed(text) + scanner.finish()
        content = "".join(v for kind, v in events if kind == "content") if scanner.calls else text
        return final(g, message(content, [ollama_call(c, i) for i, c in enumerate(scanner.calls)]))

    return await respond(request, gen, timings, keep_alive_s, lines, with_thinking(whole))


# --- /api/generate --------------------------------------------------------------------------------


def _generate_prompt(st: ApiState, body: GenerateRequest, info: TemplateInfo | None,
                     render_kwargs: dict[str, Any]) -> tuple[str, bool]:
    """(prompt text, add_bos): verbatim for raw (or a `{{ .Prompt }}` template, or a model without
    a chat template), else the user turn rendered by the model's chat template."""
    raw = body.raw or (body.template is not None and body.template.strip() in _TRIVIAL_TEMPLATES)
    if raw:
        if body.system:
            raise InvalidRequest("system cannot be combined with raw (raw prompts are sent as they are)",
                                 "system")
        return body.prompt, True
    if info is not None and info.source == "fallback":  # a base model: its "template" is the prompt
        return (f"{body.system}\n\n{body.prompt}" if body.system else body.prompt), True
    messages = ([{"role": "system", "content": body.system}] if body.system else []) + [
        {"role": "user", "content": body.prompt}]
    return st.engine.render_chat(messages, **render_kwargs), False


def _prepare_generate(st: ApiState, body: GenerateRequest, opts: Options,
                      info: TemplateInfo | None) -> Job:
    think = plan_thinking(st, ask_ollama(body.model, body.think, opts.reasoning_budget), info,
                          st.engine.n_ctx)
    text, add_bos = _generate_prompt(st, body, info, think.render_kwargs)
    prompt: str | list[int] = text
    if body.context:  # the conversation so far, as token ids a previous response returned
        prompt = list(body.context) + st.engine.tokenize(text, False)
    job = prepare_job(st, prompt, add_bos=add_bos, requested_max_tokens=max_tokens_of(st, opts),
                      sampling=sampling_of(opts, grammar_of(body.format)), stop=opts.stops())
    return think.attach(fit_num_ctx(job, opts), prompt)


@router.post("/api/generate", openapi_extra=ollama_body_doc(GenerateRequest))
async def generate(request: Request) -> Response:
    st = state_of(request)
    timings = Timings(st, st.clock())
    raw: JsonBody = await json_body(request)
    body: GenerateRequest = parse_model(GenerateRequest, raw.data)
    opts, keep_alive_s = common(st, body)
    if body.images:
        raise InvalidRequest("images: this model takes text only", "images")
    if body.suffix:
        raise InvalidRequest("suffix (fill-in-the-middle) is not supported", "suffix")
    template = (body.template or "").strip()
    if template and template not in _TRIVIAL_TEMPLATES:
        raise InvalidRequest("template: Go templates are not supported; edge renders the model's own Jinja "
                             "chat template. Send raw: true with a prompt you formatted yourself", "template")
    if not body.prompt and not body.system and not body.context:
        return await load_or_unload(st, body.model, keep_alive_s, lambda text: {"response": text})
    priority = parse_priority(request.headers.get(PRIORITY_HEADER))
    st = timings.st = await on_model(request, st, body.model, opts)
    job = await raw.run(partial(_prepare_generate, st, body, opts, template_info(st.engine)))
    gen = Generation(st, [job], priority, timings.t0_s, stream=body.stream)
    head = {"model": body.model}

    def context_of(g: Generation) -> list[int]:
        prompt = job.request.prompt if isinstance(job.request.prompt, list) else []
        return list(prompt) + (st.engine.tokenize(g.outcomes[0].text, False) if g.outcomes[0].text else [])

    def final(g: Generation, text: str) -> dict[str, Any]:
        return {**head, "created_at": created_at(), "response": text, "done": True,
                "done_reason": done_reason(g), "context": context_of(g), **timings.final(g)}

    async def lines(g: Generation) -> AsyncIterator[dict[str, Any]]:
        async for _, ev in g.events():
            if ev.reasoning:
                yield {**head, "created_at": created_at(), "response": "", "thinking": ev.reasoning,
                       "done": False}
            if ev.text:
                yield {**head, "created_at": created_at(), "response": ev.text, "done": False}
        err = stream_error(g)
        if err is not None:
            yield err
            return
        yield final(g, "")

    return await respond(request, gen, timings, keep_alive_s, lines,
                         with_thinking(lambda g: final(g, g.outcomes[0].text), None))


# --- /api/embed, /api/embeddings ------------------------------------------------------------------


async def _embed(request: Request, st: ApiState, model: str, inputs: list[str], *, truncate: bool,
                 dimensions: int | None, options: Options | None,
                 keep_alive: float | None) -> tuple[list[Any], int, Timings]:
    timings = Timings(st, st.clock())
    if options is not None:
        options.log_ignored()
    name = untagged(st, model)
    st = timings.st = await st.for_model(request, name)
    before_s = await hold_loaded(st)
    try:
        await timings.load_if_unloaded()
        vectors, n_tokens = await embed_inputs(st, name, list(inputs), dimensions, truncate=truncate,
                                               priority=parse_priority(request.headers.get(PRIORITY_HEADER)))
    except BaseException:
        await finish_keep_alive(st, before_s)
        raise
    await finish_keep_alive(st, keep_alive)
    return vectors, n_tokens, timings


async def _check_embed_name(st: ApiState, model: str) -> None:
    """404 unless `model` is the served model or the embeddings model (requests that embed nothing)."""
    if st.host is not None:
        served_name(st, model)
        return
    info = await anyio.to_thread.run_sync(st.engine.embedding_info)
    if untagged(st, model) != info["model"]:
        served_name(st, model)


@router.post("/api/embed", openapi_extra=ollama_body_doc(EmbedRequest))
async def embed(request: Request) -> Response:
    st = state_of(request)
    raw = await json_body(request)
    body: EmbedRequest = parse_model(EmbedRequest, raw.data)
    keep_alive = st.settings.keep_alive_s if body.keep_alive is None else parse_keep_alive(body.keep_alive)
    inputs = body.inputs()
    if not inputs:  # Ollama: an empty input loads the model
        await _check_embed_name(st, body.model)
        return await load_or_unload(st, body.model, keep_alive, lambda _t: {"embeddings": []})
    vectors, n_tokens, timings = await _embed(request, st, body.model, inputs, truncate=body.truncate,
                                              dimensions=body.dimensions, options=body.options,
                                              keep_alive=keep_alive)
    now = st.clock()
    return JSONResponse({"model": body.model, "embeddings": [[float(x) for x in v] for v in vectors],
                         "total_duration": int((now - timings.t0_s) * _NS),
                         "load_duration": int(timings.load_s * _NS), "prompt_eval_count": n_tokens})


@router.post("/api/embeddings", openapi_extra=ollama_body_doc(EmbeddingsRequest))
async def embeddings_legacy(request: Request) -> Response:
    st = state_of(request)
    raw = await json_body(request)
    body: EmbeddingsRequest = parse_model(EmbeddingsRequest, raw.data)
    keep_alive = st.settings.keep_alive_s if body.keep_alive is None else parse_keep_alive(body.keep_alive)
    if not body.prompt:  # Ollama answers an empty prompt with an empty vector
        await _check_embed_name(st, body.model)
        return JSONResponse({"embedding": []})
    vectors, _, _ = await _embed(request, st, body.model, [body.prompt], truncate=True, dimensions=None,
                                 options=body.options, keep_alive=keep_alive)
    return JSONResponse({"embedding": [float(x) for x in vectors[0]]})

