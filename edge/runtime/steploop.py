"""The engine thread: the step loop that owns all engine-thread state and reads the mailbox.

Each step: take mail (new requests, knobs, cancels); ask `stepplan.plan_step` what
to do (admissions, evictions, active and parked sequences, the batch, threads);
carry it out: trim KV, fill the batch, decode (retrying without what cannot fit),
commit, sample each sequence and hand text over; publish an `EngineStats` snapshot.
Every decision is in stepplan.py; this module only executes. Nothing here is
touched by another thread except that snapshot (replaced whole, never mutated).
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import TYPE_CHECKING

from edge.errors import DecodeFailed, EdgeError
from edge.runtime.delivery import Delivery
from edge.runtime.embedqueue import EmbedQueue
from edge.runtime.handle import Wakeups
from edge.runtime.hostcache import HostCache
from edge.runtime.sequence import Sequence, StepPerf
from edge.runtime.spec_step import DraftView, SeqSpec, Speculation
from edge.runtime.stepplan import (
    Admit,
    Chunk,
    SeqView,
    Slot,
    SlotState,
    StashView,
    StepPlan,
    StepView,
    WaitView,
    duty_after,
    kv_cells_held,
    plan_step,
)
from edge.runtime.types import EngineStats, FinishReason, Priority

if TYPE_CHECKING:
    from edge.clock import Clock
    from edge.runtime.batch import Batch
    from edge.runtime.mailbox import Mail, Mailbox
    from edge.runtime.residency import Live, Residency
    from edge.runtime.types import GenerationRequest

log = logging.getLogger("edge.engine")
SampleHook = Callable[["GenerationRequest", int], int]  # (request, token) -> token; tests inject faults
WaitEntry = tuple[tuple[int, int], int, Sequence]  # (admission key, tie-break, sequence)


class StepLoop(Delivery):
    """Continuous batching over the residency's context; `run()` is the engine thread."""

    def __init__(self, mailbox: Mailbox, residency: Residency, clock: Clock, n_slots: int,
                 step_token_budget: int, sample_hook: SampleHook | None = None,
                 speculation: Speculation | None = None, host_cache_bytes: int = 0) -> None:
        self.mailbox = mailbox
        self.res = residency
        self.clock = clock
        self.n_slots = n_slots
        self.budget = max(1, step_token_budget)
        self.sample_hook = sample_hook
        self.knobs = mailbox.knobs
        self.spec = speculation or Speculation("off", 1)  # speculative decoding (spec_step.py)
        self.host = HostCache(host_cache_bytes)  # idle prompt caches out of the KV cache
        self.waiting: list[WaitEntry] = []
        self.running: dict[int, Sequence] = {}
        self.slots = [Slot(i) for i in range(n_slots)]
        self.perf = StepPerf()
        self.stats: EngineStats | None = None  # the published snapshot
        self._threads_now = self.knobs.n_threads
        self._step_no = 0
        self.runnable = False  # the last step left something to run without new input
        self._freed = False  # a slot became idle during this step (waiting work may fit now)
        self._off_owed_s = 0.0  # off-duty stepping time owed (knobs.off_threads > 0, duty < 1)
        self._sample_s = self._decode_s = 0.0
        self._batch_tokens = 0  # tokens in the last decoded batch (the step-cost model's x)
        self._totals = [0, 0, 0]  # decoded, prefilled, steps
        self.wakeups = Wakeups()  # consumers' wake-ups, sent once per iteration
        self.embeds = EmbedQueue()  # embedding jobs: at most one batch per iteration

    @property
    def idle(self) -> bool:
        """No waiting or admitted work (read from any thread: a racy but harmless snapshot)."""
        return not (self.waiting or self.running or self.embeds)

    # --- what the engine thread (enginethread.py) drives -------------------------------
    def take(self, mail: Mail) -> None:
        """New work and knobs from the mailbox."""
        if mail.knobs is not None:
            self.knobs = mail.knobs
        for seq in mail.new:
            heapq.heappush(self.waiting, (seq.key, id(seq), seq))
        self.embeds.extend(mail.embeds)

    def context_replaced(self) -> None:
        """A new context was made (with the knobs' threads); the old one's KV went with it."""
        self._threads_now = self.knobs.n_threads
        self.forget_kv()

    def forget_kv(self) -> None:
        for slot in self.slots:
            slot.tokens.clear()
            slot.state = SlotState.IDLE
        self.host.clear()  # unloading is for memory: the stashed caches go with the context

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

    def _view(self, live: Live, with_waiting: bool = True) -> StepView:
        """The plain data `plan_step` decides from (the first waiting requests only: no more
        than the idle slots can take)."""
        n_idle = sum(1 for s in self.slots if s.state is SlotState.IDLE)
        stash = self.host.on and live.share_prefixes
        waiting: tuple[WaitView, ...] = ()
        stashed: tuple[StashView, ...] = ()  # only admissions look at them
        if with_waiting and n_idle and self.waiting:
            wq = self.waiting
            first = sorted(wq) if len(wq) <= n_idle else heapq.nsmallest(n_idle, wq)
            waiting = tuple(WaitView(e[0], len(e[2].prompt), e[2].prompt) for e in first)
            stashed = self.host.views() if stash else ()
        return StepView(
            live.n_ctx, live.batch.capacity, self.budget, tuple(s.view() for s in self.slots),
            tuple(SeqView(sid, q.key, q.n_prompt_left) for sid, q in self.running.items()),
            waiting, self._off_owed_s, *self._draft_view(live), share_prefixes=live.share_prefixes,
            stashed=stashed, stash=stash)

    def _draft_view(self, live: Live) -> DraftView:
        """What the plan needs to give drafts: each decoding sequence's guess (no deeper than the
        context and max_tokens leave room for) and the measured step costs."""
        if not self.spec.on:
            return (), (), 0.0
        cands: list[tuple[int, SeqSpec, int]] = []
        for sid, q in self.running.items():
            if q.spec is not None and q.n_prompt_left == 0 and q.pending_tok >= 0:
                limit = min(live.n_ctx_seq - len(self.slots[sid].tokens) - 1, q.max_tokens - q.n_gen - 1)
                cands.append((sid, q.spec, limit))
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
        t0 = time.perf_counter()
        self._step_no += 1
        if plan.admit and not self._admit(live, plan.admit):
            # a cache could keep fewer tokens than planned: batch the prompts as they now stand
            plan = plan_step(self._view(live, with_waiting=False), self.knobs)
        if not plan.active:
            self.publish(0.0, 0.0, 0, 0)
            return 0.0
        self._sample_s = self._decode_s = 0.0
        if self.spec.on:
            specs = {sid: q.spec for sid, q in self.running.items() if q.spec is not None}
            self.spec.apply(plan.drafts, specs, live.draft, plan.threads)
        chunks = self._decode(live, list(plan.chunks))
        n_dec = n_pre = 0
        for ch in chunks:
            if ch.decode:
                n_dec += 1
            else:
                n_pre += ch.n
            if ch.wants_logits:
                self._sample(live, self.running[ch.seq_id])
        step_s, decode_s = time.perf_counter() - t0, self._decode_s
        self.spec.observe_step(self._batch_tokens, decode_s)
        self.perf.add(step_s, decode_s, self._sample_s, n_dec, n_pre)
        self.publish(step_s, decode_s, n_dec, n_pre)
        return step_s

    # --- admission to slots -----------------------------------------------------------
    def _admit(self, live: Live, admits: tuple[Admit, ...]) -> bool:
        """Give the planned waiting requests their slots; False when a slot kept fewer cached
        tokens than planned (the plan's prompt chunks are then stale)."""
        as_planned = True
        restoring = {a.restore for a in admits if a.restore >= 0}  # kept while others stash
        for a in admits:
            key, _, seq = heapq.heappop(self.waiting)
            assert key == a.key, "the plan admits in admission order"
            try:
                n_keep = self._take_slot(live, a, restoring)
            except BaseException as exc:  # not in `running` yet: fail_all would not reach it
                self._drop_kv(live, self.slots[a.seq_id])  # whatever it holds is unaccounted for
                seq.finish(FinishReason.ERROR, exc if isinstance(exc, EdgeError)
                           else DecodeFailed(-100, f"internal error: {exc}"))
                raise
            slot = self.slots[a.seq_id]
            as_planned = as_planned and n_keep == a.n_keep
            slot.state = SlotState.PREFILL
            slot.last_used = self._step_no
            seq.seq_id, seq.n_done, seq.cached = slot.seq_id, n_keep, n_keep
            seq.wakeups = self.wakeups
            seq.spec = self.spec.state_for(seq.prompt, seq.request.speculative, seq.request.n_draft)
            self.running[slot.seq_id] = seq
            seq.started()  # the request holds a slot now: admission stops counting it as waiting
        return as_planned

    def _take_slot(self, live: Live, a: Admit, restoring: set[int]) -> int:
        """The KV side of one admission: evictions, stashes and the cache the slot starts from.
        Returns the cached tokens kept (fewer than planned when a cache could not be had)."""
        for sid in a.evict:
            self._drop_kv(live, self.slots[sid])
        slot = self.slots[a.seq_id]
        if a.seq_id in a.stash:
            self._stash(live, slot, drop=False, keep=restoring)  # its own cache is not kept whole
        if a.source >= 0:
            n_keep = self._share_prefix(live, slot, self.slots[a.source], a.n_keep)
        elif a.restore >= 0:
            n_keep = self._restore(live, slot, a.restore, a.n_keep)
        else:
            n_keep = self._trim_slot(live, slot, a.n_keep)
        for sid in a.stash:
            if sid != a.seq_id:
                self._stash(live, self.slots[sid], keep=restoring)
        return n_keep

    def _trim_slot(self, live: Live, slot: Slot, n_keep: int) -> int:
        """Remove the slot's KV beyond `n_keep`; fall back to a full clear when llama.cpp cannot
        remove a partial sequence or a sliding-window cache lost positions the tail needs."""
        ctx, n_swa = live.ctx, live.model.n_swa
        if n_keep < len(slot.tokens) and not ctx.seq_rm(slot.seq_id, n_keep, -1):
            n_keep = 0
        if n_keep > 0 and n_swa > 0 and ctx.seq_pos_min(slot.seq_id) > max(0, n_keep - n_swa):
            n_keep = 0
        if n_keep == 0:
            ctx.seq_rm(slot.seq_id, -1, -1)
        del slot.tokens[n_keep:]
        return n_keep

    def _share_prefix(self, live: Live, slot: Slot, source: Slot, n_keep: int) -> int:
        """The slot drops its own cache and owns `source`'s first n_keep cells as well."""
        self._drop_kv(live, slot)
        n_keep = min(n_keep, len(source.tokens))
        if n_keep > 0:
            live.ctx.seq_cp(source.seq_id, slot.seq_id, 0, n_keep)
            slot.tokens.extend(source.tokens[:n_keep])
        return n_keep

    def _stash(self, live: Live, slot: Slot, drop: bool = True, keep: Collection[int] = ()) -> None:
        """Move (or with `drop` False, copy) an idle slot's cache to host memory; one larger
        than the whole budget stays where it is. Entries in `keep` are not pushed out for it."""
        if slot.tokens and live.ctx.seq_state_size(slot.seq_id) <= self.host.budget_bytes:
            self.host.put(slot.tokens, live.ctx.seq_state(slot.seq_id), keep)
            if drop:
                self._drop_kv(live, slot)

    def _restore(self, live: Live, slot: Slot, key: int, n_keep: int) -> int:
        """A stashed cache back as this slot's, cut to its first n_keep cells (0 if it failed)."""
        entry = self.host.take(key)
        self._drop_kv(live, slot)
        if entry is None:  # pushed out since the plan (kept only within one _admit)
            return 0
        if not live.ctx.set_seq_state(slot.seq_id, entry.data):
            log.warning("could not restore a %d-token prompt cache; evaluating the prompt", len(entry.tokens))
            live.ctx.seq_rm(slot.seq_id, -1, -1)
            return 0
        slot.tokens.extend(entry.tokens)
        return self._trim_slot(live, slot, min(n_keep, len(entry.tokens)))

    def _drop_kv(self, live: Live, slot: Slot) -> None:
        live.ctx.seq_rm(slot.seq_id, -1, -1)
        slot.tokens.clear()

    # --- decode ---------------------------------------------------------------------
    def _fill(self, batch: Batch, chunks: list[Chunk]) -> None:
        batch.clear()
        self._batch_tokens = 0
        for ch in chunks:
            seq = self.running[ch.seq_id]
            if ch.decode and seq.spec is not None and seq.spec.draft:
                seq.out_idx = batch.add_tokens(ch.seq_id, [seq.pending_tok, *seq.spec.draft],
                                               len(self.slots[ch.seq_id].tokens))
                self._batch_tokens += len(seq.spec.draft)
            elif ch.decode:
                seq.out_idx = batch.add_token(ch.seq_id, seq.pending_tok, len(self.slots[ch.seq_id].tokens))
            else:
                p0 = seq.n_done
                row = batch.add_prompt(ch.seq_id, seq.prompt[p0 : p0 + ch.n], p0, ch.wants_logits)
                if ch.wants_logits:
                    seq.out_idx = row

    def _decode(self, live: Live, chunks: list[Chunk]) -> list[Chunk]:
        """llama_decode the planned chunks; returns those that made it into the KV cache.

        Status 1 (no KV room): first drop prompt chunks (they retry next step), then fail the
        most recently admitted decoding sequence, until the rest fits. Any other error fails
        exactly the sequences in the batch and clears their KV.
        """
        ctx, batch = live.ctx, live.batch
        while chunks:
            self._fill(batch, chunks)
            self._batch_tokens += sum(ch.n for ch in chunks)
            td = time.perf_counter()
            rc = batch.decode(ctx.ptr)
            self._decode_s += time.perf_counter() - td
            if rc == 0:
                self._commit(chunks)
                return chunks
            if rc == 1 and self._drop_drafts(chunks):
                continue  # without the drafts it may fit
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
                if seq.spec is not None and seq.spec.draft:
                    slot.tokens.extend(seq.spec.draft)  # in the KV now; _verify trims what fails
            else:
                slot.tokens.extend(seq.prompt[seq.n_done : seq.n_done + ch.n])
                seq.n_done += ch.n
                if seq.n_done == len(seq.prompt):
                    slot.state = SlotState.DECODE

    def _drop_drafts(self, chunks: list[Chunk]) -> bool:
        dropped = False
        for ch in chunks:
            sp = self.running[ch.seq_id].spec
            if ch.decode and sp is not None and sp.draft:
                sp.draft = []
                dropped = True
        return dropped

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
                    self._drop_kv(self.res.live, slot)

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
        self._totals[0] += n_dec
        self._totals[1] += n_pre
        self._totals[2] += 1 if step_s > 0 else 0
        knobs = self.knobs
        n_active = 0 if knobs.paused else min(len(self.running), knobs.active_limit)
        n_ctx = self.res.live.n_ctx if self.res.loaded else 0
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
            kv_cells_total=n_ctx,
            n_slots=self.n_slots,
            knobs=knobs,
            total_tokens_decoded=self._totals[0],
            total_tokens_prefilled=self._totals[1],
            total_steps=self._totals[2],
            last_progress_s=self.clock.monotonic(),
            interactive_awaiting_first=sum(1 for q in self.running.values()
                                           if q.request.priority is Priority.INTERACTIVE and q.n_gen == 0),
            **self._embed_counts(),
            speculative=self.spec.mode,
            spec_drafted=self.spec.drafted,
            spec_accepted=self.spec.accepted,
            spec_draft_len=self.spec.last_draft_len,
            flash_attn=self.res.flash_attn,
            attention=self.res.attention,
            prompt_cache_entries=len(self.host.entries),
            prompt_cache_bytes=self.host.used_bytes,
            prompt_cache_restored=self.host.restored,
        )

    def _embed_counts(self) -> dict[str, int]:
        e = self.embeds
        return {"embed_batches": e.batches, "embed_inputs": e.inputs, "chat_steps_with_embed": e.beside_chat}
