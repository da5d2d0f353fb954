"""The controller's CPU-contention stage on a fake clock: decode threads follow the free cores,
with hysteresis, a logged reason, back within a second when the neighbour leaves, no flapping
beside one that comes and goes, and unknown is not none."""

from __future__ import annotations

from edge.scheduler.contention import wanted_threads
from edge.scheduler.controller import decide, ladder_for
from edge.scheduler.state import ControlInput, ControllerConfig, ControllerState, Decision, QueueState
from edge.telemetry.sample import Sample
from tests.fakes import engine_stats

CFG = ControllerConfig(n_slots=4, max_threads=2, limit_c=99.0, reserve_bytes=1 << 30)
Q = QueueState(running_interactive=1)


def tick(t_s: float, other: float | None, state: ControllerState,
         cores: int = 2) -> tuple[Decision, ControllerState]:
    r = ControlInput(t_s=t_s, temp_c=45.0, slope_c_per_s=0.0, limit_c=99.0, cpu_cores=cores,
                     cpu_other_cores=other)
    return decide(r, Q, engine_stats(active=1), state, CFG)


def test_wanted_threads_rounds_the_free_cores() -> None:
    assert [wanted_threads(2, o, 2) for o in (0.0, 0.4, 0.5, 0.9, 1.5, 2.0)] == [2, 2, 1, 1, 1, 1]
    assert wanted_threads(8, 2.2, 8) == 6 and wanted_threads(4, 0.0, 2) == 2


def test_a_busy_neighbour_takes_a_thread_after_a_hold_and_gives_it_back() -> None:
    st = ControllerState()
    d, st = tick(0.0, 0.0, st)
    assert d.knobs.n_threads == 2 and d.threads_cap is None
    assert "contention" not in " ".join(d.throttle_reasons)
    d, st = tick(1.0, 0.95, st)  # a neighbour appears: not acted on at once (one reading)
    assert d.knobs.n_threads == 2
    d, st = tick(2.0, 0.9, st)
    assert d.knobs.n_threads == 2
    d, st = tick(3.0, 0.92, st)  # held for 2 s: drop to the free core
    assert d.knobs.n_threads == 1 and d.threads_cap == 1 and "contention:threads" in d.throttle_reasons
    assert "2 -> 1 threads: 0.9 core taken by other processes" in d.reason
    d, st = tick(4.0, 1.0, st)  # still there: stays down, says why
    assert d.knobs.n_threads == 1 and "1 of 2 threads: 1.0 core taken" in d.reason
    d, st = tick(4.25, 0.05, st)  # it leaves: the first free reading starts the restore's quarter second
    assert d.knobs.n_threads == 1
    d, st = tick(4.5, 0.8, st)  # back for a moment: the restore timer starts over
    d, st = tick(4.75, 0.0, st)
    assert d.knobs.n_threads == 1
    d, st = tick(5.0, 0.0, st)  # free for 0.25 s: the threads are back, a second after it left
    assert d.knobs.n_threads == 2 and d.threads_cap is None and "1 -> 2 threads" in d.reason


def _flaps(period_s: float, until_s: float, step_s: float = 0.25) -> tuple[list[float], list[float]]:
    """A neighbour taking a core for `period_s`, then leaving it free as long, read every `step_s`
    (the loop's pace while capped; at full threads it reads every second, which only slows the
    drops). The times the thread count changed, and those spent on fewer threads while it was off."""
    st, changes, lost, prev = ControllerState(), [], [], 2
    for i in range(int(until_s / step_s)):
        t = i * step_s
        busy = int(t // period_s) % 2 == 1
        d, st = tick(t, 1.0 if busy else 0.0, st)
        if d.knobs.n_threads != prev:
            changes.append(t)
            prev = d.knobs.n_threads
        if not busy and d.knobs.n_threads == 1:
            lost.append(t)
    return changes, lost


def test_a_neighbour_that_stops_gets_its_threads_back_within_a_second() -> None:
    st = ControllerState()
    for t in (0.0, 1.0, 2.0, 3.0):
        d, st = tick(t, 1.0, st)
    assert d.knobs.n_threads == 1
    t, reading = 3.0, 1.0
    while d.knobs.n_threads == 1:  # it stops at 3.0 s; the first reading after covers part of its run
        t += 0.25
        d, st = tick(t, reading, st)
        reading = 0.0
    assert t - 3.0 <= 1.0


def test_a_neighbour_starting_and_stopping_every_two_seconds_does_not_make_the_threads_flap() -> None:
    changes, _ = _flaps(2.0, 120.0)
    assert len(changes) <= 2  # held for 2 s it never drops them: a 2 s burst ends as the hold does
    changes, _ = _flaps(3.0, 180.0)  # 3 s bursts do drop them: each restore then waits longer
    assert 4 <= len(changes) <= 12, changes  # not one drop and one restore per cycle (60 of them)
    late = [c for c in changes if c > 60.0]
    assert len(late) <= 2, late  # settled: one thread for as long as the neighbour keeps coming back
    later, _ = _flaps(3.0, 180.0)
    assert later == changes  # a pure function of the readings


def test_a_drop_long_after_the_last_restore_starts_the_backoff_over() -> None:
    st = ControllerState(threads_cap=1, threads_restored_s=0.0, threads_backoff=8.0)
    d, st = tick(100.0, 0.0, st)
    for t in (100.25, 100.5, 101.0, 102.0):
        d, st = tick(t, 0.0, st)
    assert d.knobs.n_threads == 2 and st.threads_backoff == 8.0  # 8 x 0.25 s = 2 s to come back
    for t in (103.0, 104.0, 105.0):  # a neighbour within 10 s of that restore: a flap, doubled
        d, st = tick(t, 1.0, st)
    assert d.knobs.n_threads == 1 and st.threads_backoff == 16.0
    st = ControllerState(threads_restored_s=0.0, threads_backoff=16.0)
    for t in (200.0, 201.0, 202.0):  # long after: back to one quarter second
        d, st = tick(t, 1.0, st)
    assert d.knobs.n_threads == 1 and st.threads_backoff == 1.0


def test_unknown_contention_changes_nothing_and_says_so_when_capped() -> None:
    st = ControllerState()
    d, st = tick(0.0, None, st)
    assert d.knobs.n_threads == 2 and d.cpu_other_cores is None  # unknown is not "none", nor a cut
    for t in (1.0, 2.0, 3.0):
        d, st = tick(t, 1.0, st)
    assert d.knobs.n_threads == 1
    d, st = tick(4.0, None, st)  # readings stop: keep the cap, say it is unknown now
    assert d.knobs.n_threads == 1 and "CPU contention unknown" in d.reason


def test_the_cap_also_bounds_thermal_levels_and_off_duty_threads() -> None:
    st = ControllerState(threads_cap=1)
    hot = ControlInput(t_s=0.0, temp_c=99.0 - CFG.margin_c + 3, slope_c_per_s=0.1, limit_c=99.0,
                       cpu_cores=2, cpu_other_cores=1.0)
    d, _ = decide(hot, Q, engine_stats(active=4, knobs=ladder_for(CFG)[2].knobs), st, CFG)
    assert d.knobs.n_threads == 1 and d.knobs.off_threads == 0


def test_sample_fields_reach_the_controller() -> None:
    s = Sample(t_s=3.0, source="linux", temp_c=50.0, cpu_cores=2, cpu_other_cores=0.7)
    r = ControlInput.from_reading(s)
    assert (r.cpu_cores, r.cpu_other_cores) == (2, 0.7)
