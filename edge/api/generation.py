"""From a parsed request to engine handles and back: checks, admission, events.

All checks that depend on the model (context length, max_tokens cap, grammar)
run here, before anything is queued, so a bad request never takes a slot.
`Generation` owns the tickets and handles of one HTTP request and always
releases them (finish, error or client disconnect).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from edge.api.schemas import ResponseFormat, _Sampling
from edge.api.state import ApiState, ServerState
from edge.errors import ContextOverflow, EdgeError, EngineStopped, InvalidRequest
from edge.runtime.llama.sampling import json_schema_to_grammar
from edge.runtime.text.chat_template import TemplateInfo
from edge.runtime.types import (
    EngineLike,
    FinishReason,
    GenerationRequest,
    Priority,
    RequestHandleLike,
    SamplingParams,
    TokenEvent,
    TokenLogprob,
    Usage,
)
from edge.scheduler.admission import TicketLike

log = logging.getLogger("edge.api")

PRIORITY_HEADER = "x-edge-priority"

def parse_priority(value: str | None) -> Priority:
    if value is None or value.strip().lower() in ("", "interactive"):
        return Priority.INTERACTIVE
    if value.strip().lower() == "background":
        return Priority.BACKGROUND
    raise InvalidRequest("X-Edge-Priority must be 'interactive' or 'background'", "X-Edge-Priority")


def template_info(engine: EngineLike) -> TemplateInfo | None:
    """The chat template in use (None until the model is loaded, or for an engine that cannot say)."""
    return engine.chat_template_info


def grammar_for(fmt: ResponseFormat | None, param: str = "response_format") -> str | None:
    """GBNF for `response_format` (or /v1/responses' `text.format`, named by `param`), from
    llama.cpp's own converter (InvalidRequest when it cannot)."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return json_schema_to_grammar(None)
    if fmt.json_schema is None or not fmt.json_schema.schema_:
        where = "json_schema.schema" if param == "response_format" else "schema"
        raise InvalidRequest(f"{param} json_schema needs {where}", param)
    try:
        return json_schema_to_grammar(fmt.json_schema.schema_)
    except InvalidRequest as exc:
        if param == "response_format":
            raise
        raise InvalidRequest(f"{param}: {exc}", param) from None


def sampling_for(body: _Sampling, grammar: str | None) -> SamplingParams:
    base = SamplingParams()
    overrides: dict[str, Any] = {
        name: getattr(body, name)
        for name in (
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "repeat_penalty",
            "presence_penalty",
            "frequency_penalty",
            "seed",
        )
        if getattr(body, name) is not None
    }
    return replace(base, **overrides, logit_bias=body.logit_bias_ids(), grammar=grammar)


@dataclass
class Job:
    """One choice to generate: the engine request plus what the API needs to report it."""

    request: GenerationRequest
    n_prompt: int
    prompt_text: str | None = None  # for log_prompts only


def prepare_job(
    st: ApiState,
    prompt: str | list[int],
    *,
    add_bos: bool,
    requested_max_tokens: int | None,
    sampling: SamplingParams,
    stop: tuple[str, ...],
    logprobs: int | None = None,
    max_tokens_param: str = "max_tokens",
    speculative: bool | None = None,
    n_draft: int | None = None,
) -> Job:
    """Tokenize and check against the context and the max_tokens cap, before any queueing."""
    tokens = list(prompt) if isinstance(prompt, list) else st.engine.tokenize(prompt, add_bos)
    if not tokens:
        raise InvalidRequest("prompt is empty", "prompt")
    n_ctx = st.engine.n_ctx
    if len(tokens) >= n_ctx:
        raise ContextOverflow(len(tokens), n_ctx)
    cap = st.settings.max_tokens_cap
    if requested_max_tokens is not None and requested_max_tokens > cap:
        raise InvalidRequest(
            f"{max_tokens_param} is {requested_max_tokens}; this server allows at most {cap}",
            max_tokens_param,
        )
    max_tokens = requested_max_tokens if requested_max_tokens is not None else min(cap, n_ctx - len(tokens))
    req = GenerationRequest(prompt=tokens, max_tokens=max_tokens, sampling=sampling, stop=stop, add_bos=False,
                            logprobs=logprobs, speculative=speculative, n_draft=n_draft)
    return Job(req, len(tokens), None if isinstance(prompt, list) else prompt)


@dataclass
class Outcome:
    """What one choice produced."""

    text: str = ""
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    n_generated: int = 0
    error: Exception | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)  # when the request asked for them
    reasoning: str = ""  # the think block's text (requests with a ReasoningSpec; `text` is the answer)


@dataclass
class Generation:
    """The engine work of one HTTP request. Use as `async with`: exit releases everything."""

    st: ApiState
    jobs: list[Job]
    priority: Priority
    t0_s: float
    stream: bool = False
    handles: list[RequestHandleLike] = field(default_factory=list)
    tickets: list[TicketLike] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    shed_errors: dict[int, EdgeError] = field(default_factory=dict)
    first_token_s: float | None = None
    client_gone: bool = False
    closed: bool = False

    def __post_init__(self) -> None:
        self.outcomes = [Outcome() for _ in self.jobs]

    async def __aenter__(self) -> Generation:
        st = self.st
        if st.server_state is not ServerState.SERVING:
            raise EngineStopped("server is draining; retry shortly")
        try:
            needs = [(job.n_prompt, job.request.max_tokens) for job in self.jobs]
            self.tickets = list(st.admission.admit_all(self.priority, needs))  # all prompts, or none
            for i, ticket in enumerate(self.tickets):
                ticket.bind(partial(self._shed, i))  # the scheduler may shed this work later
            for job, ticket in zip(self.jobs, self.tickets, strict=True):
                rid = f"req-{uuid.uuid4().hex[:16]}"
                # the engine starts the ticket when the sequence takes a slot: it no longer waits
                handle = st.engine.submit(replace(job.request, priority=self.priority, request_id=rid),
                                          on_start=ticket.start)
                if not self.stream:
                    handle.quiet()  # the answer is sent whole: no wake-up per step
                self.handles.append(handle)
                st.track(rid, handle)
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    def _shed(self, index: int, err: EdgeError) -> None:
        """Called by the scheduler (any thread) when it sheds this request (background; any on eviction)."""
        self.shed_errors[index] = err
        if index < len(self.handles):
            self.handles[index].cancel()

    async def __aexit__(self, *exc: object) -> None:
        """Release tickets, cancel unfinished handles, record metrics and log. Idempotent."""
        if self.closed:
            return
        self.closed = True
        submitted = bool(self.handles)
        cancelled = 0
        for h in self.handles:
            if not h.done:
                h.cancel()
                cancelled += 1
            self.st.untrack(h.request_id)
        for t in self.tickets:
            t.release()
        self.handles, self.tickets = [], []
        m = self.st.metrics
        if cancelled:
            m.cancelled.inc(cancelled)
        m.duration.observe(self.st.clock() - self.t0_s)
        for job, out in zip(self.jobs, self.outcomes, strict=True):
            m.prompt_tokens.inc(out.usage.prompt_tokens if out.usage else job.n_prompt)
            m.reasoning_tokens.inc(out.usage.reasoning_tokens if out.usage else 0)
        if submitted:
            self.log_done()

    def cancel(self) -> None:
        self.client_gone = True
        for h in self.handles:
            h.cancel()

    async def events(self) -> AsyncIterator[tuple[int, TokenEvent]]:
        """(choice index, event) from every handle, interleaved as they arrive; records outcomes."""
        last_s: float | None = None
        async for index, ev in _merge(self.handles):
            now_s = self.st.clock()
            out = self.outcomes[index]
            if ev.n_tokens:
                if self.first_token_s is None:
                    self.first_token_s = now_s
                    self.st.metrics.ttft.observe(now_s - self.t0_s)
                elif last_s is not None:
                    self.st.metrics.token_latency.observe((now_s - last_s) / ev.n_tokens)
                last_s = now_s
                out.n_generated += ev.n_tokens
                self.st.metrics.generated_tokens.inc(ev.n_tokens)
            out.text += ev.text
            out.reasoning += ev.reasoning
            out.logprobs.extend(ev.logprobs)
            if ev.finish_reason is not None:
                out.finish_reason = ev.finish_reason
                out.usage = ev.usage or Usage(self.jobs[index].n_prompt, out.n_generated)
                out.error = self.shed_errors.get(index, ev.error)
            yield index, ev

    def usage(self) -> Usage:
        prompt = sum(
            o.usage.prompt_tokens if o.usage else j.n_prompt
            for o, j in zip(self.outcomes, self.jobs, strict=True)
        )
        gen = sum(o.usage.completion_tokens if o.usage else o.n_generated for o in self.outcomes)
        cached = sum(o.usage.cached_tokens if o.usage else 0 for o in self.outcomes)
        thought = sum(o.usage.reasoning_tokens if o.usage else 0 for o in self.outcomes)
        return Usage(prompt, gen, cached, thought)

    def log_done(self) -> None:
        u = self.usage()
        if self.st.settings.log_prompts:
            log.info(
                "done prompt=%r output=%r",
                [j.prompt_text or j.request.prompt for j in self.jobs],
                [o.text for o in self.outcomes],
            )
        log.info(
            "request done: %d prompt + %d generated tokens in %.3f s%s",
            u.prompt_tokens,
            u.completion_tokens,
            self.st.clock() - self.t0_s,
            " (client gone)" if self.client_gone else "",
        )


def failure(out: Outcome) -> EdgeError | None:
    """The error a finished choice should be reported as, if any."""
    if out.finish_reason is FinishReason.ERROR:
        if isinstance(out.error, EdgeError):
            return out.error
        log.error("generation failed: %r", out.error)
        return EngineStopped("generation failed inside the engine; see the server log")
    if out.finish_reason is FinishReason.CANCELLED:
        if isinstance(out.error, EdgeError):  # shed by the scheduler
            return out.error
        return EngineStopped("generation cancelled: the server is shutting down")
    return None


def openai_finish(reason: FinishReason | None) -> str | None:
    if reason is None:
        return None
    return "length" if reason is FinishReason.LENGTH else "stop"


async def _merge(handles: list[RequestHandleLike]) -> AsyncIterator[tuple[int, TokenEvent]]:
    if len(handles) == 1:
        async for ev in handles[0]:
            yield 0, ev
        return
    queue: asyncio.Queue[tuple[int, TokenEvent | None]] = asyncio.Queue()

    async def pump(i: int, h: RequestHandleLike) -> None:
        try:
            async for ev in h:
                await queue.put((i, ev))
        finally:
            await queue.put((i, None))

    tasks = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)]
    try:
        remaining = len(tasks)
        while remaining:
            i, ev = await queue.get()
            if ev is None:
                remaining -= 1
            else:
                yield i, ev
    finally:
        for t in tasks:
            t.cancel()
