"""`edge sim` with speculative decoding: the simulated engine offers each decoding sequence's
guess to the shipped step plan, which drafts where the measured step cost lets it pay."""

from __future__ import annotations

from edge.runtime.types import Knobs, Priority
from edge.sim.engine import SimEngine
from edge.sim.throughput import ThroughputModel
from edge.sim.workloads import Client, SimRequest

# a GPU-like device: 8 sequences decode almost as fast as one (memory-bound)
GPU = ThroughputModel({(2, s): 30.0 * s / (1 + 0.05 * (s - 1)) for s in (1, 2, 4, 8, 16, 32, 64)}, {2: 900.0})
# a CPU like this one: a batch of n tokens costs nearly n single steps (compute-bound)
CPU = ThroughputModel({(2, s): 100.0 * (1 + 0.05 * (s - 1)) for s in (1, 2, 4, 8, 16, 32, 64)}, {2: 300.0})


def _finish_s(tp: ThroughputModel, draft_max: int, accept: float, streams: int = 1,
              knobs: Knobs | None = None) -> tuple[float, SimEngine]:
    eng = SimEngine(tp, 4, knobs or Knobs(4, 2, 1.0), 100 << 20, 1024, 8192, draft_max)
    client = Client("c", Priority.INTERACTIVE, (50, 50), (400, 400), accept_rate=accept)
    reqs = [SimRequest(i, client, Priority.INTERACTIVE, 50, 400, 0.0, accept_rate=accept)
            for i in range(streams)]
    for r in reqs:
        eng.submit(r)
    t = 0.0
    while not all(r.done for r in reqs) and t < 600:
        eng.step(t, 0.1, 1.0)
        t += 0.1
    return t, eng


def test_speculation_pays_where_verify_is_cheap_and_guesses_hold() -> None:
    plain, _ = _finish_s(GPU, 0, 0.8)
    spec, eng = _finish_s(GPU, 8, 0.8)
    assert spec < 0.5 * plain
    st = eng.stats()
    # a d-token draft at per-token acceptance a keeps a + a^2 + ... + a^d of its tokens
    assert st.speculative == "ngram" and st.spec_drafted > 100
    assert 0.3 < st.spec_accepted / st.spec_drafted < 0.8


def test_speculation_is_not_chosen_where_it_cannot_pay() -> None:
    plain, _ = _finish_s(CPU, 0, 0.3)
    spec, eng = _finish_s(CPU, 8, 0.3)  # compute-bound and guesses that fail: the plan drafts nothing
    assert eng.stats().spec_drafted == 0 and spec == plain


def test_no_drafts_while_the_controller_cuts_load() -> None:
    _, eng = _finish_s(GPU, 8, 0.8, knobs=Knobs(4, 2, 1.0, speculate=False))
    assert eng.stats().spec_drafted == 0
