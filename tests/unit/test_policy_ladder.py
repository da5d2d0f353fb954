"""The actuator ladder: order, monotone loads, and the efficiency frontier from measured figures."""

from __future__ import annotations

import itertools

import pytest

from edge.runtime.types import Knobs
from edge.scheduler.policy import batch_share, best_batch, build_ladder, estimated_load, rates_of
from edge.sim.throughput import load_throughput

# one thread decodes 8 sequences at 60 tok/s, two threads at 80: decode is mostly memory-bound
TABLE = tuple((t, s, (60.0 if t == 1 else 80.0) * (0.6 + 0.05 * s)) for t in (1, 2) for s in range(1, 9))


def _expected_tps(knobs: Knobs) -> float:
    rates = {(t, s): v for t, s, v in TABLE}
    off = rates[(knobs.off_threads, knobs.active_limit)] if knobs.off_threads else 0.0
    return knobs.duty * rates[(knobs.n_threads, knobs.active_limit)] + (1.0 - knobs.duty) * off


def test_ladder_shape_without_figures() -> None:
    ladder = build_ladder(8, 2)
    loads = [lv.load for lv in ladder]
    assert loads == sorted(loads, reverse=True)
    assert ladder[0].knobs.admit_background and not ladder[1].knobs.admit_background
    assert ladder[-1].knobs.paused and ladder[-1].load == 0.0
    # two threads are duty-cycled down to the tie with one thread (estimated load only), idling
    two_thread_duties = [lv.knobs.duty for lv in ladder[2:-1] if lv.knobs.n_threads == 2]
    assert min(two_thread_duties) <= 0.55
    assert all(lv.knobs.off_threads == 0 for lv in ladder)


def test_off_duty_threads_count_in_the_load_estimate() -> None:
    idle = estimated_load(8, 2, 0.6, 8, 2)
    mixed = estimated_load(8, 2, 0.6, 8, 2, off_threads=1)
    assert idle == 0.6 and abs(mixed - (0.6 + 0.4 * 0.5)) < 1e-12


def test_measured_figures_keep_only_the_efficiency_frontier() -> None:
    plain, ladder = build_ladder(8, 2), build_ladder(8, 2, decode_tps=TABLE)
    running = ladder[2:-1]
    loads = [lv.load for lv in ladder]
    assert loads == sorted(loads, reverse=True) and ladder[-1].knobs.paused
    assert ladder[0].knobs == plain[0].knobs  # full speed is unchanged
    # every level at full occupancy is expected to beat every cheaper one by > 1 %
    full_slots = [lv for lv in running if lv.knobs.active_limit == 8]
    tps = [_expected_tps(lv.knobs) for lv in full_slots]
    assert all(a > b * 1.01 for a, b in itertools.pairwise(tps))
    # between one and two threads, two threads part of the time and one thread (not idling) the
    # rest: at the same estimated load that beats two threads idling (80 x 0.75 = 60 tok/s)
    mid = next(lv for lv in running if abs(lv.load - 0.75) < 0.013)
    assert mid.knobs.n_threads == 2 and mid.knobs.off_threads == 1 and "off-duty" in mid.label
    assert _expected_tps(mid.knobs) > 0.75 * 80.0 * 1.1
    # below one thread at full duty nothing has an off-duty part (there is no cheaper thread count)
    one = next(i for i, lv in enumerate(running) if lv.knobs.n_threads == 1 and lv.knobs.duty == 1.0)
    assert all(lv.knobs.off_threads == 0 for lv in running[one:])
    # fewer sequences stay last, below the floor of threads x duty
    first_fewer = next(i for i, lv in enumerate(running) if lv.knobs.active_limit < 8)
    assert all(lv.knobs.active_limit < 8 for lv in running[first_fewer:])


def test_calibration_table_covers_every_knob() -> None:
    tp = load_throughput()
    table = tp.decode_table(8)
    assert {(t, s) for t, s, _ in table} == {(t, s) for t in (1, 2) for s in range(1, 9)}
    assert all(v == round(tp.decode_tokens_per_s(s, t), 2) for t, s, v in table)
    # the simulated device charges an off-duty part as the controller estimates it
    mixed = tp.utilisation(8, 2, 0.6, off_threads=1)
    assert mixed == tp.utilisation(8, 2, 0.6) + 0.4 * tp.utilisation(8, 1, 1.0)
    ladder = build_ladder(8, 2, decode_tps=table)
    assert any(lv.knobs.off_threads == 1 for lv in ladder)


# one thread is compute-bound (batches of 1-3 decode at the same rate), two threads gain from batching
FLAT_THEN_RISING = tuple((1, s, 50.0 if s <= 3 else 50.0 + (s - 3)) for s in range(1, 9)) + tuple(
    (2, s, 60.0 + 4.0 * s) for s in range(1, 9))


def test_batch_share_follows_measured_speedup() -> None:
    rates = rates_of(FLAT_THEN_RISING)
    # a batch that decodes no faster does no more arithmetic and draws no more power
    assert batch_share(1, 1, 8, rates) == batch_share(3, 1, 8, rates) == pytest.approx(0.7)
    assert batch_share(8, 1, 8, rates) == pytest.approx(1.0)
    assert 0.7 < batch_share(4, 2, 8, rates) < batch_share(6, 2, 8, rates) < 1.0
    # without figures: linear in the batch, as before
    assert batch_share(4, 1, 8) == pytest.approx(0.8)
    # a full batch costs the same in both models, so full-slot levels keep their loads
    assert estimated_load(8, 2, 0.6, 8, 2, 1, rates) == pytest.approx(estimated_load(8, 2, 0.6, 8, 2, 1))


def test_levels_name_the_batch_background_work_runs_best_at() -> None:
    rates = rates_of(FLAT_THEN_RISING)
    # one thread: a 4th sequence adds heat for 2 % more tokens; three decode as fast as one
    assert best_batch(8, 1, 1.0, 0, 8, 2, rates) == 3
    # two threads at full duty gain from every sequence: no cap
    assert best_batch(8, 2, 1.0, 0, 8, 2, rates) == 8
    assert best_batch(8, 2, 1.0, 0, 8, 2, {}) == 0  # no figures, no cap
    ladder = build_ladder(8, 2, decode_tps=FLAT_THEN_RISING)
    assert ladder[0].batch == 8
    one_thread = [lv for lv in ladder[2:-1] if lv.knobs.n_threads == 1 and lv.knobs.active_limit == 8]
    assert one_thread and all(lv.batch == 3 for lv in one_thread)
    # on the real calibration the cheap end of the ladder caps background work below every slot
    real = build_ladder(8, 2, decode_tps=load_throughput().decode_table(8))
    assert any(0 < lv.batch < 8 for lv in real[2:-1])
