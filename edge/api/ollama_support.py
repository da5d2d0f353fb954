"""What Ollama's generation routes share: names, options → sampling, num_ctx, timings, keep-alive.

`respond` runs one `Generation` as Ollama answers: NDJSON lines while streaming (admission
first, so an overload is a 503 + Retry-After before any byte is sent), or the final object
at once; a disconnect cancels the engine work, and the request's keep-alive is applied when
it is over (`Engine.set_keep_alive`). Timings are Ollama's: nanoseconds, load measured when
the weights had been unloaded (`ensure_loaded` before queueing).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import datetime, timezone
from functools import partial
from typing import Any

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from edge.api.errors import to_http
from edge.api.generation import Generation, Job, failure
from edge.api.ollama_schemas import Options, _Generating
from edge.api.respond import NdjsonStream, ndjson_line, stream_or_json
from edge.api.state import ApiState
from edge.api.tool_parse import ParsedCall
from edge.errors import ContextOverflow, InvalidRequest, ModelLoadError
from edge.runtime.llama.sampling import json_schema_to_grammar
from edge.runtime.types import FinishReason, SamplingParams

_NS = 1_000_000_000


def state_of(request: Request) -> ApiState:
    st: ApiState = request.app.state.edge
    return st


def created_at() -> str:
    """RFC 3339 in UTC, as Ollama writes it."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def untagged(st: ApiState, name: str) -> str:
    """Ollama clients add ":latest" to untagged names; edge's names have no tags."""
    if name not in st.model_names and name.endswith(":latest"):
        return name[: -len(":latest")]
    return name


def served_name(st: ApiState, name: str) -> str:
    """The name as this server knows it (ModelNotFound, a 404, when it serves no such model)."""
    name = untagged(st, name)
    st.resolve_name(name)
    return name


def grammar_of(fmt: str | dict[str, Any] | None) -> str | None:
    """`format`: "json" or a JSON schema, through llama.cpp's converter (the /v1 path)."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return json_schema_to_grammar(None)
    try:
        return json_schema_to_grammar(fmt)  # type: ignore[arg-type]
    except InvalidRequest as exc:
        raise InvalidRequest(f"format: {exc}", "format") from None


def sampling_of(opts: Options, grammar: str | None) -> SamplingParams:
    names = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "repeat_last_n",
             "presence_penalty", "frequency_penalty", "seed")
    values = {n: getattr(opts, n) for n in names if getattr(opts, n) is not None}
    if values.get("seed") is not None and values["seed"] < 0:
        values["seed"] = None  # Ollama: a negative seed means a random one
    return replace(SamplingParams(), **values, grammar=grammar)


def max_tokens_of(st: ApiState, opts: Options) -> int | None:
    """num_predict: -1 (no limit) and -2 (fill the context) run to the context or the server's
    cap; a larger number is capped at the server's cap (Ollama has none: it stops at the context)."""
    n = opts.num_predict
    if n is None or n < 0:
        return None
    if n == 0:
        raise InvalidRequest("options.num_predict must be >= 1, or -1 for no limit", "options.num_predict")
    return min(n, st.settings.max_tokens_cap)


def check_num_ctx(st: ApiState, opts: Options) -> None:
    if opts.num_ctx is not None and opts.num_ctx > st.engine.n_ctx:
        raise InvalidRequest(
            f"options.num_ctx is {opts.num_ctx}, but this server's context holds {st.engine.n_ctx} tokens "
            "per sequence (its memory plan); send num_ctx <= that, or restart the server with a larger "
            "--ctx", "options.num_ctx")


def fit_num_ctx(job: Job, opts: Options) -> Job:
    """A smaller num_ctx than the server's bounds this request's prompt and output."""
    if opts.num_ctx is None:
        return job
    if job.n_prompt >= opts.num_ctx:
        raise ContextOverflow(job.n_prompt, opts.num_ctx)
    limit = opts.num_ctx - job.n_prompt
    return replace(job, request=replace(job.request, max_tokens=min(job.request.max_tokens, limit)))


class Timings:
    """Ollama's durations (ns) and counts for the final object."""

    def __init__(self, st: ApiState, t0_s: float) -> None:
        self.st, self.t0_s = st, t0_s
        self.load_s = 0.0
        self.submit_s = t0_s

    async def load_if_unloaded(self) -> None:
        """Load before queueing when the weights are out, so load_duration is measured (a hosted
        model was loaded by its lease: that wait is the load)."""
        if self.st.lease is not None:
            self.load_s, self.submit_s = self.st.lease.load_s, self.st.clock()
            return
        if not self.st.engine.residency_status().loaded:
            t_s = self.st.clock()
            if not await anyio.to_thread.run_sync(self.st.engine.ensure_loaded):
                raise ModelLoadError(self.st.model_id, "the model could not be loaded; see the server log")
            self.load_s = self.st.clock() - t_s
        self.submit_s = self.st.clock()

    def final(self, gen: Generation) -> dict[str, Any]:
        now = self.st.clock()
        first = gen.first_token_s if gen.first_token_s is not None else now
        usage = gen.usage()
        return {
            "total_duration": int((now - self.t0_s) * _NS),
            "load_duration": int(self.load_s * _NS),
            "prompt_eval_count": usage.prompt_tokens,
            "prompt_eval_duration": int(max(0.0, first - self.submit_s) * _NS),
            "eval_count": usage.completion_tokens,
            "eval_duration": int(max(0.0, now - first) * _NS),
        }


def done_reason(gen: Generation) -> str:
    return "length" if gen.outcomes[0].finish_reason is FinishReason.LENGTH else "stop"


def ollama_call(c: ParsedCall, index: int) -> dict[str, Any]:
    """A tool call in Ollama's shape: arguments as an object."""
    args = json.loads(c.arguments) if c.arguments else {}
    return {"id": c.id, "function": {"index": index, "name": c.name, "arguments": args}}


async def finish_keep_alive(st: ApiState, keep_alive_s: float | None) -> None:
    """Apply the request's keep-alive once it is over (0: the idle engine unloads now). Inline:
    it only stores the value and wakes the engine thread, which does any unloading itself."""
    st.set_keep_alive(keep_alive_s)


async def hold_loaded(st: ApiState) -> float | None:
    """Keep the model loaded while a request runs (an earlier `keep_alive: 0` would otherwise
    unload it between the load and the submit); returns the keep-alive that was in force. A hosted
    model is held by its lease already."""
    if st.lease is not None:
        return st.lease.model.keep_alive_s
    before_s = st.engine.residency_status().keep_alive_s
    await finish_keep_alive(st, None)
    return before_s


async def load_or_unload(st: ApiState, name: str, keep_alive_s: float | None,
                         shape: Callable[[str], dict[str, Any]]) -> Response:
    """An empty request: load the model (done_reason "load"), or unload it with keep_alive 0."""
    if st.host is not None:
        return await _host_load_or_unload(st, name, keep_alive_s, shape)
    if keep_alive_s == 0:
        await anyio.to_thread.run_sync(st.engine.unload)
        reason = "unload"
    else:
        await finish_keep_alive(st, keep_alive_s)  # first: an earlier keep_alive 0 must not undo the load
        if not await anyio.to_thread.run_sync(st.engine.ensure_loaded):
            raise ModelLoadError(st.model_id, "the model could not be loaded; see the server log")
        reason = "load"
    await finish_keep_alive(st, keep_alive_s)
    return JSONResponse({"model": name, "created_at": created_at(), **shape(""), "done": True,
                         "done_reason": reason})


async def _host_load_or_unload(st: ApiState, name: str, keep_alive_s: float | None,
                               shape: Callable[[str], dict[str, Any]]) -> Response:
    """Per model on a host: unload it now (or when its running requests end), or load it and set
    its keep-alive. The load holds no lease past the answer."""
    assert st.host is not None
    host, key = st.host, st.resolve_name(untagged(st, name))
    if keep_alive_s == 0:
        await anyio.to_thread.run_sync(host.unload_model, key)
        reason = "unload"
    else:
        def load() -> None:  # in the thread, whole: a client gone meanwhile leaves no lease behind
            lease = host.acquire(key)
            host.set_keep_alive(key, keep_alive_s)
            lease.release()

        await anyio.to_thread.run_sync(load)
        reason = "load"
    return JSONResponse({"model": name, "created_at": created_at(), **shape(""), "done": True,
                         "done_reason": reason})


async def respond(request: Request, gen: Generation, timings: Timings, keep_alive_s: float | None,
                  lines: Callable[[Generation], AsyncIterator[dict[str, Any]]],
                  whole: Callable[[Generation], dict[str, Any]]) -> Response:
    """Stream NDJSON or answer once; either way a disconnect cancels, and keep-alive applies after."""
    st = gen.st
    before_s = await hold_loaded(st)
    try:
        await timings.load_if_unloaded()
        await gen.__aenter__()  # admission: 503 + Retry-After here, before any byte is sent
    except BaseException:
        await finish_keep_alive(st, before_s)  # refused: the keep-alive stays what it was
        raise

    async def body() -> AsyncIterator[bytes]:
        async for obj in lines(gen):
            yield ndjson_line(obj)

    return await stream_or_json(request, gen, lambda close: NdjsonStream(body(), gen.cancel, close), whole,
                                after=partial(finish_keep_alive, st, keep_alive_s))


def stream_error(gen: Generation) -> dict[str, Any] | None:
    """Ollama writes a failure mid-stream as one more line, `{"error": ...}`."""
    for out in gen.outcomes:
        err = failure(out)
        if err is not None:
            return to_http(err, "/api/")[1]
    return None


async def on_model(request: Request, st: ApiState, name: str, opts: Options) -> ApiState:
    """The request's view of the model it names (loaded and leased, `ApiState.for_model`), with
    `num_ctx` checked against that model's context."""
    st = await st.for_model(request, name)
    check_num_ctx(st, opts)
    return st


def common(st: ApiState, body: _Generating) -> tuple[Options, float | None]:
    """Checks every generating request gets first: name, refused fields, options, keep_alive."""
    served_name(st, body.model)
    body.refuse_unsupported()
    opts = body.options or Options()
    opts.log_ignored()  # num_ctx is checked on the model's own engine, after `for_model`
    return opts, body.keep_alive_s(st.settings.keep_alive_s)
