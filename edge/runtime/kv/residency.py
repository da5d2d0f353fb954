"""Residency: the loaded model and context, keep-alive unloading, and reloading on demand.

A small box that serves a chat now and then should not hold a model's memory all
day: after `keep_alive_s` without work the engine thread frees the context (KV
cache, compute buffers) and the weights, and keeps only a vocabulary-only model
(a few MiB) so that tokenization and chat rendering, which the API does before
queueing, keep working. The next request is queued as usual; the engine thread
sees work while unloaded, reloads (the request simply waits), and carries on. A
failed reload fails the waiting requests with ModelLoadError and leaves the engine
UNLOADED so a later request retries (memory may have been freed meanwhile).

The engine owns keep-alive, on the engine's clock; the scheduler only asks for an
unload under a memory emergency (`Engine.unload()`).

Everything that frees or replaces the context runs on the engine thread. `lock`
orders model swaps against `submit`/`tokenize` on other threads, so no thread
uses a model while it is freed.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from edge.clock import Clock
from edge.contracts.options import DEFAULT_FLASH_ATTN, FlashAttn
from edge.errors import EngineStopped, ModelLoadError
from edge.runtime.embed.embedder import Embedder
from edge.runtime.llama import attention
from edge.runtime.llama.attention import AttnTiming
from edge.runtime.llama.batch import Batch
from edge.runtime.llama.model import ContextConfig, LlamaContext, LlamaModel
from edge.runtime.spec.config import rollback_blocker
from edge.runtime.spec.draft_model import DraftModel
from edge.runtime.text.chat_template import ChatTemplate, load_template

log = logging.getLogger("edge.engine")


def _trim_heap() -> None:
    """Give freed heap pages back to the OS (glibc keeps them otherwise, so the unload would
    not show in RSS or MemAvailable); a no-op where there is no glibc."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


@dataclass(frozen=True)
class LoadSpec:
    """How to open the model and its context."""

    model_path: str
    n_ctx: int  # requested; capped at the model's training length
    n_batch: int
    n_slots: int
    kv_type: str
    n_gpu_layers: int = 0
    warmup: bool = True  # decode once at load so the first request does not pay one-time costs
    n_outputs: int | None = None  # logits rows one batch may ask for (None: one per slot)
    draft_model_path: str | None = None  # a second model that guesses tokens (--speculative draft)
    flash_attn: FlashAttn = DEFAULT_FLASH_ATTN  # fastest: measured where the choice is free (attention.py)
    flash_attn_off_fits: bool = True  # the memory plan allows the larger buffer of no flash attention
    n_verify: int = 0  # rows of a speculative verify step (the attention probe times one)


@dataclass(frozen=True)
class Live:
    """What a step uses of the loaded model; valid on the engine thread until it unloads."""

    model: LlamaModel
    ctx: LlamaContext
    batch: Batch
    n_ctx_seq: int  # cells one sequence may hold
    draft: DraftModel | None = None  # the draft model's context, when it drafts
    share_prefixes: bool = False  # sequences may own cells together (no sliding window, no recurrence)

    @property
    def n_ctx(self) -> int:
        """Cells in the whole context (every sequence together)."""
        return self.ctx.n_ctx


class Residency:
    """Owns `model`, `ctx`, the batch and the chat template; unloads and reloads them.

    The step loop reads the loaded model through `live` (one typed record, set when a model
    is installed and cleared when it goes) and never touches the fields below.
    """

    def __init__(self, spec: LoadSpec, clock: Clock, keep_alive_s: float | None,
                 idle_poll_s: float = 1.0, template_override: str | None = None,
                 embed_model_path: str | None = None) -> None:
        self.spec = spec
        self.clock = clock
        self.keep_alive_s = keep_alive_s
        self.idle_poll_s = max(0.001, idle_poll_s)
        self.lock = threading.Lock()  # model swaps vs tokenization on other threads
        self.model: LlamaModel | None = None  # the full model, or the vocab-only one while unloaded
        self.ctx: LlamaContext | None = None
        self.batch: Batch | None = None
        self.template: ChatTemplate | None = None
        self._vocab: LlamaModel | None = None  # kept once made: samplers built while unloaded use it
        self._template_override = template_override
        self.n_ctx = spec.n_ctx  # per sequence, once loaded
        self.last_active_s = clock.monotonic()
        # embeddings: a context over these weights, or over a second model named for embeddings
        self.embed_model_path = embed_model_path
        self.embedder: Embedder | None = None
        self.spec_blocker: str | None = None  # why this model cannot roll drafts back (set at open)
        self._embed_model: LlamaModel | None = None  # the second model's weights, when loaded
        self._embed_vocab: LlamaModel | None = None  # its vocabulary, for tokenizing on any thread
        self._live: Live | None = None
        self.draft: DraftModel | None = None  # opened with the model (spec.draft_model_path)
        self.flash_attn: bool | None = None  # the context's flash attention (None: llama.cpp's auto)
        self.attention = "llama.cpp auto"  # how it was chosen (shown in /v1/status)
        self.attn_timing: AttnTiming | None = None  # the measured verdict, when edge chose

    @property
    def live(self) -> Live:
        """The loaded model, context and batch (engine thread, while `loaded`)."""
        assert self._live is not None, "no model loaded"
        return self._live

    @property
    def loaded(self) -> bool:
        return self.ctx is not None

    def need_model(self, state_name: str) -> LlamaModel:
        if self.model is None:
            raise EngineStopped(f"model not loaded (engine is {state_name})")
        return self.model

    # --- opening ----------------------------------------------------------------
    def open(self, n_threads: int, warm: bool = True) -> tuple[LlamaModel, LlamaContext, DraftModel | None]:
        """Load weights and create the context, and the draft model's when there is one
        (ModelLoadError on failure; nothing leaks).

        `warm` decodes once right away: only on the engine thread. OpenMP gives every thread
        that runs a parallel region its own team of workers; once a first decode ran on another
        thread (start() runs on the caller's), the engine thread's decodes ran at half speed
        (SmolLM2, 2 threads: 58 vs 115 tok/s), so `Engine.load()` opens cold and the engine
        thread warms the context up (`warm_up()`) before its first step."""
        s = self.spec
        model = LlamaModel(s.model_path, n_gpu_layers=s.n_gpu_layers)
        try:
            n_ctx = min(s.n_ctx, model.n_ctx_train) if model.n_ctx_train > 0 else s.n_ctx
            self.spec_blocker = rollback_blocker(model)
            n_out = s.n_outputs if self.spec_blocker is None else None  # no drafts: one row per slot
            ctx = LlamaContext(model, self._context_config(n_ctx, n_threads, n_out,
                                                                 self._flash_attn_at_open(n_threads)))
        except BaseException:
            model.close()
            raise
        draft: DraftModel | None = None
        try:
            if s.draft_model_path is not None and self.spec_blocker is None:
                draft = DraftModel(LlamaModel(s.draft_model_path, n_gpu_layers=s.n_gpu_layers), ctx.n_ctx,
                                   s.n_slots, s.n_batch, n_threads, s.kv_type)
            if s.warmup and warm:
                ctx.warm_up(model)
                if draft is not None:
                    draft.ctx.warm_up(draft.model)
        except BaseException:
            if draft is not None:
                draft.close()
            ctx.close()
            model.close()
            raise
        return model, ctx, draft

    def _context_config(self, n_ctx: int, n_threads: int, n_out: int | None,
                        fa: bool | None) -> ContextConfig:
        s = self.spec
        return ContextConfig(n_ctx=n_ctx, n_batch=s.n_batch, n_ubatch=s.n_batch, n_seq_max=s.n_slots,
                             n_threads=n_threads, kv_type=s.kv_type, n_outputs_max=n_out, flash_attn=fa)

    # --- attention kind (attention.py) --------------------------------------------------
    def _attn_free(self) -> bool:
        s = self.spec
        return attention.free_choice(s.flash_attn, s.n_gpu_layers, s.kv_type, s.flash_attn_off_fits)

    def _attn_key(self, n_threads: int) -> str:
        from edge.runtime.llama.backend import probe_backends

        return attention.verdict_key(self.spec.model_path, probe_backends().system_info, n_threads,
                                     self.spec.n_verify)

    def _flash_attn_at_open(self, n_threads: int) -> bool | None:
        """The context's flash attention: the setting, else a verdict measured on an earlier
        start, else on (what llama.cpp's auto picks on a CPU) until `choose_attention` measures."""
        if not self._attn_free():
            self.flash_attn = attention.fixed_choice(self.spec.flash_attn)
            self.attention = "setting"
            if self.flash_attn is None and self.spec.kv_type != "f16":
                self.flash_attn, self.attention = True, "a quantized KV cache needs it"
            elif self.flash_attn is None:
                self.attention = "llama.cpp auto"
            return self.flash_attn
        if self.attn_timing is None:
            self.attn_timing = attention.load_verdict(self._attn_key(n_threads))
            if self.attn_timing is not None:
                self.attention = "measured on an earlier start"
        self.flash_attn = True if self.attn_timing is None else self.attn_timing.flash_attn
        return self.flash_attn

    def choose_attention(self, n_threads: int) -> None:
        """Engine thread, before the first step: time both kinds where the choice is free and no
        earlier start did, keep the verdict, and remake the context if the other kind won."""
        if not self.loaded or not self._attn_free() or self.attn_timing is not None:
            return
        assert self.model is not None and self.ctx is not None
        n_verify = self.spec.n_verify
        on = attention.measure(self.model, n_threads, True, n_verify)
        off = attention.measure(self.model, n_threads, False, n_verify)
        best = attention.choose(on, off)
        self.attn_timing, self.attention = best, "measured at load"
        attention.save_verdict(self._attn_key(n_threads), best)
        log.info("flash attention %s: a nominal request takes %.2f s with it, %.2f s without "
                 "(prompt %.2f/%.2f ms per token, step %.1f/%.1f ms, verify %.1f/%.1f ms)",
                 "on" if best.flash_attn else "off", on.request_s(), off.request_s(),
                 on.prompt_token_s * 1e3, off.prompt_token_s * 1e3, on.step_s * 1e3, off.step_s * 1e3,
                 on.verify_s * 1e3, off.verify_s * 1e3)
        if best.flash_attn != self.flash_attn:
            self._remake_context(n_threads, best.flash_attn)

    def _remake_context(self, n_threads: int, fa: bool) -> None:
        """Replace the (empty) context with one of the other attention kind: the old one goes
        first, so two KV caches never coexist; should the new one fail, the old kind returns."""
        assert self.model is not None and self.ctx is not None
        n_ctx, n_out = self.ctx.n_ctx, self.spec.n_outputs if self.spec_blocker is None else None
        with self.lock:
            if self.batch is not None:
                self.batch.free()
            self.ctx.close()
            self.ctx = self.batch = self._live = None
        try:
            ctx = LlamaContext(self.model, self._context_config(n_ctx, n_threads, n_out, fa))
        except ModelLoadError as exc:
            log.warning("no context without/with flash attention (%s): keeping the other kind", exc)
            fa = not fa
            ctx = LlamaContext(self.model, self._context_config(n_ctx, n_threads, n_out, fa))
        self.flash_attn = fa
        self.install(self.model, ctx, self.draft)

    def install(self, model: LlamaModel, ctx: LlamaContext, draft: DraftModel | None = None) -> None:
        """Make a freshly opened model and context current."""
        with self.lock:
            self.model, self.ctx, self.draft = model, ctx, draft
        self.n_ctx = ctx.n_ctx_seq
        if self.template is None:
            self.template = load_template(self._template_override or model.chat_template(),
                                          model.token_text(model.bos_id), model.token_text(model.eos_id))
        self.batch = Batch(ctx.n_batch)
        self._live = Live(model, ctx, self.batch, self.n_ctx, draft, self.spec_blocker is None)

    def warm_up(self) -> None:
        """Decode once and forget it (engine thread; see `open`)."""
        if self.spec.warmup and self.ctx is not None and self.model is not None:
            try:
                self.ctx.warm_up(self.model)
                if self.draft is not None:
                    self.draft.ctx.warm_up(self.draft.model)
            except Exception as exc:  # only an optimisation: the first request pays instead
                log.warning("warm-up failed: %s", exc)

    # --- embeddings -------------------------------------------------------------------
    def embed_vocab(self) -> LlamaModel:
        """The model whose tokenizer embedding inputs use (any thread; with the lock held)."""
        if self.embed_model_path is None:
            return self.need_model("unloaded")
        if self._embed_vocab is None:
            self._embed_vocab = LlamaModel(self.embed_model_path, vocab_only=True)
        return self._embed_vocab

    def get_embedder(self, n_threads: int) -> Embedder:
        """The embeddings context, made on first use (engine thread; needs the weights loaded)."""
        if self.embedder is None:
            model = self.model
            if self.embed_model_path is not None:
                if self._embed_model is None:
                    self._embed_model = LlamaModel(self.embed_model_path, n_gpu_layers=self.spec.n_gpu_layers)
                model = self._embed_model
            assert model is not None and not model.vocab_only
            self.embedder = Embedder(model, n_threads)
        return self.embedder

    def release_embedder(self) -> None:
        if self.embedder is not None:
            self.embedder.close()
            self.embedder = None
        if self._embed_model is not None:
            self._embed_model.close()
            self._embed_model = None

    def release_draft(self) -> None:
        if self.draft is not None:
            self.draft.close()
            self.draft = None

    def release(self) -> None:
        """Free everything (engine stopped)."""
        self.release_embedder()
        self.release_draft()
        if self._embed_vocab is not None:
            self._embed_vocab.close()
            self._embed_vocab = None
        if self.ctx is not None:
            self._live = None
            if self.batch is not None:
                self.batch.free()
            self.ctx.close()
            self.ctx = self.batch = None
        with self.lock:
            for m in {id(x): x for x in (self.model, self._vocab) if x is not None}.values():
                m.close()
            self.model = self._vocab = None

    # --- keep-alive (engine thread) -----------------------------------------------
    def touch(self, t_s: float | None = None) -> None:
        """Work happened at `t_s` (default now): the keep-alive starts over."""
        now = self.clock.monotonic() if t_s is None else t_s
        self.last_active_s = max(self.last_active_s, now)

    def restart_keep_alive(self) -> None:
        """An unload that could not happen: the keep-alive starts over instead of retrying in a spin."""
        self.last_active_s = self.clock.monotonic()

    def keep_alive_due(self, idle: bool) -> bool:
        ka = self.keep_alive_s
        if ka is None or self.ctx is None or not idle:
            return False
        return self.clock.monotonic() - self.last_active_s >= ka

    def idle_wait_s(self) -> float | None:
        """How long the idle engine thread may sleep: forever unless a keep-alive can expire."""
        return None if self.keep_alive_s is None or self.ctx is None else self.idle_poll_s

    def try_unload(self, still_idle: Callable[[], bool], on_unloaded: Callable[[], None]) -> bool:
        """Free weights and context if `still_idle()` (checked under the model lock, which
        `submit` holds too, so no work can arrive meanwhile). `on_unloaded` runs before the
        lock is released, so whoever waits for UNLOADED sees the memory freed."""
        assert self.ctx is not None
        try:
            vocab = self._vocab or LlamaModel(self.spec.model_path, vocab_only=True)
        except ModelLoadError as exc:  # keep serving; unloading is only an optimisation
            log.warning("not unloading: vocabulary-only load failed: %s", exc)
            return False
        self._vocab = vocab
        with self.lock:
            if not still_idle():
                return False
            self.release_embedder()  # it runs over the weights about to go
            self.release_draft()
            full, ctx = self.model, self.ctx
            self.model, self.ctx, self._live = vocab, None, None
            if self.batch is not None:
                self.batch.free()
                self.batch = None
            ctx.close()
            if full is not None and full is not vocab:
                full.close()
            _trim_heap()
            on_unloaded()
        log.info("model unloaded after %.0f s idle", self.clock.monotonic() - self.last_active_s)
        return True

    def reload(self, n_threads: int) -> ModelLoadError | None:
        """Load weights and context again for queued work; the error when that fails."""
        t0_s = self.clock.monotonic()
        try:
            model, ctx, draft = self.open(n_threads)
        except Exception as exc:
            err = exc if isinstance(exc, ModelLoadError) else ModelLoadError(self.spec.model_path, str(exc))
            log.error("reload failed: %s", err)
            return err
        self.install(model, ctx, draft)
        self.last_active_s = self.clock.monotonic()
        log.info("model reloaded in %.2f s", self.last_active_s - t0_s)
        return None
