"""Slot choice, activation and batch planning: the engine's decisions, without a model."""

from __future__ import annotations

from edge.runtime.slots import (
    SeqView,
    Slot,
    SlotState,
    admission_key,
    choose_slot,
    common_prefix_len,
    eviction_order,
    kv_cells_held,
    kv_cells_used,
    may_admit,
    plan_batch,
    select_active,
)
from edge.runtime.types import Priority


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
