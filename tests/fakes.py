"""Shared test doubles: a scripted engine that implements `EngineLike`.

`ScriptedEngine` behaves like the real engine as the API and the scheduler see
it (slots, a priority wait queue, cancellation within one step, stats), but its
output is scripted and time moves only when a test says so:

- `autostep=True` (default): `submit` runs the whole script at once, so a
  request completes as soon as it is read. Good for format and usage tests.
- `autostep=False`: nothing happens until the test calls `step()`; each step
  admits waiting requests by priority into free slots and emits one token per
  active request, exactly like one `llama_decode` step. Good for queue,
  priority, cancellation and drain tests.

Tokenization is one token per whitespace-separated word, so tests can compute
expected token counts by hand.

Also here: `make_app` (the HTTP app around a ScriptedEngine) and `AsgiCall`, a raw
ASGI driver whose client can vanish on cue, for API tests.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from edge.clock import ManualClock
from edge.errors import ContextOverflow, EngineStopped, InvalidRequest, TemplateError
from edge.runtime.types import (
    EngineState,
    EngineStats,
    FinishReason,
    GenerationRequest,
    Knobs,
    ResidencyStatus,
    Usage,
)
from edge.runtime.types import TokenEvent as TokenEvent  # re-exported for tests

Script = Callable[[GenerationRequest], list[str]]


def default_script(request: GenerationRequest) -> list[str]:
    """Echo-ish output: 'tok0 tok1 ...' as many as max_tokens allows (capped at 8)."""
    return [f"tok{i} " for i in range(8)]


class ScriptedHandle:
    """A stream of TokenEvents fed by the engine; iterable from threads and from asyncio."""

    def __init__(self, request: GenerationRequest, tokens: list[str], n_prompt: int) -> None:
        self.request_id = request.request_id
        self.request = request
        self.tokens = tokens
        self.n_prompt = n_prompt
        self.emitted = 0
        self.cancel_requested = False
        self.finish_reason: FinishReason | None = None
        self.on_start: Callable[[], None] | None = None
        self._events: list[Any] = []
        self._cond = threading.Condition()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    # --- engine side ---------------------------------------------------
    def push(self, event: Any) -> None:
        with self._cond:
            self._events.append(event)
            if event.finish_reason is not None:
                self.finish_reason = event.finish_reason
            self._cond.notify_all()
            waiters, self._waiters = self._waiters, []
        for loop, ev in waiters:
            if not loop.is_closed():
                loop.call_soon_threadsafe(ev.set)

    # --- client side ---------------------------------------------------
    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def cancel(self) -> None:
        self.cancel_requested = True

    def quiet(self) -> None:
        self.quieted = True

    def __iter__(self) -> Iterator[Any]:
        i = 0
        while True:
            with self._cond:
                while i >= len(self._events):
                    self._cond.wait()
                event = self._events[i]
            i += 1
            yield event
            if event.finish_reason is not None:
                return

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[Any]:
        i = 0
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                ready = i < len(self._events)
                if not ready:
                    ev = asyncio.Event()
                    self._waiters.append((loop, ev))
            if not ready:
                await ev.wait()
                continue
            event = self._events[i]
            i += 1
            yield event
            if event.finish_reason is not None:
                return


@dataclass
class FakeEmbedJob:
    n_tokens: int
    future: concurrent.futures.Future[list[Any]] = field(default_factory=concurrent.futures.Future)


def engine_stats(*, active: int = 4, knobs: Knobs | None = None, **overrides: Any) -> EngineStats:
    """A READY engine's stats with `active` sequences each decoding one token per 0.1 s step.

    Shared by scheduler, admission, memory-guard and simulated-device tests so a new
    EngineStats field is added in one place.
    """
    fields: dict[str, Any] = dict(
        state=EngineState.READY, step_time_s=0.1, decode_time_s=0.1, tokens_decoded=active,
        tokens_prefilled=0, active=active, parked=0, waiting=0, waiting_interactive=0,
        kv_cells_used=0, kv_cells_total=8192, n_slots=8,
        knobs=knobs if knobs is not None else Knobs(active_limit=active, n_threads=2),
    )
    fields.update(overrides)
    return EngineStats(**fields)


@dataclass
class ScriptedEngine:
    """Implements `EngineLike` with scripted output; see the module docstring."""

    model_name: str = "scripted-model"
    n_ctx: int = 64
    n_slots: int = 2
    script: Script = default_script
    autostep: bool = True
    clock: ManualClock = field(default_factory=ManualClock)
    step_time_s: float = 0.01
    chat_template: bool = True
    fail_with: Exception | None = None  # every request ends with this error event
    template_info: Any = None  # what `chat_template_info` reports (a TemplateInfo); None: cannot say

    def __post_init__(self) -> None:
        self._state = EngineState.LOADING
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self.waiting: list[ScriptedHandle] = []
        self.active: list[ScriptedHandle] = []
        self.submitted: list[GenerationRequest] = []
        self.knobs = Knobs(active_limit=self.n_slots, n_threads=1)
        self.total_tokens = 0
        self.total_steps = 0
        self.last_progress_s = self.clock.monotonic()
        self.stop_calls: list[float] = []
        self.embedded: list[list[list[int]]] = []
        self.rendered: list[tuple[list[dict[str, Any]], Any]] = []  # (messages, tools) per render_chat
        self.template_kwargs: list[dict[str, Any] | None] = []  # per render_chat (enable_thinking, ...)

    # --- lifecycle -----------------------------------------------------
    @property
    def state(self) -> EngineState:
        return self._state

    def set_state(self, state: EngineState) -> None:
        self._state = state

    def start(self) -> None:
        self._state = EngineState.READY

    def stop(self, drain_timeout_s: float = 0.0) -> None:
        self.stop_calls.append(drain_timeout_s)
        with self._lock:
            for h in self.waiting + self.active:
                h.cancel()
        self._state = EngineState.DRAINING
        if self.autostep:
            self.step()
        self._state = EngineState.STOPPED

    def apply(self, knobs: Knobs) -> None:
        self.knobs = knobs

    # --- embeddings ----------------------------------------------------------
    embed_dim: int = 8
    embed_max_tokens: int = 32

    def embed(self, inputs: Any, truncate: bool = False) -> FakeEmbedJob:
        """Deterministic unit vectors from the words (same text, same vector), resolved at once."""
        if not inputs:
            raise InvalidRequest("input must not be empty", "input")
        toks = [self.tokenize(x) if isinstance(x, str) else list(x) for x in inputs]
        if truncate:
            toks = [t[: self.embed_max_tokens] for t in toks]
        for i, t in enumerate(toks):
            if len(t) > self.embed_max_tokens:
                raise ContextOverflow(len(t), self.embed_max_tokens)
            if not t:
                raise InvalidRequest(f"input[{i}] is empty", f"input[{i}]")
        job = FakeEmbedJob(sum(len(t) for t in toks))
        vecs = []
        for t in toks:
            v = [0.0] * self.embed_dim
            for tok in t:
                v[tok % self.embed_dim] += 1.0
            norm = sum(x * x for x in v) ** 0.5
            vecs.append([x / norm for x in v])
        job.future.set_result(vecs)
        self.embedded.append(toks)
        return job

    def embedding_info(self) -> dict[str, Any]:
        return {"model": self.model_name, "n_embd": self.embed_dim, "pooling": "mean",
                "max_input_tokens": self.embed_max_tokens}

    # --- text ------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        words = text.split()
        return ([1] if add_bos else []) + [100 + (hash(w) % 1000) for w in words]

    @property
    def chat_template_info(self) -> Any:
        return self.template_info

    @property
    def has_chat_template(self) -> bool:
        return self.chat_template

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    tools: list[dict[str, Any]] | None = None,
                    template_kwargs: dict[str, Any] | None = None) -> str:
        if not self.chat_template:
            raise TemplateError("model has no chat template")
        self.rendered.append((messages, tools))
        self.template_kwargs.append(template_kwargs)
        parts = [f"<{m['role']}> {m.get('content') or ''}" for m in messages]
        if tools:
            parts.insert(0, "<tools> " + " ".join(t["function"]["name"] for t in tools))
        return " ".join(parts) + (" <assistant>" if add_generation_prompt else "")

    # --- residency -------------------------------------------------------
    keep_alive_s: float | None = None
    keep_alive_calls: list[float | None] = field(default_factory=list)

    def ensure_loaded(self, timeout_s: float | None = 300.0) -> bool:
        if self._state in (EngineState.DRAINING, EngineState.STOPPED, EngineState.FAILED):
            raise EngineStopped()
        if self._state is EngineState.UNLOADED:
            self._state = EngineState.READY
        return True

    def set_keep_alive(self, keep_alive_s: float | None) -> None:
        """As the real engine: 0 unloads as soon as the engine is idle (here: at once, if idle)."""
        self.keep_alive_calls.append(keep_alive_s)
        self.keep_alive_s = keep_alive_s
        if keep_alive_s == 0:
            self.unload()

    def residency_status(self) -> ResidencyStatus:
        loaded = self._state in (EngineState.READY, EngineState.PAUSED)
        busy = bool(self.waiting or self.active)
        expires = self.keep_alive_s if loaded and not busy else None
        return ResidencyStatus(loaded, self.keep_alive_s, expires, busy)

    # --- requests --------------------------------------------------------
    def unload(self, timeout_s: float | None = 60.0) -> bool:
        """Idle: UNLOADED (the next submit is served as if reloaded); busy: refused."""
        with self._lock:
            if self.waiting or self.active:
                return False
            self._state = EngineState.UNLOADED
            return True

    def submit(self, request: GenerationRequest,
               on_start: Callable[[], None] | None = None) -> ScriptedHandle:
        if self._state in (EngineState.DRAINING, EngineState.STOPPED, EngineState.FAILED):
            raise EngineStopped()
        if request.max_tokens < 1:
            raise InvalidRequest("max_tokens must be at least 1", "max_tokens")
        n_prompt = (
            len(request.prompt)
            if isinstance(request.prompt, list)
            else len(self.tokenize(request.prompt, request.add_bos))
        )
        if n_prompt >= self.n_ctx:
            raise ContextOverflow(n_prompt, self.n_ctx)
        if not request.request_id:
            request = replace(request, request_id=f"req-{next(self._ids)}")
        handle = ScriptedHandle(request, list(self.script(request)), n_prompt)
        handle.on_start = on_start
        with self._lock:
            if self._state is EngineState.UNLOADED:
                self._state = EngineState.READY  # a real engine reloads here
            self.submitted.append(request)
            self.waiting.append(handle)
        if self.autostep:
            while not handle.done:
                self.step()
        return handle

    def step(self, n: int = 1) -> None:
        """One engine step: finish cancelled requests, admit by priority, emit one token each."""
        for _ in range(n):
            with self._lock:
                self._step_locked()

    def _step_locked(self) -> None:
        for h in [h for h in self.waiting if h.cancel_requested]:
            self.waiting.remove(h)
            h.push(TokenEvent("", 0, FinishReason.CANCELLED, Usage(h.n_prompt, 0)))
        for h in [h for h in self.active if h.cancel_requested]:
            self.active.remove(h)
            h.push(TokenEvent("", 0, FinishReason.CANCELLED, Usage(h.n_prompt, h.emitted)))
        if self.knobs.paused:
            return
        self.waiting.sort(key=lambda h: h.request.priority)  # stable: FIFO within a priority
        while self.waiting and len(self.active) < min(self.n_slots, self.knobs.active_limit):
            h = self.waiting.pop(0)
            self.active.append(h)
            if h.on_start is not None:  # it holds a slot now, as in the real engine
                h.on_start()
        for h in list(self.active):
            if self.fail_with is not None:
                self.active.remove(h)
                h.push(TokenEvent("", 0, FinishReason.ERROR, Usage(h.n_prompt, 0), self.fail_with))
                continue
            limit = min(h.request.max_tokens, self.n_ctx - h.n_prompt)
            if h.emitted < min(len(h.tokens), limit):
                text = h.tokens[h.emitted]
                h.emitted += 1
                self.total_tokens += 1
                last = h.emitted >= min(len(h.tokens), limit)
                if last:
                    reason = FinishReason.STOP if h.emitted >= len(h.tokens) else FinishReason.LENGTH
                    self.active.remove(h)
                    h.push(TokenEvent(text, 1, reason, Usage(h.n_prompt, h.emitted)))
                else:
                    h.push(TokenEvent(text, 1))
            else:  # empty script
                self.active.remove(h)
                h.push(TokenEvent("", 0, FinishReason.STOP, Usage(h.n_prompt, h.emitted)))
        self.total_steps += 1
        self.clock.advance(self.step_time_s)
        self.last_progress_s = self.clock.monotonic()

    def stats(self) -> EngineStats:
        with self._lock:
            return EngineStats(
                state=self._state,
                step_time_s=self.step_time_s,
                decode_time_s=self.step_time_s * 0.8,
                tokens_decoded=len(self.active),
                tokens_prefilled=0,
                active=len(self.active),
                parked=0,
                waiting=len(self.waiting),
                waiting_interactive=sum(1 for h in self.waiting if h.request.priority == 0),
                kv_cells_used=sum(h.n_prompt + h.emitted for h in self.active),
                kv_cells_total=self.n_ctx * self.n_slots,
                n_slots=self.n_slots,
                knobs=self.knobs,
                total_tokens_decoded=self.total_tokens,
                total_steps=self.total_steps,
                last_progress_s=self.last_progress_s,
            )


# --- HTTP API helpers: an app around a ScriptedEngine, and a raw ASGI driver ------------------
# The driver decides when the client vanishes, which TestClient cannot do.


def make_app(engine: ScriptedEngine | None = None, **settings: Any) -> tuple[Any, ScriptedEngine]:
    """`create_app` around a started ScriptedEngine; Settings fields as kwargs (plus api_key,
    scheduler, admission)."""
    from edge.api.app import create_app
    from edge.config import Settings

    engine = engine or ScriptedEngine()
    if engine.state.value == "loading":
        engine.start()
    api_key = settings.pop("api_key", "")
    scheduler = settings.pop("scheduler", None)
    admission = settings.pop("admission", None)
    app = create_app(
        Settings(**settings),
        engine,
        scheduler,
        admission=admission,
        api_key=api_key,
        model_aliases=("alias.gguf",),
    )
    return app, engine


@dataclass
class AsgiCall:
    """One request driven by hand: `disconnect()` makes the client vanish."""

    app: Any
    method: str
    path: str
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    sent: list[dict[str, Any]] = field(default_factory=list)
    yield_on_send: bool = False

    def __post_init__(self) -> None:
        self._gone = asyncio.Event()
        raw = b"" if self.body is None else json.dumps(self.body).encode()
        self._inbox: list[dict[str, Any]] = [{"type": "http.request", "body": raw, "more_body": False}]

    async def _receive(self) -> dict[str, Any]:
        if self._inbox:
            return self._inbox.pop(0)
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict[str, Any]) -> None:
        if self.yield_on_send:
            await asyncio.sleep(0)  # a real server may suspend here (flow control)
        self.sent.append(message)

    def disconnect(self) -> None:
        self._gone.set()

    async def run(self) -> None:
        hdrs = [(b"content-type", b"application/json")]
        hdrs += [(k.lower().encode(), v.encode()) for k, v in self.headers.items()]
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "1.1",
            "method": self.method,
            "path": self.path,
            "raw_path": self.path.encode(),
            "query_string": b"",
            "headers": hdrs,
            "client": ("127.0.0.1", 1234),
            "server": ("127.0.0.1", 8088),
            "scheme": "http",
            "root_path": "",
        }
        await self.app(scope, self._receive, self._send)

    @property
    def status(self) -> int | None:
        for m in self.sent:
            if m["type"] == "http.response.start":
                return int(m["status"])
        return None

    @property
    def body_bytes(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")

    def header(self, name: str) -> str | None:
        for m in self.sent:
            if m["type"] == "http.response.start":
                for k, v in m["headers"]:
                    if k.decode().lower() == name.lower():
                        return v.decode()
        return None


async def settle(n: int = 50) -> None:
    """Let other tasks run (no real time passes)."""
    for _ in range(n):
        await asyncio.sleep(0)


def sse_events(raw: bytes) -> list[Any]:
    """Parse an OpenAI SSE body strictly: every event is `data: ...` followed by a blank line."""
    text = raw.decode()
    assert text.endswith("\n\n"), text[-50:]
    out: list[Any] = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


CHAT = {"model": "scripted-model", "messages": [{"role": "user", "content": "hello there"}]}
