"""The engine thread's step loop: it owns all engine-thread state and executes step plans.

Each step: take mail (new requests, knobs, cancels); ask `plan.plan_step` what to do
(admissions, evictions and stashes, active and parked sequences, the batch, drafts,
threads) from a view that includes the last step's `StepOutcome`; carry it out: the KV
side of admissions (kvops.py), the batch, llama_decode (a refused batch is retried as
`plan.plan_kv_retry` says), commit, then sampling and delivery (delivery.py); publish an
`EngineStats` snapshot. Every decision is in plan.py and the pure helpers beside it; this
module only executes and reports. Nothing here is touched by another thread except that
snapshot (replaced whole, never mutated).
"""

from __future__ import annotations

import heapq
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from edge.errors import DecodeFailed, EdgeError
from edge.runtime.embed.queue import EmbedQueue
from edge.runtime.engine.handle import Wakeups
from edge.runtime.kv.hostcache import HostCache
from edge.runtime.spec.state import DraftView, SeqSpec, Speculation
from edge.runtime.step.delivery import Delivery, SampleHook
from edge.runtime.step.kvops import SlotKV
from edge.runtime.step.plan import (
    Admit,
    Chunk,
    SeqView,
    Slot,
    SlotState,
    SlotView,
    StashView,
    StepOutcome,
    StepPlan,
    StepView,
    WaitView,
    draft_room,
    duty_after,
    plan_kv_retry,
    plan_step,
    waiting_for_plan,
)
from edge.runtime.step.sequence import Sequence, StepPerf
from edge.runtime.step.stats import embed_counts, snapshot
from edge.runtime.types import EngineStats, FinishReason

if TYPE_CHECKING:
    from collections.abc import Callable

    from edge.clock import Clock
    from edge.runtime.engine.mailbox import Mail, Mailbox
    from edge.runtime.kv.residency import Live, Residency
    from edge.runtime.llama.batch import Batch

__all__ = ["SampleHook", "StepLoop"]

log = logging.getLogger("edge.engine")
WaitEntry = tuple[tuple[int, int], int, Sequence]  # (admission key, tie-break, sequence)


def _entry_key(e: WaitEntry) -> tuple[tuple[int, int], int]:
    return e[0], e[1]


class StepLoop:
    """Continuous batching over the residency's context; `run()` is the engine thread."""

    def __init__(self, mailbox: Mailbox, residency: Residency, clock: Clock, n_slots: int,
                 step_token_budget: int, sample_hook: SampleHook | None = None,
                 speculation: Speculation | None = None, host_cache_bytes: int = 0,
                 timer: Callable[[], float] = time.perf_counter) -> None:
        self.mailbox, self.timer = mailbox, timer  # timer: steps and decodes (the step-cost model's y)
        self.res = residency
        self.clock = clock
        self.n_slots = n_slots
        self.budget = max(1, step_token_budget)
        self.knobs = mailbox.knobs
        self.spec = speculation or Speculation("off", 1)  # speculative decoding (spec/state.py)
        self.host = HostCache(host_cache_bytes)  # idle prompt caches out of the KV cache
        self.waiting: list[WaitEntry] = []
        self.running: dict[int, Sequence] = {}
        self.slots = [Slot(i) for i in range(n_slots)]
        self.kv = SlotKV(self.slots, self.host)
        self.delivery = Delivery(self.slots, clock, self.spec, self._end, self._fail, sample_hook)
        self.outcome = StepOutcome()  # what the last step's execution reported (the next plan reads it)
        self._state_size: dict[int, tuple[tuple[int, int], int]] = {}  # idle caches' sizes, by slot
        self.perf = StepPerf()
        self.stats: EngineStats | None = None  # the published snapshot
        self._threads_now = self.knobs.n_threads
        self._step_no = 0
        self.runnable = False  # the last step left something to run without new input
        self._freed = False  # a slot became idle during this step (waiting work may fit now)
        self._off_owed_s = 0.0  # off-duty stepping time owed (knobs.off_threads > 0, duty < 1)
        self._decode_s = 0.0
        self._batch_tokens = 0  # tokens in the last decoded batch (the step-cost model's x)
        self._totals = [0, 0, 0]  # decoded, prefilled, steps
        self.wakeups = Wakeups()  # consumers' wake-ups, sent once per iteration
        self.embeds = EmbedQueue()  # embedding jobs: at most one batch per iteration

    @property
    def idle(self) -> bool:
        """No waiting or admitted work (read from any thread: a racy but harmless snapshot)."""
        return not (self.waiting or self.running or self.embeds)

    # --- what the engine thread (engine/thread.py) drives -------------------------------
    def take(self, mail: Mail) -> None:
        """New work and knobs from the mailbox."""
        if mail.knobs is not None:
            self.knobs = mail.knobs
        for seq in mail.new:
            heapq.heappush(self.waiting, (seq.key, id(seq), seq))
        self.embeds.extend(mail.embeds)

    def context_replaced(self, keep_host: bool = False) -> None:
        """A new context was made (with the knobs' threads); the old one's KV went with it (and,
        unless `keep_host`, the host-memory caches: another attention kind cannot restore them)."""
        self._threads_now = self.knobs.n_threads
        self.forget_kv(None if keep_host else 0)

    def forget_kv(self, keep_host_bytes: int | None = 0) -> None:
        """The slots' KV is gone; host memory keeps its most recent caches within `keep_host_bytes`
        (None: all; an unload is for memory, so it keeps a few: engine/thread.py)."""
        for slot in self.slots:
            slot.tokens.clear()
            slot.state = SlotState.IDLE
        if keep_host_bytes is not None:
            self.host.shrink(keep_host_bytes)

    # --- one iteration --------------------------------------------------------------
    def iterate(self, cancels: bool) -> None:
        """One step over the loaded context (cancels first, then the plan)."""
        knobs, live = self.knobs, self.res.live
        if cancels:
            self._reap_cancelled()
        plan = plan_step(self._view(live), knobs)
        if plan.threads != self._threads_now:
            live.ctx.set_threads(plan.threads)
            self._threads_now = plan.threads
        if not plan.run:
            self.runnable = False
            self._off_owed_s = duty_after(knobs, plan.off_step, self._off_owed_s, 0.0).off_owed_s
            self.publish(0.0, 0.0, 0, 0)
            return
        self._freed = False
        step_s = self._step(live, plan)
        self.wakeups.flush()  # before any duty-cycle pause: the tokens of this step go out now
        if self.embeds:
            embed_s = self.embeds.maybe_run(self.res, plan.threads, step_s, self.budget)
            if embed_s > 0 and self.stats is not None:  # counters only: the chat step's timings stand
                self.stats = replace(self.stats, **self._embed_counts())
            step_s += embed_s
        self.runnable = bool(self.running) or (bool(self.waiting) and self._freed) or bool(self.embeds)
        after = duty_after(knobs, plan.off_step, self._off_owed_s, step_s)
        self._off_owed_s = after.off_owed_s
        if after.sleep_s > 0:
            self.clock.sleep(after.sleep_s)

    def _view(self, live: Live) -> StepView:
        """The plain data `plan_step` decides from: the first waiting requests (`waiting_for_plan`)
        and, only when some could be admitted, what admissions need of the idle slots."""
        n_idle = sum(1 for s in self.slots if s.state is SlotState.IDLE)
        stash = self.host.on and live.share_prefixes
        first = waiting_for_plan(self.waiting, n_idle, _entry_key)
        waiting = tuple(WaitView(e[0], len(e[2].prompt), e[2].prompt) for e in first)
        stashed: tuple[StashView, ...] = self.host.views() if stash and waiting else ()
        slots = tuple(self._slot_view(live, s, stash) if waiting else s.view() for s in self.slots)
        return StepView(
            live.n_ctx, live.batch.capacity, self.budget, slots,
            tuple(SeqView(sid, q.key, q.n_prompt_left) for sid, q in self.running.items()),
            waiting, self._off_owed_s, *self._draft_view(live), share_prefixes=live.share_prefixes,
            stashed=stashed, stash=stash, n_swa=live.model.n_swa, last=self.outcome)

    def _slot_view(self, live: Live, slot: Slot, stash: bool) -> SlotView:
        """An idle cache as admissions see it: where a sliding window left it, and whether host
        memory could hold it at all."""
        if slot.state is not SlotState.IDLE or not slot.tokens:
            return slot.view()
        sid, ctx = slot.seq_id, live.ctx
        return slot.view(ctx.seq_pos_min(sid) if live.model.n_swa > 0 else 0,
                         not stash or self._state_bytes(live, slot) <= self.host.budget_bytes)

    def _state_bytes(self, live: Live, slot: Slot) -> int:
        """An idle slot's cache size in host memory, asked of llama.cpp once per cache: while
        requests wait, every step's view needs it, and an idle cache does not change."""
        key = (len(slot.tokens), slot.last_used)
        held = self._state_size.get(slot.seq_id)
        if held is None or held[0] != key:
            held = (key, live.ctx.seq_state_size(slot.seq_id))
            self._state_size[slot.seq_id] = held
        return held[1]

    def _draft_view(self, live: Live) -> DraftView:
        """What the plan needs to give drafts: each decoding sequence's guess (`draft_room` deep)
        and the measured step costs."""
        if not self.spec.on:
            return (), (), 0.0
        cands: list[tuple[int, SeqSpec, int]] = []
        for sid, q in self.running.items():
            if q.spec is not None and q.n_prompt_left == 0 and q.pending_tok >= 0 and (
                    q.think is None or not q.think.due):  # a think block due to close: no draft
                n_cells = len(self.slots[sid].tokens)
                room = draft_room(q.spec.cap, live.n_ctx_seq, n_cells, q.max_tokens, q.n_gen)
                cands.append((sid, q.spec, room))
        return self.spec.view(cands, live.draft)

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

    def _step(self, live: Live, plan: StepPlan) -> float:
        """Carry out one plan. Returns the step's wall time (0 when there was nothing to run)."""
        t0 = self.timer()
        self._step_no += 1
        short, refused = self._admit(live, plan.admit)
        self.outcome = StepOutcome(short, refused)
        chunks = list(plan.without(short))  # a short admission's chunk waits for the next plan
        if not chunks:
            self.publish(0.0, 0.0, 0, 0)
            return 0.0
        self.delivery.sample_s = self._decode_s = 0.0
        if self.spec.on:
            specs = {sid: q.spec for sid, q in self.running.items() if q.spec is not None}
            self.spec.apply(plan.drafts, specs, live.draft, plan.threads, plan.shadows)
        chunks = self._decode(live, chunks)
        n_dec = n_pre = 0
        for ch in chunks:
            if ch.decode:
                n_dec += 1
            else:
                n_pre += ch.n
            if ch.wants_logits:
                self.delivery.sample(live, self.running[ch.seq_id])
        step_s, decode_s = self.timer() - t0, self._decode_s
        self.spec.observe_step(self._batch_tokens, decode_s)
        self.perf.add(step_s, decode_s, self.delivery.sample_s, n_dec, n_pre)
        self.publish(step_s, decode_s, n_dec, n_pre)
        return step_s

    # --- admission to slots -----------------------------------------------------------
    def _admit(self, live: Live, admits: tuple[Admit, ...]) -> tuple[tuple[int, ...], int]:
        """Give the planned waiting requests their slots. Returns the seq ids whose slot kept
        fewer cached tokens than planned, and the stashes host memory refused."""
        short: list[int] = []
        refused = 0
        restoring = {a.restore for a in admits if a.restore >= 0}  # kept while others stash
        for a in admits:
            key, _, seq = heapq.heappop(self.waiting)
            assert key == a.key, "the plan admits in admission order"
            try:
                taken = self.kv.take_slot(live, a, restoring)
            except BaseException as exc:  # not in `running` yet: fail_all would not reach it
                self.kv.drop(live, self.slots[a.seq_id])  # whatever it holds is unaccounted for
                seq.finish(FinishReason.ERROR, exc if isinstance(exc, EdgeError)
                           else DecodeFailed(-100, f"internal error: {exc}"))
                raise
            refused += taken.stash_refused
            if taken.n_keep != a.n_keep:
                short.append(a.seq_id)
            slot = self.slots[a.seq_id]
            slot.state = SlotState.PREFILL
            slot.last_used = self._step_no
            seq.admit(slot.seq_id, taken.n_keep, self.wakeups,
                      self.spec.state_for(seq.prompt, seq.request.speculative, seq.request.n_draft))
            self.running[slot.seq_id] = seq
            seq.started()  # the request holds a slot now: admission stops counting it as waiting
        return tuple(short), refused

    # --- decode ---------------------------------------------------------------------
    def _fill(self, batch: Batch, chunks: list[Chunk]) -> None:
        batch.clear()
        self._batch_tokens = 0
        # by sequence id: a stream per sequence splits a batch at every gap in the ids (split_equal)
        for ch in sorted(chunks, key=lambda c: c.seq_id):
            seq = self.running[ch.seq_id]
            pos = len(self.slots[ch.seq_id].tokens)
            if ch.decode and seq.drafting:
                toks = seq.decode_tokens()
                seq.at_row(batch.add_tokens(ch.seq_id, toks, pos))
                self._batch_tokens += len(toks) - 1
            elif ch.decode:  # the common row: no list built per token
                seq.at_row(batch.add_token(ch.seq_id, seq.pending_tok, pos))
            else:
                p0 = seq.n_done
                row = batch.add_prompt(ch.seq_id, seq.prompt[p0 : p0 + ch.n], p0, ch.wants_logits)
                if ch.wants_logits:
                    seq.at_row(row)

    def _decode(self, live: Live, chunks: list[Chunk]) -> list[Chunk]:
        """llama_decode the planned chunks; returns those that made it into the KV cache.

        Status 1 (no KV room): retried as `plan_kv_retry` says until the rest fits. Any other
        error fails exactly the sequences in the batch and clears their KV. Either way the
        step's `StepOutcome` records it.
        """
        ctx, batch = live.ctx, live.batch
        failed: list[int] = []
        rc = 0
        while chunks:
            self._fill(batch, chunks)
            self._batch_tokens += sum(ch.n for ch in chunks)
            td = self.timer()
            rc = batch.decode(ctx.ptr)
            self._decode_s += self.timer() - td
            if rc == 0:
                self._commit(chunks)
                break
            if rc != 1:
                for ch in chunks:
                    self._fail(self.running[ch.seq_id], DecodeFailed(rc, "llama_decode error"))
                failed.extend(ch.seq_id for ch in chunks)
                chunks = []
                break
            drafting = [sid for sid, q in self.running.items() if q.spec is not None and q.spec.draft]
            retry = plan_kv_retry(chunks, drafting, {c.seq_id: self.running[c.seq_id].key for c in chunks})
            if retry.drop_drafts:
                for sid in drafting:
                    spec = self.running[sid].spec
                    if spec is not None:
                        spec.drop_draft()
            else:
                log.warning("KV cache full for a batch of %d sequences; retrying smaller", len(chunks))
            if retry.victim >= 0:
                self._fail(self.running[retry.victim], DecodeFailed(1, "KV cache full"))
                failed.append(retry.victim)
            chunks = list(retry.chunks)
        self.outcome = replace(self.outcome, decode_rc=rc, failed=tuple(failed))
        return chunks

    def _commit(self, chunks: list[Chunk]) -> None:
        for ch in chunks:
            seq = self.running[ch.seq_id]
            slot = self.slots[ch.seq_id]
            if ch.decode:
                slot.tokens.extend(seq.committed_decode())  # a draft's rejected tail is trimmed later
            else:
                slot.tokens.extend(seq.committed_prompt(ch.n))
                if seq.n_prompt_left == 0:
                    slot.state = SlotState.DECODE

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
                if free_kv and self.res.loaded:
                    self.kv.drop(self.res.live, slot)

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
        self.embeds.fail(err, posted_embeds)

    # --- stats ------------------------------------------------------------------------
    def publish(self, step_s: float, decode_s: float, n_dec: int, n_pre: int) -> None:
        """Replace the stats snapshot other threads read (never mutated once published)."""
        self._totals[0] += n_dec
        self._totals[1] += n_pre
        self._totals[2] += 1 if step_s > 0 else 0
        self.stats = snapshot(self, step_s, decode_s, n_dec, n_pre)

    def _embed_counts(self) -> dict[str, int]:
        return embed_counts(self.embeds)
