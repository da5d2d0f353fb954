"""Speculative decoding's pure parts: drafter, acceptance rule (incl. its distribution), chooser."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from edge.runtime.spec.rules import (
    MATCH_BUCKETS,
    MIN_RATE,
    PRIOR_RATES,
    Acceptance,
    DraftAsk,
    MatchStats,
    NgramDrafter,
    StepCost,
    choose_drafts,
    expected_tokens,
    match_bucket,
    verify,
)

# --- drafter -----------------------------------------------------------------------------------


def test_drafter_finds_the_continuation_of_an_earlier_occurrence() -> None:
    d = NgramDrafter([1, 2, 3, 4, 5, 6, 9, 9, 2, 3])
    assert d.draft(3) == [4, 5, 6]
    assert d.draft(10) == [4, 5, 6, 9, 9, 2, 3]  # up to the end of what exists
    assert d.draft(0) == []


def test_drafter_prefers_the_longest_and_most_recent_match() -> None:
    # "2 3" was followed by 7 last time, but "1 2 3" by 4: the longer match wins
    d = NgramDrafter([1, 2, 3, 4, 8, 2, 3, 7, 1, 2, 3])
    assert d.draft(1) == [4] and d.match_len == 3
    # with only "2 3" matching, the most recent occurrence wins
    d2 = NgramDrafter([2, 3, 4, 5, 2, 3, 7, 6, 2, 3])
    assert d2.draft(2) == [7, 6] and d2.match_len == 2
    # a long copied passage: the match is followed back as far as it goes (up to MAX_MATCH)
    text = list(range(100, 160))
    d3 = NgramDrafter([*text, 7, *text[:50]])
    assert d3.draft(4) == text[50:54] and d3.match_len == 48


def test_drafter_grows_with_committed_tokens_and_needs_two_tokens_of_match() -> None:
    d = NgramDrafter([10, 11, 12, 13])
    assert d.draft(4) == []  # nothing repeats yet
    d.extend([10])
    assert d.draft(4) == []  # a single-token match is not enough (NGRAM_MIN = 2)
    d.extend([11])
    assert d.draft(2) == [12, 13]
    d.extend([12, 13, 10, 11])
    assert d.draft(3) == [12, 13, 10]


def test_drafter_drafts_a_repeating_pattern_past_its_own_end() -> None:
    d = NgramDrafter([5, 6, 5, 6, 5, 6])
    assert d.draft(4) == [5, 6]  # the most recent earlier occurrence of (5, 6) is at the end


# --- acceptance rule ---------------------------------------------------------------------------


def _greedy_rows(rows: list[int]) -> tuple[list[int], object]:
    calls: list[int] = []

    def sample_row(i: int) -> int:
        calls.append(i)
        return rows[i]

    return calls, sample_row


def test_verify_keeps_the_accepted_prefix_plus_one_token() -> None:
    calls, sample_row = _greedy_rows([7, 8, 5, 1])
    out: list[int] = []
    n = verify([7, 8, 9], sample_row, lambda t: out.append(t) is None)  # type: ignore[arg-type]
    assert n == 2 and out == [7, 8, 5] and calls == [0, 1, 2]


def test_verify_all_accepted_takes_the_bonus_row() -> None:
    calls, sample_row = _greedy_rows([7, 8, 9, 4])
    out: list[int] = []
    n = verify([7, 8, 9], sample_row, lambda t: out.append(t) is None)  # type: ignore[arg-type]
    assert n == 3 and out == [7, 8, 9, 4] and calls == [0, 1, 2, 3]


def test_verify_stops_sampling_when_the_sequence_ends() -> None:
    calls, sample_row = _greedy_rows([7, 8, 9, 4])
    out: list[int] = []

    def take(t: int) -> bool:
        out.append(t)
        return t != 8  # 8 is an end token

    n = verify([7, 8, 9], sample_row, take)  # type: ignore[arg-type]
    assert out == [7, 8] and calls == [0, 1]  # the sampler never saw row 2
    assert n == 1


def test_verify_with_no_draft_is_a_plain_step() -> None:
    calls, sample_row = _greedy_rows([3])
    out: list[int] = []
    assert verify([], sample_row, lambda t: out.append(t) is None) == 0  # type: ignore[arg-type]
    assert out == [3] and calls == [0]


# A toy target: a Markov chain over 4 tokens (the next-token distribution depends on the last
# token), sampled by `rng`. The drafter is deterministic and often wrong. Speculative output must
# have exactly the chain's distribution over the first three tokens.
P = np.array([[0.5, 0.3, 0.15, 0.05],
              [0.1, 0.2, 0.3, 0.4],
              [0.25, 0.25, 0.25, 0.25],
              [0.7, 0.1, 0.1, 0.1]])


def _draw(rng: np.random.Generator, prev: int) -> int:
    return int(rng.choice(4, p=P[prev]))


def _speculative_three(rng: np.random.Generator, start: int) -> tuple[int, ...]:
    out: list[int] = []
    while len(out) < 3:
        prev = out[-1] if out else start
        draft = [(prev + 1) % 4, (prev + 2) % 4][: 3 - len(out)]  # a fixed, mediocre guess
        context = [prev, *draft]

        def sample_row(i: int, context: list[int] = context) -> int:
            return _draw(rng, context[i])  # row i: the target given the draft prefix

        def take(t: int) -> bool:
            out.append(t)
            return len(out) < 3

        verify(draft, sample_row, take)
    return tuple(out)


def test_speculative_sampling_leaves_the_distribution_unchanged() -> None:
    rng = np.random.default_rng(1234)
    n = 40_000
    counts = Counter(_speculative_three(rng, 0) for _ in range(n))
    exact = {(a, b, c): P[0, a] * P[a, b] * P[b, c] for a in range(4) for b in range(4) for c in range(4)}
    # chi-square over the 64 outcomes; 63 degrees of freedom: the 99.9 % quantile is about 104
    chi2 = sum((counts.get(k, 0) - n * p) ** 2 / (n * p) for k, p in exact.items())
    assert chi2 < 104, chi2
    # and the same check catches a biased rule: always accepting the draft's first token
    biased = Counter((1, *_speculative_three(rng, 1)[:2]) for _ in range(2000))
    chi2_b = sum((biased.get(k, 0) - 2000 * p) ** 2 / (2000 * p) for k, p in exact.items())
    assert chi2_b > 1000


# --- acceptance estimate and step cost ---------------------------------------------------------


def test_acceptance_rate_tracks_observations() -> None:
    a = Acceptance()
    assert MIN_RATE < a.rate(2) < PRIOR_RATES[0]  # the prior's mean, less its standard error: no evidence yet
    for _ in range(30):
        a.observe(2, 4, 4)  # every draft fully accepted
    assert a.rate(2) > 0.95
    for _ in range(30):
        a.observe(2, 4, 0)
    # its own failures outweigh the server-wide table (which still remembers the accepts)
    assert a.rate(2) < 0.25 < 0.5 < a.shared.rate(match_bucket(2))
    for _ in range(30):
        a.observe(2, 4, 0)
    assert a.rate(2) < MIN_RATE
    assert a.drafted == 360 and a.accepted == 120


def test_step_cost_interpolates_and_extrapolates() -> None:
    c = StepCost(prior_slope=0.1)
    assert c.cost(3) == 0.0
    c.observe(1, 0.010)
    assert c.cost(1) == pytest.approx(0.010)
    assert c.cost(5) == pytest.approx(0.010 + 4 * 0.001)  # prior: 10 % of a one-token step per token
    c.observe(9, 0.018)
    assert c.cost(5) == pytest.approx(0.014)  # between the measured neighbours
    c.observe(1, 0.020)  # twice as slow: an average, not the last figure, and mostly the machine's
    assert 0.010 < c.cost(1) < 0.020
    assert c.cost(9) == pytest.approx(0.018 * 2**StepCost.SPEED_ALPHA)  # every size follows the speed
    assert StepCost.from_table(c.table()).cost(5) == pytest.approx(c.cost(5))


def test_step_cost_keeps_its_shape_through_a_slow_stretch_seen_at_one_size() -> None:
    """Beside a neighbour only the sizes then in use are measured, 2.2x slow; once it is gone
    and a few steps of one size ran at full speed again, every size is back where it was, in
    proportion (learnt per size alone, the 17-token verify stayed at 2.2x for good)."""
    c = StepCost()
    quiet = {n: 0.010 * (1 + 0.25 * (n - 1)) for n in range(1, 18)}
    for n, s in quiet.items():
        c.observe(n, s)
    for _ in range(40):
        c.observe(1, quiet[1] * 2.2)
    assert c.cost(17) / c.cost(1) == pytest.approx(quiet[17] / quiet[1], rel=0.1)
    assert c.cost(17) > quiet[17] * 1.5  # the verify is dear now too: the machine is slow
    for _ in range(10):
        c.observe(4, quiet[4])
    for n in (1, 4, 9, 17):
        assert c.cost(n) == pytest.approx(quiet[n], rel=0.1), n


# --- chooser -----------------------------------------------------------------------------------


def _cost(per_token: float, base: float = 0.010, sizes: int = 40) -> StepCost:
    c = StepCost()
    for n in range(1, sizes + 1):
        c.observe(n, base + per_token * (n - 1))
    return c


def test_expected_tokens() -> None:
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert expected_tokens(1.0, 3) == 4.0


def test_chooser_drafts_long_when_verifying_is_cheap_and_guesses_are_good() -> None:
    out = choose_drafts([DraftAsk(0, 8, 0.9)], 1, _cost(0.0005))
    assert out == {0: 8}


def test_chooser_drafts_nothing_when_guesses_fail() -> None:
    assert choose_drafts([DraftAsk(0, 8, 0.05)], 1, _cost(0.0005)) == {}


def test_chooser_drafts_nothing_when_each_token_costs_a_full_step() -> None:
    # compute-bound: a batch of n costs n single steps, no draft can pay
    assert choose_drafts([DraftAsk(0, 8, 0.8)], 1, _cost(0.010)) == {}


def test_chooser_drafts_less_when_the_batch_already_fills_the_device() -> None:
    # cheap up to 8 tokens, then every token costs as much as a step
    c = StepCost()
    for n in range(1, 41):
        c.observe(n, 0.010 + 0.0005 * min(n - 1, 7) + 0.004 * max(0, n - 8))
    one = choose_drafts([DraftAsk(0, 8, 0.7)], 1, c)
    four = choose_drafts([DraftAsk(i, 8, 0.7) for i in range(8)], 8, c)
    assert sum(one.values()) >= 4
    assert sum(four.values()) == 0


def test_chooser_gives_tokens_to_the_best_guesser_first() -> None:
    c = StepCost()
    for n in range(1, 41):  # the device fills at 6 tokens
        c.observe(n, 0.010 + 0.0005 * min(n - 1, 5) + 0.01 * max(0, n - 6))
    out = choose_drafts([DraftAsk(0, 8, 0.3), DraftAsk(1, 8, 0.95)], 2, c)
    assert out.get(1, 0) > out.get(0, 0)


def test_chooser_probes_and_forced_sequences() -> None:
    c = _cost(0.0005)
    assert choose_drafts([DraftAsk(0, 8, 0.05, probe=True)], 1, c) == {0: 1}
    assert choose_drafts([DraftAsk(0, 5, 0.05, forced=True)], 1, c) == {0: 5}
    assert choose_drafts([DraftAsk(0, 0, 0.9)], 1, c) == {}  # nothing to draft


def test_chooser_without_measurements_drafts_only_probes_and_forced() -> None:
    assert choose_drafts([DraftAsk(0, 8, 0.9)], 1, StepCost()) == {}


def test_chooser_is_deterministic() -> None:
    rng = random.Random(5)
    asks = [DraftAsk(i, rng.randint(0, 8), rng.random()) for i in range(6)]
    c = _cost(0.001)
    assert choose_drafts(asks, 6, c) == choose_drafts(list(asks), 6, c)


def test_chooser_weighs_what_guessing_a_token_costs() -> None:
    # a draft model's guess costs a decode of its own: the dearer it is, the shorter the draft
    c = _cost(0.0005)  # a 1-token step is 10 ms
    free = choose_drafts([DraftAsk(0, 8, 0.8)], 1, c)
    cheap = choose_drafts([DraftAsk(0, 8, 0.8)], 1, c, draft_token_s=0.001)
    dear = choose_drafts([DraftAsk(0, 8, 0.8)], 1, c, draft_token_s=0.010)
    assert free[0] > cheap.get(0, 0) > 0
    assert dear == {}


class _FakeDraftModel:
    """What Speculation asks of a draft model: guesses for the planned lengths only."""

    def __init__(self) -> None:
        self.token_s = 0.002
        self.asked: list[dict[int, tuple[list[int], int]]] = []
        self.kept: list[set[int]] = []
        self.threads = 0

    def retain(self, seq_ids: object) -> None:
        self.kept.append(set(seq_ids))  # type: ignore[call-overload]

    def set_threads(self, n: int) -> None:
        self.threads = n

    def draft(self, wants: dict[int, tuple[list[int], int]]) -> dict[int, list[int]]:
        self.asked.append({sid: (list(t), k) for sid, (t, k) in wants.items()})
        return {sid: [100 + i for i in range(k)] for sid, (_, k) in wants.items()}


def test_draft_mode_offers_what_it_could_guess_and_guesses_only_the_planned_lengths() -> None:
    from edge.runtime.spec.state import Speculation

    spec = Speculation("draft", 6)
    a = spec.state_for([1, 2, 3], None, None)
    b = spec.state_for([4, 5], None, 3)
    assert a is not None and b is not None
    model = _FakeDraftModel()
    asks, _, token_s = spec.view([(0, a, 10), (1, b, 2)], model)  # type: ignore[arg-type]
    assert [(x.seq_id, x.available) for x in asks] == [(0, 6), (1, 2)]  # cap, then the room left
    assert token_s == 0.002
    assert spec.view([(0, a, 10)], None)[0] == ()  # no draft model loaded: nothing to offer
    spec.apply(((0, 4),), {0: a, 1: b}, model, n_threads=2)  # type: ignore[arg-type]
    assert model.asked == [{0: ([1, 2, 3], 4)}] and model.kept == [{0, 1}] and model.threads == 2
    assert a.draft == [100, 101, 102, 103] and b.draft == []


def test_chooser_looks_past_a_dip_in_the_step_cost() -> None:
    # measured on this CPU (Qwen2.5 0.5B Q4_K, repacked 4-row kernels): 3 tokens cost more than 4
    c = StepCost.from_table([(1, 0.032), (2, 0.068), (3, 0.083), (4, 0.077), (5, 0.101), (6, 0.093),
                             (7, 0.118), (8, 0.124), (9, 0.169)])
    assert choose_drafts([DraftAsk(0, 8, 0.9)], 1, c) == {0: 5}  # a 6-token step: 4.69 tokens / 93 ms
    assert choose_drafts([DraftAsk(0, 1, 0.9)], 1, c) == {}  # 1 drafted (a 2-token step) does not pay here


def test_acceptance_is_learnt_per_match_length_and_shared_with_the_next_request() -> None:
    # a copied passage is guessed right draft after draft behind a long match, while guesses
    # behind a two-token match (a common phrase) fail: one average would blur the two
    shared = MatchStats(Acceptance.SHARED_DECAY)
    a = Acceptance(shared)
    for _ in range(20):
        for _ in range(3):
            a.observe(40, 6, 6)
        for _ in range(5):
            a.observe(2, 6, 0)
    assert a.rate(40) > 0.9 and a.rate(2) < 0.2
    assert match_bucket(2) == 0 and match_bucket(40) == match_bucket(1000) == len(MATCH_BUCKETS)
    assert a.drafted == 20 * 8 * 6 and a.accepted == 20 * 3 * 6
    # the next request on this server starts from what the shared table has seen, not the prior
    b = Acceptance(shared)
    assert b.rate(40) > PRIOR_RATES[match_bucket(40)] and b.rate(2) < 0.3 < PRIOR_RATES[0]
    assert b.drafted == 0
    # its own drafts take over within a few observations (the prior weighs PRIOR_WEIGHT drafts)
    for _ in range(6):
        b.observe(2, 4, 4)
    assert b.rate(2) > 0.8


def test_a_guess_not_drafted_is_scored_against_the_tokens_that_follow() -> None:
    from edge.runtime.spec.state import Speculation

    spec = Speculation("ngram", 4)
    sp = spec.state_for([5, 6, 7, 8, 5, 6], None, None)
    assert sp is not None
    spec.view([(0, sp, 10)], None)
    assert sp.guess == [7, 8, 5, 6]
    spec.apply((), {0: sp}, shadows=(0,))  # the plan drafted nothing and scores the guess
    assert sp.draft == [] and sp.shadow == [7, 8, 5, 6]
    for tok in (7, 8, 5, 6):
        sp.commit(tok)
    assert sp.shadow == [] and sp.shadow_match == 2  # it held, whole: learnt behind its 2-token match
    assert sp.acc.own.n_acc[match_bucket(2)] == 4 and sp.acc.own.misses[match_bucket(2)] == 0
    assert spec.drafted == 0 and sp.acc.drafted == 0  # nothing was verified
    sp.shadow, sp.shadow_hit = [1, 2, 3], 0
    sp.commit(1)
    sp.commit(9)  # the second token differs: one of three held
    assert sp.shadow == [] and sp.acc.own.misses[match_bucket(2)] == 1
    assert sp.drafter.tokens[-6:] == [7, 8, 5, 6, 1, 9]  # the drafter saw every token
