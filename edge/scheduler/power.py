"""The power stage of `decide()`: hold a budget in watts, as the kernel's power_allocator does.

Budget, highest precedence first: `--power-budget W` (settings), the nvpmodel mode's budget
(telemetry), the profile (`battery_power_budget_w` on battery, else `power_budget_w`); a
supply that reports less than that (`supply_limit_w`: sagging, renegotiated) lowers it.
The controller aims `power_target_frac` under the budget so that noise and one control
period of lag stay inside the +5 % any 10 s window may show.

    P     ~ P_idle + w * load                  (w, P_idle learned online from the readings)
    u_ff  = (P_target - P_idle) / w            (feed-forward: the sustainable load)
    e     = (P_target - P) / w                 (error in load units)
    u     = u_ff + k_i * I - k_p * max(0, -e)  (the proportional term only cuts)
    I     integrates e, clamped; above target always, below only while the cap binds (anti-windup)

`u` picks the fastest ladder level whose estimated load fits (the same ladder as the
thermal stage, so threads, duty and slots are turned as for heat); the binding one of the
two, the lower load, wins. Down at once, up at most every `power_up_interval_s`.

Fail closed: with a budget, a missing, stale or stuck power reading caps the load at
what the profile's worst case (`max_power_w`) allows under the target, and at most
`conservative_load`: the limit is lowered, never removed. The power stage never pauses:
its floor is the lowest running level, since admitted work must progress (heat may pause).

Battery reserve: on battery below `battery_reserve_pct`, background work waits (not
admitted, parked, KV kept) while interactive work runs as before (`battery_low`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from edge.scheduler.policy import Level, Rates, estimated_load
from edge.scheduler.state import (
    BudgetOrigin,
    ControlInput,
    ControllerConfig,
    ControllerState,
    PowerControl,
    PowerStatus,
)


@dataclass(frozen=True)
class PowerVerdict:
    """What the power stage allows, and the learning it leaves behind (`status()`: the typed view
    the Decision carries)."""

    control: PowerControl
    budget_w: float | None
    origin: BudgetOrigin
    power_w: float | None
    level: int  # ladder index the power budget allows (0: no cap)
    cap_load: float | None  # allowed estimated load (None: no cap)
    integral: float
    w_per_load: float
    idle_w: float
    reason: str = ""
    on_battery: bool | None = None
    battery_pct: float | None = None
    battery_low: bool = False

    def status(self) -> PowerStatus:
        return PowerStatus(self.control, self.budget_w, self.origin, self.power_w, self.cap_load,
                           self.on_battery, self.battery_pct, self.battery_low)


def resolve_budget(inp: ControlInput, cfg: ControllerConfig) -> tuple[float | None, BudgetOrigin]:
    budget, origin = None, BudgetOrigin.NONE
    if cfg.power_budget_w is not None:
        budget, origin = cfg.power_budget_w, BudgetOrigin.SETTING
    elif inp.power_mode_budget_w is not None:
        budget, origin = inp.power_mode_budget_w, BudgetOrigin.POWER_MODE
    elif inp.on_battery and cfg.battery_power_budget_w is not None:
        budget, origin = cfg.battery_power_budget_w, BudgetOrigin.BATTERY
    elif cfg.profile_power_budget_w is not None:
        budget, origin = cfg.profile_power_budget_w, BudgetOrigin.PROFILE
    if inp.supply_limit_w is not None and (budget is None or inp.supply_limit_w < budget):
        budget, origin = inp.supply_limit_w, BudgetOrigin.SUPPLY
    return budget, origin


def battery_low(inp: ControlInput, cfg: ControllerConfig) -> bool:
    """On battery below the reserve (an unknown charge is not taken as low: the budget still holds)."""
    return bool(inp.on_battery) and inp.battery_pct is not None and inp.battery_pct < cfg.battery_reserve_pct


def _prior_w(cfg: ControllerConfig) -> float:
    return max(0.1, cfg.max_power_w - cfg.idle_power_w)


def fail_closed_load(target_w: float, cfg: ControllerConfig) -> float:
    """The load at which the profile's worst case draws the target, and at most conservative_load."""
    return min(cfg.conservative_load, max(0.0, (target_w - cfg.idle_power_w) / _prior_w(cfg)))


@dataclass(frozen=True)
class Demand:
    """Sequences that want to run now (running, parked or waiting), by priority."""

    interactive: int = 0
    background: int = 0


def effective_loads(ladder: tuple[Level, ...], demand: Demand, cfg: ControllerConfig,
                    rates: Rates | None) -> list[float]:
    """Estimated load each level would really run at with this demand: no more sequences than want
    to run, background held to the level's efficient batch (as shape_knobs does). A budget in watts is
    about what is drawn, not what a level could draw with every slot busy."""
    want = demand.interactive + demand.background
    loads = []
    for lv in ladder:
        k = lv.knobs
        if k.paused:
            loads.append(0.0)
            continue
        active = min(max(1, want), k.active_limit)
        if lv.batch > 0 and demand.background > 0:
            active = min(active, max(lv.batch, demand.interactive))
        loads.append(estimated_load(active, k.n_threads, k.duty, cfg.n_slots, cfg.max_threads, k.off_threads,
                                    rates))
    return loads


@lru_cache(maxsize=256)
def _loads_for(cfg: ControllerConfig, demand: Demand) -> tuple[float, ...]:
    from edge.scheduler.thermal import ladder_for, rates_for  # cached per config

    return tuple(effective_loads(ladder_for(cfg), demand, cfg, rates_for(cfg)))


def _fastest_within(loads: list[float], u: float) -> int:
    for i, load in enumerate(loads):
        if load <= u + 1e-9:
            return i
    return len(loads) - 1


def power_verdict(inp: ControlInput, state: ControllerState, cfg: ControllerConfig, ladder: tuple[Level, ...],
                  applied: float, dt_s: float, demand: Demand | None = None,
                  rates: Rates | None = None) -> PowerVerdict:
    """One decision of the power stage; pure. `applied` is the load the engine really ran at."""
    want = demand or Demand(background=cfg.n_slots)
    loads = list(_loads_for(cfg, want)) if rates is None else effective_loads(ladder, want, cfg, rates)
    budget, origin = resolve_budget(inp, cfg)
    low = battery_low(inp, cfg)
    idle = state.power_idle_w if state.power_idle_w is not None else cfg.idle_power_w
    w = state.power_w_per_load if state.power_w_per_load is not None else _prior_w(cfg)
    common = {"on_battery": inp.on_battery, "battery_pct": inp.battery_pct, "battery_low": low}
    if budget is None:
        return PowerVerdict(PowerControl.OFF, None, origin, inp.power_w, 0, None, 0.0, w, idle, **common)
    # a noisy sensor hides overshoots in its scatter: keep the target clear of it
    noise = inp.power_noise_w if inp.power_noise_w is not None else 0.0
    noise = max(0.0, noise - cfg.power_noise_floor_frac * budget)  # a quiet rail's jitter is no risk
    target = max(0.0, budget * cfg.power_target_frac - cfg.power_noise_margin * noise)
    paused_idx = len(ladder) - 1
    if inp.power_w is None or inp.power_stale:
        cap = fail_closed_load(target, cfg)
        level = min(_fastest_within(loads, cap), paused_idx - 1)
        why = "power reading stale" if inp.power_stale else "no power reading"
        return PowerVerdict(PowerControl.FAIL_CLOSED, budget, origin, None, level, cap, state.power_integral,
                            w, idle, f"power budget {budget:.1f} W ({origin.value}): {why}, failing closed "
                            f"at load {cap:.2f}", **common)
    p = inp.power_w
    # learn the model: watts per unit of estimated load while working, idle watts while idle
    if dt_s > 0 and applied >= 0.05:
        seen = (p - idle) / applied
        w += cfg.power_learn_rate * min(1.0, dt_s) * (seen - w)
        w = min(3.0 * _prior_w(cfg), max(0.1 * _prior_w(cfg), w))
    elif dt_s > 0 and applied == 0.0:
        idle += cfg.power_learn_rate * min(1.0, dt_s) * (p - idle)
        idle = min(cfg.max_power_w, max(0.0, idle))
    ff = (target - idle) / w
    err = (target - p) / w
    binding = 0 < state.power_level < paused_idx and applied >= 0.8 * loads[state.power_level]
    integral = state.power_integral
    if err < 0 or binding:
        integral += err * dt_s
    else:
        integral *= math.exp(-dt_s / cfg.integral_decay_s)
    integral = min(cfg.power_integral_credit, max(-cfg.power_integral_max, integral))
    u = min(1.0, max(0.0, ff + cfg.power_k_i * integral - cfg.power_k_p * max(0.0, -err)))
    # never paused for power: work that is admitted must progress; the lowest running level is the
    # most a budget can ask (a budget under the idle power cannot be met by running less)
    target_level = min(_fastest_within(loads, u), paused_idx - 1)
    level = state.power_level
    since_up = math.inf if state.power_change_s is None else inp.t_s - state.power_change_s
    if target_level > level or (target_level < level and since_up >= cfg.power_up_interval_s):
        level = target_level
    control = PowerControl.LIMITING if level > 0 else PowerControl.HOLDING
    reason = (f"power {p:.1f} W, budget {budget:.1f} W ({origin.value}), target {target:.1f} W: "
              f"load cap {u:.2f} -> {ladder[level].label}")
    return PowerVerdict(control, budget, origin, p, level, u, integral, w, idle, reason, **common)
