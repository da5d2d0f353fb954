"""Residency: the loaded model and context, keep-alive unloading, and reloading on demand.

A small box that serves a chat now and then should not hold a model's memory all day: after
`keep_alive_s` without work the engine thread frees the context (KV cache, compute buffers)
and the weights, keeping what tokenization and chat rendering need (the API does both before
queueing): the model with its weights' pages given back to the page cache where every weight
is computed from the file mapping (llama/pages.py), else a vocabulary-only model. The next
request is queued as usual; the engine thread sees work while unloaded, reloads (the request
waits), and carries on. A failed reload fails the waiting requests with ModelLoadError and
leaves the engine UNLOADED so a later request retries (memory may have been freed meanwhile).

The engine owns keep-alive, on the engine's clock; the scheduler only asks for an unload under
a memory emergency (`Engine.unload()`). Everything that frees or replaces the context runs on
the engine thread. `lock` orders model swaps against `submit`/`tokenize` on other threads, so
no thread uses a model while it is freed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

from edge.clock import Clock
from edge.contracts.options import DEFAULT_FLASH_ATTN, FlashAttn
from edge.errors import EngineStopped, ModelLoadError
from edge.kvcache import per_sequence_streams
from edge.runtime.embed.embedder import Embedder
from edge.runtime.embed.models import EmbedModels
from edge.runtime.llama import attention, pages
from edge.runtime.llama.attention import AttnTiming
from edge.runtime.llama.batch import Batch
from edge.runtime.llama.early import EARLY, Loader
from edge.runtime.llama.model import ContextConfig, LlamaContext, LlamaModel
from edge.runtime.llama.probe_cache import build_identity
from edge.runtime.spec.config import rollback_blocker
from edge.runtime.spec.draft_model import DraftModel
from edge.runtime.text.chat_template import ChatTemplate, load_template

log = logging.getLogger("edge.engine")


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
                 embed_model_path: str | None = None, weights: Loader | None = None) -> None:
        self.spec = spec
        self._weights = weights or EARLY.open  # (path, n_gpu_layers) -> mapped weights, maybe loaded early
        self.clock = clock
        self.keep_alive_s = keep_alive_s
        self.idle_poll_s = max(0.001, idle_poll_s)
        self.lock = threading.Lock()  # model swaps vs tokenization on other threads
        self.model: LlamaModel | None = None  # while unloaded: paged out (_pages_only), or `_vocab`
        self.ctx: LlamaContext | None = None
        self.batch: Batch | None = None
        self.template: ChatTemplate | None = None
        self._vocab: LlamaModel | None = None  # kept once made: samplers built while unloaded use it
        self._template_override = template_override
        self.n_ctx = spec.n_ctx  # per sequence, once loaded
        self.last_active_s = clock.monotonic()
        # embeddings: a context over these weights, or over a second model named for embeddings
        self.embeds = EmbedModels(embed_model_path, spec.n_gpu_layers)
        self.spec_blocker: str | None = None  # why this model cannot roll drafts back (set at open)
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
        """Load weights (or map back those an unload kept: `_pages_only`) and create the context,
        and the draft model's when there is one (ModelLoadError on failure; nothing leaks).

        `warm` decodes once right away: only on the engine thread. OpenMP gives every thread
        that runs a parallel region its own team of workers; once a first decode ran on another
        thread (start() runs on the caller's), the engine thread's decodes ran at half speed
        (SmolLM2, 2 threads: 58 vs 115 tok/s), so `Engine.load()` opens cold and the engine
        thread warms the context up (`warm_up()`) before its first step."""
        s = self.spec
        kept = self.model if self._pages_kept() else None
        model = kept or self._weights(s.model_path, s.n_gpu_layers)  # mapped: the page cache keeps them
        try:
            n_ctx = min(s.n_ctx, model.n_ctx_train) if model.n_ctx_train > 0 else s.n_ctx
            self.spec_blocker = rollback_blocker(model)
            n_out = s.n_outputs if self.spec_blocker is None else None  # no drafts: one row per slot
            ctx = EARLY.context(model, self._context_config(n_ctx, n_threads, n_out,  # maybe made early
                                                            self._flash_attn_at_open(n_threads), model.n_swa))
        except BaseException:
            if model is not kept:
                EARLY.drop_context(model)  # one made early on these weights goes first
                model.close()
            raise
        draft: DraftModel | None = None
        try:
            if s.draft_model_path is not None and self.spec_blocker is None:
                weights = self._weights(s.draft_model_path, s.n_gpu_layers)
                draft = DraftModel(weights, ctx.n_ctx, s.n_slots, s.n_batch, n_threads, s.kv_type)
            if s.warmup and warm:
                ctx.warm_up(model)
                if draft is not None:
                    draft.ctx.warm_up(draft.model)
        except BaseException:
            if draft is not None:
                draft.close()
            ctx.close()
            if model is not kept:
                model.close()
            raise
        return model, ctx, draft

    def context_config(self, n_threads: int) -> ContextConfig:
        """The loaded context's kind (cells, streams, threads, KV type, attention) for a probe's own."""
        assert self.model is not None
        n_ctx = self.ctx.n_ctx if self.ctx is not None else self.n_ctx
        return self._context_config(n_ctx, n_threads, None, self.flash_attn, self.model.n_swa)

    def _context_config(self, n_ctx: int, n_threads: int, n_out: int | None,
                        fa: bool | None, n_swa: int) -> ContextConfig:
        s = self.spec
        return ContextConfig(n_ctx=n_ctx, n_batch=s.n_batch, n_ubatch=s.n_batch, n_seq_max=s.n_slots,
                             n_threads=n_threads, kv_type=s.kv_type, n_outputs_max=n_out, flash_attn=fa,
                             kv_unified=not per_sequence_streams(n_swa))

    # --- attention kind (attention.py) --------------------------------------------------
    def _attn_free(self) -> bool:
        s = self.spec
        return attention.free_choice(s.flash_attn, s.n_gpu_layers, s.kv_type, s.flash_attn_off_fits)

    def _attn_key(self, n_threads: int) -> str:
        return attention.verdict_key(self.spec.model_path, build_identity(), n_threads, self.spec.n_verify)

    def _flash_attn_at_open(self, n_threads: int) -> bool | None:
        """The context's flash attention: the setting, else a verdict measured on an earlier
        start, else on (what llama.cpp's auto picks on a CPU) until `attention_steps` measures."""
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
            found = self.attn_timing is not None
            self.attention = "measured on an earlier start" if found else "on until measured"
        self.flash_attn = True if self.attn_timing is None else self.attn_timing.flash_attn
        return self.flash_attn

    def attention_owed(self) -> bool:
        """Whether edge should time the attention kinds (free choice, no verdict yet)."""
        return self.loaded and self._attn_free() and self.attn_timing is None

    def attention_steps(self, n_threads: int) -> Generator[None, None, bool]:
        """Engine thread, in idle turns after ready (engine/startup.py): time both kinds where
        the choice is free and no earlier start did, one decode per `next`; keep the verdict and
        remake the context if the other kind won. Returns whether the context was remade."""
        if not self.attention_owed():
            return False
        assert self.model is not None
        n_verify = self.spec.n_verify
        on = yield from attention.probe(self.model, n_threads, True, n_verify)
        off = yield from attention.probe(self.model, n_threads, False, n_verify)
        best = attention.choose(on, off)
        self.attn_timing, self.attention = best, "measured after start"
        attention.save_verdict(self._attn_key(n_threads), best)
        log.info("flash attention %s: a nominal request takes %.2f s with it, %.2f s without "
                 "(prompt %.2f/%.2f ms per token, step %.1f/%.1f ms, verify %.1f/%.1f ms)",
                 "on" if best.flash_attn else "off", on.request_s(), off.request_s(),
                 on.prompt_token_s * 1e3, off.prompt_token_s * 1e3, on.step_s * 1e3, off.step_s * 1e3,
                 on.verify_s * 1e3, off.verify_s * 1e3)
        if best.flash_attn == self.flash_attn:
            return False
        self._remake_context(n_threads, best.flash_attn)
        return True

    def _remake_context(self, n_threads: int, fa: bool) -> None:
        """Replace the (idle) context with one of the other attention kind: the old one goes
        first, so two KV caches never coexist; should the new one fail, the old kind returns."""
        assert self.model is not None and self.ctx is not None
        n_ctx, n_out = self.ctx.n_ctx, self.spec.n_outputs if self.spec_blocker is None else None
        n_swa = self.model.n_swa
        with self.lock:
            if self.batch is not None:
                self.batch.free()
            self.ctx.close()
            self.ctx = self.batch = self._live = None
        try:
            ctx = LlamaContext(self.model, self._context_config(n_ctx, n_threads, n_out, fa, n_swa))
        except ModelLoadError as exc:
            log.warning("no context without/with flash attention (%s): keeping the other kind", exc)
            fa = not fa
            ctx = LlamaContext(self.model, self._context_config(n_ctx, n_threads, n_out, fa, n_swa))
        self.flash_attn = fa
        self.install(self.model, ctx, self.draft)

    def install(self, model: LlamaModel, ctx: LlamaContext, draft: DraftModel | None = None) -> None:
        """Make a freshly opened model and context current."""
        with self.lock:
            old, self.model, self.ctx, self.draft = self.model, model, ctx, draft
        if old is not None and old is not model and old is not self._vocab:
            old.close()  # kept through an unload, but its file changed since: loaded anew
        self.n_ctx = ctx.n_ctx_seq
        if self.template is None:
            self.template = load_template(self._template_override or model.chat_template(),
                                          model.token_text(model.bos_id), model.token_text(model.eos_id))
        if EARLY.recording:  # what the next start primes (llama/prime.py): a draft would miss it
            head_of = self.template if self.spec_blocker is None and draft is None else None
            EARLY.note_head(model, head_of, ctx)
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
        return self.embeds.vocab(lambda: self.need_model("unloaded"))

    def get_embedder(self, n_threads: int) -> Embedder:
        """The embeddings context, made on first use (engine thread; needs the weights loaded)."""
        return self.embeds.get(self.model, n_threads)

    def release_draft(self) -> None:
        if self.draft is not None:
            self.draft.close()
            self.draft = None

    def release(self) -> None:
        """Free everything (engine stopped)."""
        self.embeds.close()
        self.release_draft()
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

    def _pages_kept(self) -> bool:
        """Unloaded to a model whose weights' pages went back (`_pages_only`), its file unchanged."""
        m = self.model
        return self.ctx is None and m is not None and not m.vocab_only and m.same_file()

    def _pages_only(self) -> bool:
        """Whether an unload keeps the model and gives its weights' pages back (llama/pages.py):
        every weight computed from the file mapping (no repacked or GPU copy), on Linux."""
        return self.model is not None and self.model.weights_mapped and pages.supported()

    def try_unload(self, still_idle: Callable[[], bool], on_unloaded: Callable[[], None]) -> bool:
        """Free weights and context if `still_idle()` (checked under the model lock, which
        `submit` holds too, so no work can arrive meanwhile). `on_unloaded` runs before the
        lock is released, so whoever waits for UNLOADED sees the memory freed."""
        assert self.ctx is not None
        keep = self._pages_only()
        try:
            vocab = self.model if keep else self._vocab or LlamaModel(self.spec.model_path, vocab_only=True)
        except ModelLoadError as exc:  # keep serving; unloading is only an optimisation
            log.warning("not unloading: vocabulary-only load failed: %s", exc)
            return False
        if not keep:
            self._vocab = vocab
        with self.lock:
            if not still_idle():
                return False
            self.embeds.release()  # it runs over the weights about to go
            self.release_draft()
            full, ctx = self.model, self.ctx
            self.model, self.ctx, self._live = vocab, None, None
            if self.batch is not None:
                self.batch.free()
                self.batch = None
            ctx.close()
            if full is not None and full is not vocab:
                full.close()
            elif full is not None:
                pages.release(full.path)  # the weights to the page cache; vocabulary and tensor table stay
            pages.trim_heap()
            on_unloaded()
        log.info("model unloaded after %.0f s idle", self.clock.monotonic() - self.last_active_s)
        return True

    def vocab_steps(self) -> Iterator[None]:
        """Idle turns after ready (engine/startup.py): the vocabulary-only model an unload leaves
        behind, made ahead (Qwen2.5's: 0.2 s), so an unload frees memory at once (none is needed
        where the unload keeps the model: `_pages_only`)."""
        if self._vocab is None and not self._pages_only():
            yield
            self._vocab = LlamaModel(self.spec.model_path, vocab_only=True)

    def reload(self, n_threads: int, warm: bool = True) -> ModelLoadError | None:
        """Load weights and context again; the error when that fails. `warm=False` when a request
        waits: its own first decode pays what the warm-up would, and no sooner."""
        t0_s = self.clock.monotonic()
        try:
            model, ctx, draft = self.open(n_threads, warm)
        except Exception as exc:
            err = exc if isinstance(exc, ModelLoadError) else ModelLoadError(self.spec.model_path, str(exc))
            log.error("reload failed: %s", err)
            return err
        self.install(model, ctx, draft)
        self.last_active_s = self.clock.monotonic()
        log.info("model reloaded in %.2f s", self.last_active_s - t0_s)
        return None
