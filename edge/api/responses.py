"""OpenAI's Responses API: `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`.

The same path as /v1/chat/completions from the parsed body on: the input items become chat
messages (instructions first; function_call items join the assistant turn; function_call_output
items are tool messages), the tools and tool_choice go through the same plan and grammar, then
template, tokenizing, the context and max-token checks, admission and the engine (`Generation`,
`respond`: a disconnect cancels, streaming or not). Output items and stream events come from
`OutputBuilder`; a finished response (unless `store: false`) is kept in the bounded
`ResponseStore` with its whole conversation, for `previous_response_id`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import TypeAdapter

from edge.api.errors import to_http
from edge.api.generation import (
    PRIORITY_HEADER,
    Generation,
    Job,
    failure,
    grammar_for,
    parse_priority,
    prepare_job,
    sampling_for,
    template_info,
)
from edge.api.reasoning import ask_responses, plan_thinking, usage_details
from edge.api.respond import json_body
from edge.api.responses_output import OutputBuilder
from edge.api.responses_schemas import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    InputPart,
    MessageItem,
    ReasoningItem,
    ResponsesRequest,
    parse_responses_request,
)
from edge.api.schemas import ChatMessage, FunctionCall, ToolCall, request_body_doc
from edge.api.sse import respond
from edge.api.state import ApiState
from edge.api.tools import ToolPlan, plan_tool_calls, template_messages
from edge.errors import InvalidRequest, PreviousResponseNotFound, ResponseNotFound
from edge.runtime.text.chat_template import TemplateInfo, with_turn_stops
from edge.runtime.types import FinishReason, SamplingParams, Usage

router = APIRouter()
_ITEMS = TypeAdapter(list[InputItem])


def api_state(request: Request) -> ApiState:
    st: ApiState = request.app.state.edge
    return st


# --- input items -> chat messages ---------------------------------------------------------------


def _part_text(parts: str | list[InputPart], param: str) -> str:
    if isinstance(parts, str):
        return parts
    texts = []
    for j, part in enumerate(parts):
        if part.type in ("input_text", "output_text", "text") and part.text is not None:
            texts.append(part.text)
        elif part.type == "refusal" and part.refusal is not None:
            texts.append(part.refusal)
        else:
            raise InvalidRequest(f"{param}[{j}].type {part.type!r} is not supported (text only)",
                                 f"{param}[{j}].type")
    return "".join(texts)


def to_messages(instructions: str | None, items: list[InputItem], first_new: int = 0) -> list[ChatMessage]:
    """Chat messages for the template. `first_new`: index of the first item the client sent in
    this request (earlier ones came from `previous_response_id`); errors name `input[i - first_new]`."""
    messages: list[ChatMessage] = []
    if instructions:
        messages.append(ChatMessage(role="system", content=instructions))
    calls: set[str] = set()
    joinable = False  # the last message is an assistant turn that later function_call items join
    for i, item in enumerate(items):
        where = f"input[{i - first_new}]" if i >= first_new else f"previous_response_id (item {i})"
        if isinstance(item, MessageItem):
            messages.append(ChatMessage(role=item.role, content=_part_text(item.content, f"{where}.content")))
            joinable = item.role == "assistant"
        elif isinstance(item, FunctionCallItem):
            call = ToolCall(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments))
            calls.add(item.call_id)
            if joinable:
                prev = messages[-1]
                prev.tool_calls = [*(prev.tool_calls or []), call]
            else:
                messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
                joinable = True
        elif isinstance(item, FunctionCallOutputItem):
            if item.call_id not in calls:
                raise InvalidRequest(f"{where}.call_id {item.call_id!r} does not match a function_call "
                                     "earlier in the conversation", f"{where}.call_id")
            messages.append(ChatMessage(role="tool", tool_call_id=item.call_id,
                                        content=_part_text(item.output, f"{where}.output")))
            joinable = False
        elif isinstance(item, ReasoningItem):
            continue  # another model's reasoning: nothing of it is text for this one
    if not any(m.role != "system" for m in messages):
        raise InvalidRequest("input must hold at least one message or item", "input")
    return messages


def conversation(st: ApiState, body: ResponsesRequest) -> tuple[list[InputItem], int]:
    """(items of the whole conversation, index of the first item of this request)."""
    prior: list[InputItem] = []
    if body.previous_response_id is not None:
        stored = st.responses.get(body.previous_response_id)
        if stored is None:
            raise PreviousResponseNotFound(body.previous_response_id)
        prior = _ITEMS.validate_python(list(stored.conversation))
    new: list[InputItem] = (
        [MessageItem(role="user", content=body.input)] if isinstance(body.input, str) else list(body.input)
    )
    return prior + new, len(prior)


def _dump(items: list[InputItem]) -> list[dict[str, Any]]:
    return [it.model_dump(exclude_none=True, by_alias=True) for it in items]


# --- the request -------------------------------------------------------------------------------


def _prepare(st: ApiState, body: ResponsesRequest, messages: list[ChatMessage],
             info: TemplateInfo | None) -> tuple[Job, ToolPlan]:
    fmt = body.response_format()
    plan = plan_tool_calls(body.function_tools(), body.chat_tool_choice(), bool(body.parallel_tool_calls),
                           info, constrained_by="text.format" if fmt is not None else None, flat=True)
    effort = body.reasoning.effort if body.reasoning is not None else None
    think = plan_thinking(st, ask_responses(body.model, effort, body.model_extra or {}), info,
                          st.engine.n_ctx)
    rendered = template_messages(messages)
    prompt = (st.engine.render_chat(rendered, tools=plan.tools, **think.render_kwargs)
              if plan.tools is not None else st.engine.render_chat(rendered, **think.render_kwargs))
    sampling = sampling_for(body, plan.grammar or grammar_for(fmt, param="text.format"))
    job = prepare_job(st, prompt, add_bos=False, requested_max_tokens=body.max_output_tokens,
                      sampling=sampling, stop=with_turn_stops((), info), max_tokens_param="max_output_tokens",
                      speculative=body.speculative, n_draft=body.n_draft)
    return think.attach(job, prompt), plan


def _usage(u: Usage) -> dict[str, Any]:
    return {"input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens": u.completion_tokens, "output_tokens_details": usage_details(u),
            "total_tokens": u.total_tokens}


def _echo(body: ResponsesRequest) -> dict[str, Any]:
    """The request's settings as a response object repeats them."""
    defaults = SamplingParams()
    choice = body.tool_choice
    fmt = body.text.format if body.text is not None and body.text.format is not None else None
    return {
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "max_tool_calls": None,
        "model": body.model,
        "parallel_tool_calls": bool(body.parallel_tool_calls),
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": body.reasoning.effort if body.reasoning is not None else None,
                      "summary": None},
        "store": body.store is not False,
        "temperature": body.temperature if body.temperature is not None else defaults.temperature,
        "text": {"format": fmt.model_dump(exclude_none=True, by_alias=True) if fmt else {"type": "text"},
                 "verbosity": "medium"},
        "tool_choice": choice.model_dump() if choice is not None and not isinstance(choice, str)
        else (choice or "auto"),
        "tools": [t.model_dump(exclude_none=True) for t in body.tools or []],
        "top_p": body.top_p if body.top_p is not None else defaults.top_p,
        "truncation": "disabled",
        "user": None,
        "metadata": body.metadata or {},
        "background": False,
        "service_tier": "default",
        "top_logprobs": 0,
    }


def _event(ev: dict[str, Any]) -> bytes:
    data = json.dumps(ev, separators=(",", ":"), ensure_ascii=False)
    return f"event: {ev['type']}\ndata: {data}\n\n".encode()


@router.post("/v1/responses", openapi_extra=request_body_doc(ResponsesRequest))
async def create_response(request: Request) -> Response:
    st = api_state(request)
    t0_s = st.clock()
    raw = await json_body(request)
    body = parse_responses_request(raw.data)
    priority = parse_priority(request.headers.get(PRIORITY_HEADER))
    st = await st.for_model(request, body.model)
    items, first_new = conversation(st, body)
    messages = to_messages(body.instructions, items, first_new)
    job, plan = await raw.run(partial(_prepare, st, body, messages, template_info(st.engine)))
    gen = Generation(st, [job], priority, t0_s, stream=bool(body.stream))
    answer = _ResponseAnswer(st, body, plan, items)
    return await respond(request, gen, answer.stream, answer.full)


class _ResponseAnswer:
    """One response object as it is streamed (events) or returned whole, and stored when done.
    A class rather than closures in the route so each shape reads (and is sized) on its own."""

    def __init__(self, st: ApiState, body: ResponsesRequest, plan: ToolPlan, items: list[InputItem]) -> None:
        self.st, self.body, self.plan, self.items = st, body, plan, items
        self.rid, self.created = f"resp_{uuid.uuid4().hex}", int(time.time())
        self.echo = _echo(body)

    def obj(self, status: str, output: list[dict[str, Any]], usage: Usage | None,
            **extra: Any) -> dict[str, Any]:
        return {"id": self.rid, "object": "response", "created_at": self.created, "status": status,
                "error": None, "incomplete_details": None, **self.echo, "output": output,
                "usage": _usage(usage) if usage is not None else None} | extra

    def done(self, g: Generation, b: OutputBuilder) -> dict[str, Any]:
        """The finished response; kept for previous_response_id unless store is false."""
        cut = g.outcomes[0].finish_reason is FinishReason.LENGTH
        extra = {"incomplete_details": {"reason": "max_output_tokens"}} if cut else {}
        final = self.obj("incomplete" if cut else "completed", b.output, g.usage(), **extra)
        if self.body.store is not False:
            self.st.responses.put(self.rid, final, [*_dump(self.items), *b.conversation_items()])
        return final

    async def stream(self, g: Generation) -> AsyncIterator[bytes]:
        b = OutputBuilder()
        yield _event(b.event("response.created", response=self.obj("in_progress", [], None)))
        yield _event(b.event("response.in_progress", response=self.obj("in_progress", [], None)))
        scanner = self.plan.scanner(stream_calls=True) if self.plan.active else None
        n_ended = 0
        async for _, ev in g.events():
            for e in b.reasoning(ev.reasoning):  # the think block: one reasoning item first
                yield _event(e)
            if ev.text:
                evs, n_ended = b.feed(scanner.feed(ev.text) if scanner else [("content", ev.text)], n_ended)
                for e in evs:
                    yield _event(e)
        err = next((e for e in (failure(o) for o in g.outcomes) if e is not None), None)
        if err is not None:
            _, payload, _ = to_http(err)
            info = payload["error"]
            yield _event(b.event("error", code=info["code"], message=info["message"], param=info["param"]))
            error = {"code": info["code"], "message": info["message"]}
            failed = self.obj("failed", b.output, g.usage(), error=error)
            yield _event(b.event("response.failed", response=failed))
            return
        if scanner is not None:
            evs, n_ended = b.feed(scanner.finish(), n_ended)
            for e in evs:
                yield _event(e)
        cut = g.outcomes[0].finish_reason is FinishReason.LENGTH
        for e in b.finish(cut):
            yield _event(e)
        final = self.done(g, b)
        yield _event(b.event("response.incomplete" if cut else "response.completed", response=final))

    def full(self, g: Generation) -> dict[str, Any]:
        b = OutputBuilder()
        scanner = self.plan.scanner(stream_calls=True) if self.plan.active else None  # as streamed
        text = g.outcomes[0].text
        b.reasoning(g.outcomes[0].reasoning)
        b.feed(scanner.feed(text) + scanner.finish() if scanner else [("content", text)], 0)
        b.finish(g.outcomes[0].finish_reason is FinishReason.LENGTH)
        return self.done(g, b)


@router.get("/v1/responses/{response_id}")
async def get_response(request: Request, response_id: str) -> dict[str, Any]:
    stored = api_state(request).responses.get(response_id)
    if stored is None:
        raise ResponseNotFound(response_id)
    return stored.response


@router.delete("/v1/responses/{response_id}")
async def delete_response(request: Request, response_id: str) -> dict[str, Any]:
    if not api_state(request).responses.delete(response_id):
        raise ResponseNotFound(response_id)
    return {"id": response_id, "object": "response", "deleted": True}
