"""Slots and the prompt caches they hold, and which idle slot a new prompt takes.

A slot is one llama.cpp sequence id; after its request ends its KV cells stay as a
prompt cache until a later prompt reuses, shares, stashes (host memory) or evicts them.
`choose_slot` is the rule for a new prompt; `eviction_order` for when KV is short.
Pure functions of plain data: the step plan (plan.py) and `edge sim` both call them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from edge.kvcache import per_sequence_streams


class SlotState(str, Enum):
    """IDLE: no request (its KV may still cache a previous prompt). PREFILL: prompt
    being evaluated. DECODE: generating one token per step."""

    IDLE = "idle"
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass
class Slot:
    """One llama.cpp sequence id and the tokens whose KV it holds, in position order (the
    step loop's own table; `SlotView` is what a plan reads)."""

    seq_id: int
    tokens: list[int] = field(default_factory=list)
    state: SlotState = SlotState.IDLE
    last_used: int = 0  # step counter when it last served a request (LRU eviction)

    def view(self, pos_min: int = 0, stashable: bool = True) -> SlotView:
        return SlotView(self.seq_id, self.state, self.last_used, len(self.tokens), self.tokens,
                        pos_min, stashable)


@dataclass(frozen=True)
class SlotView:
    """A slot as a plan sees it: `n_cells` KV cells held; `tokens` are those cells' tokens for
    prefix matching (empty where they are not known: the simulator, which caches no prompts).
    For an idle slot while requests wait: `pos_min`, the first position its cache still holds
    (a sliding-window cache forgets old ones), and `stashable`, whether host memory can take
    its cache at all (a cache larger than the whole host budget stays in its slot)."""

    seq_id: int
    state: SlotState = SlotState.IDLE
    last_used: int = 0
    n_cells: int = 0
    tokens: Sequence[int] = ()
    pos_min: int = 0
    stashable: bool = True


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(frozen=True)
class StashView:
    """A prompt cache moved to host memory (hostcache.py): restorable into an empty slot."""

    key: int
    tokens: Sequence[int]


@dataclass(frozen=True)
class SlotChoice:
    seq_id: int
    n_reuse: int  # prompt tokens whose KV is kept (never the last prompt token)
    source: int = -1  # the slot whose first n_reuse cells it shares (llama_memory_seq_cp); -1: its own
    restore: int = -1  # the stashed cache restored into it first (StashView.key); -1: none


CACHE_LOSS_WEIGHT = 0.5  # a cached token overwritten counts half a prompt token reused now


def swa_keep(n_keep: int, pos_min: int, n_swa: int) -> int:
    """Cached tokens a slot can keep: none once a sliding-window cache (`n_swa` > 0) has
    forgotten positions that the tokens after `n_keep` still attend to."""
    if n_keep > 0 and n_swa > 0 and pos_min > max(0, n_keep - n_swa):
        return 0
    return n_keep


def choose_slot(slots: Sequence[Slot | SlotView], prompt: Sequence[int], share: bool = False,
                stashed: Sequence[StashView] = (), stash: bool = False, n_swa: int = 0) -> SlotChoice | None:
    """Pick the idle slot that best serves `prompt`: the most prompt tokens reused now, less
    half of the cached tokens its tail overwrites (CACHE_LOSS_WEIGHT).

    Every chat prompt shares its template's opening with every cached one, so "the longest
    common prefix" alone took a slot holding another document's conversation for a 45-token
    match while an empty slot stood by, and the next question on that document found its
    cache gone (bench `summarise`: 1 of 5 requests reused its prompt, llama-server 2 of 5).
    A real continuation or a repeated document still wins: it reuses most of what it
    overwrites. Ties (including "nothing shared") go to the least recently used slot, so a
    cached conversation survives as long as possible. At least the last prompt token is
    always re-evaluated so that the step produces logits for it.

    With `share` (a KV cache whose cells several sequences may own: llama.cpp's unified cache
    without a sliding window), the longest prefix held by *any* slot, running ones included,
    is reused wherever the prompt goes: its cells are shared, not copied
    (`llama_memory_seq_cp`), so the empty slot gets the template's opening and system prompt
    for free and no cell is spent twice. A cache in host memory (`stashed`) that starts like
    the prompt is restored instead where it reuses more. With `stash` a slot's own cache that
    is not kept moves to host memory rather than being lost. On a tie: a slot's own cache,
    then a shared prefix, then a restored one (it costs a copy); then the least recently used
    slot. A sliding-window cache keeps its tokens only while it still holds what they need
    (`swa_keep`). With a KV stream per sequence (`per_sequence_streams`) a slot next to the
    running ones wins a tie first: llama.cpp splits a step at every gap in the running ids.
    """
    slots = _views(slots)
    running = sorted(s.seq_id for s in slots if s.state is not SlotState.IDLE)
    streams = per_sequence_streams(n_swa)
    cap = max(0, len(prompt) - 1)
    src, shared = -1, 0
    if share:
        for slot in slots:
            n = min(common_prefix_len(slot.tokens, prompt), cap)
            if n > shared:
                src, shared = slot.seq_id, n
    key, restored = -1, 0
    for e in stashed:
        n = min(common_prefix_len(e.tokens, prompt), cap)
        if n > restored:
            key, restored = e.key, n
    best: tuple[float, int, bool, int] | None = None
    best_choice: SlotChoice | None = None
    for slot in slots:
        if slot.state is not SlotState.IDLE:
            continue
        own = swa_keep(min(common_prefix_len(slot.tokens, prompt), cap), slot.pos_min, n_swa)
        held = 0 if stash and slot.stashable else len(slot.tokens)  # lost when its own cache goes
        options = [(own, 2, SlotChoice(slot.seq_id, own), held - (0 if held == 0 else own))]
        if shared > own:
            options.append((shared, 1, SlotChoice(slot.seq_id, shared, source=src), held))
        if restored > max(own, shared):
            options.append((restored, 0, SlotChoice(slot.seq_id, restored, restore=key), held))
        joins = streams and (not running or slot.seq_id in (running[0] - 1, running[-1] + 1))
        for reuse, kind, choice, lost in options:
            rank = (reuse - CACHE_LOSS_WEIGHT * lost, kind, joins, -slot.last_used)
            if best is None or rank > best:
                best, best_choice = rank, choice
    return best_choice


def kv_cells_used(slots: Sequence[Slot]) -> int:
    """Every cell holding a token, including prompt caches of idle slots."""
    return sum(len(s.tokens) for s in slots)


def kv_cells_held(slots: Sequence[Slot]) -> int:
    """Cells held by admitted requests: what stats report, since idle prompt caches are
    evicted whenever a new request needs the room."""
    return sum(len(s.tokens) for s in slots if s.state is not SlotState.IDLE)


def eviction_order(slots: Sequence[Slot | SlotView]) -> list[int]:
    """Idle slots that still cache tokens, least recently used first: evicted when KV is short."""
    idle = [s for s in _views(slots) if s.state is SlotState.IDLE and s.n_cells]
    return [s.seq_id for s in sorted(idle, key=lambda s: s.last_used)]


def _views(slots: Sequence[Slot | SlotView]) -> list[SlotView]:
    return [s.view() if isinstance(s, Slot) else s for s in slots]
