"""The power stage of decide(): budget resolution, holding a budget on a fake device, feed-forward,
anti-windup, fail-closed on missing/stale readings, the binding of heat and power, battery reserve."""

from __future__ import annotations

import pytest

from edge.runtime.types import Knobs
from edge.scheduler.controller import decide, ladder_for
from edge.scheduler.policy import estimated_load
from edge.scheduler.power import fail_closed_load, power_verdict, resolve_budget
from edge.scheduler.state import (
    BudgetOrigin,
    ControlInput,
    ControllerConfig,
    ControllerState,
    PowerControl,
    QueueState,
    ThermalMode,
)
from tests.fakes import engine_stats

CFG = ControllerConfig(n_slots=8, max_threads=2, limit_c=99.0, learning_margin_c=0.0, idle_power_w=5.0,
                       max_power_w=15.0)
LADDER = ladder_for(CFG)
COOL = 50.0  # far below T_on: thermal never binds in these tests
BUSY = QueueState(running_background=8)


def inp(t_s: float, power_w: float | None, **kw: object) -> ControlInput:
    return ControlInput(t_s=t_s, temp_c=COOL, slope_c_per_s=0.0, limit_c=99.0, power_w=power_w,
                        **kw)  # type: ignore[arg-type]


def device_power(knobs: Knobs, idle_w: float = 5.0, span_w: float = 12.0, active: int = 8) -> float:
    """A fake device whose watts are NOT the controller's prior (span 12 W, not 10): it has to learn."""
    if knobs.paused:
        return idle_w
    return idle_w + span_w * estimated_load(min(active, knobs.active_limit), knobs.n_threads, knobs.duty,
                                            CFG.n_slots, CFG.max_threads, knobs.off_threads)


def hold(cfg: ControllerConfig, seconds: int, power_of=device_power,  # type: ignore[no-untyped-def]
         queue: QueueState = BUSY, active: int = 8, **kw: object):
    state, knobs, trace = ControllerState(), LADDER[0].knobs, []
    for t in range(seconds):
        p = power_of(knobs)
        running = min(active, knobs.active_limit)
        stats = engine_stats(active=running, knobs=knobs)
        d, state = decide(inp(float(t), p, **kw), queue, stats, state, cfg)
        knobs = d.knobs
        trace.append((t, p, d))
    return trace, state


def test_budget_precedence_setting_mode_battery_profile_supply() -> None:
    cfg = ControllerConfig(power_budget_w=9.0, profile_power_budget_w=12.0, battery_power_budget_w=6.0)
    assert resolve_budget(ControlInput(t_s=0, power_mode_budget_w=7.0), cfg) == (9.0, BudgetOrigin.SETTING)
    cfg = ControllerConfig(profile_power_budget_w=12.0, battery_power_budget_w=6.0)
    assert resolve_budget(ControlInput(t_s=0, power_mode_budget_w=7.0), cfg) == (7.0, BudgetOrigin.POWER_MODE)
    assert resolve_budget(ControlInput(t_s=0, on_battery=True), cfg) == (6.0, BudgetOrigin.BATTERY)
    assert resolve_budget(ControlInput(t_s=0, on_battery=False), cfg) == (12.0, BudgetOrigin.PROFILE)
    assert resolve_budget(ControlInput(t_s=0, supply_limit_w=8.0), cfg) == (8.0, BudgetOrigin.SUPPLY)
    assert resolve_budget(ControlInput(t_s=0), ControllerConfig()) == (None, BudgetOrigin.NONE)


def test_no_budget_leaves_the_decision_unchanged() -> None:
    d0, _ = decide(inp(0, 14.0), BUSY, engine_stats(active=8, knobs=LADDER[0].knobs), ControllerState(), CFG)
    assert d0.power.control is PowerControl.OFF and d0.power.headroom_frac == 1.0
    assert d0.mode is ThermalMode.NOMINAL and d0.knobs == LADDER[0].knobs


def test_budget_is_held_within_five_percent_over_any_ten_seconds() -> None:
    cfg = ControllerConfig(**{**CFG.__dict__, "power_budget_w": 8.0})
    trace, state = hold(cfg, 120)
    powers = [p for _, p, _ in trace]
    windows = [sum(powers[i:i + 10]) / 10 for i in range(len(powers) - 9)]
    assert max(windows[3:]) <= 8.0 * 1.05  # after the first few decisions
    assert sum(powers[60:]) / 60 >= 8.0 * 0.8  # and it does not throttle far below the budget
    assert trace[-1][2].power.control is PowerControl.LIMITING
    assert trace[-1][2].mode is ThermalMode.LIMITING and "limiting:power" in trace[-1][2].throttle_reasons
    assert state.power_w_per_load == pytest.approx(12.0, rel=0.25)  # learned the device's real span


def test_feed_forward_jumps_to_the_sustainable_load_in_one_decision() -> None:
    cfg = ControllerConfig(**{**CFG.__dict__, "power_budget_w": 8.0})
    v = power_verdict(inp(1.0, 15.0), ControllerState(last_t_s=0.0), cfg, LADDER, applied=1.0, dt_s=1.0)
    # the prior (10 W span) learned a little towards the 10 W/load seen; the cap is about (7.6 - 5) / 10
    ff = (8.0 * 0.95 - 5.0) / 10.0
    assert 0.4 * ff <= LADDER[v.level].load <= ff + 1e-9  # near the sustainable load, not paused


def test_anti_windup_no_credit_while_demand_not_the_cap_keeps_power_low() -> None:
    cfg = ControllerConfig(**{**CFG.__dict__, "power_budget_w": 14.0})

    def light(knobs: Knobs) -> float:  # one sequence of demand: far under the budget
        return device_power(knobs, active=1)

    trace, state = hold(cfg, 300, power_of=light, queue=QueueState(running_interactive=1), active=1)
    assert state.power_integral <= 1e-9  # no credit built while demand, not the cap, kept power low
    assert all(d.power.control is not PowerControl.LIMITING for _, _, d in trace[5:])


def test_integral_is_clamped_under_a_persistent_overshoot() -> None:
    cfg = ControllerConfig(**{**CFG.__dict__, "power_budget_w": 6.0})
    trace, state = hold(cfg, 200, power_of=lambda k: 14.0)  # a reading that never follows the knobs
    assert state.power_integral == pytest.approx(-cfg.power_integral_max)
    k, floor = trace[-1][2].knobs, LADDER[-2].knobs
    assert trace[-1][2].power.cap_load == 0.0 and not k.paused  # the floor, not a pause
    assert (k.n_threads, k.duty) == (floor.n_threads, floor.duty)


@pytest.mark.parametrize("fault", ["missing", "stale"])
def test_fail_closed_lowers_the_load_never_removes_the_limit(fault: str) -> None:
    cfg = ControllerConfig(**{**CFG.__dict__, "power_budget_w": 8.0})
    r = inp(0, None) if fault == "missing" else inp(0, 7.0, power_stale=True)
    d, _ = decide(r, BUSY, engine_stats(active=8, knobs=LADDER[0].knobs), ControllerState(), cfg)
    cap = fail_closed_load(8.0 * 0.95, cfg)
    assert d.power.control is PowerControl.FAIL_CLOSED and d.power.headroom_frac == 0.0
    assert LADDER[[lv.knobs for lv in LADDER].index(d.knobs) if d.knobs in [lv.knobs for lv in LADDER]
                  else -1].load <= cap + 1e-9
    assert "limiting:power_fail_closed" in d.throttle_reasons
    assert not d.knobs.paused  # admitted work still progresses, at the lowest running level at worst
    tiny = ControllerConfig(**{**CFG.__dict__, "power_budget_w": 3.0})  # under the idle power
    d, _ = decide(r, BUSY, engine_stats(active=8, knobs=LADDER[0].knobs), ControllerState(), tiny)
    floor = LADDER[-2].knobs
    assert not d.knobs.paused and (d.knobs.n_threads, d.knobs.duty) == (floor.n_threads, floor.duty)
    assert d.admit_interactive
    # no budget: a missing power reading changes nothing
    d, _ = decide(inp(0, None), BUSY, engine_stats(active=8, knobs=LADDER[0].knobs), ControllerState(), CFG)
    assert d.knobs == LADDER[0].knobs


def test_the_binding_one_of_heat_and_power_wins() -> None:
    cfg = ControllerConfig(**{**CFG.__dict__, "power_budget_w": 14.0})  # generous budget
    hot = ControlInput(t_s=0, temp_c=99.0 - CFG.margin_c + 2.0, slope_c_per_s=0.2, limit_c=99.0, power_w=10.0)
    d, st = decide(hot, BUSY, engine_stats(active=8, knobs=LADDER[0].knobs),
                   ControllerState(last_t_s=-1.0), cfg)
    assert st.level > st.power_level  # heat binds: the power stage did not raise it
    assert d.power.control is PowerControl.HOLDING
    tight = ControllerConfig(**{**CFG.__dict__, "power_budget_w": 6.0})
    d2, st2 = decide(inp(0, 15.0), BUSY, engine_stats(active=8, knobs=LADDER[0].knobs),
                     ControllerState(last_t_s=-1.0), tight)
    assert st2.power_level > st2.level and d2.power.control is PowerControl.LIMITING


def test_battery_reserve_parks_background_and_keeps_interactive() -> None:
    cfg = ControllerConfig(**{**CFG.__dict__, "battery_reserve_pct": 20.0})
    low = inp(0, 9.0, on_battery=True, battery_pct=15.0)
    d, _ = decide(low, QueueState(running_background=4), engine_stats(active=4, knobs=LADDER[0].knobs),
                  ControllerState(), cfg)
    assert d.knobs.paused and not d.admit_background and d.admit_interactive
    assert d.power.battery_low and "battery:reserve" in d.throttle_reasons
    mixed = QueueState(running_background=4, running_interactive=1)
    d, _ = decide(low, mixed, engine_stats(active=5, knobs=LADDER[0].knobs), ControllerState(), cfg)
    assert not d.knobs.paused and d.knobs.active_limit == 1 and d.knobs.n_threads == CFG.max_threads
    assert d.knobs.duty == 1.0  # the chat keeps its speed
    # above the reserve, or on mains, or with the charge unknown: background runs
    for r in (inp(0, 9.0, on_battery=True, battery_pct=50.0), inp(0, 9.0, on_battery=False, battery_pct=5.0),
              inp(0, 9.0, on_battery=True)):
        d, _ = decide(r, QueueState(running_background=4), engine_stats(active=4, knobs=LADDER[0].knobs),
                      ControllerState(), cfg)
        assert not d.knobs.paused and d.admit_background


def test_power_status_is_typed_and_serialised() -> None:
    cfg = ControllerConfig(**{**CFG.__dict__, "power_budget_w": 10.0})
    d, _ = decide(inp(0, 8.0), BUSY, engine_stats(active=8, knobs=LADDER[0].knobs), ControllerState(), cfg)
    assert d.power.budget_w == 10.0 and d.power.headroom_w == pytest.approx(2.0)
    assert d.power.headroom_frac == pytest.approx(0.2)
    out = d.as_dict()["power"]
    assert out["control"] in ("holding", "limiting") and out["origin"] == "setting"
    assert out["headroom_frac"] == pytest.approx(0.2)
