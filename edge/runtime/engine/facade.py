"""The friendly Python API as functions over any `EngineLike`: `complete`, `chat`, `stream`.

`Engine` exposes them as methods too (`engine.complete(...)`), but they need
nothing beyond the engine protocol, so fakes and other engines get them for free.
Keyword arguments are the `SamplingParams` fields plus `max_tokens`, `stop`,
`priority`, `request_id`, `add_bos`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

from edge.errors import InvalidRequest
from edge.runtime.text.chat_template import with_turn_stops
from edge.runtime.types import (
    CompletionResult,
    EngineLike,
    FinishReason,
    GenerationRequest,
    RequestHandleLike,
    SamplingParams,
    TokenEvent,
    TokenLogprob,
    Usage,
)

_SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}
_REQUEST_FIELDS = {"max_tokens", "stop", "priority", "request_id", "add_bos", "logprobs", "speculative",
                   "n_draft"}


def build_request(prompt: str | list[int], **kw: Any) -> GenerationRequest:
    """GenerationRequest from flat keyword arguments; unknown names are an InvalidRequest."""
    unknown = set(kw) - _SAMPLING_FIELDS - _REQUEST_FIELDS
    if unknown:
        raise InvalidRequest(f"unknown parameter(s): {', '.join(sorted(unknown))}", param=min(unknown))
    sampling = SamplingParams(**{k: v for k, v in kw.items() if k in _SAMPLING_FIELDS})
    req = {k: v for k, v in kw.items() if k in _REQUEST_FIELDS}
    if "stop" in req:
        stop = req["stop"]
        req["stop"] = (stop,) if isinstance(stop, str) else tuple(stop)
    return GenerationRequest(prompt=prompt, sampling=sampling, **req)


def complete(engine: EngineLike, prompt: str | list[int], **kw: Any) -> CompletionResult:
    """Run one completion to the end (blocking). Raises the request's error if it failed."""
    t0 = time.monotonic()
    return collect(engine.submit(build_request(prompt, **kw)), t0)


def chat(engine: EngineLike, messages: list[dict[str, Any]], **kw: Any) -> CompletionResult:
    """Render `messages` with the model's chat template and complete the assistant turn."""
    kw.setdefault("add_bos", False)  # render_chat already wrote BOS text where the model wants it
    prompt = engine.render_chat(messages, add_generation_prompt=True)
    stop = kw.get("stop") or ()
    kw["stop"] = with_turn_stops((stop,) if isinstance(stop, str) else tuple(stop), engine.chat_template_info)
    return complete(engine, prompt, **kw)


async def stream(engine: EngineLike, prompt: str | list[int], **kw: Any) -> AsyncIterator[TokenEvent]:
    """`async for ev in stream(engine, prompt, ...)`: events as they are produced; leaving the
    loop early cancels the request."""
    handle = engine.submit(build_request(prompt, **kw))
    async for ev in handle:
        yield ev


def collect(handle: RequestHandleLike, t0: float) -> CompletionResult:
    """Read a handle to its end into a CompletionResult (raises the request's error)."""
    parts: list[str] = []
    logprobs: list[TokenLogprob] = []
    ttft = -1.0
    for ev in handle:
        if ttft < 0:
            ttft = time.monotonic() - t0
        parts.append(ev.text)
        logprobs.extend(ev.logprobs)
        if ev.finish_reason is not None:
            if ev.error is not None:
                raise ev.error
            return CompletionResult("".join(parts), ev.finish_reason, ev.usage or Usage(0, 0), ttft,
                                    time.monotonic() - t0, tuple(logprobs))
    return CompletionResult("".join(parts), FinishReason.CANCELLED, Usage(0, 0), ttft, time.monotonic() - t0)
