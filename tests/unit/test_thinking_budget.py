"""The thinking budget the device can afford (scheduler/reasoning.py): the shrink rule, the
scheduler loop's status of it, a request's cap, and `edge sim` showing it shrink on battery and
under a power cut."""

from __future__ import annotations

import pytest

from edge.clock import ManualClock
from edge.contracts.engine import Knobs
from edge.scheduler.loop import SchedulerLoop
from edge.scheduler.reasoning import (
    BATTERY_RESERVE_FACTOR,
    CUT_BASE_TOKENS,
    FLOOR_TOKENS,
    ThinkingBudget,
    request_budget,
    thinking_budget,
)
from edge.scheduler.state import Decision, MemoryMode, PowerControl, PowerStatus, ThermalMode
from edge.sim.harness import run_scenario
from edge.sim.throughput import DEFAULT_CALIBRATION, load_throughput
from tests.fakes import ScriptedEngine


def decision(mode: ThermalMode = ThermalMode.NOMINAL, budget: float = 1.0,
             power: PowerStatus | None = None) -> Decision:
    return Decision(knobs=Knobs(4, 2), mode=mode, memory=MemoryMode.OK, admit_interactive=True,
                    admit_background=True, shed_background=False, unload=False, reason="", t_s=0.0,
                    budget=budget, power=power or PowerStatus())


def test_no_cut_keeps_the_setting_and_unlimited_stays_unlimited() -> None:
    assert thinking_budget(512, decision()) == ThinkingBudget(512, 512)
    assert thinking_budget(-1, decision()).tokens is None
    assert thinking_budget(None, None).tokens is None
    holding = PowerStatus(control=PowerControl.HOLDING, budget_w=7.0, cap_load=0.5)
    assert not thinking_budget(512, decision(power=holding)).shrunk  # heat binds, not power
    unavailable = decision(ThermalMode.UNAVAILABLE)
    assert thinking_budget(512, unavailable).tokens == 512
    # a limiting stage that still allows the full load cuts nothing (an unlimited budget stays so)
    assert not thinking_budget(None, decision(ThermalMode.LIMITING, budget=1.0)).shrunk


def test_a_thermal_cut_scales_by_the_allowed_load() -> None:
    b = thinking_budget(1000, decision(ThermalMode.LIMITING, budget=0.4))
    assert b.tokens == 400 and b.factor == pytest.approx(0.4) and "thermal limiting" in b.reasons[0]
    # unlimited scales from the cut base; a guard (load 0) leaves the floor
    assert thinking_budget(None, decision(ThermalMode.CONSERVATIVE, 0.5)).tokens == CUT_BASE_TOKENS // 2
    assert thinking_budget(None, decision(ThermalMode.GUARD, 0.0)).tokens == FLOOR_TOKENS
    assert thinking_budget(10, decision(ThermalMode.GUARD, 0.0)).tokens == 10  # never above the setting


def test_power_cut_and_battery_reserve_take_the_lower_factor() -> None:
    power = PowerStatus(control=PowerControl.LIMITING, budget_w=7.0, cap_load=0.3)
    # a power cap makes the mode LIMITING too: counted once, as the power's
    b = thinking_budget(1000, decision(ThermalMode.LIMITING, 0.3, power))
    assert b.tokens == 300 and len(b.reasons) == 1 and "power budget 7 W" in b.reasons[0]
    low = PowerStatus(control=PowerControl.LIMITING, budget_w=8.0, cap_load=0.6, on_battery=True,
                      battery_pct=12.0, battery_low=True)
    b = thinking_budget(1000, decision(ThermalMode.LIMITING, 0.6, low))
    assert b.tokens == int(1000 * BATTERY_RESERVE_FACTOR) and "battery 12% under its reserve" in b.reasons[-1]
    failing = PowerStatus(control=PowerControl.FAIL_CLOSED, budget_w=7.0, cap_load=None)
    assert thinking_budget(1000, decision(ThermalMode.LIMITING, 0.5, failing)).tokens == 500
    assert b.as_dict()["shrunk"] and "battery" in b.as_dict()["reason"]


def test_a_request_may_ask_for_less_never_more() -> None:
    assert request_budget(ThinkingBudget(256, 1024, 0.25, ("x",)), 1000) == 256
    assert request_budget(ThinkingBudget(256, 1024, 0.25, ("x",)), 100) == 100
    assert request_budget(ThinkingBudget(None, None), 100) == 100
    assert request_budget(ThinkingBudget(None, None), None) is None


def test_the_scheduler_loop_reports_the_budget_in_force_and_its_history() -> None:
    engine = ScriptedEngine(n_slots=2, autostep=False)
    engine.start()
    loop = SchedulerLoop(None, engine, ManualClock(), reasoning_budget_tokens=800)
    loop.tick(0.0)  # no telemetry: conservative, a cut
    loop.tick(2.0)
    status = loop.status()["reasoning_budget"]
    assert status["base_tokens"] == 800 and status["shrunk"] and status["tokens"] < 800
    assert status["shrunk_s"] == pytest.approx(2.0) and status["min_tokens"] == status["tokens"]
    assert "conservative" in status["reason"]
    assert loop.reasoning_budget(None).base_tokens is None


@pytest.mark.parametrize(("scenario", "why"), [("power-7w", "power budget 7 W"), ("unplugged", "battery")])
def test_edge_sim_shows_the_budget_shrink_on_battery_and_under_a_power_cut(scenario: str, why: str) -> None:
    tp = load_throughput(DEFAULT_CALIBRATION)
    think = run_scenario(scenario, "edge", "jetson-orin-nano", tp, duration_s=300.0).extra["reasoning_budget"]
    assert think["shrunk_s"] > 0 and think["min_tokens"] < CUT_BASE_TOKENS and why in think["reason"]
    calm = run_scenario("chat", "edge", "jetson-orin-nano", tp, duration_s=120.0).extra["reasoning_budget"]
    assert calm["shrunk_s"] == 0 and calm["tokens"] is None


def test_edge_sim_prints_the_thinking_budget_it_cut(capsys: pytest.CaptureFixture[str]) -> None:
    from edge.cli import main

    assert main(["sim", "--scenario", "power-7w", "--policy", "edge", "--duration-s", "120"]) == 0
    note = next(line for line in capsys.readouterr().out.splitlines() if "thinking budget" in line)
    assert "thinking budget cut for" in note and "(from unlimited)" in note and "power budget 7 W" in note
