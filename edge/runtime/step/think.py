"""One sequence's think block on the engine thread: its split, its token count, its budget.

A request with a `ReasoningSpec` gets a `ThinkState`. Every token it takes goes through
`take` (after stop strings: the split of what the client sees) and is counted as reasoning
while the block is open, the token that completes the close marker included (a block the
prompt opened counts from the first token; otherwise the tokens that spelt the open marker
count once it is complete). At the budget the engine ends the block itself: `next_forced`
hands the close marker's tokens (`Markers.force_close`, tokenized at submit) one per step in
place of sampling, so they enter the model's context like its own and the model answers
after them. So reasoning tokens <= budget + the close marker's tokens, to the token. While
those tokens are due the sequence offers no draft (the loop asks `due`).
"""

from __future__ import annotations

from collections.abc import Callable

from edge.runtime.text.reasoning import Phase, ReasoningParser, ReasoningSpec, Split


class ThinkState:
    __slots__ = ("_forced", "_n_start", "budget", "close_tokens", "closing", "n_tokens", "parser", "special")

    def __init__(self, spec: ReasoningSpec, close_tokens: list[int]) -> None:
        self.parser = ReasoningParser(spec.markers, spec.started, spec.keep_markers)
        self.budget = spec.budget_tokens  # None: no cap
        self.close_tokens = close_tokens
        self.special = spec.markers.special  # render control-token pieces (harmony's markers are)
        self.n_tokens = 0  # reasoning tokens so far
        self.closing = False  # the engine began closing the block
        self._forced: list[int] = []
        self._n_start = 0  # tokens taken before the block opened (counted if it does)

    @property
    def due(self) -> bool:
        """The block is open and its budget spent: the close marker comes next."""
        return bool(self._forced) or (not self.closing and self.budget is not None
                                      and self.parser.in_reasoning and self.n_tokens >= self.budget)

    def next_forced(self) -> int | None:
        """The next close-marker token to take instead of sampling (None: sample as usual)."""
        if not self.due:
            return None
        if not self.closing:
            self.closing = True
            self._forced = list(self.close_tokens)
        return self._forced.pop(0) if self._forced else None

    def take(self, text: str) -> Split:
        """One token's text (after stop strings) -> what of it is content and reasoning."""
        was = self.parser.phase
        out = self.parser.feed(text)
        now = self.parser.phase
        if was is Phase.REASONING or now is Phase.REASONING:
            self.n_tokens += 1 + (self._n_start if was is Phase.START else 0)
            self._n_start = 0
        elif now is Phase.START:
            self._n_start += 1
        return out

    def finish(self, tail: str) -> Split:
        """The end of the output: the last held text, then whatever the parser held back."""
        a = self.parser.feed(tail) if tail else Split("", "")
        b = self.parser.finish()
        return Split(a.content + b.content, a.reasoning + b.reasoning)


def think_state(spec: ReasoningSpec | None, tokenize: Callable[[str], list[int]]) -> ThinkState | None:
    """The state for a request's spec (None: the request does not split reasoning)."""
    if spec is None:
        return None
    return ThinkState(spec, tokenize(spec.markers.force_close) if spec.budget_tokens is not None else [])
