"""Slot table, prefix matching, activation and batch planning as pure functions.

The engine thread owns the llama context; everything it *decides* each step is
computed here from plain data, so tests drive it with fakes and no model:

    waiting queue --admission_order--> slot (choose_slot: longest cached prefix)
    slot holders  --select_active-->   active | parked   (Knobs.active_limit)
    active seqs   --plan_batch-->      one batch: 1 token per decoding seq + prompt chunks
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from edge.runtime.types import Priority


class SlotState(str, Enum):
    """IDLE: no request (its KV may still cache a previous prompt). PREFILL: prompt
    being evaluated. DECODE: generating one token per step."""

    IDLE = "idle"
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass
class Slot:
    """One llama.cpp sequence id and the tokens whose KV it holds, in position order."""

    seq_id: int
    tokens: list[int] = field(default_factory=list)
    state: SlotState = SlotState.IDLE
    last_used: int = 0  # step counter when it last served a request (LRU eviction)


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(frozen=True)
class SlotChoice:
    seq_id: int
    n_reuse: int  # prompt tokens whose KV is kept (never the last prompt token)


def choose_slot(slots: Sequence[Slot], prompt: Sequence[int]) -> SlotChoice | None:
    """Pick the idle slot whose cached tokens share the longest prefix with `prompt`.

    Ties (including "no match anywhere") go to the least recently used slot, so a
    cached conversation survives as long as possible. At least the last prompt
    token is always re-evaluated so that the step produces logits for it.
    """
    best: Slot | None = None
    best_n = -1
    for slot in slots:
        if slot.state is not SlotState.IDLE:
            continue
        n = common_prefix_len(slot.tokens, prompt)
        if n > best_n or (n == best_n and best is not None and slot.last_used < best.last_used):
            best, best_n = slot, n
    if best is None:
        return None
    return SlotChoice(best.seq_id, max(0, min(best_n, len(prompt) - 1)))


def admission_key(priority: Priority, arrival: int) -> tuple[int, int]:
    """Waiting requests and slot holders are ordered interactive first, then FIFO."""
    return (int(priority), arrival)


@dataclass(frozen=True)
class SeqView:
    """What activation and batch planning need to know about one admitted sequence."""

    seq_id: int
    key: tuple[int, int]  # admission_key
    n_prompt_left: int  # prompt tokens not yet evaluated (0: decoding)


def select_active(seqs: Sequence[SeqView], active_limit: int) -> tuple[list[int], list[int]]:
    """Split slot holders into (active, parked) seq ids: the best `active_limit` keys run.

    Parked sequences keep their KV and output; they resume when the limit rises
    or when a better-ranked sequence finishes.
    """
    ranked = sorted(seqs, key=lambda s: s.key)
    limit = max(0, active_limit)
    return [s.seq_id for s in ranked[:limit]], [s.seq_id for s in ranked[limit:]]


def may_admit(holder_keys: Sequence[tuple[int, int]], key: tuple[int, int], active_limit: int) -> bool:
    """Admit a waiting request only if it would run now (it ranks within the active limit)."""
    better = sum(1 for k in holder_keys if k < key)
    return better < active_limit


@dataclass(frozen=True)
class Chunk:
    """Tokens of one sequence placed in the batch. `n == 1` and `decode` for a generating seq."""

    seq_id: int
    start: int  # index into the sequence's pending prompt (0 for decode)
    n: int
    decode: bool
    wants_logits: bool  # the last token of this chunk produces logits


def plan_batch(active: Sequence[SeqView], n_batch: int, token_budget: int) -> list[Chunk]:
    """One batch for this step: every decoding sequence gets its token first (streams never
    starve), then prompt chunks in admission order fill what the budget leaves.

    `token_budget` bounds the step's work so a long prompt is spread over steps
    instead of freezing running streams; the batch never exceeds `n_batch`.
    """
    cap = max(1, min(n_batch, token_budget))
    chunks: list[Chunk] = []
    used = 0
    for s in active:
        if s.n_prompt_left == 0 and used < n_batch:
            chunks.append(Chunk(s.seq_id, 0, 1, True, True))
            used += 1
    for s in sorted(active, key=lambda v: v.key):
        if s.n_prompt_left == 0:
            continue
        room = cap - used
        if room <= 0:
            break
        n = min(room, s.n_prompt_left)
        chunks.append(Chunk(s.seq_id, 0, n, False, n == s.n_prompt_left))
        used += n
    return chunks


def kv_cells_used(slots: Sequence[Slot]) -> int:
    """Every cell holding a token, including prompt caches of idle slots."""
    return sum(len(s.tokens) for s in slots)


def kv_cells_held(slots: Sequence[Slot]) -> int:
    """Cells held by admitted requests: what stats report, since idle prompt caches are
    evicted whenever a new request needs the room."""
    return sum(len(s.tokens) for s in slots if s.state is not SlotState.IDLE)


def eviction_order(slots: Sequence[Slot]) -> list[int]:
    """Idle slots that still cache tokens, least recently used first: evicted when KV is short."""
    idle = [s for s in slots if s.state is SlotState.IDLE and s.tokens]
    return [s.seq_id for s in sorted(idle, key=lambda s: s.last_used)]
