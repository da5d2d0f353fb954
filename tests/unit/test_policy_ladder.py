"""The actuator ladder: order, monotone loads, and the efficiency frontier from measured figures."""

from __future__ import annotations

import itertools

from edge.runtime.types import Knobs
from edge.scheduler.policy import build_ladder
from edge.sim.throughput import load_throughput

# one thread decodes 8 sequences at 60 tok/s, two threads at 80: decode is mostly memory-bound
TABLE = tuple((t, s, (60.0 if t == 1 else 80.0) * (0.6 + 0.05 * s)) for t in (1, 2) for s in range(1, 9))


def _expected_tps(knobs: Knobs) -> float:
    rates = {(t, s): v for t, s, v in TABLE}
    return knobs.duty * rates[(knobs.n_threads, knobs.active_limit)]


def test_ladder_shape_without_figures() -> None:
    ladder = build_ladder(8, 2)
    loads = [lv.load for lv in ladder]
    assert loads == sorted(loads, reverse=True)
    assert ladder[0].knobs.admit_background and not ladder[1].knobs.admit_background
    assert ladder[-1].knobs.paused and ladder[-1].load == 0.0
    # two threads are duty-cycled down to the tie with one thread (estimated load only)
    two_thread_duties = [lv.knobs.duty for lv in ladder[2:-1] if lv.knobs.n_threads == 2]
    assert min(two_thread_duties) <= 0.55


def test_measured_figures_drop_dominated_levels() -> None:
    plain, ladder = build_ladder(8, 2), build_ladder(8, 2, decode_tps=TABLE)
    running = ladder[2:-1]
    loads = [lv.load for lv in ladder]
    assert loads == sorted(loads, reverse=True) and ladder[-1].knobs.paused
    assert ladder[0].knobs == plain[0].knobs  # full speed is unchanged
    # every level at full occupancy is expected to beat every cheaper one by > 1 %
    full_slots = [lv for lv in running if lv.knobs.active_limit == 8]
    tps = [_expected_tps(lv.knobs) for lv in full_slots]
    assert all(a > b * 1.01 for a, b in itertools.pairwise(tps))
    # two threads duty-cycled below 60/80 = 0.75 give fewer tokens than one thread at full duty: gone
    assert all(lv.knobs.duty >= 0.75 for lv in running if lv.knobs.n_threads == 2)
    assert any(lv.knobs.n_threads == 1 and lv.knobs.duty == 1.0 for lv in running)
    assert len(ladder) < len(plain)
    # fewer sequences stay last, below the floor of threads x duty
    first_fewer = next(i for i, lv in enumerate(running) if lv.knobs.active_limit < 8)
    assert all(lv.knobs.active_limit < 8 for lv in running[first_fewer:])


def test_calibration_table_covers_every_knob() -> None:
    tp = load_throughput()
    table = tp.decode_table(8)
    assert {(t, s) for t, s, _ in table} == {(t, s) for t in (1, 2) for s in range(1, 9)}
    assert all(v == round(tp.decode_tokens_per_s(s, t), 2) for t, s, v in table)
    # the shipped calibration is such a case: one thread at full duty replaces two at low duty
    ladder = build_ladder(8, 2, decode_tps=table)
    assert min(lv.knobs.duty for lv in ladder[2:-1] if lv.knobs.n_threads == 2) > 0.55
