"""Speculative decoding's pure parts: the n-gram drafter, the acceptance rule, the draft-length chooser.

One verify step puts a sequence's pending token and `d` drafted tokens into the batch with
logits on every row; row i holds the target's distribution for the token after draft[:i].

Acceptance (`verify`): the sequence's own sampler chain samples row 0; while the sampled
token equals the draft token, the next row is sampled; the first token that differs (or the
bonus token after a fully accepted draft) is the last emitted. The drafters here are
deterministic (prompt lookup, a draft model decoding greedily), so the draft distribution q
is a point mass on the drafted token x, and the standard speculative-sampling rule (accept x
with probability min(1, p(x)/q(x)), else sample from norm(max(0, p - q))) reduces to: accept
x with probability p(x), else sample from p with x removed and renormalised. Sampling t ~ p
and accepting iff t == x is exactly that: P(t == x) = p(x), and t given t != x is p without x,
renormalised. So the output distribution is unchanged, greedy output is identical, and every
emitted token went through the chain (`llama_sampler_sample` accepts it), so penalties and
grammar state see exactly the emitted text. With a fixed seed the chain's random draws line
up one per emitted token too, so seeded sampling gives the same text (up to float noise from
batched evaluation).

The chooser (`choose_drafts`) gives each decoding sequence a draft allowance for this step:
the expected tokens per second of the whole step, from each sequence's acceptance estimate
(`Acceptance`) and the measured cost of a step as a function of its batch tokens
(`StepCost`), is maximised greedily one drafted token at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

NGRAM_MIN = 2  # a single-token match guesses too often to pay
NGRAM_MAX = 4


class NgramDrafter:
    """Prompt lookup: the last n tokens (n = NGRAM_MAX down to NGRAM_MIN) are looked up in a
    table of every n-gram the sequence has seen (prompt and output so far), and the tokens
    that followed their most recent earlier occurrence are the draft.

    The table is per sequence and grows incrementally as tokens are committed (`extend`).
    """

    __slots__ = ("n_max", "n_min", "table", "tokens")

    def __init__(self, tokens: Sequence[int] = (), n_min: int = NGRAM_MIN, n_max: int = NGRAM_MAX) -> None:
        self.n_min, self.n_max = max(1, n_min), max(n_min, n_max)
        self.tokens: list[int] = []
        self.table: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token that followed it
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        toks, table = self.tokens, self.table
        for t in tokens:
            i = len(toks)  # t's index: every n-gram ending just before it is followed by it
            for n in range(self.n_min, self.n_max + 1):
                if i >= n:
                    table[tuple(toks[i - n : i])] = i
            toks.append(t)

    def draft(self, k: int) -> list[int]:
        """Up to `k` tokens guessed to follow the sequence (empty: no match)."""
        toks = self.tokens
        if k <= 0:
            return []
        for n in range(self.n_max, self.n_min - 1, -1):
            if len(toks) <= n:
                continue
            start = self.table.get(tuple(toks[-n:]))
            if start is not None:
                return toks[start : start + k]
        return []


def verify(draft: Sequence[int], sample_row: Callable[[int], int], take: Callable[[int], bool]) -> int:
    """Run the acceptance rule over rows 0..len(draft); returns how many draft tokens were accepted.

    `sample_row(i)` samples the target's row i with the sequence's sampler; `take(token)`
    emits one token and says whether the sequence goes on (False after an end token, a stop
    string, max_tokens). Rows are sampled in order, and never past the first token not taken
    or not equal to its draft token, so the sampler sees exactly the emitted tokens.
    """
    for i, d in enumerate(draft):
        t = sample_row(i)
        if not take(t) or t != d:
            return i
    take(sample_row(len(draft)))
    return len(draft)


class Acceptance:
    """Per-sequence estimate of the chance that a drafted token is accepted.

    Geometric model: each drafted token is accepted with probability `a` while all before
    it were. The estimate is the discounted maximum-likelihood one, accepted / (accepted +
    rejections), starting from a prior worth a few observations.

    Kept twice, by whether the sequence's last draft was accepted whole: acceptance comes in
    runs (a copied passage is guessed right token after token; where the answer leaves the
    prompt, guesses fail at once), so after a whole accept the next draft is far likelier to
    hold than one average says (Qwen2.5 0.5B rewriting code: 51 of 81 drafts accepted whole,
    most others at once rejected). `rate` is the estimate for the state the sequence is in.
    """

    __slots__ = ("accepted", "drafted", "misses", "n_acc", "state", "steps_since_draft")

    DECAY = 0.9
    PRIOR_A = 0.5
    PRIOR_WEIGHT = 2.0

    def __init__(self) -> None:
        # per state (0: the last draft was cut short or there was none yet, 1: accepted whole)
        self.n_acc = [self.PRIOR_A * self.PRIOR_WEIGHT] * 2  # discounted accepted tokens
        self.misses = [(1 - self.PRIOR_A) * self.PRIOR_WEIGHT] * 2  # discounted drafts that stopped early
        self.state = 0
        self.drafted = self.accepted = 0  # plain totals, for metrics
        self.steps_since_draft = 0

    @property
    def rate(self) -> float:
        s = self.state
        return self.n_acc[s] / (self.n_acc[s] + self.misses[s])

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        """A verified draft."""
        self.drafted += n_drafted
        self.accepted += n_accepted
        self.learn(n_drafted, n_accepted)

    def learn(self, n_drafted: int, n_accepted: int) -> None:
        """A guess checked against what was emitted (verified, or a shadow: see SeqSpec)."""
        s = self.state
        self.n_acc[s] = self.n_acc[s] * self.DECAY + n_accepted
        self.misses[s] = self.misses[s] * self.DECAY + (1.0 if n_accepted < n_drafted else 0.0)
        self.state = 1 if n_accepted == n_drafted else 0
        self.steps_since_draft = 0


class StepCost:
    """Measured seconds of a decode step as a function of its batch tokens.

    An exponential average per batch size; a size not yet seen is interpolated from its
    measured neighbours, or extrapolated from the largest one below with `prior_slope`
    (the cost of one more token as a share of a one-token step) until it is measured.
    """

    ALPHA = 0.2

    def __init__(self, prior_slope: float = 0.1) -> None:
        self.prior_slope = prior_slope
        self.by_n: dict[int, float] = {}

    def table(self) -> tuple[tuple[int, float], ...]:
        """The measurements as plain data (what a step plan reads)."""
        return tuple(sorted(self.by_n.items()))

    @classmethod
    def from_table(cls, table: Sequence[tuple[int, float]], prior_slope: float = 0.1) -> StepCost:
        c = cls(prior_slope)
        c.by_n = dict(table)
        return c

    def observe(self, n_tokens: int, seconds: float) -> None:
        if n_tokens <= 0 or seconds <= 0:
            return
        old = self.by_n.get(n_tokens)
        self.by_n[n_tokens] = seconds if old is None else old + self.ALPHA * (seconds - old)

    def cost(self, n_tokens: int) -> float:
        """Estimated seconds for `n_tokens`; 0.0 while nothing was measured."""
        got = self.by_n.get(n_tokens)
        if got is not None:
            return got
        if not self.by_n:
            return 0.0
        lo = max((n for n in self.by_n if n < n_tokens), default=None)
        hi = min((n for n in self.by_n if n > n_tokens), default=None)
        if lo is not None and hi is not None:
            c_lo, c_hi = self.by_n[lo], self.by_n[hi]
            return c_lo + (c_hi - c_lo) * (n_tokens - lo) / (hi - lo)
        base_n = lo if lo is not None else hi
        assert base_n is not None
        unit = self.by_n[min(self.by_n)] / min(self.by_n)  # seconds of a token at the smallest size
        per_token = max(unit * self.prior_slope, 0.0)
        if lo is not None:
            return self.by_n[lo] + per_token * (n_tokens - lo)
        return max(self.by_n[base_n] - per_token * (base_n - n_tokens), 1e-9)


@dataclass(frozen=True)
class DraftAsk:
    """One decoding sequence's candidate draft for this step."""

    seq_id: int
    available: int  # draft tokens the drafter has (and the request allows)
    rate: float  # acceptance estimate
    forced: bool = False  # the request asked for speculation: draft what is available
    probe: bool = False  # long without drafting: one token, so a low estimate can recover


MIN_RATE = 0.15  # below this a sequence drafts only as a probe
PROBE_EVERY = 16  # steps without drafting after which a low-acceptance sequence probes again
GAIN_MARGIN = 1.02  # a draft token must raise expected tokens/s by 2 % to be worth the noise


def expected_tokens(rate: float, d: int) -> float:
    """Expected tokens a verify step with `d` drafted tokens emits: 1 + a + a^2 + ... + a^d."""
    return float(d + 1) if rate >= 1.0 else (1.0 - rate ** (d + 1)) / (1.0 - rate)


def choose_drafts(asks: Sequence[DraftAsk], base_tokens: int, cost: StepCost,
                  draft_token_s: float = 0.0) -> dict[int, int]:
    """Draft length per sequence (only those > 0) maximising the step's expected tokens per second.

    `asks` are the decoding sequences that could draft; `base_tokens` is what the step holds
    anyway (one token per decoding sequence plus prompt chunks). Each drafted token of a
    sequence with acceptance `a`, as its (j+1)-th, adds
    a**(j+1) expected tokens; tokens are added best first, and the allocation with the most
    (expected tokens) / (cost(batch tokens) + draft_token_s x drafted tokens) along the way
    wins (each step up by GAIN_MARGIN). The whole way is looked at, not only up to the first
    dip: batched matmul kernels work on groups of rows, so on CPU a 4-token verify can cost
    less than a 3-token one. `draft_token_s` is what guessing one token costs (a draft
    model's decode; ~0 for prompt lookup). Probing
    sequences get one token even so (a low estimate must be able to recover); forced ones
    get what they have.
    """
    out: dict[int, int] = {}
    n = base_tokens
    for a in asks:
        want = a.available if a.forced else (1 if a.probe and a.available > 0 else 0)
        if want:
            out[a.seq_id] = want
            n += want
    expected = sum(expected_tokens(a.rate, out.get(a.seq_id, 0)) for a in asks)
    free = [a for a in asks if not a.forced and a.rate >= MIN_RATE and a.available > 0]
    if cost.cost(n) <= 0:
        return out
    drafted = n - base_tokens

    def seconds(n_batch: int, n_drafted: int) -> float:
        return cost.cost(n_batch) + draft_token_s * n_drafted

    best_rate, best_out = expected / seconds(n, drafted), dict(out)
    while free:
        top = max(free, key=lambda a: a.rate ** (out.get(a.seq_id, 0) + 1))
        expected += top.rate ** (out.get(top.seq_id, 0) + 1)
        out[top.seq_id] = out.get(top.seq_id, 0) + 1
        n += 1
        drafted += 1
        if out[top.seq_id] >= top.available:
            free.remove(top)
        rate = expected / seconds(n, drafted)
        if rate >= best_rate * GAIN_MARGIN:
            best_rate, best_out = rate, dict(out)
    return best_out
