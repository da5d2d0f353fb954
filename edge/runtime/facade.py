"""The friendly face of `Engine`: `complete`, `chat`, `stream` and `from_settings`.

Kept apart from the step loop so engine.py stays about the engine thread.
Keyword arguments are the `SamplingParams` fields plus `max_tokens`, `stop`,
`priority`, `request_id`, `add_bos`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge.errors import InsufficientMemory, InvalidRequest
from edge.runtime.sequence import CompletionResult
from edge.runtime.types import FinishReason, GenerationRequest, SamplingParams, TokenEvent, Usage

if TYPE_CHECKING:
    from edge.config import Settings
    from edge.runtime.engine import Engine
    from edge.runtime.handle import RequestHandle

_SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}
_REQUEST_FIELDS = {"max_tokens", "stop", "priority", "request_id", "add_bos"}


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


class EngineConveniences:
    """Mixed into `Engine`; relies only on its public `submit`, `render_chat` and `load`."""

    def complete(self: Engine, prompt: str | list[int], **kw: Any) -> CompletionResult:  # type: ignore[misc]
        """Run one completion to the end (blocking). Raises the request's error if it failed."""
        t0 = time.monotonic()
        handle = self.submit(build_request(prompt, **kw))
        return _collect(handle, t0)

    def chat(self: Engine, messages: list[dict[str, Any]], **kw: Any) -> CompletionResult:  # type: ignore[misc]
        """Render `messages` with the model's chat template and complete the assistant turn."""
        kw.setdefault("add_bos", False)  # render_chat already wrote BOS text where the model wants it
        return self.complete(self.render_chat(messages, add_generation_prompt=True), **kw)

    async def stream(self: Engine, prompt: str | list[int], **kw: Any) -> AsyncIterator[TokenEvent]:  # type: ignore[misc]
        """`async for ev in engine.stream(prompt, ...)`: events as they are produced; leaving the
        loop early cancels the request."""
        handle = self.submit(build_request(prompt, **kw))
        async for ev in handle:
            yield ev

    @classmethod
    def from_settings(
        cls,
        model_ref: str | Path,
        settings: Settings | None = None,
        *,
        available_bytes: Callable[[], int] | None = None,
        **kw: Any,
    ) -> Engine:
        """Resolve `model_ref` (path or store name), validate the GGUF file, plan memory, and
        build an (unstarted) Engine sized by the plan. Raises InvalidGGUF, ModelNotFound,
        InsufficientMemory. `available_bytes` replaces the memory probe (tests)."""
        from edge.config import Settings as _Settings
        from edge.runtime.loading import plan_for

        settings = settings or _Settings()
        probe = {"available_bytes": available_bytes} if available_bytes is not None else {}
        path, plan = plan_for(model_ref, settings, **probe)
        if not plan.fits:
            what = f"{Path(path).name} ({plan.reason})"
            raise InsufficientMemory(plan.total_bytes, plan.available_bytes, what)
        kw.setdefault("n_ctx", plan.n_ctx)
        kw.setdefault("n_gpu_layers", plan.n_gpu_layers)
        kw.setdefault("kv_type", plan.kv_type)
        kw.setdefault("n_slots", settings.slots)
        kw.setdefault("n_batch", settings.n_batch)
        kw.setdefault("n_threads", settings.threads)
        kw.setdefault("keep_alive_s", settings.keep_alive_s)
        engine = cls(path, **kw)
        engine.plan = plan  # type: ignore[attr-defined]  # shown by /v1/status
        return engine  # type: ignore[return-value]


def _collect(handle: RequestHandle, t0: float) -> CompletionResult:
    parts: list[str] = []
    ttft = -1.0
    for ev in handle:
        if ttft < 0:
            ttft = time.monotonic() - t0
        parts.append(ev.text)
        if ev.finish_reason is not None:
            if ev.error is not None:
                raise ev.error
            return CompletionResult(
                "".join(parts), ev.finish_reason, ev.usage or Usage(0, 0), ttft, time.monotonic() - t0
            )
    return CompletionResult("".join(parts), FinishReason.CANCELLED, Usage(0, 0), ttft, time.monotonic() - t0)
