"""The engine thread's step plan (slot choice, eviction, activation, batch, threads, duty,
embeddings share) as pure functions, without a model."""

from __future__ import annotations

from dataclasses import replace

from edge.runtime.step.plan import (
    EMBED_SHARE,
    SeqView,
    Slot,
    SlotChoice,
    SlotState,
    SlotView,
    StashView,
    StepView,
    WaitView,
    admission_key,
    choose_slot,
    common_prefix_len,
    duty_after,
    embed_owed_after,
    embed_turn,
    eviction_order,
    kv_cells_held,
    kv_cells_used,
    may_admit,
    plan_batch,
    plan_step,
    select_active,
)
from edge.runtime.types import Knobs, Priority


def test_common_prefix_len() -> None:
    assert common_prefix_len([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([5, 6], [5, 6, 7]) == 2


def test_choose_slot_prefers_longest_cached_prefix() -> None:
    slots = [Slot(0, [9, 9, 9]), Slot(1, [1, 2, 3, 4, 5]), Slot(2, [1, 2])]
    choice = choose_slot(slots, [1, 2, 3, 4, 7, 8])
    assert choice is not None
    assert (choice.seq_id, choice.n_reuse) == (1, 4)


def test_choose_slot_always_reevaluates_last_prompt_token() -> None:
    slots = [Slot(0, [1, 2, 3, 4])]
    choice = choose_slot(slots, [1, 2, 3])  # prompt fully cached
    assert choice is not None and choice.n_reuse == 2


def test_choose_slot_skips_busy_slots_and_breaks_ties_by_lru() -> None:
    busy = Slot(0, [1, 2, 3], SlotState.DECODE)
    old = Slot(1, [7], last_used=3)
    new = Slot(2, [8], last_used=9)
    choice = choose_slot([busy, new, old], [1, 2, 3, 4])
    assert choice is not None and choice.seq_id == 1 and choice.n_reuse == 0
    assert choose_slot([busy], [1]) is None


def test_select_active_prefers_interactive_then_fifo() -> None:
    seqs = [
        SeqView(0, admission_key(Priority.BACKGROUND, 0), 0),
        SeqView(1, admission_key(Priority.INTERACTIVE, 5), 0),
        SeqView(2, admission_key(Priority.INTERACTIVE, 2), 3),
    ]
    active, parked = select_active(seqs, 2)
    assert active == [2, 1] and parked == [0]
    assert select_active(seqs, 0) == ([], [2, 1, 0])


def test_may_admit_only_when_it_would_run() -> None:
    holders = [admission_key(Priority.BACKGROUND, 0)]
    assert may_admit(holders, admission_key(Priority.INTERACTIVE, 9), 1)  # would preempt background
    assert not may_admit(holders, admission_key(Priority.BACKGROUND, 9), 1)
    assert may_admit(holders, admission_key(Priority.BACKGROUND, 9), 2)


def test_plan_batch_decodes_first_then_chunks_prompts_within_budget() -> None:
    seqs = [
        SeqView(0, (0, 0), 0),  # decoding
        SeqView(1, (0, 1), 300),  # long prompt
        SeqView(2, (0, 2), 10),
        SeqView(3, (0, 3), 0),
    ]
    chunks = plan_batch(seqs, n_batch=512, token_budget=128)
    assert [(c.seq_id, c.n, c.decode) for c in chunks] == [(0, 1, True), (3, 1, True), (1, 126, False)]
    assert not chunks[2].wants_logits  # the prompt is not finished: no logits yet
    assert sum(c.n for c in chunks) == 128


def test_plan_batch_last_chunk_wants_logits_and_respects_n_batch() -> None:
    chunks = plan_batch([SeqView(0, (0, 0), 40), SeqView(1, (0, 1), 40)], n_batch=64, token_budget=1000)
    assert [(c.seq_id, c.n, c.wants_logits) for c in chunks] == [(0, 40, True), (1, 24, False)]


def test_plan_batch_never_starves_decoders_even_over_budget() -> None:
    seqs = [SeqView(i, (0, i), 0) for i in range(6)]
    chunks = plan_batch(seqs, n_batch=512, token_budget=2)
    assert len(chunks) == 6 and all(c.decode and c.wants_logits for c in chunks)


def test_kv_accounting_and_eviction_order() -> None:
    slots = [
        Slot(0, [1, 2, 3], last_used=5),
        Slot(1, [4], SlotState.DECODE),
        Slot(2, [5, 6], last_used=1),
        Slot(3, []),
    ]
    assert kv_cells_used(slots) == 6
    assert kv_cells_held(slots) == 1  # idle caches are reclaimable, not reported as used
    assert eviction_order(slots) == [2, 0]


# --- plan_step: the whole step as a pure function ----------------------------------------

INT, BG = Priority.INTERACTIVE, Priority.BACKGROUND


def _view(slots: list[SlotView], running: tuple[SeqView, ...] = (), waiting: tuple[WaitView, ...] = (),
          n_ctx: int = 1000, budget: int = 64, capacity: int = 512, off_owed_s: float = 0.0) -> StepView:
    return StepView(n_ctx, capacity, budget, tuple(slots), running, waiting, off_owed_s)


def test_plan_admits_to_the_longest_cached_prefix_and_keeps_it() -> None:
    slots = [SlotView(0, n_cells=3, tokens=[9, 9, 9], last_used=1),
             SlotView(1, n_cells=4, tokens=[1, 2, 3, 4], last_used=2)]
    plan = plan_step(_view(slots, waiting=(WaitView((0, 1), 6, [1, 2, 3, 4, 5, 6]),)), Knobs(2, 2))
    assert [(a.seq_id, a.n_keep, a.evict) for a in plan.admit] == [(1, 4, ())]
    assert plan.active == (1,)
    assert [(c.seq_id, c.n, c.decode, c.wants_logits) for c in plan.chunks] == [(1, 2, False, True)]


def test_a_full_cache_evicts_idle_prompt_caches_lru_first_only_as_far_as_needed() -> None:
    slots = [SlotView(0, n_cells=300, tokens=[7] * 300, last_used=5),
             SlotView(1, n_cells=300, tokens=[8] * 300, last_used=1),
             SlotView(2, SlotState.DECODE, n_cells=300),
             SlotView(3)]
    running = (SeqView(2, (0, 0), 0),)
    plan = plan_step(_view(slots, running, (WaitView((0, 9), 200),), n_ctx=1000), Knobs(4, 2))
    (a,) = plan.admit
    assert a.seq_id == 3 and a.n_keep == 0 and a.evict == (1,)  # 100 free + slot 1's 300 >= 201
    assert set(plan.active) == {2, 3}


def test_a_request_that_cannot_fit_beside_running_ones_waits_and_leaves_the_caches_alone() -> None:
    slots = [SlotView(0, n_cells=100, tokens=[7] * 100), SlotView(1, SlotState.DECODE, n_cells=800),
             SlotView(2)]
    plan = plan_step(_view(slots, (SeqView(1, (0, 0), 0),), (WaitView((0, 9), 500),), n_ctx=1000),
                     Knobs(3, 2))
    assert plan.admit == () and plan.active == (1,)
    # alone it is admitted anyway (the decode then reports the cache as full)
    alone = plan_step(_view([SlotView(0)], waiting=(WaitView((0, 9), 5000),), n_ctx=1000), Knobs(1, 2))
    assert [a.seq_id for a in alone.admit] == [0]


def test_admission_stops_at_background_when_not_admitted_and_at_the_active_limit() -> None:
    slots = [SlotView(i) for i in range(4)]
    waiting = (WaitView((int(INT), 1), 10), WaitView((int(BG), 2), 10), WaitView((int(BG), 3), 10))
    assert len(plan_step(_view(slots, waiting=waiting), Knobs(4, 2, admit_background=False)).admit) == 1
    assert len(plan_step(_view(slots, waiting=waiting), Knobs(2, 2)).admit) == 2
    for stopped in (Knobs(2, 2, paused=True), Knobs(0, 2)):
        plan = plan_step(_view(slots, (SeqView(0, (0, 0), 0),), waiting), stopped)
        assert not plan.run and plan.admit == () and plan.chunks == () and plan.parked == (0,)


def test_a_lone_prompt_goes_in_one_batch_and_a_prompt_beside_streams_in_the_budget() -> None:
    slots = [SlotView(0, SlotState.PREFILL), SlotView(1, SlotState.DECODE, n_cells=10)]
    lone = plan_step(_view(slots, (SeqView(0, (0, 1), 300),), budget=64), Knobs(2, 2))
    assert [(c.n, c.wants_logits) for c in lone.chunks] == [(300, True)] and lone.n_prefill == 300
    beside = plan_step(_view(slots, (SeqView(0, (0, 1), 300), SeqView(1, (0, 0), 0)), budget=64), Knobs(2, 2))
    assert beside.n_decode == 1 and beside.n_prefill == 63
    assert [c.wants_logits for c in beside.chunks] == [True, False]


def test_an_interactive_prompt_is_batched_without_background_prompts() -> None:
    slots = [SlotView(i, SlotState.PREFILL) for i in range(3)]
    running = (SeqView(0, (int(BG), 1), 40), SeqView(1, (int(INT), 5), 20), SeqView(2, (int(BG), 2), 0))
    plan = plan_step(_view(slots, running, budget=256), Knobs(3, 2))
    assert [(c.seq_id, c.decode) for c in plan.chunks] == [(2, True), (1, False)]
    # once the interactive prompt is in, background prompts fill the budget again
    done = (running[0], SeqView(1, (int(INT), 5), 0), running[2])
    later = plan_step(_view(slots, done, budget=256), Knobs(3, 2))
    assert (0, False) in [(c.seq_id, c.decode) for c in later.chunks]


def test_parked_sequences_keep_their_slots_and_run_when_the_limit_rises() -> None:
    slots = [SlotView(i, SlotState.DECODE, n_cells=5) for i in range(3)]
    running = tuple(SeqView(i, (int(BG), i), 0) for i in range(3))
    plan = plan_step(_view(slots, running), Knobs(1, 2))
    assert plan.active == (0,) and plan.parked == (1, 2) and plan.n_decode == 1
    assert plan_step(_view(slots, running), Knobs(3, 2)).n_decode == 3


def test_threads_follow_the_knobs_and_off_duty_steps_pay_back_what_is_owed() -> None:
    slots = [SlotView(0, SlotState.DECODE, n_cells=5)]
    running = (SeqView(0, (0, 0), 0),)
    assert plan_step(_view(slots, running), Knobs(1, 1)).threads == 1
    mixed = Knobs(1, 2, duty=0.5, off_threads=1)
    first = plan_step(_view(slots, running), mixed)
    assert (first.threads, first.off_step) == (2, False)
    owed = duty_after(mixed, first.off_step, 0.0, step_s=0.01).off_owed_s
    assert owed == 0.01  # (1 - duty) / duty of the step
    second = plan_step(_view(slots, running, off_owed_s=owed), mixed)
    assert (second.threads, second.off_step) == (1, True)
    assert duty_after(mixed, True, owed, step_s=0.004).off_owed_s == 0.006
    # without off_threads, the rest of the cycle is a pause
    assert duty_after(Knobs(1, 2, duty=0.25), False, 0.0, step_s=0.01).sleep_s == 0.03
    assert duty_after(Knobs(1, 2), False, 0.0, step_s=0.01) == duty_after(Knobs(1, 2), False, 5.0, 0.0)


def test_embeddings_take_at_most_their_share_beside_chat_and_every_step_alone() -> None:
    alone = embed_turn(0.0, chat_s=0.0)
    assert alone.run and not alone.beside_chat
    embed_s, chat_s = 0.25, 0.0625  # binary fractions: the sums below are exact
    owed, ran = embed_owed_after(embed_s), 0
    assert owed == embed_s * (1 - EMBED_SHARE) / EMBED_SHARE
    for _ in range(40):
        t = embed_turn(owed, chat_s)
        assert t.beside_chat
        owed = embed_owed_after(embed_s) if t.run else t.owed_s
        ran += t.run
    assert ran == 10  # one batch per 4 chat steps: embeddings took 10 * 0.25 s of 5 s, their share
    assert ran * embed_s / (ran * embed_s + 40 * chat_s) <= EMBED_SHARE


def test_plan_gives_decoding_sequences_drafts_only_while_speculation_is_allowed() -> None:
    from edge.runtime.spec.rules import DraftAsk

    cost = tuple((n, 0.010 + 0.0002 * (n - 1)) for n in range(1, 20))  # verifying is cheap
    slots = (SlotView(0, SlotState.DECODE, 0, 10), SlotView(1, SlotState.DECODE, 0, 10))
    view = StepView(n_ctx=256, batch_capacity=64, token_budget=32, slots=slots,
                    running=(SeqView(0, (0, 0), 0), SeqView(1, (0, 1), 0)),
                    draft_asks=(DraftAsk(0, 6, 0.9), DraftAsk(1, 6, 0.02)), step_cost=cost)
    plan = plan_step(view, Knobs(2, 2))
    assert dict(plan.drafts) == {0: 6}  # the good guesser drafts, the bad one does not
    assert plan_step(view, Knobs(2, 2, speculate=False)).drafts == ()
    parked = plan_step(view, Knobs(1, 2))  # sequence 1 parked, 0 runs
    assert dict(parked.drafts) == {0: 6}
    tight = StepView(n_ctx=256, batch_capacity=5, token_budget=32, slots=slots, running=view.running,
                     draft_asks=view.draft_asks, step_cost=cost)
    assert dict(plan_step(tight, Knobs(2, 2)).drafts) == {0: 3}  # what the batch has room for


def test_shared_prefixes_come_from_any_slot_running_or_idle() -> None:
    running = Slot(0, [1, 2, 3, 4, 5, 6], SlotState.DECODE)
    empty = Slot(1, [])
    prompt = [1, 2, 3, 4, 9, 9]
    assert choose_slot([running, empty], prompt, share=True) == SlotChoice(1, 4, source=0)
    assert choose_slot([running, empty], prompt) == SlotChoice(1, 0)  # a cache that cannot share
    # a cached document is not overwritten for its template opening: the empty slot shares it
    doc_a = Slot(0, [1, 2, 3, *range(100, 160)], last_used=1)
    assert choose_slot([doc_a, empty], [1, 2, 3, *range(500, 540)], share=True) == SlotChoice(1, 3, 0)
    # a question that leaves the document's cache early shares its start and keeps it whole
    assert choose_slot([doc_a, empty], [1, 2, 3, 100, 101], share=True) == SlotChoice(1, 4, 0)
    # the conversation's next turn continues in its own slot
    turn = [1, 2, 3, *range(100, 160), 7, 8]
    assert choose_slot([doc_a, empty], turn, share=True) == SlotChoice(0, 63)


def test_an_admission_never_evicts_the_slot_it_shares_from() -> None:
    # 16 cells: two idle caches of 6; the new prompt (10 tokens, 3 shared) needs 8 free
    a = SlotView(0, SlotState.IDLE, last_used=1, n_cells=6, tokens=[1, 2, 3, 7, 7, 7])
    b = SlotView(1, SlotState.IDLE, last_used=2, n_cells=6, tokens=[8, 8, 8, 8, 8, 8])
    c = SlotView(2, SlotState.IDLE, last_used=3, n_cells=0)
    view = StepView(16, 32, 32, (a, b, c), waiting=(WaitView((0, 1), 10, [1, 2, 3, *range(20, 27)]),),
                    share_prefixes=True)
    plan = plan_step(view, Knobs(3, 2))
    (adm,) = plan.admit
    assert (adm.seq_id, adm.n_keep, adm.source) == (2, 3, 0)
    assert adm.evict == (1,)  # the least recently used is slot 0, but its cells are being shared


def test_a_stashed_cache_is_restored_where_it_reuses_the_most() -> None:
    empty = Slot(1, [])
    other = Slot(0, [1, 2, 3, *range(100, 110)], last_used=4)
    doc = StashView(7, (1, 2, 3, *range(200, 240)))
    prompt = [1, 2, 3, *range(200, 240), 9, 9]
    choice = choose_slot([other, empty], prompt, share=True, stashed=[doc], stash=True)
    assert choice == SlotChoice(1, 43, restore=7)
    # with stashing, cutting a slot's cache short costs nothing (it is copied out whole first),
    # so its own cells win over sharing them from it
    assert choose_slot([other, empty], [1, 2, 3, 100, 5], share=True, stashed=[doc],
                       stash=True) == SlotChoice(0, 4)
    assert choose_slot([other, empty], [1, 2, 3, 100, 5], share=True) == SlotChoice(1, 4, source=0)


def test_when_a_request_takes_a_slot_every_other_idle_cache_is_stashed() -> None:
    a = SlotView(0, SlotState.IDLE, last_used=1, n_cells=6, tokens=[1, 2, 3, 7, 7, 7])
    b = SlotView(1, SlotState.IDLE, last_used=2, n_cells=5, tokens=[1, 2, 8, 8, 8])
    run = SlotView(2, SlotState.DECODE, last_used=3, n_cells=4, tokens=[1, 2, 3, 4])
    c = SlotView(3, SlotState.IDLE, last_used=0, n_cells=0)
    view = StepView(64, 32, 32, (a, b, run, c), running=(SeqView(2, (0, 0), 0),),
                    waiting=(WaitView((0, 1), 6, [1, 2, 3, 7, 7, 9]),), share_prefixes=True, stash=True)
    (adm,) = plan_step(view, Knobs(4, 2)).admit
    # the prompt continues slot 0's cache except its last cell: slot 0 is copied out whole first
    # (its tail is lost otherwise), then trimmed; slot 1 moves out; the running slot stays
    assert (adm.seq_id, adm.n_keep, adm.stash, adm.evict) == (0, 5, (0, 1), ())
    whole = StepView(64, 32, 32, (a, b, run, c), running=(SeqView(2, (0, 0), 0),),
                     waiting=(WaitView((0, 1), 8, [1, 2, 3, 7, 7, 7, 5, 5]),), share_prefixes=True,
                     stash=True)
    (adm,) = plan_step(whole, Knobs(4, 2)).admit
    assert (adm.seq_id, adm.n_keep, adm.stash) == (0, 6, (1,))  # kept whole: only the other moves


def test_choose_slot_does_not_overwrite_a_cached_document_for_the_template_opening() -> None:
    # every chat prompt starts with the template's opening (here 1, 2, 3): a new document takes
    # the empty slot instead of overwriting the cached conversation about another one
    doc_a = Slot(0, [1, 2, 3, *range(100, 160)], last_used=1)
    empty = Slot(1, [], last_used=5)
    choice = choose_slot([doc_a, empty], [1, 2, 3, *range(500, 540)])
    assert choice is not None and choice.seq_id == 1
    # the same document again still goes back to its cache
    again = choose_slot([doc_a, empty], [1, 2, 3, *range(100, 140), 7, 8])
    assert again is not None and (again.seq_id, again.n_reuse) == (0, 43)
    # with no empty slot, the one whose loss is smallest, keeping what it shares
    doc_b = Slot(1, [1, 2, 3, *range(200, 210)], last_used=5)
    third = choose_slot([doc_a, doc_b], [1, 2, 3, *range(500, 540)])
    assert third is not None and (third.seq_id, third.n_reuse) == (1, 3)


# --- the plan decides what the loop used to: retries, waiting view, draft room, SWA, stashes ----


def test_a_refused_batch_retries_without_drafts_then_prompts_then_fails_the_newest() -> None:
    from edge.runtime.step.plan import Chunk, plan_kv_retry

    keys = {0: (0, 1), 1: (0, 2), 2: (0, 3)}
    dec0, dec1, pre2 = Chunk(0, 0, 1, True, True), Chunk(1, 0, 1, True, True), Chunk(2, 0, 8, False, True)
    first = plan_kv_retry([dec0, dec1, pre2], drafting=[1], keys=keys)
    assert first.drop_drafts and first.chunks == (dec0, dec1, pre2) and first.victim == -1
    second = plan_kv_retry([dec0, dec1, pre2], drafting=[], keys=keys)
    assert not second.drop_drafts and second.chunks == (dec0, dec1) and second.victim == -1
    third = plan_kv_retry([dec0, dec1], drafting=[], keys=keys)
    assert third.chunks == (dec0,) and third.victim == 1  # the most recently admitted goes
    assert plan_kv_retry([pre2], drafting=[], keys=keys).victim == 2  # a lone prompt that cannot fit


def test_the_plan_looks_at_no_more_waiting_requests_than_idle_slots() -> None:
    from edge.runtime.step.plan import waiting_for_plan

    waiting = [(3, "c"), (1, "a"), (2, "b"), (0, "z")]
    assert waiting_for_plan(waiting, 2, key=lambda e: (e[0], 0)) == [(0, "z"), (1, "a")]
    assert waiting_for_plan(waiting, 9, key=lambda e: (e[0], 0)) == sorted(waiting)
    assert waiting_for_plan(waiting, 0, key=lambda e: (e[0], 0)) == []


def test_draft_room_is_bounded_by_cap_context_and_max_tokens() -> None:
    from edge.runtime.step.plan import draft_room

    assert draft_room(16, 4096, 100, 200, 10) == 16
    assert draft_room(16, 110, 100, 200, 10) == 9  # the pending token and one after the draft
    assert draft_room(16, 4096, 100, 200, 195) == 4
    assert draft_room(16, 4096, 100, 200, 199) == 0


def test_a_sliding_window_cache_that_forgot_what_the_tail_needs_is_not_reused() -> None:
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    held = SlotView(0, n_cells=8, tokens=[1, 2, 3, 4, 5, 6, 7, 8], pos_min=5)
    keeps = choose_slot([held], prompt, n_swa=4)
    assert keeps is not None and keeps.n_reuse == 0  # the tail attends back to 4, which is gone
    assert choose_slot([held], prompt, n_swa=3) == SlotChoice(0, 8)  # it attends back to 5 only
    assert choose_slot([held], prompt) == SlotChoice(0, 8)  # no sliding window


def test_a_cache_host_memory_cannot_hold_is_not_planned_as_stashed() -> None:
    big = SlotView(0, n_cells=5, tokens=[1, 2, 3, 10, 11], stashable=False)
    small = SlotView(1, n_cells=3, tokens=[7, 8, 9])
    view = StepView(64, 32, 32, (big, small, SlotView(2)), waiting=(WaitView((0, 1), 3, [4, 5, 6]),),
                    share_prefixes=True, stash=True)
    plan = plan_step(view, Knobs(3, 2))
    assert len(plan.admit) == 1
    a = plan.admit[0]
    assert 0 not in a.stash and 1 in a.stash  # the big cache stays in its slot, not half-planned
    assert a.seq_id != 0  # taking its slot would lose it


def test_an_admission_that_kept_less_leaves_its_chunk_to_the_next_plan() -> None:
    view = StepView(64, 32, 32, (SlotView(0, SlotState.DECODE, n_cells=4), SlotView(1)),
                    running=(SeqView(0, (0, 0), 0),), waiting=(WaitView((0, 1), 5, [1, 2, 3, 4, 5]),))
    plan = plan_step(view, Knobs(2, 2))
    assert {c.seq_id for c in plan.chunks} == {0, 1}
    assert [c.seq_id for c in plan.without([1])] == [0]
    assert plan.without([]) == plan.chunks


def test_no_drafts_right_after_the_kv_cache_refused_a_batch_and_shadows_only_for_free_guesses() -> None:
    from edge.runtime.spec.rules import DraftAsk
    from edge.runtime.step.plan import StepOutcome

    slots = (SlotView(0, SlotState.DECODE, n_cells=10), SlotView(1, SlotState.DECODE, n_cells=10))
    running = (SeqView(0, (0, 0), 0), SeqView(1, (0, 1), 0))
    asks = (DraftAsk(0, 4, 0.9, free=True), DraftAsk(1, 4, 0.01, free=False))
    cost = tuple((n, 0.01 + 0.001 * n) for n in range(1, 12))
    view = StepView(64, 32, 32, slots, running, draft_asks=asks, step_cost=cost)
    plan = plan_step(view, Knobs(2, 2))
    assert dict(plan.drafts).get(0, 0) > 0 and 1 not in dict(plan.drafts)
    assert plan.shadows == ()  # the drafted one is verified; the other's guess is not free
    full = plan_step(replace(view, last=StepOutcome(decode_rc=1)), Knobs(2, 2))
    assert full.drafts == () and full.shadows == (0,)  # its free guess is still scored


def test_with_a_stream_per_sequence_a_slot_next_to_the_running_ones_wins_a_tie() -> None:
    """llama.cpp splits a batch at every gap in the running sequence ids when each sequence has
    its own stream: a new request goes next to the running ones (slot 1, not the least recently
    used slot 2), unless another slot reuses more of its prompt."""
    prompt = [5, 6, 7, 8]
    slots = [Slot(0, [1, 2, 3], SlotState.DECODE, 9), Slot(1, [], SlotState.IDLE, 5),
             Slot(2, [], SlotState.IDLE, 1), Slot(3, [], SlotState.IDLE, 3)]
    assert choose_slot(slots, prompt, n_swa=0).seq_id == 2  # one pool: least recently used
    assert choose_slot(slots, prompt, n_swa=512).seq_id == 1  # streams: next to slot 0
    slots[3] = Slot(3, [5, 6, 7], SlotState.IDLE, 3)
    assert choose_slot(slots, prompt, n_swa=512).seq_id == 3  # its cached prefix still wins
    idle = [Slot(i, [], SlotState.IDLE, u) for i, u in enumerate((4, 2, 7, 6))]
    assert choose_slot(idle, prompt, n_swa=512).seq_id == 1  # nothing running: least recently used
