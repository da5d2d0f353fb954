"""The engine thread's decisions for one step, as pure functions of plain data.

The step loop (steploop.py) only executes; what it *decides* each step is computed
here from a frozen `StepView` and the scheduler's `Knobs`, so tests drive it with no
model and `edge sim` runs the same rules as the engine:

    waiting queue --plan_admissions--> slot (longest cached prefix; LRU prompt caches evicted for room)
    slot holders  --select_active----> active | parked   (Knobs.active_limit)
    active seqs   --plan_batch-------> one batch: 1 token per decoding seq + prompt chunks in the budget
    decoding seqs --plan_drafts------> each one's draft length (speculative decoding; speculative.py)
    knobs         --plan_step--------> this step's threads; `duty_after`: the pause or off-duty time owed
    embeddings    --embed_turn-------> beside chat, a batch only once chat has had its share of the time
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from edge.runtime.speculative import DraftAsk, StepCost, choose_drafts
from edge.runtime.types import Knobs, Priority

EMBED_SHARE = 0.5  # of the engine's time embeddings may take while chat sequences run
STEP_TOKEN_BUDGET = 256  # tokens one step evaluates beside running streams (the engine's default)
N_BATCH = 512  # llama_decode batch capacity (settings.n_batch's default)


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

    def view(self) -> SlotView:
        return SlotView(self.seq_id, self.state, self.last_used, len(self.tokens), self.tokens)


@dataclass(frozen=True)
class SlotView:
    """A slot as a plan sees it: `n_cells` KV cells held; `tokens` are those cells' tokens for
    prefix matching (empty where they are not known: the simulator, which caches no prompts)."""

    seq_id: int
    state: SlotState = SlotState.IDLE
    last_used: int = 0
    n_cells: int = 0
    tokens: Sequence[int] = ()


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


def choose_slot(slots: Sequence[Slot | SlotView], prompt: Sequence[int], share: bool = False,
                stashed: Sequence[StashView] = (), stash: bool = False) -> SlotChoice | None:
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
    slot.
    """
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
    best: tuple[float, int, int] | None = None
    best_choice: SlotChoice | None = None
    for slot in slots:
        if slot.state is not SlotState.IDLE:
            continue
        own = min(common_prefix_len(slot.tokens, prompt), cap)
        held = 0 if stash else len(slot.tokens)  # what is lost when the slot's own cache goes
        options = [(own, 2, SlotChoice(slot.seq_id, own), held - (0 if stash else own))]
        if shared > own:
            options.append((shared, 1, SlotChoice(slot.seq_id, shared, source=src), held))
        if restored > max(own, shared):
            options.append((restored, 0, SlotChoice(slot.seq_id, restored, restore=key), held))
        for reuse, kind, choice, lost in options:
            rank = (reuse - CACHE_LOSS_WEIGHT * lost, kind, -slot.last_used)
            if best is None or rank > best:
                best, best_choice = rank, choice
    return best_choice


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


def kv_cells_used(slots: Sequence[Slot]) -> int:
    """Every cell holding a token, including prompt caches of idle slots."""
    return sum(len(s.tokens) for s in slots)


def kv_cells_held(slots: Sequence[Slot]) -> int:
    """Cells held by admitted requests: what stats report, since idle prompt caches are
    evicted whenever a new request needs the room."""
    return sum(len(s.tokens) for s in slots if s.state is not SlotState.IDLE)


def eviction_order(slots: Sequence[Slot | SlotView]) -> list[int]:
    """Idle slots that still cache tokens, least recently used first: evicted when KV is short."""
    idle = [s for s in slots if s.state is SlotState.IDLE and _cells(s)]
    return [s.seq_id for s in sorted(idle, key=lambda s: s.last_used)]


def _cells(s: Slot | SlotView) -> int:
    return s.n_cells if isinstance(s, SlotView) else len(s.tokens)


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
    stashed: tuple[StashView, ...] = ()  # prompt caches in host memory (hostcache.py)
    stash: bool = False  # idle caches move to host memory when a request takes a slot


@dataclass(frozen=True)
class Admit:
    """Give waiting request `key` slot `seq_id`, keeping `n_keep` cached prompt tokens (its own,
    slot `source`'s first n_keep cells, shared, or stashed cache `restore`'s), after dropping
    the prompt caches of the idle slots in `evict`. The idle slots in `stash` move their
    caches to host memory: `seq_id` itself first (when its own cache is not kept whole), the
    others once the new sequence has its prefix."""

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
        choice = choose_slot(slots, w.prompt, view.share_prefixes, view.stashed, view.stash)
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
            stash = [s.seq_id for s in slots if s.state is SlotState.IDLE and s.n_cells
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
    return StepPlan(threads, off_step, True, tuple(admits), tuple(active), tuple(parked), tuple(chunks),
                    drafts)


def plan_drafts(view: StepView, knobs: Knobs, chunks: Sequence[Chunk]) -> tuple[tuple[int, int], ...]:
    """Each decoding sequence's draft length for this step: none while the scheduler cuts load
    (`knobs.speculate`), else what maximises the step's expected tokens per second given each
    sequence's acceptance and the measured step cost (`speculative.choose_drafts`), within
    what the batch has room for."""
    if not knobs.speculate or not view.draft_asks:
        return ()
    decoding = {c.seq_id for c in chunks if c.decode}
    asks = [a for a in view.draft_asks if a.seq_id in decoding]
    base = sum(c.n for c in chunks)
    room = view.batch_capacity - base
    out: list[tuple[int, int]] = []
    for sid, n in sorted(choose_drafts(asks, base, StepCost.from_table(view.step_cost),
                                            view.draft_token_s).items()):
        n = min(n, room)
        if n > 0:
            out.append((sid, n))
            room -= n
    return tuple(out)


# --- after a step ----------------------------------------------------------------------


@dataclass(frozen=True)
class DutyAfter:
    sleep_s: float  # idle for the rest of the duty cycle (no off_threads)
    off_owed_s: float  # off-duty stepping time still owed (with off_threads)


def duty_after(knobs: Knobs, off_step: bool, off_owed_s: float, step_s: float) -> DutyAfter:
    """What a step of `step_s` leaves owed under duty < 1: a pause, or off-thread steps."""
    mixed = knobs.off_threads > 0 and knobs.duty < 1.0
    if step_s <= 0:
        return DutyAfter(0.0, off_owed_s if mixed else 0.0)
    rest_s = step_s * (1.0 - knobs.duty) / knobs.duty
    if mixed:
        return DutyAfter(0.0, max(0.0, off_owed_s - step_s if off_step else rest_s))
    return DutyAfter(rest_s if knobs.duty < 1.0 else 0.0, 0.0)


@dataclass(frozen=True)
class EmbedTurn:
    run: bool  # an embeddings batch runs now
    beside_chat: bool  # chat ran this step (the batch delays it)
    owed_s: float  # chat time still owed before the next batch (when not running now)


def embed_turn(owed_s: float, chat_s: float) -> EmbedTurn:
    """Beside running chat, embeddings get at most EMBED_SHARE of the engine's time: a batch
    (about a prompt chunk's work) runs only once chat steps have had their share since the
    last one, so a chat stalls one batch at a time and at most that often. Alone, they run
    every step."""
    if chat_s <= 0:
        return EmbedTurn(True, False, 0.0)
    owed_s -= chat_s
    return EmbedTurn(owed_s <= 0, True, owed_s)


def embed_owed_after(embed_s: float) -> float:
    """Chat time owed after an embeddings batch beside chat that took `embed_s`."""
    return embed_s * (1.0 - EMBED_SHARE) / EMBED_SHARE
