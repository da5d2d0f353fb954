"""The engine thread's decisions for one step, as pure functions of plain data.

The plan is authoritative: the step loop (loop.py) only executes it, and what it *decides*
each step is computed here from a frozen `StepView` (which includes the previous step's
`StepOutcome`) and the scheduler's `Knobs`, so tests drive it with no model and `edge sim`
runs the same rules as the engine:

    waiting queue --waiting_for_plan--> the first requests idle slots could take
                  --plan_admissions--> slot (longest cached prefix; stash, evict or keep caches)
    slot holders  --select_active----> active | parked   (Knobs.active_limit)
    active seqs   --plan_batch-------> one batch: 1 token per decoding seq + prompt chunks in the budget
    decoding seqs --draft_room, plan_drafts--> each one's draft length, and the guesses only scored
    knobs         --plan_step--------> this step's threads (duty.py: the pause or off-duty time owed)
    an admission that kept less --StepPlan.without--> its chunk waits for the next plan
    a batch the KV cache refused --plan_kv_retry--> drop drafts, then prompts, then the newest stream
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

# the engine's and edge sim's defaults, defined once there; re-exported for the step's users
from edge.contracts.options import DEFAULT_N_BATCH as N_BATCH  # noqa: F401
from edge.contracts.options import STEP_TOKEN_BUDGET  # noqa: F401
from edge.runtime.spec.rules import DraftAsk, StepCost, choose_drafts
from edge.runtime.step.duty import (  # noqa: F401  (re-exported: one import for the step's rules)
    EMBED_SHARE,
    DutyAfter,
    EmbedTurn,
    duty_after,
    embed_owed_after,
    embed_turn,
)
from edge.runtime.step.slots import (  # noqa: F401  (re-exported)
    CACHE_LOSS_WEIGHT,
    Slot,
    SlotChoice,
    SlotState,
    SlotView,
    StashView,
    choose_slot,
    common_prefix_len,
    eviction_order,
    kv_cells_held,
    kv_cells_used,
    swa_keep,
)
from edge.runtime.types import Knobs, Priority

T = TypeVar("T")


def admission_key(priority: Priority, arrival: int) -> tuple[int, int]:
    """Waiting requests and slot holders are ordered interactive first, then FIFO."""
    return (int(priority), arrival)


@dataclass(frozen=True)
class SeqView:
    """What activation and batch planning need to know about one admitted sequence."""

    seq_id: int
    key: tuple[int, int]  # admission_key
    n_prompt_left: int  # prompt tokens not yet evaluated (0: decoding)


@dataclass(frozen=True)
class WaitView:
    """A waiting request: its admission key and prompt (`prompt` empty where the tokens are not
    known, as in the simulator; `n_prompt` always counts them)."""

    key: tuple[int, int]
    n_prompt: int
    prompt: Sequence[int] = ()


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

    `token_budget` bounds the step's work so a long prompt is spread over steps instead of
    freezing running streams; the batch never exceeds `n_batch`. While an interactive prompt
    is being evaluated no background prompt joins it: that request's first token waits for
    every token in its batch.
    """
    cap = max(1, min(n_batch, token_budget))
    chunks: list[Chunk] = []
    used = 0
    for s in active:
        if s.n_prompt_left == 0 and used < n_batch:
            chunks.append(Chunk(s.seq_id, 0, 1, True, True))
            used += 1
    prompts = sorted((s for s in active if s.n_prompt_left > 0), key=lambda v: v.key)
    if prompts and prompts[0].key[0] == Priority.INTERACTIVE:
        prompts = [s for s in prompts if s.key[0] == Priority.INTERACTIVE]
    for s in prompts:
        room = cap - used
        if room <= 0:
            break
        n = min(room, s.n_prompt_left)
        chunks.append(Chunk(s.seq_id, 0, n, False, n == s.n_prompt_left))
        used += n
    return chunks


# --- one step ------------------------------------------------------------------------


@dataclass(frozen=True)
class StepView:
    """What the engine thread knows before a step, as plain data.

    `waiting` lists the first waiting requests in admission order (no more than the idle
    slots can take); `off_owed_s` is off-duty stepping time owed from earlier steps.
    """

    n_ctx: int  # KV cells in the context, all sequences together
    batch_capacity: int
    token_budget: int
    slots: tuple[SlotView, ...]
    running: tuple[SeqView, ...] = ()
    waiting: tuple[WaitView, ...] = ()
    off_owed_s: float = 0.0
    draft_asks: tuple[DraftAsk, ...] = ()  # decoding sequences' guesses (speculative decoding)
    step_cost: tuple[tuple[int, float], ...] = ()  # measured seconds of a step by batch tokens
    draft_token_s: float = 0.0  # measured seconds of guessing one token (a draft model's decode)
    share_prefixes: bool = False  # slots may share prefix cells (choose_slot)
    stashed: tuple[StashView, ...] = ()  # prompt caches in host memory (kv/hostcache.py)
    stash: bool = False  # idle caches move to host memory when a request takes a slot
    n_swa: int = 0  # sliding-window size of the model's cache (0: none)
    last: StepOutcome | None = None  # what the previous step's execution reported


@dataclass(frozen=True)
class Admit:
    """Give waiting request `key` slot `seq_id`, keeping `n_keep` cached prompt tokens (its own,
    slot `source`'s first n_keep cells, shared, or stashed cache `restore`'s), after dropping
    the prompt caches of the idle slots in `evict`. The idle slots in `stash` move their
    caches to host memory: `seq_id` itself first (when its own cache is not kept whole), the
    others before a restore places its cells (kvops.py says why), or after `source`'s prefix is
    shared."""

    key: tuple[int, int]
    seq_id: int
    n_keep: int
    evict: tuple[int, ...] = ()
    source: int = -1
    restore: int = -1
    stash: tuple[int, ...] = ()


@dataclass(frozen=True)
class StepPlan:
    """One step: `run` False means paused (nothing admitted or decoded)."""

    threads: int
    off_step: bool  # stepping with knobs.off_threads to pay off-duty time owed
    run: bool
    admit: tuple[Admit, ...] = ()
    active: tuple[int, ...] = ()
    parked: tuple[int, ...] = ()
    chunks: tuple[Chunk, ...] = ()
    drafts: tuple[tuple[int, int], ...] = ()  # (seq id, draft tokens verified beside its token)
    shadows: tuple[int, ...] = ()  # decoding seqs whose free guess is scored, not drafted

    def without(self, seq_ids: Iterable[int]) -> tuple[Chunk, ...]:
        """This plan's chunks less those of `seq_ids` (admissions that kept fewer cached
        tokens than planned: their chunk is stale, and the next plan batches them)."""
        drop = set(seq_ids)
        return self.chunks if not drop else tuple(c for c in self.chunks if c.seq_id not in drop)

    @property
    def n_decode(self) -> int:
        return sum(1 for c in self.chunks if c.decode)

    @property
    def n_prefill(self) -> int:
        return sum(c.n for c in self.chunks if not c.decode)


def plan_admissions(view: StepView, knobs: Knobs) -> tuple[list[Admit], list[SeqView]]:
    """Waiting requests to idle slots, in admission order, while each would run now and fits.

    A request needs its uncached prompt plus one cell; idle slots' prompt caches are evicted
    least recently used first to make room, but only when that makes it fit: a request that
    must wait for running sequences to release KV leaves the caches alone. Alone (nothing
    running) it is admitted anyway: the decode then reports the cache as full.
    Returns the admissions and the slot holders after them.
    """
    slots = list(view.slots)
    running = list(view.running)
    holder_keys = [r.key for r in running]
    admits: list[Admit] = []
    for w in view.waiting:
        if w.key[0] == Priority.BACKGROUND and not knobs.admit_background:
            break  # admission order: everything behind it is background too
        if not may_admit(holder_keys, w.key, knobs.active_limit):
            break
        choice = choose_slot(slots, w.prompt, view.share_prefixes, view.stashed, view.stash, view.n_swa)
        if choice is None:
            break
        slot = slots[choice.seq_id]
        need = w.n_prompt + 1
        if choice.source >= 0:  # shared cells cost nothing; the slot's own cache goes
            n_keep = min(choice.n_reuse, slots[choice.source].n_cells)
            freed, need = slot.n_cells, need - n_keep
        elif choice.restore >= 0:  # restored cells are new ones
            n_keep, freed = choice.n_reuse, slot.n_cells
        else:
            n_keep = min(choice.n_reuse, slot.n_cells)
            freed, need = slot.n_cells - n_keep, need - n_keep
        stash: list[int] = []
        if view.stash:  # every idle cache but the one kept leaves the KV cache for host memory
            keep_own = choice.source < 0 and choice.restore < 0 and n_keep == slot.n_cells
            stash = [s.seq_id for s in slots if s.state is SlotState.IDLE and s.n_cells and s.stashable
                     and (s.seq_id != slot.seq_id or not keep_own)]
            freed += sum(slots[sid].n_cells for sid in stash if sid not in (slot.seq_id, choice.source))
        free = view.n_ctx - sum(s.n_cells for s in slots) + freed
        evict: list[int] = []
        for sid in eviction_order(slots):
            if free >= need:
                break
            if sid not in (slot.seq_id, choice.source, *stash):
                free += slots[sid].n_cells
                evict.append(sid)
        if free < need and running:
            break
        for sid in (*evict, *stash):
            slots[sid] = replace(slots[sid], n_cells=0, tokens=())
        slots[slot.seq_id] = replace(slot, state=SlotState.PREFILL, n_cells=n_keep, tokens=())
        admits.append(Admit(w.key, slot.seq_id, n_keep, tuple(evict), choice.source, choice.restore,
                            tuple(stash)))
        holder_keys.append(w.key)
        running.append(SeqView(slot.seq_id, w.key, w.n_prompt - n_keep))
    return admits, running


def step_threads(knobs: Knobs, off_owed_s: float) -> tuple[int, bool]:
    """(threads, off_step): with duty < 1 and off_threads, steps with fewer threads pay back
    the off-duty time the full-thread steps ran up (fewer threads decode more tokens per
    joule where decode is memory-bound; the scheduler picks this from measured figures)."""
    off_step = knobs.off_threads > 0 and knobs.duty < 1.0 and off_owed_s > 0.0
    return (knobs.off_threads if off_step else knobs.n_threads), off_step


def plan_step(view: StepView, knobs: Knobs) -> StepPlan:
    """Everything the engine thread decides before it fills the batch.

    The step token budget bounds how long a prompt chunk stalls running streams; with
    nothing decoding there is nothing to stall, and one big batch evaluates a prompt fastest.
    """
    threads, off_step = step_threads(knobs, view.off_owed_s)
    if knobs.paused or knobs.active_limit == 0:
        return StepPlan(threads, off_step, False, parked=tuple(r.seq_id for r in view.running))
    admits, running = plan_admissions(view, knobs)
    active, parked = select_active(running, knobs.active_limit)
    active_set = set(active)
    run = [v for v in running if v.seq_id in active_set]
    budget = view.token_budget if any(v.n_prompt_left == 0 for v in run) else view.batch_capacity
    chunks = plan_batch(run, view.batch_capacity, budget)
    drafts = plan_drafts(view, knobs, chunks)
    drafted = {sid for sid, _ in drafts}
    shadows = tuple(a.seq_id for a in view.draft_asks if a.free and a.seq_id not in drafted)
    return StepPlan(threads, off_step, True, tuple(admits), tuple(active), tuple(parked), tuple(chunks),
                    drafts, shadows)


def plan_drafts(view: StepView, knobs: Knobs, chunks: Sequence[Chunk]) -> tuple[tuple[int, int], ...]:
    """Each decoding sequence's draft length for this step: none while the scheduler cuts load
    (`knobs.speculate`) or right after the KV cache had no room for a batch, else what
    maximises the product of the step's sequences' expected tokens per second given each
    sequence's acceptance and the measured step cost (`rules.choose_drafts`), within
    what the batch has room for."""
    if not knobs.speculate or not view.draft_asks or (view.last is not None and view.last.kv_full):
        return ()  # after a batch the KV cache refused, no drafts until one fits again
    decoding = {c.seq_id for c in chunks if c.decode}
    asks = [a for a in view.draft_asks if a.seq_id in decoding]
    base = sum(c.n for c in chunks)
    room = view.batch_capacity - base
    out: list[tuple[int, int]] = []
    for sid, n in sorted(choose_drafts(asks, base, StepCost.from_table(view.step_cost),
                                       view.draft_token_s, len(chunks)).items()):
        n = min(n, room)
        if n > 0:
            out.append((sid, n))
            room -= n
    return tuple(out)


def waiting_for_plan(entries: Sequence[T], n_idle: int, key: Callable[[T], tuple[int, int]]) -> list[T]:
    """The waiting requests a plan looks at: the first `n_idle` in admission order (no more
    than the idle slots could take this step)."""
    if n_idle <= 0 or not entries:
        return []
    return sorted(entries, key=key) if len(entries) <= n_idle else heapq.nsmallest(n_idle, entries, key=key)


def draft_room(cap: int, n_ctx_seq: int, n_cells: int, max_tokens: int, n_gen: int) -> int:
    """Most tokens a decoding sequence may draft now: its cap, and no deeper than its context
    and max_tokens leave room for (the pending token and the one after the draft included)."""
    return min(cap, n_ctx_seq - n_cells - 1, max_tokens - n_gen - 1)


@dataclass(frozen=True)
class StepOutcome:
    """What executing a plan reported, for stats and for the next plan (`StepView.last`).

    `short`: admitted sequences whose slot kept fewer cached tokens than planned (a failed
    partial removal or restore), so their chunk waited; `stash_refused`: caches that left
    the KV cache but that host memory did not keep; `decode_rc`: llama_decode's last status
    (1: the KV cache had no room); `failed`: sequences failed to make the batch fit."""

    short: tuple[int, ...] = ()
    stash_refused: int = 0
    decode_rc: int = 0
    failed: tuple[int, ...] = ()

    @property
    def kv_full(self) -> bool:
        return self.decode_rc == 1 or bool(self.failed)


@dataclass(frozen=True)
class KvRetry:
    """How to retry a batch the KV cache had no room for: without drafts, with `chunks` only,
    and with `victim` (-1: none) failed."""

    drop_drafts: bool
    chunks: tuple[Chunk, ...]
    victim: int = -1


def plan_kv_retry(chunks: Sequence[Chunk], drafting: Iterable[int],
                  keys: dict[int, tuple[int, int]]) -> KvRetry:
    """llama_decode found no KV room for the batch (status 1): first drop every draft (they
    retry as plain steps), then the prompt chunks (they retry next step), then fail the most
    recently admitted decoding sequence, until the rest fits."""
    decoding = {c.seq_id for c in chunks if c.decode}
    if decoding & set(drafting):
        return KvRetry(True, tuple(chunks))
    prefill = [c for c in chunks if not c.decode]
    if prefill and len(prefill) < len(chunks):
        return KvRetry(False, tuple(c for c in chunks if c.decode))
    victim = max(chunks, key=lambda c: keys[c.seq_id]).seq_id
    return KvRetry(False, tuple(c for c in chunks if c.seq_id != victim), victim)
