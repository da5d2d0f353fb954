"""Speculation on the engine thread: per-sequence drafter state, this step's drafts, the counters.

Before a step the loop asks `view()` for each decoding sequence's guess and hands them to
the plan (`plan.plan_drafts` picks each draft length with `rules.choose_drafts`);
`apply()` cuts the guesses to the planned lengths. Prompt lookup (ngram) guesses before the
plan, for free; a draft model (draft_model.py) costs a decode per guessed token, so it only
offers how many it could guess, and guesses after the plan, exactly the planned lengths. The loop
puts `[pending, *draft]` into the batch with logits on every row, verifies with
`rules.verify` after llama_decode, reports the accepted count to `settle()`, and
removes the rejected tail's KV itself (it owns the context).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from edge.contracts.options import SpeculativeMode
from edge.runtime.spec.rules import (
    Acceptance,
    DraftAsk,
    MatchStats,
    NgramDrafter,
    StepCost,
    spec_cap,
    wants_probe,
)

if TYPE_CHECKING:
    from edge.runtime.spec.draft_model import DraftModel

DraftView = tuple[tuple[DraftAsk, ...], tuple[tuple[int, float], ...], float]


@dataclass
class SeqSpec:
    """One sequence's speculation state."""

    drafter: NgramDrafter  # its tokens are the sequence's so far, the pending one last
    forced: bool  # the request asked for speculation
    cap: int  # most tokens it may draft per step
    acc: Acceptance = field(default_factory=Acceptance)
    guess: list[int] = field(default_factory=list)  # the drafter's guess for this step
    draft: list[int] = field(default_factory=list)  # the planned part of it (verified after decode)
    shadow: list[int] = field(default_factory=list)  # a free guess not drafted, checked as tokens come
    shadow_hit: int = 0  # how many of its tokens came so far
    guess_match: int = 0  # the match length behind the guess (rules.NgramDrafter.match_len)
    draft_match: int = 0  # ... behind the draft
    shadow_match: int = 0  # ... behind the shadow

    def drop_draft(self) -> None:
        """The batch had no KV room with the draft: this step verifies nothing."""
        self.draft = []

    def commit(self, tok: int) -> None:
        """A token was emitted: the drafter learns it, and a pending shadow guess is checked.

        A prompt-lookup guess costs nothing, so one the plan did not draft is still scored
        against the tokens that follow: acceptance is learnt while not drafting, so a
        sequence that stopped drafting after misses resumes as soon as guesses hold again."""
        self.drafter.extend((tok,))
        sh = self.shadow
        if sh:
            if tok == sh[self.shadow_hit]:
                self.shadow_hit += 1
                if self.shadow_hit < len(sh):
                    return
            self.acc.learn(self.shadow_match, len(sh), self.shadow_hit)
            self.shadow, self.shadow_hit = [], 0


class Speculation:
    """The engine's speculation: mode (contracts.options.SPECULATIVE_MODES), k, the step-cost
    model and counters."""

    def __init__(self, mode: SpeculativeMode, k: int) -> None:
        self.mode = mode
        self.k = max(1, k)
        self.cost = StepCost()
        self.matches = MatchStats(Acceptance.SHARED_DECAY)  # acceptance by match length, all sequences
        self.drafted = 0
        self.accepted = 0
        self.last_draft_len = 0.0

    @property
    def on(self) -> bool:
        return self.mode != "off"

    def state_for(self, prompt: list[int], speculative: bool | None, n_draft: int | None) -> SeqSpec | None:
        """Per-sequence state at admission; None when this sequence never speculates (`spec_cap`)."""
        cap = spec_cap(self.on, self.k, speculative, n_draft)
        if cap == 0:
            return None
        return SeqSpec(NgramDrafter(prompt), forced=speculative is True, cap=cap,
                       acc=Acceptance(self.matches))

    def view(self, cands: Iterable[tuple[int, SeqSpec, int]], model: DraftModel | None) -> DraftView:
        """(seq id, state, most tokens it may draft now) -> what the plan chooses from: the
        asks, the measured step costs and the seconds of guessing one token."""
        out: list[DraftAsk] = []
        by_model = self.mode == "draft"
        for sid, sp, limit in cands:
            if by_model:  # a draft model's guesses are learnt as one kind (match length 0)
                sp.guess, sp.guess_match = [], 0
                n = min(sp.cap, limit) if model is not None else 0
            else:
                sp.guess = sp.drafter.draft(min(sp.cap, limit))
                sp.guess_match = sp.drafter.match_len
                n = len(sp.guess)
            if n > 0:
                out.append(DraftAsk(sid, n, sp.acc.rate(sp.guess_match), sp.forced,
                                    probe=wants_probe(sp.acc.steps_since_draft), free=not by_model))
        return tuple(out), self.cost.table(), model.token_s if by_model and model is not None else 0.0

    def apply(self, drafts: tuple[tuple[int, int], ...], specs: Mapping[int, SeqSpec],
              model: DraftModel | None = None, n_threads: int = 0, shadows: tuple[int, ...] = ()) -> None:
        """The plan's draft lengths: cut each guess to its length (0: no draft this step); a
        draft model guesses now, the planned lengths only. The plan's `shadows` keep their
        free guess to score it against the tokens that come (unless one is being scored)."""
        chosen = dict(drafts)
        if self.mode == "draft" and model is not None:
            model.retain(specs)
            if n_threads:
                model.set_threads(n_threads)
            wants = {sid: (sp.drafter.tokens, chosen[sid]) for sid, sp in specs.items() if chosen.get(sid)}
            got = model.draft(wants) if wants else {}
            for sid, sp in specs.items():
                sp.guess = got.get(sid, [])
        scored = set(shadows)
        for sid, sp in specs.items():
            n = chosen.get(sid, 0)
            sp.draft, sp.draft_match = sp.guess[:n], sp.guess_match
            if not n:
                sp.acc.steps_since_draft += 1
            if sid in scored and not sp.shadow:
                sp.shadow, sp.shadow_hit, sp.shadow_match = sp.guess, 0, sp.guess_match
        self.last_draft_len = sum(chosen.values()) / len(specs) if specs else 0.0

    def settle(self, sp: SeqSpec, n_accepted: int) -> None:
        """After verifying `sp.draft`: update the estimate and the counters."""
        n = len(sp.draft)
        if n:
            sp.acc.observe(sp.draft_match, n, n_accepted)
            self.drafted += n
            self.accepted += n_accepted
        sp.draft = []

    def observe_step(self, n_tokens: int, decode_s: float) -> None:
        if self.on:
            self.cost.observe(n_tokens, decode_s)

    def seed(self, curve: Mapping[int, float]) -> None:
        """A verify-cost curve measured apart from the steps (spec/calibration.py): a head start
        for sizes the engine has not measured itself; its own measurements stand."""
        for n, seconds in curve.items():
            if n not in self.cost.by_n and seconds > 0:
                self.cost.seed(n, seconds)
