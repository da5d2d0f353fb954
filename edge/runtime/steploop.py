"""The engine thread: the step loop that owns all engine-thread state and reads the mailbox.

Each step: take mail (new requests, knobs, cancels); admit waiting requests to
idle slots with the longest cached prefix; split slot holders into active and
parked; build one batch; decode (retrying without what cannot fit); sample each
sequence and hand text over; publish an `EngineStats` snapshot. Nothing here is
touched by another thread except that snapshot (replaced whole, never mutated).
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from edge.errors import DecodeFailed, EdgeError
from edge.runtime.handle import Wakeups
from edge.runtime.sampling import token_logprobs
from edge.runtime.sequence import Sequence, StepPerf
from edge.runtime.slots import (
    Chunk,
    SeqView,
    Slot,
    SlotState,
    choose_slot,
    eviction_order,
    kv_cells_held,
    kv_cells_used,
    may_admit,
    plan_batch,
    select_active,
)
from edge.runtime.types import EngineState, EngineStats, FinishReason, Knobs, Priority, TokenLogprob

if TYPE_CHECKING:
    from edge.clock import Clock
    from edge.runtime.embed import EmbedJob
    from edge.runtime.mailbox import LoadWaiter, Mailbox, UnloadWaiter
    from edge.runtime.residency import Residency
    from edge.runtime.types import GenerationRequest

log = logging.getLogger("edge.engine")
EMBED_SHARE = 0.5  # of the engine's time embeddings may take while chat sequences run
SampleHook = Callable[["GenerationRequest", int], int]  # (request, token) -> token; tests inject faults
WaitEntry = tuple[tuple[int, int], int, Sequence]  # (admission key, tie-break, sequence)


class StepLoop:
    """Continuous batching over the residency's context; `run()` is the engine thread."""

    def __init__(self, mailbox: Mailbox, residency: Residency, clock: Clock, n_slots: int,
                 step_token_budget: int, sample_hook: SampleHook | None = None) -> None:
        self.mailbox = mailbox
        self.res = residency
        self.clock = clock
        self.n_slots = n_slots
        self.budget = max(1, step_token_budget)
        self.sample_hook = sample_hook
        self.knobs = mailbox.knobs
        self.waiting: list[WaitEntry] = []
        self.running: dict[int, Sequence] = {}
        self.slots = [Slot(i) for i in range(n_slots)]
        self.perf = StepPerf()
        self.stats: EngineStats | None = None  # the published snapshot
        self._threads_now = self.knobs.n_threads
        self._step_no = 0
        self._runnable = False  # the last step left something to run without new input
        self._freed = False  # a slot became idle during this step (waiting work may fit now)
        self._off_owed_s = 0.0  # off-duty stepping time owed (knobs.off_threads > 0, duty < 1)
        self._sample_s = self._decode_s = 0.0
        self._totals = [0, 0, 0]  # decoded, prefilled, steps
        self.ready = threading.Event()  # set once the thread has warmed the context up
        self.wakeups = Wakeups()  # consumers' wake-ups, sent once per iteration
        self.embeds: deque[EmbedJob] = deque()  # embedding jobs: one batch per iteration
        self.embed_batches = 0
        self.embed_inputs = 0
        self.chat_steps_with_embed = 0  # decode steps that also ran an embedding batch (chat delayed)
        self._embed_owed_s = 0.0  # chat time owed before the next embedding batch beside chat

    @property
    def idle(self) -> bool:
        """No waiting or admitted work (read from any thread: a racy but harmless snapshot)."""
        return not (self.waiting or self.running or self.embeds)

    # --- the thread -----------------------------------------------------------------
    def run(self) -> None:
        res = self.res
        res.warm_up()  # on this thread: see Residency.open
        self.ready.set()
        while True:
            # take() only consults the timer while no mail is pending, so `idle` is the whole story
            mail = self.mailbox.take(self._runnable, lambda: res.keep_alive_due(self.idle), res.idle_wait_s)
            if mail.stopping:
                return
            if mail.knobs is not None:
                self.knobs = mail.knobs
            for seq in mail.new:
                heapq.heappush(self.waiting, (seq.key, id(seq), seq))
            self.embeds.extend(mail.embeds)
            busy = not self.idle or bool(mail.load_waiters)  # a load request is work to load for
            t_step_s = self.clock.monotonic()  # not after the step: a caller may move a test clock
            try:
                if not res.loaded and busy and not self._reload():
                    self._settle_loads(mail.load_waiters)
                    self._settle_unloads(mail.unload_waiters)
                    continue
                self._settle_loads(mail.load_waiters)
                if res.loaded:
                    self._iteration(mail.cancels)
                if busy or not self.idle:
                    res.touch(t_step_s)
                self._settle_unloads(mail.unload_waiters)
            except Exception as exc:  # a bug: fail what was running, keep serving the rest
                log.exception("engine step failed")
                self.fail_all(DecodeFailed(-100, f"internal error: {exc}"), running_only=True)
                self._runnable = bool(self.waiting)
            finally:
                self.wakeups.flush()

    # --- residency ------------------------------------------------------------------
    def _reload(self) -> bool:
        """Reload for queued work; on failure fail it and stay UNLOADED (a later request retries)."""
        self.mailbox.set_state(EngineState.LOADING)
        err = self.res.reload(self.knobs.n_threads)
        if err is not None:
            self.mailbox.set_state(EngineState.UNLOADED)  # before the requests hear: they may retry
            self.fail_all(err)
            self.publish(0.0, 0.0, 0, 0)
            return False
        self._threads_now = self.knobs.n_threads  # the new context was made with them
        self.mailbox.set_state(EngineState.PAUSED if self.knobs.paused else EngineState.READY)
        self.publish(0.0, 0.0, 0, 0)
        return True

    def _settle_loads(self, waiters: list[LoadWaiter]) -> None:
        for w in waiters:
            w.settle(self.res.loaded)

    def _settle_unloads(self, waiters: list[UnloadWaiter]) -> None:
        """After a step: honour unload requests and the keep-alive timer."""
        res = self.res
        if not waiters and not res.keep_alive_due(self.idle):
            return
        ok = not res.loaded or self._try_unload()
        if not ok:  # busy or failed: the keep-alive starts over instead of retrying in a spin
            res.last_active_s = self.clock.monotonic()
        for w in waiters:
            w.settle(ok)

    def _try_unload(self) -> bool:
        box = self.mailbox

        def still_idle() -> bool:  # called under the residency lock, which every submit holds
            return self.idle and box.quiet()

        def unloaded() -> None:
            for slot in self.slots:  # their KV went with the context
                slot.tokens.clear()
                slot.state = SlotState.IDLE
            box.set_state(EngineState.UNLOADED)

        if not self.res.try_unload(still_idle, unloaded):
            return False
        self.publish(0.0, 0.0, 0, 0)
        return True

    # --- one iteration --------------------------------------------------------------
    def _iteration(self, cancels: bool) -> None:
        knobs = self.knobs
        # duty < 1: after a step with n_threads, either idle for the rest of the cycle or, with
        # off_threads, step with that many threads for as long (fewer threads decode more tokens
        # per joule where decode is memory-bound; the scheduler picks this from measured figures)
        mixed = knobs.off_threads > 0 and knobs.duty < 1.0
        if not mixed:
            self._off_owed_s = 0.0
        off_step = mixed and self._off_owed_s > 0.0
        threads = knobs.off_threads if off_step else knobs.n_threads
        if threads != self._threads_now:
            assert self.res.ctx is not None
            self.res.ctx.set_threads(threads)
            self._threads_now = threads
        if cancels:
            self._reap_cancelled()
        if knobs.paused or knobs.active_limit == 0:
            self._runnable = False
            self.publish(0.0, 0.0, 0, 0)
            return
        self._freed = False
        step_s = self._step(knobs)
        self.wakeups.flush()  # before any duty-cycle pause: the tokens of this step go out now
        if self.embeds:
            step_s += self._maybe_embed(threads, chat_s=step_s)
        self._runnable = bool(self.running) or (bool(self.waiting) and self._freed) or bool(self.embeds)
        if step_s > 0 and mixed:
            owed = self._off_owed_s - step_s if off_step else step_s * (1.0 - knobs.duty) / knobs.duty
            self._off_owed_s = max(0.0, owed)
        elif step_s > 0 and knobs.duty < 1.0:
            self.clock.sleep(step_s * (1.0 - knobs.duty) / knobs.duty)

    def _maybe_embed(self, threads: int, chat_s: float) -> float:
        """Beside running chat, embeddings get at most EMBED_SHARE of the engine's time: a batch
        (about a prompt chunk's work) runs only once chat steps have had their share since the
        last one, so a chat stalls one batch at a time and at most that often. Alone, they run
        every step."""
        if chat_s <= 0:
            self._embed_owed_s = 0.0
            return self._embed_batch(threads, beside_chat=False)
        self._embed_owed_s -= chat_s
        if self._embed_owed_s > 0:
            return 0.0
        embed_s = self._embed_batch(threads, beside_chat=True)
        self._embed_owed_s = embed_s * (1.0 - EMBED_SHARE) / EMBED_SHARE
        return embed_s

    def _embed_batch(self, threads: int, beside_chat: bool) -> float:
        """One embedding batch (a burst of requests delays chat by one batch per step, not all of it)."""
        t0 = time.perf_counter()
        self.embeds = deque(j for j in self.embeds if not j.future.cancelled())  # the client went away
        if not self.embeds:
            return 0.0
        try:
            embedder = self.res.get_embedder(threads)
            embedder.set_threads(threads)
            done = embedder.run_batch(self.embeds, self.budget)
        except Exception as exc:  # cannot make the context (memory): fail the waiting jobs, keep chat
            log.warning("embeddings failed: %s", exc)
            err = exc if isinstance(exc, EdgeError) else DecodeFailed(-1, f"embeddings failed: {exc}")
            while self.embeds:
                job = self.embeds.popleft()
                if not job.future.done():
                    job.future.set_exception(err)
            return time.perf_counter() - t0
        self.embed_batches += 1
        self.embed_inputs += done
        self.chat_steps_with_embed += 1 if beside_chat else 0
        if self.stats is not None:  # counters only: the chat step's timings stay what they were
            self.stats = replace(self.stats, embed_batches=self.embed_batches, embed_inputs=self.embed_inputs,
                                 chat_steps_with_embed=self.chat_steps_with_embed)
        while self.embeds and self.embeds[0].done:
            job = self.embeds.popleft()
            if not job.future.done():
                job.future.set_result([v for v in job.vectors if v is not None])
        return time.perf_counter() - t0

    def _reap_cancelled(self) -> None:
        for sid, seq in list(self.running.items()):
            if seq.handle.cancel_requested:
                self._finish(seq, FinishReason.CANCELLED, free_kv=True)
                del self.running[sid]
        if any(e[2].handle.cancel_requested for e in self.waiting):
            keep = []
            for e in self.waiting:
                if e[2].handle.cancel_requested:
                    e[2].finish(FinishReason.CANCELLED)
                else:
                    keep.append(e)
            heapq.heapify(keep)
            self.waiting = keep

    def _step(self, knobs: Knobs) -> float:
        """One batch. Returns the step's wall time (0 when there was nothing to run)."""
        t0 = time.perf_counter()
        self._step_no += 1
        self._admit(knobs)
        views = [SeqView(sid, s.key, s.n_prompt_left) for sid, s in self.running.items()]
        active, _parked = select_active(views, knobs.active_limit)
        if not active:
            self.publish(0.0, 0.0, 0, 0)
            return 0.0
        active_ids = set(active)
        run = [v for v in views if v.seq_id in active_ids]
        assert self.res.batch is not None
        # the step budget bounds how long a prompt chunk stalls running streams; with none
        # decoding there is nothing to stall, and one big batch evaluates a prompt fastest
        budget = self.budget if any(v.n_prompt_left == 0 for v in run) else self.res.batch.capacity
        chunks = plan_batch(run, self.res.batch.capacity, budget)
        self._sample_s = self._decode_s = 0.0
        chunks = self._decode(chunks)
        n_dec = n_pre = 0
        for ch in chunks:
            if ch.decode:
                n_dec += 1
            else:
                n_pre += ch.n
            if ch.wants_logits:
                self._sample(self.running[ch.seq_id])
        step_s, decode_s = time.perf_counter() - t0, self._decode_s
        self.perf.add(step_s, decode_s, self._sample_s, n_dec, n_pre)
        self.publish(step_s, decode_s, n_dec, n_pre)
        return step_s

    # --- admission to slots -----------------------------------------------------------
    def _admit(self, knobs: Knobs) -> None:
        ctx = self.res.ctx
        assert ctx is not None
        while self.waiting:
            key, _, seq = self.waiting[0]
            if key[0] == Priority.BACKGROUND and not knobs.admit_background:
                return  # heap order: everything behind it is background too
            if not any(s.state is SlotState.IDLE for s in self.slots):
                return
            if not may_admit([s.key for s in self.running.values()], key, knobs.active_limit):
                return
            choice = choose_slot(self.slots, seq.prompt)
            assert choice is not None
            slot = self.slots[choice.seq_id]
            n_keep = choice.n_reuse
            need = len(seq.prompt) - n_keep + 1
            free = ctx.n_ctx - kv_cells_used(self.slots) + (len(slot.tokens) - n_keep)
            for sid in eviction_order(self.slots):
                if free >= need:
                    break
                if sid != slot.seq_id:
                    free += len(self.slots[sid].tokens)
                    self._drop_kv(self.slots[sid])
            if free < need and self.running:
                return  # wait for running sequences to release KV
            heapq.heappop(self.waiting)
            n_keep = self._trim_slot(slot, n_keep)
            slot.state = SlotState.PREFILL
            slot.last_used = self._step_no
            seq.seq_id, seq.n_done, seq.cached = slot.seq_id, n_keep, n_keep
            seq.wakeups = self.wakeups
            self.running[slot.seq_id] = seq
            seq.started()  # the request holds a slot now: admission stops counting it as waiting

    def _trim_slot(self, slot: Slot, n_keep: int) -> int:
        """Remove the slot's KV beyond `n_keep`; fall back to a full clear when llama.cpp cannot
        remove a partial sequence or a sliding-window cache lost positions the tail needs."""
        ctx, model = self.res.ctx, self.res.model
        assert ctx is not None and model is not None
        if n_keep < len(slot.tokens) and not ctx.seq_rm(slot.seq_id, n_keep, -1):
            n_keep = 0
        if n_keep > 0 and model.n_swa > 0 and ctx.seq_pos_min(slot.seq_id) > max(0, n_keep - model.n_swa):
            n_keep = 0
        if n_keep == 0:
            ctx.seq_rm(slot.seq_id, -1, -1)
        del slot.tokens[n_keep:]
        return n_keep

    def _drop_kv(self, slot: Slot) -> None:
        assert self.res.ctx is not None
        self.res.ctx.seq_rm(slot.seq_id, -1, -1)
        slot.tokens.clear()

    # --- decode ---------------------------------------------------------------------
    def _fill(self, chunks: list[Chunk]) -> None:
        batch = self.res.batch
        assert batch is not None
        batch.clear()
        for ch in chunks:
            seq = self.running[ch.seq_id]
            if ch.decode:
                seq.out_idx = batch.add_token(ch.seq_id, seq.pending_tok, len(self.slots[ch.seq_id].tokens))
            else:
                p0 = seq.n_done
                row = batch.add_prompt(ch.seq_id, seq.prompt[p0 : p0 + ch.n], p0, ch.wants_logits)
                if ch.wants_logits:
                    seq.out_idx = row

    def _decode(self, chunks: list[Chunk]) -> list[Chunk]:
        """llama_decode the planned chunks; returns those that made it into the KV cache.

        Status 1 (no KV room): first drop prompt chunks (they retry next step), then fail the
        most recently admitted decoding sequence, until the rest fits. Any other error fails
        exactly the sequences in the batch and clears their KV.
        """
        ctx, batch = self.res.ctx, self.res.batch
        assert ctx is not None and batch is not None
        while chunks:
            self._fill(chunks)
            td = time.perf_counter()
            rc = batch.decode(ctx.ptr)
            self._decode_s += time.perf_counter() - td
            if rc == 0:
                self._commit(chunks)
                return chunks
            if rc == 1:
                log.warning("KV cache full for a batch of %d sequences; retrying smaller", len(chunks))
                prefill = [c for c in chunks if not c.decode]
                if prefill and len(prefill) < len(chunks):
                    chunks = [c for c in chunks if c.decode]
                    continue
                victim = max(chunks, key=lambda c: self.running[c.seq_id].key)
                self._fail(self.running[victim.seq_id], DecodeFailed(1, "KV cache full"))
                chunks = [c for c in chunks if c.seq_id != victim.seq_id]
                continue
            for ch in chunks:
                self._fail(self.running[ch.seq_id], DecodeFailed(rc, "llama_decode error"))
            return []
        return []

    def _commit(self, chunks: list[Chunk]) -> None:
        for ch in chunks:
            seq = self.running[ch.seq_id]
            slot = self.slots[ch.seq_id]
            if ch.decode:
                slot.tokens.append(seq.pending_tok)
                seq.pending_tok = -1
            else:
                slot.tokens.extend(seq.prompt[seq.n_done : seq.n_done + ch.n])
                seq.n_done += ch.n
                if seq.n_done == len(seq.prompt):
                    slot.state = SlotState.DECODE

    # --- sample and deliver -------------------------------------------------------------
    def _sample(self, seq: Sequence) -> None:
        """Sample one token for `seq` and hand its text over; errors fail this sequence only."""
        try:
            ctx, model = self.res.ctx, self.res.model
            assert ctx is not None and model is not None and seq.sampler is not None
            ts = time.perf_counter()
            tok = seq.sampler.sample(ctx.ptr, seq.out_idx)
            self._sample_s += time.perf_counter() - ts
            if self.sample_hook is not None:
                tok = self.sample_hook(seq.request, tok)
            seq.n_gen += 1
            seq.n_unreported += 1
            if seq.t_first_s < 0:
                seq.t_first_s = self.clock.monotonic()
            if model.is_eog(tok):
                self._end(seq, FinishReason.STOP)
                return
            if seq.request.logprobs is not None:
                seq.pending_logprobs.append(self._logprob(ctx.ptr, seq, tok))
            text = seq.stream.feed(model.piece(tok))
            if seq.stream.stopped:
                seq.emit(text)
                self._end(seq, FinishReason.STOP)
            elif seq.n_gen >= seq.max_tokens or len(self.slots[seq.seq_id].tokens) >= self.res.n_ctx:
                seq.emit(text)
                self._end(seq, FinishReason.LENGTH)
            else:
                seq.pending_tok = tok
                seq.emit(text)
        except Exception as exc:
            log.warning("request %s failed while sampling: %s", seq.handle.request_id, exc)
            err = exc if isinstance(exc, EdgeError) else DecodeFailed(-1, f"sampling failed: {exc}")
            self._fail(seq, err)

    def _logprob(self, ctx_ptr: object, seq: Sequence, tok: int) -> TokenLogprob:
        model = self.res.model
        assert model is not None and seq.request.logprobs is not None
        lp, top = token_logprobs(ctx_ptr, seq.out_idx, model.n_vocab, tok, seq.request.logprobs)

        def piece(t: int) -> tuple[str, bytes]:
            raw = model.piece(t)
            return raw.decode("utf-8", "replace"), raw

        text, raw = piece(tok)
        return TokenLogprob(text, raw, lp, tuple((*piece(t), v) for t, v in top))

    def _end(self, seq: Sequence, reason: FinishReason) -> None:
        self._finish(seq, reason, free_kv=False)
        self.running.pop(seq.seq_id, None)

    def _fail(self, seq: Sequence, err: Exception) -> None:
        self._finish(seq, FinishReason.ERROR, err, free_kv=True)
        self.running.pop(seq.seq_id, None)

    def _finish(self, seq: Sequence, reason: FinishReason, error: Exception | None = None, *,
                free_kv: bool) -> None:
        """Every exit path: final event, sampler freed, slot idle (its KV kept as a prompt cache
        after a normal finish, removed after cancel or error)."""
        self.res.touch()  # before the caller can see the end
        try:
            seq.finish(reason, error)
        finally:
            if seq.seq_id >= 0:
                slot = self.slots[seq.seq_id]
                slot.state = SlotState.IDLE
                slot.last_used = self._step_no
                self._freed = True
                if free_kv and self.res.ctx is not None:
                    self._drop_kv(slot)

    def fail_all(self, err: Exception, running_only: bool = False) -> None:
        """Fail running requests (and, unless `running_only`, waiting and posted ones too)."""
        for seq in list(self.running.values()):
            self._finish(seq, FinishReason.ERROR, err, free_kv=True)
        self.running.clear()
        if running_only:
            return
        posted, posted_embeds = self.mailbox.take_new()
        for seq in [e[2] for e in self.waiting] + posted:
            seq.finish(FinishReason.ERROR, err)
        self.waiting = []
        for job in [*self.embeds, *posted_embeds]:
            if not job.future.done():
                job.future.set_exception(err)
        self.embeds.clear()

    # --- stats ------------------------------------------------------------------------
    def publish(self, step_s: float, decode_s: float, n_dec: int, n_pre: int) -> None:
        self._totals[0] += n_dec
        self._totals[1] += n_pre
        self._totals[2] += 1 if step_s > 0 else 0
        knobs = self.knobs
        n_active = 0 if knobs.paused else min(len(self.running), knobs.active_limit)
        ctx = self.res.ctx
        self.stats = EngineStats(
            state=self.mailbox.state,
            step_time_s=step_s,
            decode_time_s=decode_s,
            tokens_decoded=n_dec,
            tokens_prefilled=n_pre,
            active=n_active,
            parked=len(self.running) - n_active,
            waiting=len(self.waiting),
            waiting_interactive=sum(1 for e in self.waiting if e[0][0] == Priority.INTERACTIVE),
            kv_cells_used=kv_cells_held(self.slots),
            kv_cells_total=ctx.n_ctx if ctx is not None else 0,
            n_slots=self.n_slots,
            knobs=knobs,
            total_tokens_decoded=self._totals[0],
            total_tokens_prefilled=self._totals[1],
            total_steps=self._totals[2],
            last_progress_s=self.clock.monotonic(),
            interactive_awaiting_first=sum(1 for q in self.running.values()
                                           if q.request.priority is Priority.INTERACTIVE and q.n_gen == 0),
            embed_batches=self.embed_batches,
            embed_inputs=self.embed_inputs,
            chat_steps_with_embed=self.chat_steps_with_embed,
        )
