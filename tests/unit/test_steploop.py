"""The step loop's execution, the mailbox and residency's keep-alive over fakes: no model.

A fake context records every KV removal and a fake batch what was decoded, so these
tests check what the loop *does* with a plan: trim a reused slot, drop evicted caches,
retry a batch the cache cannot hold, free a cancelled sequence's cells.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from edge.clock import ManualClock
from edge.runtime.engine.handle import RequestHandle
from edge.runtime.engine.mailbox import Mail, Mailbox
from edge.runtime.kv.residency import Live
from edge.runtime.step.loop import StepLoop
from edge.runtime.step.plan import SlotState, admission_key
from edge.runtime.step.sequence import Sequence
from edge.runtime.types import EngineState, FinishReason, GenerationRequest, Knobs, Priority

EOS = 2


@dataclass
class FakeCtx:
    n_ctx: int = 64
    ptr: object = None
    removed: list[tuple[int, int, int]] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)
    shared: list[tuple[int, int, int, int]] = field(default_factory=list)  # seq_cp(src, dst, p0, p1)
    saved: list[int] = field(default_factory=list)  # seq_state(seq)
    restored: list[tuple[int, bytes]] = field(default_factory=list)  # set_seq_state(seq, data)
    restore_ok: bool = True
    state_size: int = 100
    sized: int = 0  # seq_state_size calls
    primed: tuple[int, ...] = ()  # sequence 0's tokens from before the engine (llama/prime.py)
    ops: list[str] = field(default_factory=list)  # every KV call in order: "rm 0", "save 1", "restore 0"

    def settle(self) -> None:
        """No other thread decodes into a fake context."""

    def seq_rm(self, seq_id: int, p0: int, p1: int) -> bool:
        self.removed.append((seq_id, p0, p1))
        self.ops.append(f"rm {seq_id}" if p0 < 0 else f"rm {seq_id} from {p0}")
        return True

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self.shared.append((src, dst, p0, p1))

    def seq_state_size(self, seq_id: int) -> int:
        self.sized += 1
        return self.state_size

    def seq_state(self, seq_id: int) -> bytes:
        self.saved.append(seq_id)
        self.ops.append(f"save {seq_id}")
        return f"cells of {seq_id}, save {len(self.saved)}".encode()

    def set_seq_state(self, seq_id: int, data: bytes) -> bool:
        self.restored.append((seq_id, data))
        self.ops.append(f"restore {seq_id}")
        return self.restore_ok

    def seq_pos_min(self, seq_id: int) -> int:
        return 0

    def set_threads(self, n: int) -> None:
        self.threads.append(n)


class FakeModel:
    n_swa = 0
    n_vocab = 100

    def is_eog(self, tok: int) -> bool:
        return tok == EOS

    def piece(self, tok: int) -> bytes:
        return f"<{tok}>".encode()


@dataclass
class FakeBatch:
    capacity: int = 32
    rc: list[int] = field(default_factory=list)  # scripted llama_decode results (then 0)
    rows: list[tuple[int, int, int]] = field(default_factory=list)  # (seq, token, pos)
    decoded: list[list[tuple[int, int, int]]] = field(default_factory=list)

    def clear(self) -> None:
        self.rows = []

    def add_token(self, seq_id: int, token: int, pos: int) -> int:
        self.rows.append((seq_id, token, pos))
        return len(self.rows) - 1

    def add_tokens(self, seq_id: int, tokens: list[int], pos0: int) -> int:
        self.rows.extend((seq_id, t, pos0 + j) for j, t in enumerate(tokens))
        return len(self.rows) - len(tokens)

    def add_prompt(self, seq_id: int, tokens: list[int], pos0: int, logits_last: bool) -> int:
        self.rows.extend((seq_id, t, pos0 + j) for j, t in enumerate(tokens))
        return len(self.rows) - 1

    def decode(self, ctx_ptr: object) -> int:
        rc = self.rc.pop(0) if self.rc else 0
        if rc == 0:
            self.decoded.append(list(self.rows))
        return rc


class FakeSampler:
    def __init__(self, tokens: list[int]) -> None:
        self.tokens = list(tokens)
        self.freed = False

    def sample(self, ctx_ptr: object, idx: int) -> int:
        return self.tokens.pop(0) if self.tokens else 7

    def free(self) -> None:
        self.freed = True


class FakeResidency:
    def __init__(self, ctx: FakeCtx, batch: FakeBatch, share: bool = False) -> None:
        self.live = Live(FakeModel(), ctx, batch, n_ctx_seq=ctx.n_ctx,  # type: ignore[arg-type]
                         share_prefixes=share)
        self.loaded = True
        self.touched = 0
        self.flash_attn: bool | None = None
        self.attention = "llama.cpp auto"

    def touch(self, t_s: float | None = None) -> None:
        self.touched += 1


def _loop(n_slots: int = 2, budget: int = 8, share: bool = False, host_bytes: int = 0,
          **kw: object) -> tuple[StepLoop, FakeCtx, FakeBatch]:
    ctx, batch = FakeCtx(**kw), FakeBatch()  # type: ignore[arg-type]
    box = Mailbox(Knobs(n_slots, 2))
    box.set_state(EngineState.READY)
    loop = StepLoop(box, FakeResidency(ctx, batch, share), ManualClock(), n_slots,  # type: ignore[arg-type]
                    budget, host_cache_bytes=host_bytes)
    return loop, ctx, batch


_arrival = iter(range(10_000))


def _seq(prompt: list[int], out: list[int], max_tokens: int = 8,
         priority: Priority = Priority.INTERACTIVE) -> Sequence:
    req = GenerationRequest(prompt, max_tokens=max_tokens, priority=priority)
    return Sequence(req, prompt, FakeSampler(out), RequestHandle("r"),  # type: ignore[arg-type]
                    admission_key(priority, next(_arrival)), 0.0)


def _submit(loop: StepLoop, *seqs: Sequence) -> None:
    for s in seqs:
        loop.mailbox.post(s)
    loop.take(loop.mailbox.take(False, lambda: False, lambda: 0.0))


def _run(loop: StepLoop, steps: int = 20) -> None:
    for _ in range(steps):
        if loop.idle:
            return
        loop.iterate(cancels=True)


def test_a_request_runs_to_eos_and_its_slot_keeps_the_kv_as_a_prompt_cache() -> None:
    loop, _ctx, batch = _loop()
    seq = _seq([10, 11, 12], [5, 6, EOS])
    _submit(loop, seq)
    _run(loop)
    assert batch.decoded[0] == [(0, 10, 0), (0, 11, 1), (0, 12, 2)]  # one prompt batch
    assert batch.decoded[1] == [(0, 5, 3)] and batch.decoded[2] == [(0, 6, 4)]
    assert loop.slots[0].tokens == [10, 11, 12, 5, 6] and loop.slots[0].state is SlotState.IDLE
    events = list(seq.handle)
    assert "".join(e.text for e in events) == "<5><6>" and events[-1].finish_reason is FinishReason.STOP
    assert seq.sampler is None  # freed with the final event


def test_a_second_turn_reuses_the_cached_prefix_and_trims_only_the_tail() -> None:
    loop, ctx, batch = _loop()
    _submit(loop, _seq([10, 11, 12], [5, EOS]))
    _run(loop)
    ctx.removed.clear()
    _submit(loop, _seq([10, 11, 12, 5, 20, 21], [EOS]))
    _run(loop)
    assert ctx.removed == []  # the cache [10, 11, 12, 5] is a prefix: nothing to remove
    assert batch.decoded[-1] == [(0, 20, 4), (0, 21, 5)]
    _submit(loop, _seq([10, 11, 12, 5, 20, 99], [EOS]))
    _run(loop)
    assert ctx.removed == [(0, 5, -1)]  # kept [10, 11, 12, 5, 20]; the diverging tail went


def test_a_new_prompt_shares_the_opening_another_slot_holds_instead_of_evaluating_it() -> None:
    loop, ctx, batch = _loop(share=True)
    _submit(loop, _seq([1, 2, 3, 10, 11], [5, 6, EOS]))
    _run(loop)
    ctx.removed.clear()
    _submit(loop, _seq([1, 2, 3, 20, 21], [EOS]))  # same template opening, another document
    _run(loop)
    assert ctx.shared == [(0, 1, 0, 3)]  # the empty slot owns slot 0's first three cells too
    assert batch.decoded[-1] == [(1, 20, 3), (1, 21, 4)]  # only the new part is evaluated
    assert loop.slots[0].tokens == [1, 2, 3, 10, 11, 5, 6]  # the first document's cache stays whole
    assert loop.slots[1].tokens == [1, 2, 3, 20, 21]
    assert (0, 3, -1) not in ctx.removed


def test_without_shared_cells_the_opening_costs_the_other_cache_its_tail() -> None:
    loop, ctx, batch = _loop(share=False)  # a sliding-window or recurrent cache
    _submit(loop, _seq([1, 2, 3, 10, 11], [5, EOS]))
    _run(loop)
    _submit(loop, _seq([1, 2, 3, 20, 21], [EOS]))
    _run(loop)
    # the opening is reused by trimming the first document's cache instead
    assert ctx.shared == [] and (0, 3, -1) in ctx.removed and batch.decoded[-1][0] == (0, 20, 3)


def test_idle_caches_leave_the_kv_cache_for_host_memory_and_come_back() -> None:
    loop, ctx, batch = _loop(share=True, host_bytes=1 << 20)
    _submit(loop, _seq([1, 2, 3, 10, 11], [5, 6, EOS]))  # document A, in slot 0
    _run(loop)
    _submit(loop, _seq([1, 2, 3, 20, 21], [EOS]))  # document B starts like A
    _run(loop)
    # A's cache is copied out whole, then B keeps its first three cells
    assert ctx.saved == [0] and (0, 3, -1) in ctx.removed and batch.decoded[-1] == [(0, 20, 3), (0, 21, 4)]
    assert loop.stats is not None and loop.stats.prompt_cache_entries == 1
    _submit(loop, _seq([1, 2, 3, 10, 11, 5, 6, 30], [EOS]))  # A's next turn: restored, not evaluated
    _run(loop)
    assert ctx.restored == [(1, b"cells of 0, save 1")]  # into the unused slot
    assert batch.decoded[-1] == [(1, 30, 7)]  # only the new token
    assert ctx.saved == [0, 0] and (0, -1, -1) in ctx.removed  # B moved out in its turn
    assert loop.slots[0].tokens == [] and loop.slots[1].tokens == [1, 2, 3, 10, 11, 5, 6, 30]
    assert loop.stats is not None and loop.stats.prompt_cache_restored == 1


def test_idle_caches_leave_before_a_restore_places_its_cells() -> None:
    """llama.cpp places restored cells at its head: restored beside an idle cache about to go,
    they held the unified cache's top cell up, and every step of that sequence attended over
    the departed cache's span (a story after a 1,100-token prompt: 1,109 cells instead of 208)."""
    loop, ctx, _batch = _loop(share=True, host_bytes=1 << 20)
    _submit(loop, _seq([1, 2, 3, 10, 11], [5, EOS]))  # A, slot 0
    _run(loop)
    _submit(loop, _seq([4, 5, 6], [EOS]))  # B, slot 1: A's cache goes to host memory
    _run(loop)
    ctx.ops.clear()
    _submit(loop, _seq([1, 2, 3, 10, 11, 5, 30], [EOS]))  # A's next turn: restored into slot 0
    _run(loop)
    assert ctx.ops == ["save 1", "rm 1", "rm 0", "restore 0"]  # B left before A came back


def test_a_cache_one_admission_restores_survives_another_stashing_its_extension() -> None:
    """Two admissions in one step: the first moves an idle cache out that extends the host entry
    the second restores; the entry must still be there (it was lost: KeyError, a failed step)."""
    loop, _ctx, batch = _loop(share=True, host_bytes=1 << 20)
    for prompt in ([1, 2, 3, 10, 11], [4, 5, 6], [1, 2, 3, 10, 11, 12]):
        _submit(loop, _seq(prompt, [EOS]))
        _run(loop)
    assert sorted(e.tokens for e in loop.host.entries.values()) == [(1, 2, 3, 10, 11), (4, 5, 6)]
    assert loop.slots[0].tokens == [1, 2, 3, 10, 11, 12] and loop.slots[1].tokens == []
    first, second = _seq([4, 5, 6, 7], [8, EOS]), _seq([1, 2, 3, 10, 11, 99], [9, EOS])
    _submit(loop, first, second)
    _run(loop)
    assert first.handle.done and second.handle.done  # (before: the step failed, both hung)
    events = [list(first.handle), list(second.handle)]
    assert [e[-1].finish_reason for e in events] == [FinishReason.STOP, FinishReason.STOP]
    assert "".join(e.text for e in events[1]) == "<9>"
    assert loop.stats is not None and loop.stats.prompt_cache_restored == 3  # [1 .. 11], [4, 5, 6], [1 .. 11]
    rows = [r for d in batch.decoded for r in d]
    assert (0, 99, 5) in rows or (1, 99, 5) in rows  # only the new token of the second one evaluated


def test_a_request_whose_admission_fails_hears_the_error() -> None:
    loop, ctx, _batch = _loop(share=True, host_bytes=1 << 20)
    _submit(loop, _seq([1, 2, 3], [EOS]))
    _run(loop)
    _submit(loop, _seq([4, 5], [EOS]))  # slot 0's cache goes to host memory for this one
    _run(loop)

    def broken(seq_id: int, data: bytes) -> bool:
        raise RuntimeError("restore blew up")

    ctx.set_seq_state = broken  # type: ignore[method-assign]
    seq = _seq([1, 2, 3, 4], [EOS])
    _submit(loop, seq)
    with pytest.raises(RuntimeError):  # the engine thread logs it and fails what runs
        loop.iterate(cancels=True)
    assert seq.handle.done  # (before: it was in neither `waiting` nor `running`, and hung)
    events = list(seq.handle)
    assert events and events[-1].finish_reason is FinishReason.ERROR


def test_a_cache_larger_than_the_host_budget_stays_in_its_slot() -> None:
    loop, ctx, _batch = _loop(share=True, host_bytes=1000, state_size=5000)
    _submit(loop, _seq([1, 2, 3, 10, 11], [EOS]))
    _run(loop)
    _submit(loop, _seq([4, 5, 6], [EOS]))
    _run(loop)
    assert ctx.saved == [] and loop.slots[0].tokens == [1, 2, 3, 10, 11]  # kept, not lost
    assert loop.slots[1].tokens == [4, 5, 6]


def test_a_restore_llama_cpp_refuses_evaluates_the_prompt_instead() -> None:
    loop, ctx, batch = _loop(share=True, host_bytes=1 << 20, restore_ok=False)
    _submit(loop, _seq([1, 2, 3, 10, 11], [EOS]))
    _run(loop)
    _submit(loop, _seq([4, 5, 6], [EOS]))
    _run(loop)
    _submit(loop, _seq([1, 2, 3, 10, 11, 30], [EOS]))
    _run(loop)
    assert len(ctx.restored) == 1 and (0, -1, -1) in ctx.removed
    assert batch.decoded[-1][0] == (0, 1, 0) and len(batch.decoded[-1]) == 6  # the whole prompt


def test_a_full_batch_drops_prompt_chunks_first_then_fails_the_newest_decoder() -> None:
    loop, _ctx, batch = _loop(n_slots=3, budget=16)
    a, b = _seq([1, 3], [5, 5, 5, 5]), _seq([1, 4], [6, 6, 6, 6])
    _submit(loop, a, b)
    loop.iterate(cancels=False)  # both prompts in one batch
    c = _seq([8, 8, 8], [EOS])
    _submit(loop, c)
    batch.rc = [1]  # no KV room for the batch with c's prompt: retried without it
    loop.iterate(cancels=False)
    assert [r[0] for r in batch.decoded[-1]] == [0, 1]
    assert c.seq_id in loop.running and c.n_done == 0  # its prompt waits for the next step
    batch.rc = [1, 1]  # decode tokens alone do not fit either: the newest admitted decoder fails
    loop.iterate(cancels=False)
    assert b.handle.cancel_requested is False and b.seq_id not in loop.running
    assert list(b.handle)[-1].finish_reason is FinishReason.ERROR


def test_a_cancel_frees_the_slot_and_its_kv_cells() -> None:
    loop, ctx, _batch = _loop()
    seq = _seq([10, 11], [5, 5, 5, 5, 5, 5], max_tokens=6)
    _submit(loop, seq)
    loop.iterate(cancels=False)
    loop.iterate(cancels=False)
    seq.handle.cancel()
    loop.iterate(cancels=True)
    assert loop.idle and loop.slots[0].tokens == [] and (0, -1, -1) in ctx.removed
    assert loop.stats is not None and loop.stats.kv_cells_used == 0
    assert list(seq.handle)[-1].finish_reason is FinishReason.CANCELLED


def test_knobs_park_background_and_set_threads_at_the_next_step() -> None:
    loop, ctx, batch = _loop(n_slots=2)
    bg, chat = _seq([1], [5] * 8, priority=Priority.BACKGROUND), _seq([2], [6] * 8)
    _submit(loop, bg, chat)
    loop.iterate(cancels=False)
    loop.take(Mail(knobs=Knobs(1, 1)))
    loop.iterate(cancels=False)
    assert [r[0] for r in batch.decoded[-1]] == [chat.seq_id]  # the background stream is parked
    assert ctx.threads == [1]
    assert loop.stats is not None and (loop.stats.active, loop.stats.parked) == (1, 1)


def test_paused_knobs_run_nothing_and_publish_the_pause() -> None:
    loop, _ctx, batch = _loop()
    _submit(loop, _seq([1, 2], [EOS]))
    loop.take(Mail(knobs=Knobs(1, 2, paused=True)))
    loop.iterate(cancels=False)
    assert batch.decoded == [] and not loop.runnable and len(loop.waiting) == 1


class _TemplateModel(FakeModel):
    vocab_only = False
    bos_id, eos_id = 1, EOS

    def chat_template(self) -> str | None:
        return None

    def token_text(self, tok: int) -> str:
        return ""


@dataclass
class _Ctx(FakeCtx):
    n_batch: int = 16
    n_ctx_seq: int = 32


def test_residency_keep_alive_runs_on_its_own_clock_and_starts_over_after_a_refused_unload() -> None:
    from edge.runtime.kv.residency import LoadSpec, Residency

    clock = ManualClock()
    res = Residency(LoadSpec("m.gguf", 64, 16, 2, "f16"), clock, keep_alive_s=30.0)
    assert not res.loaded and not res.keep_alive_due(idle=True) and res.idle_wait_s() is None
    res.install(_TemplateModel(), _Ctx())  # type: ignore[arg-type]
    try:
        assert res.live.n_ctx_seq == 32 and res.live.n_ctx == 64 and res.live.batch.capacity == 16
        assert res.idle_wait_s() == 1.0
        clock.sleep(29.0)
        assert not res.keep_alive_due(idle=True)
        clock.sleep(1.0)
        assert res.keep_alive_due(idle=True) and not res.keep_alive_due(idle=False)
        res.restart_keep_alive()
        assert not res.keep_alive_due(idle=True)
        res.touch(clock.monotonic() + 40.0)
        clock.sleep(60.0)
        assert not res.keep_alive_due(idle=True)  # due 30 s after the last work, whenever that was
        clock.sleep(10.0)
        assert res.keep_alive_due(idle=True)
    finally:
        res.live.batch.free()


def test_the_mailbox_hands_over_everything_at_once_and_refuses_work_once_draining() -> None:
    import pytest

    from edge.errors import EngineStopped

    box = Mailbox(Knobs(2, 2))
    with pytest.raises(EngineStopped):
        box.ask_unload()  # still LOADING: nothing to unload
    box.set_state(EngineState.READY)
    a, b = _seq([1], [EOS]), _seq([2], [EOS], priority=Priority.BACKGROUND)
    box.post(a)
    box.post(b)
    box.set_knobs(Knobs(1, 1, paused=True))
    assert box.state is EngineState.PAUSED and box.pending() == (2, 1) and not box.quiet()
    box.poke_cancel()
    waiter = box.ask_unload()
    mail = box.take(False, lambda: False, lambda: 0.0)
    assert mail.new == [a, b] and mail.knobs == Knobs(1, 1, paused=True) and mail.cancels
    assert mail.unload_waiters == [waiter] and not mail.stopping
    assert box.pending() == (0, 0) and box.quiet()
    # nothing new: take() returns at once only when the caller has runnable work or a timer is due
    assert box.take(True, lambda: False, lambda: 0.0).new == []
    assert box.take(False, lambda: True, lambda: 0.0).cancels is False
    assert box.begin_drain() and box.state is EngineState.DRAINING
    with pytest.raises(EngineStopped):
        box.post(_seq([3], [EOS]))
    box.ask_stop()
    assert box.take(False, lambda: False, lambda: 0.0).stopping


# --- speculative decoding ------------------------------------------------------------------


def _spec_loop() -> tuple[StepLoop, FakeCtx, FakeBatch]:
    from edge.runtime.spec.state import Speculation

    ctx, batch = FakeCtx(), FakeBatch()
    box = Mailbox(Knobs(2, 2))
    box.set_state(EngineState.READY)
    loop = StepLoop(box, FakeResidency(ctx, batch), ManualClock(), 2, 8,  # type: ignore[arg-type]
                    speculation=Speculation("ngram", 4))
    return loop, ctx, batch


def _spec_seq(prompt: list[int], out: list[int], max_tokens: int = 8) -> Sequence:
    req = GenerationRequest(prompt, max_tokens=max_tokens, speculative=True)
    return Sequence(req, prompt, FakeSampler(out), RequestHandle("r"),  # type: ignore[arg-type]
                    admission_key(Priority.INTERACTIVE, next(_arrival)), 0.0)


def test_a_draft_is_verified_in_one_batch_and_its_rejected_tail_removed() -> None:
    loop, ctx, batch = _spec_loop()
    # prompt "1 2 3 4 1 2": after sampling 3 the drafter guesses 4 1 2 3 (the earlier "1 2 3 ..")
    seq = _spec_seq([1, 2, 3, 4, 1, 2], [3, 4, 1, 9, 5, EOS])
    _submit(loop, seq)
    _run(loop)
    assert batch.decoded[0] == [(0, t, i) for i, t in enumerate([1, 2, 3, 4, 1, 2])]
    # step 2: pending 3 at position 6 plus the draft 4 1 2 3, every row with logits
    assert batch.decoded[1] == [(0, 3, 6), (0, 4, 7), (0, 1, 8), (0, 2, 9), (0, 3, 10)]
    # rows: 4 accepted, 1 accepted, then 9 != 2: the KV of drafted "2 3" (positions 9, 10) goes
    assert (0, 9, -1) in ctx.removed
    assert batch.decoded[2][0] == (0, 9, 9)  # the correction token is the next pending one
    events = list(seq.handle)
    assert "".join(e.text for e in events) == "<3><4><1><9><5>"
    assert loop.slots[0].tokens == [1, 2, 3, 4, 1, 2, 3, 4, 1, 9, 5]  # exactly what the KV holds
    assert loop.stats is not None and loop.stats.spec_drafted >= 4 and loop.stats.spec_accepted >= 2


def test_a_sequence_ending_inside_its_draft_keeps_only_what_it_emitted() -> None:
    loop, ctx, batch = _spec_loop()
    seq = _spec_seq([1, 2, 3, 4, 1, 2], [3, 4, EOS])
    _submit(loop, seq)
    _run(loop)
    assert len(batch.decoded) == 2  # the prompt, then one verify step that ended the request
    assert (0, 8, -1) in ctx.removed  # drafted 1 2 3 after the accepted 4: removed
    assert loop.slots[0].tokens == [1, 2, 3, 4, 1, 2, 3, 4]
    assert list(seq.handle)[-1].finish_reason is FinishReason.STOP


def test_knob_off_means_no_drafts() -> None:
    loop, _ctx, batch = _spec_loop()
    seq = _spec_seq([1, 2, 3, 4, 1, 2], [3, 4, 1, 2, EOS])
    loop.mailbox.set_knobs(Knobs(2, 2, speculate=False))
    _submit(loop, seq)
    assert not loop.knobs.speculate
    _run(loop)
    assert all(len(rows) == 1 for rows in batch.decoded[1:])  # one token per step


def test_a_sliding_window_cache_is_cleared_by_the_plan_not_trimmed() -> None:
    loop, ctx, batch = _loop(n_slots=1)
    loop.res.live.model.n_swa = 2  # type: ignore[misc]
    ctx.seq_pos_min = lambda seq_id: 3  # type: ignore[method-assign]  # the window forgot 0..2
    _submit(loop, _seq([10, 11, 12, 13, 14], [EOS]))
    _run(loop)
    ctx.removed.clear()
    _submit(loop, _seq([10, 11, 12, 13, 99], [EOS]))
    _run(loop)
    assert ctx.removed == [(0, -1, -1)]  # planned with n_keep 0: one full clear, no partial trim
    assert batch.decoded[-1][0] == (0, 10, 0) and len(batch.decoded[-1]) == 5


def test_a_short_admission_is_reported_and_its_prompt_runs_in_the_next_step() -> None:
    loop, _ctx, batch = _loop(share=True, host_bytes=1 << 20, restore_ok=False)
    _submit(loop, _seq([1, 2, 3, 10, 11], [EOS]))
    _run(loop)
    _submit(loop, _seq([4, 5, 6], [EOS]))
    _run(loop)
    n_batches = len(batch.decoded)
    _submit(loop, _seq([1, 2, 3, 10, 11, 30], [EOS]))
    loop.iterate(cancels=False)  # admitted with a restore that failed: nothing else to run
    assert len(loop.outcome.short) == 1 and len(batch.decoded) == n_batches
    loop.iterate(cancels=False)
    assert loop.outcome.short == () and len(batch.decoded[-1]) == 6


def test_a_refused_batch_is_reported_to_the_next_plan() -> None:
    loop, _ctx, batch = _loop(n_slots=3, budget=16)
    a, b = _seq([1, 3], [5, 5, 5, 5]), _seq([1, 4], [6, 6, 6, 6])
    _submit(loop, a, b)
    loop.iterate(cancels=False)
    batch.rc = [1]  # two decoding streams do not fit: the newest fails, the other goes on
    loop.iterate(cancels=False)
    assert loop.outcome.decode_rc == 0 and loop.outcome.failed == (b.seq_id,)
    assert loop.outcome.kv_full
    loop.iterate(cancels=False)
    assert loop.outcome == type(loop.outcome)()  # a clean step reports nothing


def test_an_idle_caches_size_is_asked_of_llama_cpp_once_while_requests_wait() -> None:
    loop, ctx, _batch = _loop(share=True, host_bytes=1 << 20)
    _submit(loop, _seq([1, 2, 3, 10, 11], [EOS]))
    _run(loop)
    loop.mailbox.set_knobs(Knobs(2, 2, paused=True))
    _submit(loop, _seq([4, 5, 6], [EOS]))
    for _ in range(5):  # paused: the request waits, and every step's view looks at slot 0's cache
        loop.iterate(cancels=False)
    assert ctx.sized == 1 and loop.waiting
