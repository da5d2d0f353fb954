"""The pure controller: control law, hysteresis, rate limit, anti-windup, guards, conservative mode."""

from __future__ import annotations

from dataclasses import replace

import pytest

from edge.runtime.types import EngineStats, Knobs
from edge.scheduler.controller import decide, ladder_for
from edge.scheduler.policy import estimated_load, level_for_budget, rates_of
from edge.scheduler.state import (
    ControlInput,
    ControllerConfig,
    ControllerState,
    MemoryMode,
    QueueState,
    ThermalMode,
)
from edge.sim.throughput import load_throughput
from edge.telemetry.sample import PressureLevel, Sample
from tests.fakes import engine_stats

# learning margin off: the other tests pin T_set; its own test below turns it on
CFG = ControllerConfig(n_slots=8, max_threads=2, limit_c=99.0, reserve_bytes=1 << 30, learning_margin_c=0.0)
T_SET = 99.0 - CFG.margin_c
T_ON = T_SET - CFG.on_band_c
T_GUARD = 99.0 - CFG.guard_band_c
Q = QueueState()


def inp(t_s: float, temp_c: float | None, slope: float = 0.0, **kw: object) -> ControlInput:
    return ControlInput(t_s=t_s, temp_c=temp_c, slope_c_per_s=slope, limit_c=99.0, **kw)  # type: ignore[arg-type]


def stats(knobs: Knobs, active: int = 8) -> EngineStats:
    return engine_stats(active=active, knobs=knobs)


def run(seq: list[ControlInput], state: ControllerState | None = None, cfg: ControllerConfig = CFG):
    state = state or ControllerState()
    out = []
    for r in seq:
        d, state = decide(r, Q, stats(ladder_for(cfg)[state.level].knobs), state, cfg)
        out.append(d)
    return out, state


def test_below_t_on_runs_full_speed() -> None:
    (d,), st = run([inp(0, T_ON - 5)])
    assert d.mode is ThermalMode.NOMINAL and st.level == 0
    assert d.knobs == ladder_for(CFG)[0].knobs and d.knobs.admit_background
    assert d.admit_interactive and d.admit_background and not d.shed_background
    assert d.budget == 1.0 and d.t_set_c == T_SET and d.reason


def test_step_response_turns_down_with_heat_and_forecast() -> None:
    # same temperature just above target; a rising slope forecasts more heat and cuts deeper
    (flat,), _ = run([inp(0, T_SET + 1, slope=0.0)])
    (rising,), _ = run([inp(0, T_SET + 1, slope=0.3)])
    assert flat.mode is ThermalMode.LIMITING
    assert rising.budget < flat.budget
    assert rising.forecast_c == pytest.approx(T_SET + 1 + CFG.horizon_s * 0.3)
    assert (
        rising.knobs.active_limit * rising.knobs.n_threads * rising.knobs.duty
        < flat.knobs.active_limit * flat.knobs.n_threads * flat.knobs.duty
    )
    # far over target: budget below the lowest running level -> paused (KV kept)
    (hot,), _ = run([inp(0, T_GUARD - 0.5, slope=12.0 / CFG.horizon_s)])
    assert hot.mode is ThermalMode.PAUSED and hot.knobs.paused and not hot.admit_interactive
    assert hot.cooldown_s > 0


def test_first_actuator_is_background_admission() -> None:
    ladder = ladder_for(CFG)
    assert ladder[0].knobs.admit_background and not ladder[1].knobs.admit_background
    assert ladder[1].knobs.active_limit == ladder[0].knobs.active_limit
    k2 = ladder[2].knobs  # then threads and duty cycle, every slot still decoding
    assert k2.active_limit == 8 and k2.n_threads * k2.duty < ladder[1].knobs.n_threads
    assert ladder[-2].knobs.active_limit < 8  # fewer sequences last, just before pause
    assert ladder[-1].knobs.paused and all(not lv.knobs.paused for lv in ladder[:-1])
    loads = [lv.load for lv in ladder]
    assert loads == sorted(loads, reverse=True)


def test_rate_limit_one_change_per_interval() -> None:
    later_s = CFG.down_interval_s + 0.1
    hot = T_GUARD - 0.5  # over target, under the guard
    seq = [inp(0.0, T_SET + 0.5), inp(0.5, hot, slope=0.1), inp(later_s, hot, slope=0.1)]
    (d0, d1, d2), _ = run(seq)
    assert d0.knobs != ladder_for(CFG)[0].knobs
    assert d1.knobs == d0.knobs  # within the interval: no change despite a lower budget
    assert d2.knobs != d1.knobs  # after it: turned down further


def test_hysteresis_needs_clear_margin_to_step_up() -> None:
    cfg = replace(CFG, up_interval_s=0.0, down_interval_s=0.0)
    ladder = ladder_for(cfg)
    level = 10
    st = ControllerState(mode=ThermalMode.LIMITING, level=level, last_change_s=0.0, u_sus=ladder[level].load)
    # budget exactly a hair above the next level's load (within the hysteresis band): stay
    need = ladder[level - 1].load - ladder[level].load  # budget = u_sus - k_pu * u_sus * err
    k = cfg.k_pu * max(cfg.gain_floor, st.u_sus)
    err = -(need + cfg.hysteresis_load / 2) / k
    _, st2 = decide(inp(10, T_SET + err), Q, stats(ladder[level].knobs), st, cfg)
    assert st2.level == level
    # comfortably above: climbs, but never more than one bounded step while near target
    err = -(need + 2 * cfg.hysteresis_load) / k
    _d, st3 = decide(inp(10, T_SET + err), Q, stats(ladder[level].knobs), st, cfg)
    assert st3.level < level
    assert ladder[st3.level].load - ladder[level].load <= 0.15 + 1e-9


def test_integral_anti_windup_clamps_and_bleeds_off() -> None:
    seq = [inp(float(t), T_SET + 1.0) for t in range(0, 400)]  # over target, under the guard
    _, st = run(seq)
    assert st.integral_c_s == pytest.approx(CFG.integral_max_c_s)  # clamped, not 800
    # below target while demand, not the cap, keeps the device cool (engine idle): it bleeds off
    idle = st
    for t in range(1, 121):
        _, idle = decide(inp(400.0 + t, T_SET - 2.0), Q, stats(ladder_for(CFG)[idle.level].knobs, active=0),
                         idle, CFG)
    assert 0.0 < idle.integral_c_s < CFG.integral_max_c_s * 0.2


def test_integral_winds_below_target_only_while_the_cap_binds() -> None:
    """A steady offset under target while the cap binds is wasted headroom: the integral removes it."""
    ladder = ladder_for(CFG)
    level = len(ladder) // 2
    cfg = replace(CFG, up_interval_s=1e9, down_interval_s=1e9)  # freeze the level to isolate the integral
    start = ControllerState(mode=ThermalMode.LIMITING, level=level, last_change_s=0.0, last_t_s=0.0,
                            u_sus=0.5)
    bound = start
    for t in range(1, 200):  # the engine runs at what the level allows, 1 C under target
        d_bound, bound = decide(inp(float(t), T_SET - 1.0), Q, stats(ladder[level].knobs), bound, cfg)
    assert bound.integral_c_s == pytest.approx(CFG.integral_min_c_s)  # wound down, clamped
    d_first, _ = decide(inp(1.0, T_SET - 1.0), Q, stats(ladder[level].knobs), start, cfg)
    assert d_bound.budget > d_first.budget  # the budget rose with it
    # far below target (outside the band) or an engine running below its cap: no credit grows
    far = start
    for t in range(1, 200):
        _, far = decide(inp(float(t), T_SET - CFG.integral_band_c - 1.0), Q, stats(ladder[level].knobs),
                        far, cfg)
    light = start
    for t in range(1, 200):
        _, light = decide(inp(float(t), T_SET - 1.0), Q, stats(ladder[level].knobs, active=1), light, cfg)
    assert far.integral_c_s == 0.0 and light.integral_c_s == 0.0


def test_sustainable_load_learned_near_target() -> None:
    ladder = ladder_for(CFG)
    level = 12
    st = ControllerState(mode=ThermalMode.LIMITING, level=level, u_sus=1.0, last_change_s=0.0)
    cfg = replace(CFG, up_interval_s=1e9, down_interval_s=1e9)  # freeze the level to isolate learning
    for t in range(1, 200):
        run_stats = stats(ladder[level].knobs, active=4)
        _, st = decide(inp(float(t), T_SET + 0.5, slope=0.0), Q, run_stats, st, cfg)
    # learned on the ladder's scale (what the level allows), the scale the budget maps onto
    assert st.u_sus == pytest.approx(ladder[level].load, abs=0.03)
    # an idle engine teaches nothing
    st_idle = ControllerState(mode=ThermalMode.LIMITING, level=level, u_sus=1.0, last_change_s=0.0)
    for t in range(1, 50):
        _, st_idle = decide(inp(float(t), T_SET + 0.5), Q, stats(ladder[level].knobs, active=0), st_idle, cfg)
    assert st_idle.u_sus == 1.0


@pytest.mark.parametrize(
    ("kw", "tag"),
    [
        ({"kernel_throttling": True}, "guard:kernel_throttling"),
        ({"thermal_pressure": PressureLevel.HEAVY}, "guard:os_pressure"),
        ({}, "guard:temperature"),
    ],
)
def test_hard_guards_go_straight_to_pause(kw: dict, tag: str) -> None:
    temp = T_GUARD if tag == "guard:temperature" else T_ON - 10  # cool, except for the temperature guard
    st = ControllerState(last_change_s=0.0)  # a change just happened: guards ignore the rate limit
    d, _st2 = decide(inp(0.5, temp, **kw), Q, stats(ladder_for(CFG)[0].knobs), st, CFG)
    assert d.mode is ThermalMode.GUARD and d.knobs.paused
    assert not d.admit_interactive and not d.admit_background
    assert tag in d.throttle_reasons


def test_guard_holds_until_clearly_cooler_then_restarts_low() -> None:
    (d,), st = run([inp(0, T_GUARD + 0.5)])
    assert d.mode is ThermalMode.GUARD
    resume = T_GUARD - CFG.guard_release_c
    (d1,), st = run([inp(5, resume + 0.5, slope=-0.1)], st)
    assert d1.knobs.paused and d1.cooldown_s == pytest.approx(5.0, abs=0.1)
    (d2,), st = run([inp(10, resume - 0.5, slope=-0.1)], st)
    assert d2.mode is ThermalMode.LIMITING and not d2.knobs.paused
    assert st.level == len(ladder_for(CFG)) - 2  # the lowest running level, then climbs


@pytest.mark.parametrize(
    "reading",
    [
        ControlInput(t_s=1.0, temp_c=50.0, limit_c=99.0, stale=True),
        ControlInput(t_s=1.0, temp_c=None, limit_c=None),
    ],
)
def test_stale_or_unknown_is_conservative_never_nominal(reading: ControlInput) -> None:
    busy = QueueState(running_interactive=1, waiting_background=1)
    d, _ = decide(reading, busy, None, ControllerState(), CFG)
    assert d.mode is ThermalMode.CONSERVATIVE
    assert not d.knobs.paused and d.admit_interactive
    assert d.budget <= CFG.conservative_load
    assert d.knobs != ladder_for(CFG)[0].knobs
    assert not d.knobs.admit_background and not d.admit_background and d.background_retry_s > 0


def test_failing_sensor_is_conservative_even_if_marked_absent_before() -> None:
    """Absent means 'never existed'; a stale reading stays conservative whatever it claims."""
    r = ControlInput(t_s=1.0, temp_c=None, stale=True, thermal_sensor_absent=True)
    d, _ = decide(r, Q, None, ControllerState(), CFG)
    assert d.mode is ThermalMode.CONSERVATIVE


def test_no_sensor_at_all_is_unavailable_full_speed_not_nominal() -> None:
    r = ControlInput(t_s=1.0, thermal_sensor_absent=True, mem_available_bytes=8 << 30)
    busy = QueueState(running_interactive=1, waiting_background=1)
    d, st = decide(r, busy, None, ControllerState(), CFG)
    assert d.mode is ThermalMode.UNAVAILABLE and st.mode is ThermalMode.UNAVAILABLE
    assert d.knobs == ladder_for(CFG)[0].knobs and d.admit_background and d.admit_interactive
    assert "unavailable" in d.reason and d.throttle_reasons == ()
    # the memory guard still acts without thermal sensors
    low = replace(r, t_s=2.0, mem_available_bytes=CFG.reserve_bytes // 2)
    d, _ = decide(low, busy, None, st, CFG)
    assert d.mode is ThermalMode.UNAVAILABLE and d.memory is MemoryMode.SHED
    assert not d.admit_background and d.shed_background
    # and so does a kernel throttle flag (a guard needs no temperature)
    d, _ = decide(replace(r, t_s=3.0, kernel_throttling=True), busy, None, st, CFG)
    assert d.mode is ThermalMode.GUARD


def test_background_alone_runs_at_the_thermal_budget_not_starved() -> None:
    """With no interactive work, a limited device keeps admitting background at the allowed level."""
    hot = ControlInput(t_s=10.0, temp_c=T_SET + 1.0, slope_c_per_s=0.05, limit_c=99.0)
    st = ControllerState(level=3, last_change_s=0.0, last_t_s=9.0)
    alone = QueueState(running_background=2, waiting_background=1)
    d, _ = decide(hot, alone, None, st, CFG)
    assert d.mode is ThermalMode.LIMITING and d.knobs.admit_background and d.admit_background
    mixed = QueueState(running_background=2, waiting_interactive=1)
    d, _ = decide(hot, mixed, None, st, CFG)
    assert d.mode is ThermalMode.LIMITING and not d.admit_background and d.background_retry_s >= 1.0


def test_macos_pressure_only() -> None:
    st0 = ControllerState()
    d, _ = decide(ControlInput(t_s=0, thermal_pressure=PressureLevel.NOMINAL), Q, None, st0, CFG)
    assert d.mode is ThermalMode.NOMINAL
    d, _ = decide(ControlInput(t_s=0, thermal_pressure=PressureLevel.MODERATE), Q, None, st0, CFG)
    assert d.mode is ThermalMode.LIMITING and d.budget == CFG.conservative_load


def test_trip_point_from_device_overrides_profile() -> None:
    temp = 80.0 - CFG.margin_c + 1.0  # over target for an 80 C trip, cool for the 99 C profile
    st0 = ControllerState()
    d, _ = decide(ControlInput(t_s=0, temp_c=temp, slope_c_per_s=0.0, limit_c=80.0), Q, None, st0, CFG)
    assert d.t_lim_c == 80.0 and d.t_set_c == 80.0 - CFG.margin_c and d.mode is ThermalMode.LIMITING
    d, _ = decide(ControlInput(t_s=0, temp_c=temp, slope_c_per_s=0.0), Q, None, st0, CFG)
    assert d.t_lim_c == 99.0 and d.mode is ThermalMode.NOMINAL


def test_memory_states_with_hysteresis() -> None:
    gib = 1 << 30
    st = ControllerState()
    d, st = decide(inp(0, 40, mem_available_bytes=8 * gib, psi_some_avg10=12.0), Q, None, st, CFG)
    assert d.memory is MemoryMode.TIGHT and not d.admit_interactive and not d.shed_background
    d, st = decide(inp(1, 40, mem_available_bytes=8 * gib, psi_some_avg10=7.0), Q, None, st, CFG)
    assert d.memory is MemoryMode.TIGHT  # still above half the threshold
    d, st = decide(inp(2, 40, mem_available_bytes=8 * gib, psi_some_avg10=3.0), Q, None, st, CFG)
    assert d.memory is MemoryMode.OK and d.admit_interactive
    d, st = decide(inp(3, 40, mem_available_bytes=8 * gib, psi_full_avg10=2.5), Q, None, st, CFG)
    assert d.memory is MemoryMode.SHED and d.shed_background and not d.knobs.admit_background
    d, st = decide(inp(4, 40, mem_available_bytes=gib // 2), Q, None, ControllerState(), CFG)
    assert d.memory is MemoryMode.SHED and "reserve" in d.reason
    # thermal full speed but memory-limited: the final verdict is the minimum of the two
    assert d.mode is ThermalMode.NOMINAL and not d.admit_interactive


def test_idle_time_never_unloads_keep_alive_is_the_engines() -> None:
    """One owner of keep-alive (the engine, on its own clock): the controller unloads only to give
    memory back, however long the queue has been idle (its idle time came from another clock)."""
    idle = QueueState(last_activity_s=100.0)
    for t_s in (401.0, 10_000.0, 1e7):
        d, _ = decide(inp(t_s, 40), idle, None, ControllerState(), CFG)
        assert not d.unload and not d.evict and "unload" not in d.reason


def test_decide_is_pure_and_accepts_samples() -> None:
    st = ControllerState()
    r = inp(3, T_SET + 1, slope=0.2)
    a = decide(r, Q, None, st, CFG)
    b = decide(r, Q, None, st, CFG)
    assert a == b and st == ControllerState()
    sample = Sample(t_s=3.0, source="sim:x", temp_c=T_SET + 1, limit_c=99.0, kernel_throttling=True)
    d, _ = decide(sample, Q, None, st, CFG)
    assert d.mode is ThermalMode.GUARD  # a bare Sample is adapted field by field


def test_interactive_first_parks_background_when_limiting() -> None:
    mixed = QueueState(running_background=4, waiting_interactive=1)
    only_bg = QueueState(running_background=4)
    hot = inp(10.0, T_SET + CFG.interactive_band_c / 2)  # over target but within the interactive band
    d_bg, _ = decide(hot, only_bg, None, ControllerState(), CFG)
    d_mix, _ = decide(hot, mixed, None, ControllerState(), CFG)
    assert d_bg.mode is ThermalMode.LIMITING and d_bg.knobs.active_limit == 8
    # interactive at full speed; background fills what is left of the level's load, the rest is parked
    k_mix = d_mix.knobs
    assert k_mix.duty == 1.0 and k_mix.n_threads == 2 and 1 <= k_mix.active_limit < 8
    lvl_load = ladder_for(CFG)[level_for_budget(ladder_for(CFG), d_mix.budget)].load
    assert estimated_load(k_mix.active_limit, 2, 1.0, 8, 2) <= max(lvl_load, estimated_load(1, 2, 1.0, 8, 2))
    assert "limiting:background_parked" in d_mix.throttle_reasons
    # hotter than the band: interactive work gets the level's load, not a free boost
    hotter = inp(10.0, T_SET + CFG.interactive_band_c + 0.25)
    assert hotter.temp_c is not None and hotter.temp_c < T_GUARD
    d_hot, _ = decide(hotter, mixed, None, ControllerState(), CFG)
    level_load = ladder_for(CFG)[level_for_budget(ladder_for(CFG), d_hot.budget)].load
    k = d_hot.knobs
    assert k.active_limit < 8
    # never more than the level allows (beyond what one interactive sequence needs at the floor duty)
    assert estimated_load(k.active_limit, k.n_threads, k.duty, 8, 2) <= max(
        level_load, estimated_load(1, 1, CFG.min_duty, 8, 2)) + 1e-9
    assert estimated_load(k.active_limit, k.n_threads, k.duty, 8, 2) < estimated_load(
        k_mix.active_limit, 2, 1.0, 8, 2)  # less than the boost inside the band


def test_falling_temperature_after_a_cut_earns_no_jump_back_to_full() -> None:
    """Cooling because the load was cut says nothing about the full load: climb in bounded steps.

    Before: a steep fall put the forecast far below target and the controller jumped to full
    speed, the die heated by R_die * dP within seconds and the device bounced off the guard.
    """
    ladder = ladder_for(CFG)
    low = len(ladder) - 2
    st = ControllerState(mode=ThermalMode.LIMITING, level=low, last_change_s=0.0, last_t_s=59.0, u_sus=1.0)
    falling = inp(60.0, T_SET - 4.0, slope=-7.5 / CFG.horizon_s)  # forecast T_SET - 11.5, far below target
    d, st2 = decide(falling, Q, stats(ladder[low].knobs), st, CFG)
    assert d.forecast_c is not None and d.forecast_c < T_SET - 10
    assert 0 < st2.level < low  # it does climb ...
    assert ladder[st2.level].load - ladder[low].load <= 0.15 + 1e-9  # ... one bounded step
    # genuinely cool (below T_on, forecast under target): straight back to full speed
    d, st3 = decide(inp(60.0, T_ON - 1.0, slope=-0.1), Q, stats(ladder[low].knobs), st, CFG)
    assert st3.level == 0 and d.mode is ThermalMode.NOMINAL


def test_controller_remembers_psi_so_a_past_hog_releases_admission_early() -> None:
    plenty, gone = 8 << 30, 96 << 20
    st = ControllerState()
    d0, st = decide(inp(0.0, 50.0, mem_available_bytes=gone, psi_some_avg10=53.0, psi_full_avg10=15.6),
                    Q, None, st, CFG)
    assert d0.memory is MemoryMode.SHED and st.mem_short_at_s == 0.0
    # the hog exits: memory is back at once, the PSI averages trail it down
    d1, st = decide(inp(1.0, 50.0, mem_available_bytes=plenty, psi_some_avg10=50.0, psi_full_avg10=15.0),
                    Q, None, st, CFG)
    assert d1.memory is MemoryMode.OK and d1.admit_interactive and d1.admit_background
    assert st.psi_prev == (50.0, 15.0)
    # long after the shortage (beyond the trail), the same PSI means real pressure again
    late = replace(st, memory=MemoryMode.SHED)
    d2, _ = decide(inp(200.0, 50.0, mem_available_bytes=plenty, psi_some_avg10=45.0, psi_full_avg10=13.0),
                   Q, None, late, CFG)
    assert d2.memory is MemoryMode.SHED


def test_guard_trip_teaches_the_sustainable_load_and_drops_credit() -> None:
    """The load that ran into the guard was not sustainable: the climb back starts from below it.

    Before: u_sus stayed at its old guess and the integral kept its credit, so after a fan
    failure the controller climbed straight back into the guard every ~30 s.
    """
    ladder = ladder_for(CFG)
    level = 6
    ran = ladder[level].load
    st = ControllerState(mode=ThermalMode.LIMITING, level=level, last_change_s=0.0, last_t_s=9.0,
                         u_sus=1.0, integral_c_s=-40.0, learned_s=500.0)
    d, st2 = decide(inp(10.0, T_GUARD + 0.1), Q, stats(ladder[level].knobs), st, CFG)
    assert d.mode is ThermalMode.GUARD
    assert st2.u_sus == pytest.approx(0.8 * ran) and st2.u_sus < ran
    assert st2.integral_c_s == 0.0 and st2.learned_s == 0.0
    # staying in the guard teaches nothing more; other guards (no temperature scale) teach nothing
    _, st3 = decide(inp(11.0, T_GUARD + 0.2), Q, stats(ladder[-1].knobs, active=0), st2, CFG)
    assert st3.u_sus == st2.u_sus
    _, st4 = decide(inp(10.0, T_ON - 10, kernel_throttling=True), Q, stats(ladder[level].knobs), st, CFG)
    assert st4.u_sus == 1.0 and st4.integral_c_s == -40.0


def test_integral_earns_no_credit_below_target_while_the_temperature_rises() -> None:
    """Rising towards target is not a steady offset: winding down then only adds overshoot."""
    ladder = ladder_for(CFG)
    level = len(ladder) // 2
    cfg = replace(CFG, up_interval_s=1e9, down_interval_s=1e9)
    flat = rising = ControllerState(mode=ThermalMode.LIMITING, level=level, last_change_s=0.0, last_t_s=0.0,
                                    u_sus=0.5)
    for t in range(1, 60):
        _, flat = decide(inp(float(t), T_SET - 1.0, slope=0.0), Q, stats(ladder[level].knobs), flat, cfg)
        _, rising = decide(inp(float(t), T_SET - 1.0, slope=0.05), Q, stats(ladder[level].knobs), rising, cfg)
    assert flat.integral_c_s < -10.0
    assert rising.integral_c_s == 0.0


def test_target_starts_wider_until_the_sustainable_load_is_learned() -> None:
    cfg = replace(CFG, learning_margin_c=1.0, learn_confidence_s=60.0, up_interval_s=1e9,
                  down_interval_s=1e9)
    final = 99.0 - cfg.margin_c
    (d0,), st = run([inp(0, T_ON - 5)], cfg=cfg)
    assert d0.t_set_c == pytest.approx(final - 1.0)  # a fresh controller has only a guess
    level = 12
    st = ControllerState(mode=ThermalMode.LIMITING, level=level, last_change_s=0.0, last_t_s=0.0)
    half = None
    for t in range(1, 100):
        d, st = decide(inp(float(t), final - 0.5), Q, stats(ladder_for(cfg)[level].knobs), st, cfg)
        if t == 31:
            half = d.t_set_c
    assert half is not None and final - 1.0 < half < final  # the margin shrinks as it learns ...
    assert d.t_set_c == pytest.approx(final) and st.learned_s >= 60.0  # ... to the configured one
    # an idle engine teaches nothing, so the margin stays wide
    idle = ControllerState(mode=ThermalMode.LIMITING, level=level, last_change_s=0.0, last_t_s=0.0)
    for t in range(1, 100):
        d_idle, idle = decide(inp(float(t), final - 0.5), Q, stats(ladder_for(cfg)[level].knobs, active=0),
                              idle, cfg)
    assert d_idle.t_set_c == pytest.approx(final - 1.0)


def test_heating_above_target_at_a_sustainable_cap_learns_the_load_down_fast() -> None:
    """A fan failure: the old sustainable load now heats the device. u_sus drops within seconds.

    Slow learning (only while flat near target) left u_sus at its old value for the whole
    excursion, and the Pi profile's fan-failure run crept past T_lim - 3 on 2 of 24 seeds.
    """
    ladder = ladder_for(CFG)
    level = 8
    cap = ladder[level].load
    cfg = replace(CFG, up_interval_s=1e9, down_interval_s=1e9)  # freeze the level to isolate learning
    start = ControllerState(mode=ThermalMode.LIMITING, level=level, last_change_s=0.0, last_t_s=0.0,
                            u_sus=cap)
    st = start
    for t in range(1, 11):  # 10 s above target and rising, engine running at the cap
        _, st = decide(inp(float(t), T_SET + 0.5, slope=0.1), Q, stats(ladder[level].knobs), st, cfg)
    assert st.u_sus < 0.95 * cap
    # rising above target because the cap sits well above u_sus (a boost, a climb) teaches nothing
    above = replace(start, u_sus=cap - 0.3)
    for t in range(1, 11):
        _, above = decide(inp(float(t), T_SET + 0.5, slope=0.1), Q, stats(ladder[level].knobs), above, cfg)
    assert above.u_sus == pytest.approx(cap - 0.3)
    # nor does heating while the engine runs far below its cap (demand, not the cap, set the load)
    light = start
    for t in range(1, 11):
        _, light = decide(inp(float(t), T_SET + 0.5, slope=0.1), Q, stats(ladder[level].knobs, active=1),
                          light, cfg)
    assert light.u_sus == pytest.approx(cap)


CFG_T = replace(CFG, decode_tps=load_throughput().decode_table(8))  # the measured calibration


def _limiting_at(cfg: ControllerConfig, load: float) -> tuple[ControllerState, int]:
    """A controller that learned `load` as sustainable and sits at that level of the ladder."""
    ladder = ladder_for(cfg)
    level = level_for_budget(ladder, load)
    return ControllerState(mode=ThermalMode.LIMITING, level=level, last_change_s=0.0, last_t_s=99.0,
                           u_sus=ladder[level].load), level


def test_background_runs_at_its_efficient_batch_beside_a_streaming_chat() -> None:
    """Measured figures: one thread decodes 1-3 sequences at one rate; more background adds heat, not tokens.

    Before: an interactive request parked background work for its whole answer, running alone at
    two threads (85 tokens per unit of load in `edge sim`, against 109 for a batch of three).
    """
    ladder = ladder_for(CFG_T)
    st, level = _limiting_at(CFG_T, 0.45)
    assert 0 < ladder[level].batch < 8
    at_target = inp(100.0, T_SET)
    streaming = QueueState(running_interactive=1, running_background=4)
    d, st2 = decide(at_target, streaming, stats(ladder[level].knobs, active=5), st, CFG_T)
    assert st2.level == level and d.mode is ThermalMode.LIMITING
    assert d.knobs.active_limit == ladder[level].batch  # the chat plus background up to the batch
    assert "limiting:background_parked" not in d.throttle_reasons
    # no background: the chat users are never held to the batch
    chat = QueueState(running_interactive=6)
    d_chat, _ = decide(at_target, chat, stats(ladder[level].knobs, active=6), st, CFG_T)
    assert d_chat.knobs.active_limit == 8
    # more chat users than the batch: every one of them stays active
    crowd = QueueState(running_interactive=6, running_background=2)
    d_crowd, _ = decide(at_target, crowd, stats(ladder[level].knobs, active=8), st, CFG_T)
    assert d_crowd.knobs.active_limit == 6


def test_interactive_waiting_for_its_first_token_runs_alone() -> None:
    ladder = ladder_for(CFG_T)
    st, level = _limiting_at(CFG_T, 0.45)
    prefilling = engine_stats(active=5, knobs=ladder[level].knobs, interactive_awaiting_first=1)
    queue = QueueState(running_interactive=1, running_background=4)
    d, _ = decide(inp(100.0, T_SET), queue, prefilling, st, CFG_T)
    assert "limiting:background_parked" in d.throttle_reasons
    assert d.knobs.active_limit < ladder[level].batch  # background parked until the first token
    queued = QueueState(waiting_interactive=1, running_background=4)  # not even in a slot yet
    d_q, _ = decide(inp(100.0, T_SET), queued, stats(ladder[level].knobs, active=4), st, CFG_T)
    assert "limiting:background_parked" in d_q.throttle_reasons


def test_pre_guard_cuts_when_a_reading_right_under_the_guard_rises_fast() -> None:
    """The 15 s slope lags a sudden change; the raw readings of the last seconds do not.

    Before: after a fan failure the die rose ~0.3 C/s while the fitted slope still read ~0,
    and the die crossed the guard line (82 C on the Pi) before the controller cut.
    """
    ladder = ladder_for(CFG_T)
    st, level = _limiting_at(CFG_T, 0.6)
    running = stats(ladder[level].knobs, active=8)
    applied = estimated_load(8, ladder[level].knobs.n_threads, ladder[level].knobs.duty, 8, 2,
                             ladder[level].knobs.off_threads, rates_of(CFG_T.decode_tps))
    near = T_GUARD - CFG_T.pre_guard_c / 2
    rising = inp(100.0, T_SET, raw_temp_c=near, fast_slope_c_per_s=0.2)
    d, st2 = decide(rising, Q, running, st, CFG_T)
    assert "limiting:pre_guard" in d.throttle_reasons and d.mode is ThermalMode.LIMITING
    assert ladder[st2.level].load <= CFG_T.pre_guard_cut * applied + 1e-9
    assert st2.last_change_s == 100.0  # climbing back starts from here, rate-limited
    # the same reading, flat: nothing to react to beyond the PI
    flat = inp(100.0, T_SET, raw_temp_c=near, fast_slope_c_per_s=0.0)
    d_flat, st_flat = decide(flat, Q, running, st, CFG_T)
    assert "limiting:pre_guard" not in d_flat.throttle_reasons and st_flat.level == level
    # rising fast but well under the guard: the forecast and the PI handle it
    low = inp(100.0, T_SET, raw_temp_c=T_SET, fast_slope_c_per_s=0.3)
    d_low, _ = decide(low, Q, running, st, CFG_T)
    assert "limiting:pre_guard" not in d_low.throttle_reasons


def test_speculation_only_at_full_load() -> None:
    (cool,), _ = run([inp(0, T_ON - 5)])
    assert cool.knobs.speculate  # full speed: drafts may pay
    (hot,), _ = run([inp(0, T_SET + 1, slope=0.3)])
    assert hot.knobs.duty < 1.0 or hot.knobs.n_threads < CFG.max_threads or hot.knobs.paused
    assert not hot.knobs.speculate  # the controller is cutting work: no tokens thrown away
