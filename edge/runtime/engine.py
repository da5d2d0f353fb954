"""The engine: one thread owns the llama context and runs continuous batching.

This file is the any-thread API (lifecycle, submit, knobs, stats); the engine
thread's step loop lives in `edge/runtime/steploop.py`. Each step:
  1. take new requests, knobs and cancellations (one short critical section);
  2. admit waiting requests to idle slots, reusing the longest cached prefix;
  3. choose who runs (`Knobs.active_limit`; surplus is parked with its KV kept);
  4. build ONE llama_batch: one token per decoding sequence, then prompt chunks;
  5. llama_decode; on failure retry without the sequences that cannot fit;
  6. sample each sequence with its own llama.cpp chain and hand text to its handle.
Any thread or asyncio task may call `submit()`; the thread sleeps on a
Condition when there is nothing to do. The public conveniences (`complete`,
`stream`, `chat`, `from_settings`) live in `edge/runtime/facade.py`.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from edge.clock import Clock, SystemClock
from edge.config import Settings
from edge.errors import ContextOverflow, EngineStopped, InvalidRequest
from edge.runtime.batch import Batch
from edge.runtime.chat_template import ChatTemplate, load_template
from edge.runtime.facade import EngineConveniences
from edge.runtime.handle import RequestHandle
from edge.runtime.model import ContextConfig, LlamaContext, LlamaModel
from edge.runtime.residency import Residency
from edge.runtime.sampling import GrammarFirstLast, build_sampler, free_chain, validate_sampling
from edge.runtime.sequence import Sequence, StepPerf, empty_stats
from edge.runtime.slots import Slot, admission_key
from edge.runtime.steploop import StepLoop
from edge.runtime.types import EngineState, EngineStats, GenerationRequest, Knobs, Priority

_ACCEPTING = (EngineState.READY, EngineState.PAUSED, EngineState.UNLOADED, EngineState.LOADING)
SampleHook = Callable[[GenerationRequest, int], int]  # (request, token) -> token; tests inject faults


class Engine(EngineConveniences, Residency, StepLoop):
    """Continuous-batching engine over llama.cpp; implements `EngineLike`.

    `settings`, when given, supplies slots, n_batch and kv_type, and n_ctx / n_threads where
    those are None. `step_token_budget` caps the tokens one step evaluates (decode tokens
    always go in; prompt chunks fill the rest), bounding how long a long prompt can stall
    running streams. `clock` paces the duty cycle and stamps stats; `sample_hook` lets tests
    inject faults after sampling. The model loads in `start()` (or `load()`), not here.
    `keep_alive_s` (default from settings; None: never) unloads the weights after that much
    idle time on `clock`; the next request reloads them (see `Residency`). `idle_poll_s` is
    how often (real time) an idle engine thread looks at that timer. `warmup` decodes one
    token at load so the first request does not pay one-time costs.
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        settings: Settings | None = None,
        n_ctx: int | None = None,
        n_slots: int = 4,
        n_threads: int | None = None,
        n_batch: int = 512,
        kv_type: str = "f16",
        n_gpu_layers: int = 0,
        step_token_budget: int = 256,
        chat_template: str | None = None,
        clock: Clock | None = None,
        sample_hook: SampleHook | None = None,
        keep_alive_s: float | None = None,
        idle_poll_s: float = 1.0,
        warmup: bool = True,
    ) -> None:
        if settings is not None:
            keep_alive_s = keep_alive_s if keep_alive_s is not None else settings.keep_alive_s
            n_ctx = n_ctx if n_ctx is not None else settings.n_ctx
            n_slots, n_batch, kv_type = settings.slots, settings.n_batch, settings.kv_type
            n_threads = n_threads if n_threads is not None else settings.threads
        self.model_path = str(model_path)
        self.model_name = Path(model_path).stem
        self.n_slots = n_slots
        self._n_ctx_req = n_ctx or 4096
        self.n_ctx = self._n_ctx_req
        self._n_batch = n_batch
        self._kv_type = kv_type
        self._n_gpu_layers = n_gpu_layers
        self._budget = max(1, step_token_budget)
        self._template_override = chat_template
        self._clock: Clock = clock or SystemClock()
        self._sample_hook = sample_hook
        n_threads = n_threads or max(1, os.cpu_count() or 1)
        self._knobs = Knobs(active_limit=n_slots, n_threads=n_threads)

        self._cond = threading.Condition(threading.Lock())
        self._inbox: list[Sequence] = []
        self._dirty = False  # something for the loop to look at (submit, cancel, knobs, stop)
        self._cancel_seen = False
        self._stopping = False
        self._state = EngineState.LOADING
        self._thread: threading.Thread | None = None
        self._arrival = itertools.count()

        self.plan: Any = None  # the MemoryPlan when built by from_settings
        self.model: LlamaModel | None = None
        self._ctx: LlamaContext | None = None
        self._template: ChatTemplate | None = None
        self._stats: EngineStats | None = None
        # step-loop state (engine thread only)
        self._waiting: list[tuple[tuple[int, int], int, Sequence]] = []
        self._running: dict[int, Sequence] = {}
        self._slots = [Slot(i) for i in range(n_slots)]
        self._step_no = 0
        self._runnable = False  # the last step left something to run without new input
        self._freed = False  # a slot became idle during this step (waiting work may fit now)
        self._sample_s = 0.0
        self._decode_s = 0.0
        self._totals = [0, 0, 0]  # decoded, prefilled, steps
        self.perf = StepPerf()
        # residency (keep-alive unload / reload; see edge/runtime/residency.py)
        self._keep_alive_s = keep_alive_s
        self._idle_poll_s = max(0.001, idle_poll_s)
        self._warmup = warmup
        self._model_lock = threading.Lock()  # model swaps vs tokenization on other threads
        self._vocab: LlamaModel | None = None  # vocab-only model, kept once made (samplers use it)
        self._unload_waiters: list[Any] = []
        self._last_active_s = self._clock.monotonic()
        self._off_owed_s = 0.0  # off-duty stepping time owed (knobs.off_threads > 0, duty < 1)

    # --- lifecycle ---------------------------------------------------------

    def load(self) -> None:
        """Load weights and create the context before `start()` (idempotent). Raises
        ModelLoadError. Reloads after an unload happen on the engine thread (`Residency`)."""
        if self._ctx is not None:
            return
        try:
            model, ctx = self._open()
        except BaseException:
            self._state = EngineState.FAILED
            raise
        self._install(model, ctx)

    def _open(self) -> tuple[LlamaModel, LlamaContext]:
        model = LlamaModel(self.model_path, n_gpu_layers=self._n_gpu_layers)
        try:
            n_ctx = min(self._n_ctx_req, model.n_ctx_train) if model.n_ctx_train > 0 else self._n_ctx_req
            cfg = ContextConfig(
                n_ctx=n_ctx,
                n_batch=self._n_batch,
                n_ubatch=self._n_batch,
                n_seq_max=self.n_slots,
                n_threads=self._knobs.n_threads,
                kv_type=self._kv_type,
            )
            ctx = LlamaContext(model, cfg)
        except BaseException:
            model.close()
            raise
        if self._warmup:
            try:
                ctx.warm_up(model)
            except BaseException:
                ctx.close()
                model.close()
                raise
        return model, ctx

    def _install(self, model: LlamaModel, ctx: LlamaContext) -> None:
        """Make a freshly opened model and context current (the vocab-only model stays alive:
        samplers built while unloaded point at its vocabulary)."""
        with self._model_lock:
            self.model, self._ctx = model, ctx
        self.n_ctx = ctx.n_ctx_seq
        self._n_batch = ctx.n_batch
        if self._template is None:
            self._template = load_template(
                self._template_override or model.chat_template(),
                model.token_text(model.bos_id),
                model.token_text(model.eos_id),
            )
        self._batch = Batch(self._n_batch)
        self._publish_stats(0.0, 0.0, 0, 0)

    def start(self) -> None:
        """Load (if needed) and start the engine thread. State becomes READY."""
        if self._thread is not None:
            return
        self.load()
        self._state = EngineState.PAUSED if self._knobs.paused else EngineState.READY
        self._thread = threading.Thread(target=self._run, name="edge-engine", daemon=True)
        self._thread.start()

    def stop(self, drain_timeout_s: float = 0.0) -> None:
        """Refuse new work; let running requests finish for up to `drain_timeout_s`; then fail
        what is left with EngineStopped, free the context and the model."""
        with self._cond:
            if self._state in (EngineState.STOPPED, EngineState.FAILED) and self._thread is None:
                return
            self._state = EngineState.DRAINING
            self._dirty = True
            self._cond.notify_all()
        deadline = time.monotonic() + max(0.0, drain_timeout_s)
        while self._thread is not None and time.monotonic() < deadline and self._busy():
            time.sleep(0.01)
        with self._cond:
            self._stopping = True
            self._dirty = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._fail_all(EngineStopped())
        self._release()
        self._state = EngineState.STOPPED

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _busy(self) -> bool:
        with self._cond:
            return bool(self._inbox or self._waiting or self._running)

    def _release(self) -> None:
        if self._ctx is not None:
            self._batch.free()
            self._ctx.close()
            self._ctx = None
        with self._model_lock:
            for m in {id(x): x for x in (self.model, self._vocab) if x is not None}.values():
                m.close()
            self.model = self._vocab = None

    @property
    def state(self) -> EngineState:
        return self._state

    # --- requests ----------------------------------------------------------

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        """Works while unloaded too (the vocabulary-only model answers)."""
        with self._model_lock:
            return self._need_model().tokenize(text, add_bos=add_bos)

    def detokenize(self, tokens: list[int]) -> str:
        with self._model_lock:
            return self._need_model().detokenize(tokens)

    @property
    def has_chat_template(self) -> bool:
        """False for base models: `render_chat` then uses the documented plain fallback."""
        return self._template is not None and not self._template.is_fallback

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """Render with the model's template. The text starts with the BOS text exactly when the
        model wants a BOS, so submit it with `add_bos=False` (a double BOS is removed anyway)."""
        model = self._need_model()
        assert self._template is not None
        text = self._template.render(messages, add_generation_prompt)
        bos = self._template.bos_token
        if model.add_bos and bos and not text.startswith(bos):
            text = bos + text
        return text

    def submit(self, request: GenerationRequest) -> RequestHandle:
        """Queue a request; raises InvalidRequest, ContextOverflow or EngineStopped, never later.
        While UNLOADED the request is accepted and waits for the reload (ModelLoadError in its
        final event if that fails)."""
        with self._model_lock:  # an unload cannot free the model (or its vocab) under us
            return self._submit(request)

    def _submit(self, request: GenerationRequest) -> RequestHandle:
        model = self._need_model()
        if self._state not in _ACCEPTING:
            raise EngineStopped(f"engine is {self._state.value}")
        if isinstance(request.prompt, str):
            prompt = model.tokenize(request.prompt, add_bos=request.add_bos)
        else:
            prompt = list(request.prompt)
            if any(not isinstance(t, int) or not 0 <= t < model.n_vocab for t in prompt):
                raise InvalidRequest("prompt contains token ids outside the vocabulary", param="prompt")
        if not prompt:
            raise InvalidRequest("prompt is empty", param="prompt")
        if len(prompt) >= self.n_ctx:
            raise ContextOverflow(len(prompt), self.n_ctx)
        if request.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be >= 1, got {request.max_tokens}", param="max_tokens")
        if any(not isinstance(s, str) for s in request.stop):
            raise InvalidRequest("stop must be a list of strings", param="stop")
        validate_sampling(request.sampling, model.n_vocab)
        chain = build_sampler(request.sampling, model.vocab, model.n_vocab)
        rid = request.request_id or uuid.uuid4().hex
        handle = RequestHandle(rid, on_cancel=self._on_cancel)
        seq = Sequence(
            request,
            prompt,
            chain,
            handle,
            admission_key(request.priority, next(self._arrival)),
            self._clock.monotonic(),
        )
        with self._cond:
            if self._state not in _ACCEPTING:
                if isinstance(chain, GrammarFirstLast):
                    chain.free()
                else:
                    free_chain(chain)
                raise EngineStopped(f"engine is {self._state.value}")
            self._inbox.append(seq)
            self._dirty = True
            self._cond.notify()
        return handle

    def apply(self, knobs: Knobs) -> None:
        """New knobs, effective at the next step."""
        if (knobs.active_limit < 0 or knobs.n_threads < 1 or not (0.0 < knobs.duty <= 1.0)
                or not (0 <= knobs.off_threads < knobs.n_threads)):
            raise InvalidRequest(f"invalid knobs: {knobs}")
        with self._cond:
            self._knobs = knobs
            if self._state in (EngineState.READY, EngineState.PAUSED):
                self._state = EngineState.PAUSED if knobs.paused else EngineState.READY
            self._dirty = True
            self._cond.notify()

    def stats(self) -> EngineStats:
        s = self._stats
        if s is None:
            return empty_stats(self._state, self.n_slots, self._knobs, self.n_ctx)
        with self._cond:
            extra = len(self._inbox)
            extra_i = sum(1 for q in self._inbox if q.request.priority is Priority.INTERACTIVE)
        if s.state is not self._state or extra:
            s = replace(
                s,
                state=self._state,
                waiting=s.waiting + extra,
                waiting_interactive=s.waiting_interactive + extra_i,
            )
        return s

    def _on_cancel(self) -> None:
        with self._cond:
            self._cancel_seen = True
            self._dirty = True
            self._cond.notify()

    def _need_model(self) -> LlamaModel:
        if self.model is None:
            raise EngineStopped(f"model not loaded (engine is {self._state.value})")
        return self.model
