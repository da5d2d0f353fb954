"""Adaptive speculation never loses: the real step loop, plan and n-gram drafter over a fake
context whose step costs and answers are scripted (issue 35).

The answer each sequence gives is fixed in advance (its sampler returns it token by token), so
a draft holds exactly where the prompt-lookup guess matches what comes next: acceptance
emerges from the text as it does on a model. A decode advances a fake timer by a scripted
cost curve of the batch's tokens (and of the time: a neighbour that slows every step for a
while), which is what the step-cost model learns from. Tokens per (fake) second with the
engine's defaults are compared with `--speculative off` on the same answers and costs.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from edge.clock import ManualClock
from edge.contracts.options import DEFAULT_DRAFT_MAX
from edge.runtime.engine.mailbox import Mailbox
from edge.runtime.spec.state import Speculation
from edge.runtime.step.loop import StepLoop
from edge.runtime.types import EngineState, Knobs
from tests.unit.test_steploop import FakeBatch, FakeCtx, FakeResidency, _seq, _submit

Cost = Callable[[int, float], float]  # (batch tokens, fake time) -> seconds


@dataclass
class Timer:
    t: float = 0.0

    def __call__(self) -> float:
        return self.t


class TimedBatch(FakeBatch):
    """A batch whose decode takes the scripted cost of its tokens on the fake timer."""

    timer: Timer
    cost: Cost

    def decode(self, ctx_ptr: object) -> int:
        self.timer.t += self.cost(len(self.rows), self.timer.t)
        rc = super().decode(ctx_ptr)
        self.decoded.clear()  # nothing reads them here: keep memory flat
        return rc


def linear(one_s: float, slope: float) -> Cost:
    """A step of n tokens costs one_s * (1 + slope * (n - 1)): slope 0.05 is a memory-bound
    GPU, 0.2-0.3 a CPU like the catalog's on 2 threads, 0.6 a verify that costs almost a step
    per token."""
    return lambda n, t: one_s * (1.0 + slope * (n - 1))


def lumpy(one_s: float) -> Cost:
    """CPU matmul kernels work in row groups: 2-4 rows cost the same, 5-8 the same, and so on."""
    return lambda n, t: one_s * (1.0 + 0.45 * ((n + 3) // 4))


def neighbour(base: Cost, start_s: float, end_s: float, factor: float = 2.2) -> Cost:
    """Every step `factor` times slower while a neighbour holds a core."""
    return lambda n, t: base(n, t) * (factor if start_s <= t < end_s else 1.0)


def free_text(rng: random.Random, n: int, follow: float, vocab: int = 24) -> list[int]:
    """A Markov text: each token follows its predecessor's usual successor with probability
    `follow`, else any token: bigrams repeat all the time, so prompt lookup always has a guess,
    and it holds about `follow` of the time (0: free-form prose, guesses that fail)."""
    usual = {t: rng.randrange(vocab) for t in range(vocab)}
    out = [rng.randrange(vocab)]
    for _ in range(n - 1):
        out.append(usual[out[-1]] if rng.random() < follow else rng.randrange(vocab))
    return [10 + t for t in out]  # clear of the fake model's EOS


@dataclass
class Run:
    tokens: int
    seconds: float
    drafted: int
    accepted: int
    finish_s: tuple[float, ...] = ()  # each answer's, from the start of the answers

    @property
    def mean_finish_s(self) -> float:
        return sum(self.finish_s) / len(self.finish_s)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds


def calibrated(cost: Cost, t_s: float = 0.0) -> dict[int, float]:
    """What the start-up calibration measures (spec/calibration.py): one sequence's steps of
    1..k+1 tokens, at time `t_s`."""
    return {n: cost(n, t_s) for n in range(1, DEFAULT_DRAFT_MAX + 2)}


def run(answers: list[tuple[list[int], list[int]]], cost: Cost, mode: str, *,
        seed_curve: dict[int, float] | None = None, after_s: float = 0.0,
        warm: list[tuple[list[int], list[int]]] | None = None) -> Run:
    """(prompt, answer) pairs run at once on one engine; `warm` runs first on the same engine
    (what it learnt stays), and the answers start at `after_s` on the fake timer, or when `warm`
    is done if later. Tokens and seconds are counted over the answers."""
    timer = Timer()
    ctx, batch = FakeCtx(n_ctx=8192), TimedBatch(capacity=256)
    batch.timer, batch.cost = timer, cost
    box = Mailbox(Knobs(4, 2))
    box.set_state(EngineState.READY)
    spec = Speculation(mode, DEFAULT_DRAFT_MAX)  # type: ignore[arg-type]
    if seed_curve:
        spec.seed(seed_curve)
    loop = StepLoop(box, FakeResidency(ctx, batch), ManualClock(), 4, 256,  # type: ignore[arg-type]
                    speculation=spec, timer=timer)

    def go(pairs: list[tuple[list[int], list[int]]]) -> tuple[int, list[float]]:
        seqs = [_seq(p, a, max_tokens=len(a)) for p, a in pairs]
        _submit(loop, *seqs)
        done = [0.0] * len(seqs)
        while not loop.idle:
            loop.iterate(cancels=True)
            for i, s in enumerate(seqs):
                if not done[i] and s.n_gen >= len(pairs[i][1]):
                    done[i] = timer.t
        return sum(s.n_gen for s in seqs), done

    if warm:
        go(warm)
    timer.t = max(timer.t, after_s)  # with and without speculation alike, whatever warm took
    t0, d0, a0 = timer.t, spec.drafted, spec.accepted
    n, done = go(answers)
    return Run(n, timer.t - t0, spec.drafted - d0, spec.accepted - a0, tuple(t - t0 for t in done))


def pairs(rng: random.Random, streams: int, follow: float, n: int = 240) -> list[tuple[list[int], list[int]]]:
    return mixed(rng, (follow,) * streams, n)


def copies(rng: random.Random, streams: int, n: int = 240) -> list[tuple[list[int], list[int]]]:
    """Answers that repeat a document given in the prompt (summarise, rewrite, quote)."""
    out = []
    for _ in range(streams):
        doc = [100 + rng.randrange(5000) for _ in range(n)]
        out.append(([50, 51, *doc, 52, 53], doc))
    return out


def mixed(rng: random.Random, follows: tuple[float, ...], n: int = 240) -> list[tuple[list[int], list[int]]]:
    """One answer per `follow`: streams whose guesses hold beside streams whose guesses do not."""
    out = []
    for f in follows:
        text = free_text(rng, 64 + n, f)
        out.append((text[:64], text[64:]))
    return out


def ratio(answers: list[tuple[list[int], list[int]]], cost: Cost, **kw: object) -> tuple[float, Run]:
    on = run(answers, cost, "ngram", **kw)  # type: ignore[arg-type]
    off = run(answers, cost, "off", **kw)  # type: ignore[arg-type]
    assert on.tokens == off.tokens == sum(len(a) for _, a in answers)
    return on.tok_s / off.tok_s, on


CURVES = {"gpu": linear(0.010, 0.05), "cpu": linear(0.020, 0.25), "costly": linear(0.014, 0.6),
          "lumpy": lumpy(0.015)}


@pytest.mark.parametrize("curve", sorted(CURVES))
@pytest.mark.parametrize("streams", [1, 4])
@pytest.mark.parametrize("follow", [0.0, 0.3, 0.6, 0.8])
@pytest.mark.parametrize("seeded", [True, False])
def test_free_text_never_loses_more_than_three_percent(curve: str, streams: int, follow: float,
                                                        seeded: bool) -> None:
    """`follow`: how often the text takes its usual next token (0: prose; guesses fail). Seeded:
    the start-up calibration is in (cached from an earlier start, or done in idle turns);
    unseeded: the first requests after a first start, before it ran."""
    cost = CURVES[curve]
    r, on = ratio(pairs(random.Random(f"{curve}{streams}{follow}"), streams, follow), cost,
                  seed_curve=calibrated(cost) if seeded else None)
    assert r >= 0.97, (r, on)


@pytest.mark.parametrize(("streams", "least"), [(1, 1.5), (4, 1.2)])
def test_answers_that_repeat_the_prompt_go_much_faster(streams: int, least: float) -> None:
    """On the CPU-like curve four streams could gain 1.75x at most (a batch of 4(1 + d) tokens
    costs 1 + 0.25 (4 + 4d - 1) one-token steps, against 1.75 for four tokens)."""
    cpu = CURVES["cpu"]
    r, on = ratio(copies(random.Random(streams), streams), cpu, seed_curve=calibrated(cpu))
    assert r >= least and on.accepted > 0.8 * on.drafted, (r, on)


@pytest.mark.parametrize("streams", [1, 4])
def test_right_after_a_neighbour_stops_free_text_still_does_not_lose(streams: int) -> None:
    """The box was busy (every step 2.2x slower) while the engine learnt its step costs, then
    the neighbour left: the first requests after it must not pay for stale costs."""
    rng = random.Random(7 + streams)
    cost = neighbour(CURVES["cpu"], 0.0, 30.0)
    busy = pairs(rng, streams, 0.6, n=600)  # answers that draft a lot while it is busy
    r, on = ratio(pairs(rng, streams, 0.0), cost, warm=busy, after_s=30.0,
                  seed_curve=calibrated(CURVES["cpu"]))
    assert r >= 0.97, (r, on)


@pytest.mark.parametrize("streams", [1, 4])
def test_while_a_neighbour_comes_and_goes_free_text_does_not_lose(streams: int) -> None:
    rng = random.Random(11 + streams)
    base = CURVES["cpu"]

    def cost(n: int, t: float) -> float:
        return base(n, t) * (2.2 if int(t // 2.0) % 2 else 1.0)  # busy 2 s, free 2 s

    r, on = ratio(pairs(rng, streams, 0.0, n=600), cost, seed_curve=calibrated(base))
    assert r >= 0.97, (r, on)


def test_a_calibration_taken_beside_a_neighbour_does_not_make_it_draft_at_a_loss() -> None:
    """Start-up measured the verify curve while the box was busy (one-token steps slow, so
    verifying looks cheap next to them); the box is quiet now."""
    base = CURVES["costly"]
    seeded = {n: base(n, 0.0) * (2.2 if n == 1 else 1.0) for n in range(1, 18)}
    r, on = ratio(pairs(random.Random(3), 1, 0.0), base, seed_curve=seeded)
    assert r >= 0.97, (r, on)


@pytest.mark.parametrize("curve", ["cpu", "gpu", "costly"])
@pytest.mark.parametrize("seed", [0, 1])
def test_streams_that_draft_well_do_not_leave_one_that_cannot_behind(curve: str, seed: int) -> None:
    """Four answers at once, three whose guesses hold 90 % of the time and one whose guesses
    never hold. Drafting long for the three made every step of the fourth dearer, and once
    they were done it ran on alone at one-sequence cost: the round lost 5 % on the CPU curve
    (the step's summed tokens/s was the draft chooser's objective; the product is now). The
    round must not lose, and the answers on average must still finish sooner than without
    speculation (by far on the GPU's flat curve, where verifying is nearly free)."""
    cost = CURVES[curve]
    answers = mixed(random.Random(seed), (0.9, 0.9, 0.9, 0.0))
    r, on = ratio(answers, cost, seed_curve=calibrated(cost))
    off = run(answers, cost, "off", seed_curve=calibrated(cost))
    assert r >= 0.97, (r, on)
    assert on.mean_finish_s <= off.mean_finish_s * {"cpu": 1.0, "gpu": 0.85, "costly": 1.01}[curve], (on, off)


@pytest.mark.parametrize("curve", sorted(CURVES))
@pytest.mark.parametrize("streams", [1, 4])
@pytest.mark.parametrize("follow", [0.0, 0.3, 0.6])
def test_one_step_size_measured_beside_a_neighbour_does_not_skew_the_rest(curve: str, streams: int,
                                                                          follow: float) -> None:
    """While the box was busy only the no-draft step ran (prose: no guess held), so only its
    cost was measured 2.2x slow while the verify sizes kept the calibration's quiet figures:
    read side by side, drafting would look cheaper than not drafting. The step-cost model takes
    a slowdown seen at one size as the machine's (test_speculative.py), so after the neighbour
    left the answers, prose or not, must not lose."""
    rng = random.Random(23 + streams)
    cost = neighbour(CURVES[curve], 0.0, 30.0)
    busy = pairs(rng, streams, 0.0, n=300)
    r, on = ratio(pairs(rng, streams, follow), cost, warm=busy, after_s=30.0,
                  seed_curve=calibrated(CURVES[curve]))
    assert r >= 0.97, (r, on)
