"""The engine: the any-thread API over three parts, each owning its own state.

    Engine (any thread) ── Mailbox ──► StepLoop (engine thread) ── Residency (model, context)

`Engine` validates and tokenizes in the caller's thread (so a bad request fails
before it is queued), posts a `Sequence` to the `Mailbox`, and reads the step
loop's published `EngineStats`. The `StepLoop` (step/loop.py) runs continuous
batching: each step takes mail, admits waiting requests to idle slots reusing the
longest cached prefix, splits slot holders into active and parked
(`Knobs.active_limit`), builds ONE llama_batch, decodes, samples each sequence
with its own sampler and hands text to its handle. `Residency` (kv/residency.py) owns
the model and context, and unloads them after `keep_alive_s` idle.
The friendly functions (`complete`, `chat`, `stream`) live in facade.py; what an engine is
built from is one `EngineConfig` (config.py), which the host layer resolves from settings.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import Any

from edge.clock import Clock, SystemClock
from edge.errors import ContextOverflow, EngineStopped, InvalidRequest
from edge.runtime.embed.embedder import EmbedJob, describe, prepare_inputs
from edge.runtime.engine import facade
from edge.runtime.engine.config import EngineConfig
from edge.runtime.engine.handle import RequestHandle
from edge.runtime.engine.mailbox import ACCEPTING, Mailbox
from edge.runtime.engine.thread import EngineThread
from edge.runtime.kv.residency import LoadSpec, Residency
from edge.runtime.llama.model import LlamaModel
from edge.runtime.llama.sampling import build_sampler, validate_sampling
from edge.runtime.spec.config import check_speculation
from edge.runtime.spec.state import Speculation
from edge.runtime.step.loop import SampleHook, StepLoop
from edge.runtime.step.plan import admission_key
from edge.runtime.step.sequence import Sequence as Seq
from edge.runtime.step.sequence import StepPerf, empty_stats
from edge.runtime.step.think import think_state
from edge.runtime.text import chat_template as templates
from edge.runtime.types import (
    MAX_TOP_LOGPROBS,
    CompletionResult,
    EngineState,
    EngineStats,
    GenerationRequest,
    Knobs,
    ResidencyStatus,
    TokenEvent,
)


class Engine:
    """Continuous-batching engine over llama.cpp; implements `EngineLike`.

    Everything it is built from is one `EngineConfig`, resolved and checked above the runtime
    (`edge.host.loading.build_engine` from settings; tests and tools build one directly).
    `clock` paces the duty cycle, stamps stats and times keep-alive; `sample_hook` lets tests
    inject faults after sampling. The model loads in `start()` (or `load()`), not here.
    """

    def __init__(self, config: EngineConfig, *, clock: Clock | None = None,
                 sample_hook: SampleHook | None = None) -> None:
        self.config = config
        self.model_path = str(config.model_path)
        self.model_name = config.model_path.stem
        self.n_slots = config.n_slots
        self.draft_max = config.draft_max
        self._spec_mode = config.speculative
        self._template_choice = config.chat_template
        clock = clock or SystemClock()
        self._clock = clock
        self._knobs = Knobs(active_limit=config.n_slots,
                            n_threads=config.n_threads or max(1, os.cpu_count() or 1))
        template = config.chat_template.source if config.chat_template is not None else None
        embed = None if config.embedding_model is None else str(config.embedding_model)
        self.residency = Residency(load_spec(config), clock, config.keep_alive_s, config.idle_poll_s,
                                   template, embed)
        self._box = Mailbox(self._knobs)
        self._loop = StepLoop(self._box, self.residency, clock, config.n_slots, config.step_token_budget,
                              sample_hook, Speculation(config.speculative, config.draft_max),
                              config.prompt_cache_bytes)
        self._thread_body = EngineThread(self._box, self.residency, self._loop, clock)
        self._thread: threading.Thread | None = None
        self._arrival = itertools.count()

    # --- lifecycle ---------------------------------------------------------

    def load(self) -> None:
        """Load weights and create the context before `start()` (idempotent). Raises
        ModelLoadError. Reloads after an unload happen on the engine thread."""
        if self.residency.loaded:
            return
        try:
            model, ctx, draft = self.residency.open(self._knobs.n_threads, warm=False)  # warmed on its thread
        except BaseException:
            self._box.set_state(EngineState.FAILED)
            raise
        self.residency.install(model, ctx, draft)
        if self.residency.spec_blocker is not None and self._loop.spec.on:
            self._loop.spec.mode = "off"  # requests that force it get a 400 (_sequence)
        self._loop.publish(0.0, 0.0, 0, 0)

    def start(self) -> None:
        """Load (if needed) and start the engine thread. State becomes READY."""
        if self._thread is not None:
            return
        self.load()
        self._thread = threading.Thread(target=self._thread_body.run, name="edge-engine", daemon=True)
        self._thread.start()
        self._thread_body.ready.wait()  # warmed up (probes run later, when idle): /ready may say so now
        self._box.set_state(EngineState.PAUSED if self._knobs.paused else EngineState.READY)

    def wait_for_probes(self, timeout_s: float | None = None) -> bool:
        """Wait until the probes deferred past `ready` (engine/startup.py) have run, e.g. before a
        benchmark whose baseline runs beside the engine. True when none is owed."""
        return self._thread_body.startup.idle.finished.wait(timeout_s)

    def stop(self, drain_timeout_s: float = 0.0) -> None:
        """Refuse new work; let running requests finish for up to `drain_timeout_s`; then fail
        what is left with EngineStopped, free the context and the model."""
        if not self._box.begin_drain() and self._thread is None:
            return
        deadline = time.monotonic() + max(0.0, drain_timeout_s)
        while self._thread is not None and time.monotonic() < deadline and self._busy():
            time.sleep(0.01)
        self._box.ask_stop()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._loop.fail_all(EngineStopped())
        self.residency.release()
        self._box.set_state(EngineState.STOPPED)

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _busy(self) -> bool:
        return self._box.pending()[0] > 0 or self._box.pending_embeds() > 0 or not self._loop.idle

    @property
    def state(self) -> EngineState:
        return self._box.state

    @property
    def model(self) -> LlamaModel | None:
        """The loaded model (the vocabulary-only one while unloaded)."""
        return self.residency.model

    @property
    def n_ctx(self) -> int:
        """Context length per sequence (the requested one until the model is loaded)."""
        return self.residency.n_ctx

    @property
    def perf(self) -> StepPerf:
        return self._loop.perf

    @property
    def keep_alive_s(self) -> float | None:
        return self.residency.keep_alive_s

    # --- text --------------------------------------------------------------

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        """Works while unloaded too (the vocabulary-only model answers)."""
        with self.residency.lock:
            return self._need_model().tokenize(text, add_bos=add_bos)

    def detokenize(self, tokens: list[int]) -> str:
        with self.residency.lock:
            return self._need_model().detokenize(tokens)

    @property
    def has_chat_template(self) -> bool:
        """False for base models: `render_chat` then uses the documented plain fallback."""
        t = self.residency.template
        return t is not None and not t.is_fallback

    @property
    def chat_template_info(self) -> templates.TemplateInfo | None:
        """Which template renders chats (model, fallback, name, file) and its tool syntax and turn
        markers; None until the model has been loaded once."""
        t = self.residency.template
        return None if t is None else templates.describe(t, self._template_choice)

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    tools: list[dict[str, Any]] | None = None,
                    template_kwargs: dict[str, Any] | None = None) -> str:
        """Render with the model's template. The text starts with the BOS text exactly when the
        model wants a BOS, so submit it with `add_bos=False` (a double BOS is removed anyway).
        `tools` (HF convention: [{"type": "function", "function": {...}}]) reaches the template
        as its `tools` variable; `template_kwargs` (e.g. `enable_thinking`) as theirs."""
        model = self._need_model()
        template = self.residency.template
        assert template is not None
        extra = {**(template_kwargs or {}), **({"tools": tools} if tools is not None else {})}
        return template.prompt(messages, model.add_bos, add_generation_prompt, **extra)

    # --- requests ----------------------------------------------------------

    def submit(self, request: GenerationRequest, on_start: Callable[[], None] | None = None) -> RequestHandle:
        """Queue a request; raises InvalidRequest, ContextOverflow or EngineStopped, never later.
        While UNLOADED the request is accepted and waits for the reload (ModelLoadError in its
        final event if that fails). `on_start` runs on the engine thread when it gets a slot."""
        with self.residency.lock:  # an unload cannot free the model (or its vocab) under us
            seq = self._sequence(request, on_start)
            try:
                self._box.post(seq)
            except EngineStopped:
                assert seq.sampler is not None
                seq.sampler.free()
                raise
        return seq.handle

    def _sequence(self, request: GenerationRequest, on_start: Callable[[], None] | None) -> Seq:
        state = self._box.state
        model = self._need_model()
        if state not in ACCEPTING:
            raise EngineStopped(f"engine is {state.value}")
        if isinstance(request.prompt, str):
            prompt = model.tokenize(request.prompt, add_bos=request.add_bos)
        else:
            prompt = list(request.prompt)
            if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < model.n_vocab
                   for t in prompt):
                raise InvalidRequest("prompt contains token ids outside the vocabulary", param="prompt")
        if not prompt:
            raise InvalidRequest("prompt is empty", param="prompt")
        if len(prompt) >= self.n_ctx:
            raise ContextOverflow(len(prompt), self.n_ctx)
        if request.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be >= 1, got {request.max_tokens}", param="max_tokens")
        if any(not isinstance(s, str) for s in request.stop):
            raise InvalidRequest("stop must be a list of strings", param="stop")
        if request.logprobs is not None and not 0 <= request.logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequest(f"top_logprobs must be in 0..{MAX_TOP_LOGPROBS}", param="top_logprobs")
        check_speculation(request, self.draft_max, self.residency.spec_blocker, self._spec_mode)
        validate_sampling(request.sampling, model.n_vocab)
        think = think_state(request.reasoning, lambda text: model.tokenize(text, add_bos=False))
        if think is not None and think.budget is not None and think.budget < 0:
            raise InvalidRequest(f"reasoning budget must be >= 0 tokens, got {think.budget}",
                                 "reasoning_budget")
        sampler = build_sampler(request.sampling, model.vocab, model.n_vocab)
        handle = RequestHandle(request.request_id or uuid.uuid4().hex, on_cancel=self._box.poke_cancel)
        key = admission_key(request.priority, next(self._arrival))
        return Seq(request, prompt, sampler, handle, key, self._clock.monotonic(), on_start, think)

    def embed(self, inputs: Sequence[str | list[int]], truncate: bool = False) -> EmbedJob:
        """L2-normalised embeddings of `inputs` (texts or token ids), computed on the engine
        thread one batch per step: `job.future` resolves with one vector per input
        (`job.n_tokens` counts the input tokens). Raises InvalidRequest / ContextOverflow here,
        before anything is queued; with `truncate`, too-long inputs keep their first tokens."""
        with self.residency.lock:
            job = EmbedJob(prepare_inputs(self.residency.embed_vocab(), inputs, truncate))
            self._box.post_embed(job)
        return job

    def embedding_info(self) -> dict[str, Any]:
        """The embeddings model, vector size and pooling (metadata only: nothing big is loaded)."""
        with self.residency.lock:
            return describe(self.residency.embed_vocab())

    def apply(self, knobs: Knobs) -> None:
        """New knobs, effective at the next step."""
        if (knobs.active_limit < 0 or knobs.n_threads < 1 or not (0.0 < knobs.duty <= 1.0)
                or not (0 <= knobs.off_threads < knobs.n_threads)):
            raise InvalidRequest(f"invalid knobs: {knobs}")
        self._knobs = knobs
        self._box.set_knobs(knobs)

    def stats(self) -> EngineStats:
        s = self._loop.stats
        state = self._box.state
        if s is None:
            return empty_stats(state, self.n_slots, self._knobs, self.n_ctx)
        extra, extra_i = self._box.pending()
        if s.state is not state or extra:
            s = replace(s, state=state, waiting=s.waiting + extra,
                        waiting_interactive=s.waiting_interactive + extra_i)
        return s

    def unload(self, timeout_s: float | None = 60.0) -> bool:
        """Free the weights and the context if the engine is idle (state becomes UNLOADED).
        Returns True when unloaded (or already), False when there was work (nothing is
        touched then) or the engine thread did not answer within `timeout_s`."""
        if self._box.state is EngineState.UNLOADED:
            return True
        if self._thread is None:
            raise EngineStopped(f"cannot unload: engine is {self._box.state.value}")
        waiter = self._box.ask_unload()
        waiter.done.wait(timeout_s)
        return waiter.unloaded

    def ensure_loaded(self, timeout_s: float | None = 300.0) -> bool:
        """Load the weights now if they were unloaded (keep-alive or `unload()`), without a request.
        True once loaded; False when the load failed or did not finish within `timeout_s`."""
        if self._box.state in (EngineState.READY, EngineState.PAUSED):
            return True
        if self._thread is None:
            raise EngineStopped(f"cannot load: engine is {self._box.state.value}")
        waiter = self._box.ask_load()
        waiter.done.wait(timeout_s)
        return waiter.loaded

    def set_keep_alive(self, keep_alive_s: float | None) -> None:
        """How long the model stays loaded once idle, from now on (None: forever; 0: unload as soon
        as idle). The idle timer itself is unchanged: it counts from the last work."""
        if keep_alive_s is not None and keep_alive_s < 0:
            raise InvalidRequest(f"keep-alive must be >= 0 seconds or None, got {keep_alive_s}", "keep_alive")
        self.residency.keep_alive_s = keep_alive_s
        self._box.wake()  # an idle engine thread re-reads the timer (it may have slept forever)

    def residency_status(self) -> ResidencyStatus:
        """Whether the weights are loaded, the keep-alive, and when an idle model would unload."""
        res = self.residency
        expires = None
        if res.loaded and res.keep_alive_s is not None:
            expires = max(0.0, res.last_active_s + res.keep_alive_s - self._clock.monotonic())
        busy = not self._loop.idle or self._box.pending()[0] > 0
        return ResidencyStatus(loaded=res.loaded, keep_alive_s=res.keep_alive_s,
                               expires_in_s=None if busy else expires, busy=busy)

    def tick(self) -> None:
        """Wake the engine thread to look at its idle timer now (tests with a manual clock;
        in production it looks every `idle_poll_s` anyway)."""
        self._box.wake()

    def wait_for_state(self, state: EngineState, timeout_s: float = 60.0) -> bool:
        """Block until the engine reaches `state` (True) or `timeout_s` passes (False)."""
        return self._box.wait_for_state(state, timeout_s)

    def _need_model(self) -> LlamaModel:
        return self.residency.need_model(self._box.state.value)

    # --- the friendly API (facade.py) -----------------------------------------

    def complete(self, prompt: str | list[int], **kw: Any) -> CompletionResult:
        """Run one completion to the end (blocking). Raises the request's error if it failed."""
        return facade.complete(self, prompt, **kw)

    def chat(self, messages: list[dict[str, Any]], **kw: Any) -> CompletionResult:
        """Render `messages` with the model's chat template and complete the assistant turn."""
        return facade.chat(self, messages, **kw)

    def stream(self, prompt: str | list[int], **kw: Any) -> AsyncIterator[TokenEvent]:
        """`async for ev in engine.stream(prompt, ...)`; leaving the loop early cancels."""
        return facade.stream(self, prompt, **kw)


def load_spec(config: EngineConfig) -> LoadSpec:
    """How `Residency` opens the model and its context for `config`."""
    draft = None if config.draft_model is None else str(config.draft_model)
    return LoadSpec(str(config.model_path), config.n_ctx, config.n_batch, config.n_slots, config.kv_type,
                    config.n_gpu_layers, config.warmup, config.n_outputs, draft, config.flash_attn,
                    config.flash_attn_off_fits, config.n_verify)
