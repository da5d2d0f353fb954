"""Speculation on the engine thread: per-sequence drafter state, this step's drafts, the counters.

Before a step the loop asks `asks()` for each decoding sequence's guess (the n-gram
drafter's) and hands them to the plan (`stepplan.plan_drafts` picks each draft length with
`speculative.choose_drafts`); `apply()` cuts the guesses to the planned lengths. The loop
puts `[pending, *draft]` into the batch with logits on every row, verifies with
`speculative.verify` after llama_decode, reports the accepted count to `settle()`, and
removes the rejected tail's KV itself (it owns the context).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from edge.runtime.speculative import PROBE_EVERY, Acceptance, DraftAsk, NgramDrafter, StepCost


@dataclass
class SeqSpec:
    """One sequence's speculation state."""

    drafter: NgramDrafter
    forced: bool  # the request asked for speculation
    cap: int  # most tokens it may draft per step
    acc: Acceptance = field(default_factory=Acceptance)
    guess: list[int] = field(default_factory=list)  # the drafter's guess for this step
    draft: list[int] = field(default_factory=list)  # the planned part of it (verified after decode)


class Speculation:
    """The engine's speculation: mode (off / ngram), k, the step-cost model and counters."""

    def __init__(self, mode: str, k: int) -> None:
        self.mode = mode  # "off" or "ngram"
        self.k = max(1, k)
        self.cost = StepCost()
        self.drafted = 0
        self.accepted = 0
        self.last_draft_len = 0.0

    @property
    def on(self) -> bool:
        return self.mode != "off"

    def state_for(self, prompt: list[int], speculative: bool | None, n_draft: int | None) -> SeqSpec | None:
        """Per-sequence state at admission; None when this sequence never speculates."""
        if not self.on or speculative is False or n_draft == 0:
            return None
        cap = self.k if n_draft is None else min(self.k, n_draft)
        return SeqSpec(NgramDrafter(prompt), forced=speculative is True, cap=cap)

    def asks(self, cands: Iterable[tuple[int, SeqSpec, int]]) -> tuple[DraftAsk, ...]:
        """(seq id, state, most tokens it may draft now) -> what the plan chooses from."""
        out: list[DraftAsk] = []
        for sid, sp, limit in cands:
            sp.guess = sp.drafter.draft(min(sp.cap, limit))
            if sp.guess:
                out.append(DraftAsk(sid, len(sp.guess), sp.acc.rate, sp.forced,
                                    probe=sp.acc.steps_since_draft >= PROBE_EVERY))
        return tuple(out)

    def apply(self, drafts: tuple[tuple[int, int], ...], specs: Mapping[int, SeqSpec]) -> None:
        """The plan's draft lengths: cut each guess to its length (0: no draft this step)."""
        chosen = dict(drafts)
        for sid, sp in specs.items():
            n = chosen.get(sid, 0)
            sp.draft = sp.guess[:n]
            if not n:
                sp.acc.steps_since_draft += 1
        self.last_draft_len = sum(chosen.values()) / len(specs) if specs else 0.0

    def settle(self, sp: SeqSpec, n_accepted: int) -> None:
        """After verifying `sp.draft`: update the estimate and the counters."""
        n = len(sp.draft)
        if n:
            sp.acc.observe(n, n_accepted)
            self.drafted += n
            self.accepted += n_accepted
        sp.draft = []

    def observe_step(self, n_tokens: int, decode_s: float) -> None:
        if self.on:
            self.cost.observe(n_tokens, decode_s)
