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
the product of the step's sequences' expected tokens per second, from each sequence's
acceptance estimate (`Acceptance`) and the measured cost of a step as a function of its batch
tokens (`StepCost`), is maximised greedily one drafted token at a time.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

NGRAM_MIN = 2  # a single-token match guesses too often to pay
MAX_CANDIDATES = 64  # earlier occurrences of the last NGRAM_MIN tokens compared, most recent first
MAX_MATCH = 48  # how far back a match is followed (longer says no more about what comes next)


class NgramDrafter:
    """Prompt lookup by the longest suffix match: every earlier occurrence (prompt or output so
    far) of the sequence's last NGRAM_MIN tokens is a candidate, followed backwards while the
    tokens before it agree; the longest match wins, the most recent on a tie, and the tokens
    that followed it are the draft. `match_len` says how long the match was: a draft that
    continues a 40-token copied passage holds far more often than one behind a common
    two-token phrase (Qwen2.5 0.5B, bench workloads: the first drafted token held 50-80 % of
    the time behind a 2-token match, 93-100 % behind 33 or more), and `Acceptance` learns
    per match length.

    The index (NGRAM_MIN-gram -> positions of the token that followed) grows as tokens are
    committed (`extend`); a lookup compares at most MAX_CANDIDATES x MAX_MATCH tokens.
    """

    __slots__ = ("index", "match_len", "tokens")

    def __init__(self, tokens: Sequence[int] = ()) -> None:
        self.tokens: list[int] = []
        self.index: dict[tuple[int, int], list[int]] = {}
        self.match_len = 0  # of the last draft (0: none)
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        toks, index = self.tokens, self.index
        for t in tokens:
            i = len(toks)  # t's index: the bigram ending just before it is followed by it
            if i >= NGRAM_MIN:
                index.setdefault((toks[i - 2], toks[i - 1]), []).append(i)
            toks.append(t)

    def draft(self, k: int) -> list[int]:
        """Up to `k` tokens guessed to follow the sequence (empty: no match)."""
        self.match_len = 0
        toks = self.tokens
        n = len(toks)
        if k <= 0 or n <= NGRAM_MIN:
            return []
        cands = self.index.get((toks[-2], toks[-1]))
        if not cands:
            return []
        best_p, best_m = -1, 0
        for p in reversed(cands[-MAX_CANDIDATES:]):
            m, j = NGRAM_MIN, p - 1 - NGRAM_MIN  # toks[p - m : p] == toks[n - m :]
            while m < MAX_MATCH and j >= 0 and toks[j] == toks[n - 1 - m]:
                m += 1
                j -= 1
            if m > best_m:
                best_p, best_m = p, m
                if m >= MAX_MATCH:
                    break
        self.match_len = best_m
        return toks[best_p : best_p + k]


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


MATCH_BUCKETS = (2, 3, 4, 8, 16, 32)  # upper bounds of the match lengths learnt apart; then the rest
PRIOR_RATES = (0.45, 0.55, 0.6, 0.7, 0.8, 0.85, 0.9)  # per bucket, before anything was observed


def match_bucket(match_len: int) -> int:
    """Which bucket a draft behind a `match_len`-token match is learnt in."""
    return bisect.bisect_left(MATCH_BUCKETS, match_len)


class MatchStats:
    """Discounted counts per match-length bucket: accepted tokens, and drafts cut short.

    Geometric model: each drafted token is accepted with probability `a` while all before it
    were, so the maximum-likelihood `a` is accepted / (accepted + drafts cut short)."""

    __slots__ = ("decay", "misses", "n_acc")

    def __init__(self, decay: float, rates: Sequence[float] = PRIOR_RATES, weight: float = 2.0) -> None:
        self.decay = decay
        self.n_acc = [r * weight for r in rates]
        self.misses = [(1 - r) * weight for r in rates]

    def rate(self, bucket: int) -> float:
        return self.n_acc[bucket] / (self.n_acc[bucket] + self.misses[bucket])

    def learn(self, bucket: int, n_drafted: int, n_accepted: int) -> None:
        self.n_acc[bucket] = self.n_acc[bucket] * self.decay + n_accepted
        self.misses[bucket] = self.misses[bucket] * self.decay + (1.0 if n_accepted < n_drafted else 0.0)


class Acceptance:
    """Per-sequence estimate of the chance that a drafted token is accepted, by match length.

    The sequence's own discounted counts per bucket, on top of a prior worth PRIOR_WEIGHT
    observations taken from the engine's shared table (every sequence's drafts, discounted more
    slowly): a new request starts from what this server has seen of such matches lately, not
    from a fixed guess, and its own text takes over within a few drafts (a quoted answer is
    often over before a per-request estimate has learnt anything). Acceptance comes in runs (a
    copied passage is guessed right token after token; where the answer leaves the prompt,
    guesses fail at once), and the match length tells the two apart: behind a long match the
    draft continues the copy, right after a miss the match is short.
    """

    __slots__ = ("accepted", "drafted", "own", "shared", "steps_since_draft")

    DECAY = 0.9
    SHARED_DECAY = 0.98
    PRIOR_WEIGHT = 2.0
    CONFIDENCE_Z = 1.0  # standard errors below the mean that `rate` answers

    def __init__(self, shared: MatchStats | None = None) -> None:
        self.shared = shared if shared is not None else MatchStats(self.SHARED_DECAY)
        zero = [0.0] * len(PRIOR_RATES)
        self.own = MatchStats(self.DECAY, zero, weight=0.0)
        self.drafted = self.accepted = 0  # plain totals, for metrics
        self.steps_since_draft = 0

    def rate(self, match_len: int) -> float:
        """The estimate drafting is decided on: the mean less CONFIDENCE_Z standard errors.

        The chooser drafts for whichever sequence's estimate is highest, so it acts on the
        estimates that noise pushed up (with ~10 observations' worth, +-0.15): on scripted text
        whose guesses held 40 % of the time, drafts planned at 0.6-0.8 held 17-36 %, and four
        streams lost 3-5 % on a CPU-like cost curve. A lower bound that tightens as a sequence's
        own evidence grows keeps that, and costs little where guesses hold (copied text: 0.95+)."""
        b = match_bucket(match_len)
        w = self.PRIOR_WEIGHT
        acc, miss = self.own.n_acc[b], self.own.misses[b]
        n = acc + miss + w
        mean = (acc + w * self.shared.rate(b)) / n
        return max(0.0, mean - self.CONFIDENCE_Z * math.sqrt(mean * (1.0 - mean) / (n + 1.0)))

    def observe(self, match_len: int, n_drafted: int, n_accepted: int) -> None:
        """A verified draft."""
        self.drafted += n_drafted
        self.accepted += n_accepted
        self.learn(match_len, n_drafted, n_accepted)

    def learn(self, match_len: int, n_drafted: int, n_accepted: int) -> None:
        """A guess checked against what was emitted (verified, or a shadow: see SeqSpec)."""
        b = match_bucket(match_len)
        self.own.learn(b, n_drafted, n_accepted)
        self.shared.learn(b, n_drafted, n_accepted)
        self.steps_since_draft = 0


class StepCost:
    """Measured seconds of a decode step as a function of its batch tokens.

    The curve's shape per batch size (`by_n`, seconds at `speed` 1.0: an exponential average
    per size) times the machine's speed now (`speed`). Each step moves `speed` first, by the
    step's own size's surprise: a neighbour taking a core, a thread cut or a clock change slows
    every size alike, and only the sizes then in use are measured. Learnt per size alone, one
    busy minute left the sizes drafted beside a neighbour (on one thread) at twice the cost of
    those measured after it, for good, since a size that looks dear is never run to learn
    otherwise (SmolLM2: 17-token verifies at 268 ms beside a 44 ms 4-token step).

    A size not yet seen is interpolated from its measured neighbours, or beyond them
    extrapolated along the slope of the two nearest measured sizes; with one size measured,
    with `prior_slope` (the cost of one more token as a share of a token's). A flat guess below
    the smallest size measured made a 4-sequence step that had only ever run with drafts look
    as dear as a 6-token one, so drafting two tokens looked free and it never ran without them
    to learn otherwise (a scripted 4-stream run lost 11 %: tests/unit/test_spec_never_loses.py).
    """

    ALPHA = 0.2  # a size's shape
    SPEED_ALPHA = 0.8  # the machine's speed, in log space: most of a surprise is the machine's

    def __init__(self, prior_slope: float = 0.1) -> None:
        self.prior_slope = prior_slope
        self.by_n: dict[int, float] = {}  # seconds at speed 1.0
        self.speed = 1.0

    def table(self) -> tuple[tuple[int, float], ...]:
        """The estimates at the speed now, as plain data (what a step plan reads)."""
        return tuple(sorted((n, v * self.speed) for n, v in self.by_n.items()))

    def seed(self, n_tokens: int, seconds: float) -> None:
        """A size measured apart from the steps (calibration), at the speed now."""
        self.by_n[n_tokens] = seconds / self.speed

    @classmethod
    def from_table(cls, table: Sequence[tuple[int, float]], prior_slope: float = 0.1) -> StepCost:
        c = cls(prior_slope)
        c.by_n = dict(table)
        return c

    def observe(self, n_tokens: int, seconds: float) -> None:
        if n_tokens <= 0 or seconds <= 0:
            return
        old = self.by_n.get(n_tokens)
        if old is None:
            self.by_n[n_tokens] = seconds / self.speed
            return
        self.speed *= (seconds / (old * self.speed)) ** self.SPEED_ALPHA
        self.by_n[n_tokens] = old + self.ALPHA * (seconds / self.speed - old)

    def cost(self, n_tokens: int) -> float:
        """Estimated seconds for `n_tokens` at the speed now; 0.0 while nothing was measured."""
        return self.speed * self._shape(n_tokens)

    def _shape(self, n_tokens: int) -> float:
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
        if lo is not None:  # every size measured lies below: lo and the next one down
            a, b = max((n for n in self.by_n if n < lo), default=None), lo
        else:  # every size measured lies above: hi and the next one up
            a, b = base_n, min((n for n in self.by_n if n > base_n), default=None)
        if a is not None and b is not None:
            per_token = max((self.by_n[b] - self.by_n[a]) / (b - a), 0.0)
        else:
            per_token = max(self.by_n[base_n] / base_n * self.prior_slope, 0.0)
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
    free: bool = False  # the guess cost nothing (prompt lookup): scored even when not drafted


MIN_RATE = 0.15  # below this a sequence drafts only as a probe
PROBE_EVERY = 16  # steps without drafting after which a low-acceptance sequence probes again


def spec_cap(on: bool, k: int, speculative: bool | None, n_draft: int | None) -> int:
    """Most tokens a new sequence may draft per step; 0: it never speculates (speculation off,
    or the request said `speculative: false` or `n_draft: 0`)."""
    if not on or speculative is False or n_draft == 0:
        return 0
    return k if n_draft is None else min(k, n_draft)


def wants_probe(steps_since_draft: int) -> bool:
    """A sequence long without a draft offers one token, so a low estimate can recover."""
    return steps_since_draft >= PROBE_EVERY
GAIN_MARGIN = 1.02  # a draft token must raise expected tokens/s by 2 % to be worth the noise


def expected_tokens(rate: float, d: int) -> float:
    """Expected tokens a verify step with `d` drafted tokens emits: 1 + a + a^2 + ... + a^d."""
    return float(d + 1) if rate >= 1.0 else (1.0 - rate ** (d + 1)) / (1.0 - rate)


def choose_drafts(asks: Sequence[DraftAsk], base_tokens: int, cost: StepCost,
                  draft_token_s: float = 0.0, n_seqs: int = 0) -> dict[int, int]:
    """Draft length per sequence (only those > 0) maximising the product of the step's
    sequences' expected tokens per second. `asks` are the decoding sequences that could draft;
    `base_tokens` is what the step holds anyway (one token per decoding sequence plus prompt
    chunks); `n_seqs` how many sequences it holds (at least the asks): each waits for the
    drafted rows. The product
    (proportional fairness), not the sum: a draft that makes the step 20 % dearer must speed its
    own sequence by more than 20 % for each other one. The sum let three sequences whose text
    repeats draft long beside one whose text does not, which then ran on alone at one-sequence
    cost: four streams lost 5 % on a CPU cost curve (tests/unit/test_spec_never_loses.py). With
    one sequence, or several alike, the product picks what the sum picks.

    A drafted token of a sequence with acceptance `a`, as its (j+1)-th, adds a**(j+1) expected
    tokens; tokens are added best first (by the factor they raise their sequence's expected
    tokens by), and the allocation with the best product along the way wins (each step up by
    GAIN_MARGIN in the geometric mean). The whole way is looked at, not only up to the first
    dip: batched matmul kernels work on groups of rows, so on CPU a 4-token verify can cost
    less than a 3-token one. `draft_token_s` is what guessing one token costs (a draft
    model's decode; ~0 for prompt lookup). Probing sequences get one token even so (a low
    estimate must be able to recover); forced ones get what they have.
    """
    out: dict[int, int] = {}
    n = base_tokens
    explore = base_tokens in cost.by_n  # a step never run without drafts is run so once first
    for a in asks:
        want = a.available if a.forced else (1 if a.probe and a.available > 0 else 0)
        if want:
            out[a.seq_id] = want
            n += want
    got = {a.seq_id: expected_tokens(a.rate, out.get(a.seq_id, 0)) for a in asks}
    free = [a for a in asks if explore and not a.forced and a.rate >= MIN_RATE and a.available > 0]
    if cost.cost(n) <= 0:
        return out
    drafted = n - base_tokens
    n_wait = max(n_seqs, len(asks))
    margin = n_wait * math.log(GAIN_MARGIN)
    log_got = sum(math.log(e) for e in got.values())  # log of the product of expected tokens

    def log_step(n_batch: int, n_drafted: int) -> float:  # every sequence waits for the step
        return n_wait * math.log(cost.cost(n_batch) + draft_token_s * n_drafted)

    def gain(a: DraftAsk) -> float:  # expected tokens one more drafted token adds to `a`
        return a.rate ** (out.get(a.seq_id, 0) + 1)

    best, best_out = log_got - log_step(n, drafted), dict(out)
    while free:
        top = max(free, key=lambda a: gain(a) / got[a.seq_id])
        more = gain(top)
        log_got += math.log1p(more / got[top.seq_id])
        got[top.seq_id] += more
        out[top.seq_id] = out.get(top.seq_id, 0) + 1
        n += 1
        drafted += 1
        if out[top.seq_id] >= top.available:
            free.remove(top)
        now = log_got - log_step(n, drafted)
        if now >= best + margin:
            best, best_out = now, dict(out)
    return best_out
