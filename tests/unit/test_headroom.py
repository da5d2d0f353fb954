"""Headroom and the balancer's weight: pure functions of a decision, its config and the queue."""

from __future__ import annotations

from dataclasses import replace

import pytest

from edge.runtime.types import Knobs
from edge.scheduler.headroom import (
    MIN_WEIGHT_PCT,
    AgentState,
    AgentWeight,
    LoadState,
    agent_weight,
    limits_of,
    memory_headroom,
    thermal_headroom,
)
from edge.scheduler.state import (
    ControllerConfig,
    Decision,
    LimitHeadroom,
    LimitKind,
    MemoryMode,
    ThermalMode,
)

CFG = ControllerConfig()  # guard band 3, on band 10
# T_lim 99, T_set 94.5: full weight below T_on = 84.5, none at the guard line 96
BASE = Decision(knobs=Knobs(active_limit=4, n_threads=2), mode=ThermalMode.NOMINAL, memory=MemoryMode.OK,
                admit_interactive=True, admit_background=True, shed_background=False, unload=False,
                reason="cool", t_s=0.0, budget=1.0, t_lim_c=99.0, t_set_c=94.5, forecast_c=60.0)
IDLE = LoadState(running=0, waiting=0, n_slots=4, max_queue=8)


def _weight(limits: tuple[LimitHeadroom, ...] = (), load: LoadState = IDLE, **kw: object) -> AgentWeight:
    args: dict[str, object] = {"draining": False, "ready": True, "not_ready_reason": ""}
    args.update(kw)
    return agent_weight(limits=limits, load=load, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(("forecast_c", "expected"), [
    (60.0, 1.0), (84.5, 1.0), (90.25, 0.5), (96.0, 0.0), (101.0, 0.0)])
def test_thermal_headroom_falls_linearly_from_t_on_to_the_guard_line(forecast_c: float,
                                                                    expected: float) -> None:
    h = thermal_headroom(replace(BASE, forecast_c=forecast_c), CFG)
    assert h.kind is LimitKind.THERMAL and not h.blocking
    assert h.headroom == pytest.approx(expected)


def test_thermal_headroom_never_exceeds_the_budget_and_blocks_when_paused() -> None:
    limiting = replace(BASE, mode=ThermalMode.LIMITING, budget=0.4, forecast_c=86.0)
    h = thermal_headroom(limiting, CFG)
    assert h.headroom == pytest.approx(0.4) and "budget 0.40" in h.reason
    for mode in (ThermalMode.PAUSED, ThermalMode.GUARD):
        h = thermal_headroom(replace(BASE, mode=mode, admit_interactive=False, budget=0.0), CFG)
        assert h.blocking and h.headroom == 0.0 and mode.value in h.reason
    # no thermal sensor: the forecast is unknown, the weight is the budget's (full speed)
    h = thermal_headroom(replace(BASE, mode=ThermalMode.UNAVAILABLE, forecast_c=None), CFG)
    assert h.headroom == 1.0 and not h.blocking


def test_memory_blocks_outside_ok_and_controller_limits_are_appended() -> None:
    assert not memory_headroom(BASE).blocking
    tight = replace(BASE, memory=MemoryMode.TIGHT, admit_interactive=False, reason="PSI high")
    m = memory_headroom(tight)
    assert m.blocking and m.kind is LimitKind.MEMORY and "PSI high" in m.reason
    # a paused admission because of memory is the memory limit's, not a thermal one
    assert not thermal_headroom(tight, CFG).blocking
    power = LimitHeadroom(LimitKind.POWER, 0.3, False, "12.1 W of 15 W")
    kinds = [lim.kind for lim in limits_of(replace(BASE, limits=(power,)), CFG)]
    assert kinds == [LimitKind.THERMAL, LimitKind.MEMORY, LimitKind.POWER]


def test_full_headroom_idle_box_gets_full_weight() -> None:
    w = _weight(limits_of(BASE, CFG))
    assert w == AgentWeight(AgentState.UP, 100, "full headroom", w.factors)
    assert dict(w.factors) == {"thermal": 1.0, "memory": 1.0, "slots": 1.0, "queue": 1.0}
    assert w.line() == "up 100%" and w.line(announce_ready=True) == "up ready 100%"


def test_a_box_heating_up_loses_weight_before_it_refuses_work() -> None:
    weights = [_weight(limits_of(replace(BASE, forecast_c=f), CFG)).weight_pct
               for f in (80.0, 86.0, 89.0, 92.0, 95.0)]
    assert weights == sorted(weights, reverse=True) and weights[0] == 100 and weights[-1] < 10
    hot = _weight(limits_of(replace(BASE, forecast_c=92.0), CFG))
    assert hot.state is AgentState.UP and hot.reason.startswith("thermal 0.35: forecast 92.0 C")


def test_the_tightest_limit_sets_the_weight_and_power_slots_in() -> None:
    power = LimitHeadroom(LimitKind.POWER, 0.25, False, "13.5 W of 15 W budget")
    w = _weight((*limits_of(replace(BASE, forecast_c=88.0), CFG), power))
    assert w.weight_pct == 25 and w.reason == "power 0.25: 13.5 W of 15 W budget"


def test_slots_and_queue_scale_the_weight() -> None:
    limits = limits_of(BASE, CFG)
    half = _weight(limits, LoadState(running=2, waiting=0, n_slots=4, max_queue=8))
    assert half.weight_pct == 88 and half.reason == "slots 0.88: 2 of 4 slots busy"
    busy = _weight(limits, LoadState(running=4, waiting=4, n_slots=4, max_queue=7))
    assert busy.weight_pct == 56 and dict(busy.factors)["queue"] == 0.75  # slots 0.75 x queue 0.75
    full = _weight(limits, LoadState(running=4, waiting=8, n_slots=4, max_queue=7))
    assert dict(full.factors)["queue"] == 0.5 and full.weight_pct == 38
    # the limits weigh more than the load: a hot idle box gets less than a cool busy one
    hot_idle = _weight(limits_of(replace(BASE, forecast_c=92.0), CFG))
    assert hot_idle.weight_pct < busy.weight_pct
    # never 0 while up: 0 % reads as DRAIN in HAProxy and the box would get nothing
    crowded = _weight((LimitHeadroom(LimitKind.THERMAL, 0.004, False, "hot"),),
                      LoadState(running=4, waiting=7, n_slots=4, max_queue=7))
    assert crowded.weight_pct == MIN_WEIGHT_PCT and crowded.state is AgentState.UP


def test_draining_and_not_ready_override_every_headroom() -> None:
    limits = limits_of(BASE, CFG)
    d = _weight(limits, draining=True, ready=False, not_ready_reason="server draining")
    assert d.state is AgentState.DRAIN and d.line() == "drain" and d.line(announce_ready=True) == "drain"
    down = _weight(limits, ready=False, not_ready_reason="past the thermal limit: guard – 97 °C\n")
    assert down.state is AgentState.DOWN and down.weight_pct == 0
    line = down.line()
    assert line.startswith("down #past the thermal limit") and line.isascii() and "\n" not in line


def test_queue_full_follows_admissions_rule() -> None:
    assert not LoadState(running=1, waiting=0, n_slots=2, max_queue=0).queue_full  # a free slot
    assert LoadState(running=2, waiting=0, n_slots=2, max_queue=0).queue_full
    assert not LoadState(running=2, waiting=2, n_slots=2, max_queue=3).queue_full
    assert LoadState(running=2, waiting=3, n_slots=2, max_queue=3).queue_full


def test_a_power_budget_is_a_limit_the_balancer_and_readiness_see() -> None:
    from edge.scheduler.state import BudgetOrigin, PowerControl, PowerStatus

    assert [lim.kind for lim in limits_of(BASE, CFG)] == [LimitKind.THERMAL, LimitKind.MEMORY]  # no budget
    held = replace(BASE, power=PowerStatus(PowerControl.HOLDING, 10.0, BudgetOrigin.SETTING, power_w=6.0))
    (power,) = [lim for lim in limits_of(held, CFG) if lim.kind is LimitKind.POWER]
    assert power.headroom == pytest.approx(0.4) and not power.blocking and "6.0 W of 10.0 W" in power.reason
    over = replace(BASE, power=PowerStatus(PowerControl.LIMITING, 10.0, BudgetOrigin.SETTING, power_w=11.0))
    (power,) = [lim for lim in limits_of(over, CFG) if lim.kind is LimitKind.POWER]
    assert power.blocking and power.headroom == 0.0  # more than 5 % over: no new work
    blind = replace(BASE, power=PowerStatus(PowerControl.FAIL_CLOSED, 10.0, BudgetOrigin.SETTING))
    (power,) = [lim for lim in limits_of(blind, CFG) if lim.kind is LimitKind.POWER]
    assert power.headroom == 0.0 and not power.blocking  # no reading: weighed down, still serving
    assert _weight(limits_of(blind, CFG)).weight_pct == MIN_WEIGHT_PCT
