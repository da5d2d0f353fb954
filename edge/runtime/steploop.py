"""The engine thread: the step loop that owns the llama context.

`StepLoop` is mixed into `Engine` (engine.py holds the public, any-thread API;
this file holds only what runs on the engine thread). Each step: take inbox,
knobs and cancellations; admit waiting requests to idle slots with the longest
cached prefix; split slot holders into active and parked; build one batch; decode
(retrying without what cannot fit); sample each sequence and hand text over.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import llama_cpp

from edge.errors import DecodeFailed, EdgeError
from edge.runtime.batch import Batch
from edge.runtime.sampling import GrammarFirstLast
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
from edge.runtime.types import EngineState, EngineStats, FinishReason, Knobs, Priority

if TYPE_CHECKING:
    from collections.abc import Callable

    from edge.clock import Clock
    from edge.runtime.model import LlamaContext, LlamaModel
    from edge.runtime.types import GenerationRequest

log = logging.getLogger("edge.engine")


class StepLoop:
    """Engine-thread half of `Engine`; every attribute below is set by `Engine.__init__`."""

    _cond: threading.Condition
    _inbox: list[Sequence]
    _dirty: bool
    _cancel_seen: bool
    _stopping: bool
    _state: EngineState
    _knobs: Knobs
    _clock: Clock
    _sample_hook: Callable[[GenerationRequest, int], int] | None
    _ctx: LlamaContext | None
    model: LlamaModel | None
    _batch: Batch
    _n_batch: int
    _budget: int
    n_ctx: int
    n_slots: int
    _waiting: list[tuple[tuple[int, int], int, Sequence]]
    _running: dict[int, Sequence]
    _slots: list[Slot]
    _step_no: int
    _runnable: bool
    _freed: bool
    _off_owed_s: float
    _sample_s: float
    _decode_s: float
    _totals: list[int]
    _stats: EngineStats | None
    perf: StepPerf
    _unload_waiters: list[Any]
    _last_active_s: float

    if TYPE_CHECKING:  # from Residency

        def _keep_alive_due(self) -> bool: ...

        def _idle_wait_s(self) -> float | None: ...

        def _idle(self) -> bool: ...

        def _reload(self) -> bool: ...

        def _settle_unloads(self, waiters: list[Any]) -> None: ...

    def _run(self) -> None:
        threads_now = self._knobs.n_threads
        while True:
            with self._cond:
                while not self._dirty and not self._runnable and not self._keep_alive_due():
                    self._cond.wait(self._idle_wait_s())
                self._dirty = False
                if self._stopping:
                    return
                inbox, self._inbox = self._inbox, []
                knobs = self._knobs
                cancels, self._cancel_seen = self._cancel_seen, False
                unload_waiters, self._unload_waiters = self._unload_waiters, []
            busy = bool(inbox or self._waiting or self._running)
            t_step_s = self._clock.monotonic()  # not after the step: a caller may move a test clock
            try:
                if self._ctx is None and busy:  # unloaded: this work waits for the reload
                    for seq in inbox:
                        heapq.heappush(self._waiting, (seq.key, id(seq), seq))
                    inbox = []
                    if not self._reload():
                        self._settle_unloads(unload_waiters)
                        continue
                    threads_now = knobs.n_threads  # the new context was made with them
                if self._ctx is not None:
                    threads_now = self._iteration(inbox, knobs, cancels, threads_now)
                if busy or not self._idle():
                    self._last_active_s = max(self._last_active_s, t_step_s)
                self._settle_unloads(unload_waiters)
            except Exception as exc:  # a bug: fail what was running, keep serving the rest
                log.exception("engine step failed")
                self._fail_all(DecodeFailed(-100, f"internal error: {exc}"), running_only=True)
                self._runnable = bool(self._waiting)

    def _iteration(self, inbox: list[Sequence], knobs: Knobs, cancels: bool, threads_now: int) -> int:
        for seq in inbox:
            heapq.heappush(self._waiting, (seq.key, id(seq), seq))
        # duty < 1: after a step with n_threads, either idle for the rest of the cycle or, with
        # off_threads, step with that many threads for as long (fewer threads decode more tokens
        # per joule where decode is memory-bound; the scheduler picks this from measured figures)
        mixed = knobs.off_threads > 0 and knobs.duty < 1.0
        if not mixed:
            self._off_owed_s = 0.0
        off_step = mixed and self._off_owed_s > 0.0
        threads = knobs.off_threads if off_step else knobs.n_threads
        if threads != threads_now:
            assert self._ctx is not None
            self._ctx.set_threads(threads)
        if cancels:
            self._reap_cancelled()
        if knobs.paused or knobs.active_limit == 0:
            self._runnable = False
            self._publish_stats(0.0, 0.0, 0, 0)
            return threads
        self._freed = False
        step_s = self._step(knobs)
        self._runnable = bool(self._running) or (bool(self._waiting) and self._freed)
        if step_s > 0 and mixed:
            owed = self._off_owed_s - step_s if off_step else step_s * (1.0 - knobs.duty) / knobs.duty
            self._off_owed_s = max(0.0, owed)
        elif step_s > 0 and knobs.duty < 1.0:
            self._clock.sleep(step_s * (1.0 - knobs.duty) / knobs.duty)
        return threads

    def _reap_cancelled(self) -> None:
        for sid, seq in list(self._running.items()):
            if seq.handle.cancel_requested:
                self._finish(seq, FinishReason.CANCELLED, free_kv=True)
                del self._running[sid]
        if any(e[2].handle.cancel_requested for e in self._waiting):
            keep = []
            for e in self._waiting:
                if e[2].handle.cancel_requested:
                    e[2].finish(FinishReason.CANCELLED)
                else:
                    keep.append(e)
            heapq.heapify(keep)
            self._waiting = keep

    def _step(self, knobs: Knobs) -> float:
        """One batch. Returns the step's wall time (0 when there was nothing to run)."""
        t0 = time.perf_counter()
        self._step_no += 1
        self._admit(knobs)
        views = [SeqView(sid, s.key, s.n_prompt_left) for sid, s in self._running.items()]
        active, _parked = select_active(views, knobs.active_limit)
        if not active:
            self._publish_stats(0.0, 0.0, 0, 0)
            return 0.0
        active_set = set(active)
        chunks = plan_batch([v for v in views if v.seq_id in active_set], self._n_batch, self._budget)
        self._sample_s = self._decode_s = 0.0
        chunks = self._decode(chunks)
        n_dec = n_pre = 0
        for ch in chunks:
            if ch.decode:
                n_dec += 1
            else:
                n_pre += ch.n
            if ch.wants_logits:
                self._sample(self._running[ch.seq_id])
        t1 = time.perf_counter()
        step_s, decode_s = t1 - t0, self._decode_s
        self.perf.add(step_s, decode_s, self._sample_s, n_dec, n_pre)
        self._publish_stats(step_s, decode_s, n_dec, n_pre)
        return step_s

    def _admit(self, knobs: Knobs) -> None:
        assert self._ctx is not None
        while self._waiting:
            key, _, seq = self._waiting[0]
            if key[0] == Priority.BACKGROUND and not knobs.admit_background:
                return  # heap order: everything behind it is background too
            if not any(s.state is SlotState.IDLE for s in self._slots):
                return
            if not may_admit([s.key for s in self._running.values()], key, knobs.active_limit):
                return
            choice = choose_slot(self._slots, seq.prompt)
            assert choice is not None
            slot = self._slots[choice.seq_id]
            n_keep = choice.n_reuse
            need = len(seq.prompt) - n_keep + 1
            free = self._ctx.n_ctx - kv_cells_used(self._slots) + (len(slot.tokens) - n_keep)
            for sid in eviction_order(self._slots):
                if free >= need:
                    break
                if sid != slot.seq_id:
                    free += len(self._slots[sid].tokens)
                    self._drop_kv(self._slots[sid])
            if free < need and self._running:
                return  # wait for running sequences to release KV
            heapq.heappop(self._waiting)
            n_keep = self._trim_slot(slot, n_keep)
            slot.state = SlotState.PREFILL
            slot.last_used = self._step_no
            seq.seq_id, seq.n_done, seq.cached = slot.seq_id, n_keep, n_keep
            self._running[slot.seq_id] = seq

    def _trim_slot(self, slot: Slot, n_keep: int) -> int:
        """Remove the slot's KV beyond `n_keep`; fall back to a full clear when llama.cpp cannot
        remove a partial sequence or a sliding-window cache lost positions the tail needs."""
        ctx, model = self._ctx, self.model
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
        assert self._ctx is not None
        self._ctx.seq_rm(slot.seq_id, -1, -1)
        slot.tokens.clear()

    def _fill(self, chunks: list[Chunk]) -> None:
        batch = self._batch
        batch.clear()
        for ch in chunks:
            seq = self._running[ch.seq_id]
            if ch.decode:
                seq.out_idx = batch.add_token(ch.seq_id, seq.pending_tok, len(self._slots[ch.seq_id].tokens))
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
        assert self._ctx is not None
        while chunks:
            self._fill(chunks)
            td = time.perf_counter()
            rc = self._batch.decode(self._ctx.ptr)
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
                victim = max(chunks, key=lambda c: self._running[c.seq_id].key)
                self._fail(self._running[victim.seq_id], DecodeFailed(1, "KV cache full"))
                chunks = [c for c in chunks if c.seq_id != victim.seq_id]
                continue
            for ch in chunks:
                self._fail(self._running[ch.seq_id], DecodeFailed(rc, "llama_decode error"))
            return []
        return []

    def _commit(self, chunks: list[Chunk]) -> None:
        for ch in chunks:
            seq = self._running[ch.seq_id]
            slot = self._slots[ch.seq_id]
            if ch.decode:
                slot.tokens.append(seq.pending_tok)
                seq.pending_tok = -1
            else:
                slot.tokens.extend(seq.prompt[seq.n_done : seq.n_done + ch.n])
                seq.n_done += ch.n
                if seq.n_done == len(seq.prompt):
                    slot.state = SlotState.DECODE

    def _sample(self, seq: Sequence) -> None:
        """Sample one token for `seq` and hand its text over; errors fail this sequence only."""
        try:
            assert self._ctx is not None and self.model is not None
            ts = time.perf_counter()
            chain = seq.chain
            if type(chain) is GrammarFirstLast:
                tok = chain.sample(self._ctx.ptr, seq.out_idx)
            else:
                tok = llama_cpp.llama_sampler_sample(chain, self._ctx.ptr, seq.out_idx)
            self._sample_s += time.perf_counter() - ts
            if self._sample_hook is not None:
                tok = self._sample_hook(seq.request, tok)
            model = self.model
            seq.n_gen += 1
            seq.n_unreported += 1
            if seq.t_first_s < 0:
                seq.t_first_s = self._clock.monotonic()
            if model.is_eog(tok):
                self._end(seq, FinishReason.STOP)
                return
            text = seq.stream.feed(model.piece(tok))
            if seq.stream.stopped:
                seq.emit(text)
                self._end(seq, FinishReason.STOP)
            elif seq.n_gen >= seq.max_tokens or len(self._slots[seq.seq_id].tokens) >= self.n_ctx:
                seq.emit(text)
                self._end(seq, FinishReason.LENGTH)
            else:
                seq.pending_tok = tok
                seq.emit(text)
        except Exception as exc:
            log.warning("request %s failed while sampling: %s", seq.handle.request_id, exc)
            err = exc if isinstance(exc, EdgeError) else DecodeFailed(-1, f"sampling failed: {exc}")
            self._fail(seq, err)

    def _end(self, seq: Sequence, reason: FinishReason) -> None:
        self._finish(seq, reason, free_kv=False)
        self._running.pop(seq.seq_id, None)

    def _fail(self, seq: Sequence, err: Exception) -> None:
        self._finish(seq, FinishReason.ERROR, err, free_kv=True)
        self._running.pop(seq.seq_id, None)

    def _finish(
        self, seq: Sequence, reason: FinishReason, error: Exception | None = None, *, free_kv: bool
    ) -> None:
        """Every exit path: final event, sampler freed, slot idle (its KV kept as a prompt cache
        after a normal finish, removed after cancel or error)."""
        self._last_active_s = self._clock.monotonic()  # before the caller can see the end
        try:
            seq.finish(reason, error)
        finally:
            if seq.seq_id >= 0:
                slot = self._slots[seq.seq_id]
                slot.state = SlotState.IDLE
                slot.last_used = self._step_no
                self._freed = True
                if free_kv and self._ctx is not None:
                    self._drop_kv(slot)

    def _fail_all(self, err: Exception, running_only: bool = False) -> None:
        for seq in list(self._running.values()):
            self._finish(seq, FinishReason.ERROR, err, free_kv=True)
        self._running.clear()
        if running_only:
            return
        with self._cond:
            inbox, self._inbox = self._inbox, []
        for seq in [e[2] for e in self._waiting] + inbox:
            seq.finish(FinishReason.ERROR, err)
        self._waiting = []

    def _publish_stats(self, step_s: float, decode_s: float, n_dec: int, n_pre: int) -> None:
        self._totals[0] += n_dec
        self._totals[1] += n_pre
        self._totals[2] += 1 if step_s > 0 else 0
        n_active = min(len(self._running), self._knobs.active_limit)
        n_wait_i = sum(1 for e in self._waiting if e[0][0] == Priority.INTERACTIVE)
        self._stats = EngineStats(
            state=self._state,
            step_time_s=step_s,
            decode_time_s=decode_s,
            tokens_decoded=n_dec,
            tokens_prefilled=n_pre,
            active=0 if self._knobs.paused else n_active,
            parked=len(self._running) - (0 if self._knobs.paused else n_active),
            waiting=len(self._waiting),
            waiting_interactive=n_wait_i,
            kv_cells_used=kv_cells_held(self._slots),
            kv_cells_total=self._ctx.n_ctx if self._ctx is not None else 0,
            n_slots=self.n_slots,
            knobs=self._knobs,
            total_tokens_decoded=self._totals[0],
            total_tokens_prefilled=self._totals[1],
            total_steps=self._totals[2],
            last_progress_s=self._clock.monotonic(),
            interactive_awaiting_first=sum(1 for q in self._running.values()
                                           if q.request.priority is Priority.INTERACTIVE and q.n_gen == 0),
        )
