"""The thermal stages of `decide()`: from a reading to a level on the actuator ladder.

Each stage is a pure function over small frozen records. `frame()` fixes the
temperatures and times of this decision; `thermal_verdict()` asks the stages in
order and the first that applies answers:

    hard guard -> cooling after a guard -> no sensor (unavailable) -> unknown (conservative)
    -> OS pressure only (macOS) -> regulate (forecast, PI budget, learning, level, pre-guard)

The control law itself is described in controller.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from edge.contracts.engine import EngineState, EngineStats
from edge.scheduler.policy import (
    Level,
    Rates,
    build_ladder,
    estimated_load,
    level_at_most,
    level_for_budget,
    rates_of,
)
from edge.scheduler.state import ControlInput, ControllerConfig, ControllerState, ThermalMode
from edge.telemetry.sample import PressureLevel

MAX_UP_LOAD_STEP = 0.15  # one upward change raises the estimated load by at most this much
DEFAULT_COOLDOWN_S = 10.0
GUARD_U_SUS_FACTOR = 0.8  # after a guard trip, the sustainable load is at most this share of what ran
DROP_SLACK_LOAD = 0.1  # heating at a cap this close above u_sus also says u_sus is too high
DROP_FACTOR = 0.9  # ... and u_sus is then pulled towards this share of the cap
BINDING_FRACTION = 0.8  # the cap binds when the engine runs at >= this share of the level's load


@lru_cache(maxsize=32)
def ladder_for(cfg: ControllerConfig) -> tuple[Level, ...]:
    return build_ladder(cfg.n_slots, cfg.max_threads, cfg.min_duty, cfg.decode_tps)


@lru_cache(maxsize=32)
def rates_for(cfg: ControllerConfig) -> Rates:
    return rates_of(cfg.decode_tps)


@dataclass(frozen=True)
class Frame:
    """The temperatures, times and load one decision works with."""

    now_s: float
    dt_s: float  # since the previous decision
    since_change_s: float  # since the level last changed
    t_lim_c: float
    t_set_c: float  # target: T_lim - margin - extra margin while u_sus is still a guess
    t_guard_c: float
    t_on_c: float  # below: no cap at all
    resume_c: float  # leave a guard below this
    temp_known: bool
    applied: float  # estimated load the engine really ran at since the last decision
    ladder: tuple[Level, ...]

    @property
    def paused_idx(self) -> int:
        return len(self.ladder) - 1

    @property
    def lowest_run_idx(self) -> int:
        return len(self.ladder) - 2


@dataclass(frozen=True)
class Thermal:
    """The thermal verdict and the learning state it leaves behind."""

    mode: ThermalMode
    level: int
    budget: float
    reason: str
    tags: tuple[str, ...]
    integral_c_s: float
    u_sus: float
    learned_s: float
    forecast_c: float | None = None


def applied_load(stats: EngineStats | None, cfg: ControllerConfig) -> float:
    """Estimated load the engine really ran at (fewer sequences than allowed draw less)."""
    if stats is None or stats.state is not EngineState.READY or stats.knobs.paused:
        return 0.0
    k = stats.knobs
    return estimated_load(stats.active, k.n_threads, k.duty, cfg.n_slots, cfg.max_threads, k.off_threads,
                          rates_for(cfg))


def frame(inp: ControlInput, stats: EngineStats | None, state: ControllerState,
          cfg: ControllerConfig) -> Frame:
    now = inp.t_s
    t_lim = inp.limit_c if inp.limit_c is not None else cfg.limit_c
    # until the sustainable load is learned the PI runs on a guess: keep a wider margin meanwhile
    unsure = cfg.learning_margin_c * max(0.0, 1.0 - state.learned_s / cfg.learn_confidence_s)
    t_set, t_guard = t_lim - cfg.margin_c - unsure, t_lim - cfg.guard_band_c
    return Frame(
        now_s=now,
        dt_s=0.0 if state.last_t_s is None else max(0.0, now - state.last_t_s),
        since_change_s=math.inf if state.last_change_s is None else now - state.last_change_s,
        t_lim_c=t_lim, t_set_c=t_set, t_guard_c=t_guard, t_on_c=t_set - cfg.on_band_c,
        resume_c=t_guard - cfg.guard_release_c,
        temp_known=inp.temp_c is not None and not inp.stale,
        applied=applied_load(stats, cfg),
        ladder=ladder_for(cfg),
    )


def thermal_verdict(inp: ControlInput, state: ControllerState, cfg: ControllerConfig, fr: Frame) -> Thermal:
    """The first stage that applies decides."""
    return (guard(inp, state, fr) or cooling(inp, state, fr) or unavailable(inp, state, fr)
            or conservative(inp, state, cfg, fr) or os_pressure(inp, state, cfg, fr)
            or regulate(inp, state, cfg, fr))


def _keep(state: ControllerState, mode: ThermalMode, level: int, budget: float, reason: str,
          tags: tuple[str, ...] = ()) -> Thermal:
    """A verdict that leaves the learning state as it was."""
    return Thermal(mode, level, budget, reason, tags, state.integral_c_s, state.u_sus, state.learned_s)


def guard_reason(inp: ControlInput, t_guard_c: float) -> tuple[str, str] | None:
    """(tag, reason) of the first hard guard that fires, else None."""
    if inp.kernel_throttling:
        return "guard:kernel_throttling", "kernel is throttling (cooling device or frequency cap active)"
    if inp.thermal_pressure is not None and inp.thermal_pressure >= PressureLevel.HEAVY:
        return "guard:os_pressure", f"OS thermal pressure {inp.thermal_pressure.name.lower()}"
    if inp.temp_c is not None and not inp.stale and inp.temp_c >= t_guard_c:
        return "guard:temperature", f"{inp.temp_c:.1f} C at or above guard {t_guard_c:.1f} C"
    return None


def guard(inp: ControlInput, state: ControllerState, fr: Frame) -> Thermal | None:
    """Hard guards pause at once. A temperature trip is evidence: the load that ran into it was
    not sustainable, so u_sus drops below it, the integral loses any credit built under target,
    and the extra learning margin comes back."""
    hit = guard_reason(inp, fr.t_guard_c)
    if hit is None:
        return None
    integral, u_sus, learned_s = state.integral_c_s, state.u_sus, state.learned_s
    if state.mode is not ThermalMode.GUARD and hit[0] == "guard:temperature":
        if fr.applied > 0:
            u_sus = min(u_sus, fr.applied * GUARD_U_SUS_FACTOR)
        integral, learned_s = max(0.0, integral), 0.0
    return Thermal(ThermalMode.GUARD, fr.paused_idx, 0.0, hit[1], (hit[0],), integral, u_sus, learned_s)


def cooling(inp: ControlInput, state: ControllerState, fr: Frame) -> Thermal | None:
    """After a guard: stay paused until clearly cooler."""
    if state.mode is not ThermalMode.GUARD or not fr.temp_known or inp.temp_c < fr.resume_c:  # type: ignore[operator]
        return None
    reason = f"cooling: {inp.temp_c:.1f} C, resume below {fr.resume_c:.1f} C"
    return _keep(state, state.mode, fr.paused_idx, 0.0, reason, ("guard:cooling",))


def unavailable(inp: ControlInput, state: ControllerState, fr: Frame) -> Thermal | None:
    """No sensor exists: thermal control is off (not "nominal"); the memory guard still acts."""
    if not (inp.thermal_sensor_absent and not inp.stale and inp.temp_c is None
            and inp.thermal_pressure is None):
        return None
    reason = ("thermal control unavailable: no thermal sensor or OS thermal signal on this "
              "machine; running unthrottled, memory guard only")
    return _keep(state, ThermalMode.UNAVAILABLE, 0, 1.0, reason)


def conservative(inp: ControlInput, state: ControllerState, cfg: ControllerConfig,
                 fr: Frame) -> Thermal | None:
    """Unknown or stale: never nominal, never paused on that alone."""
    if fr.temp_known or not (inp.stale or inp.thermal_pressure is None):
        return None
    why = "telemetry stale" if inp.stale else "no temperature or OS pressure available"
    level = max(state.level, level_at_most(fr.ladder, cfg.conservative_load))
    if state.mode in (ThermalMode.GUARD, ThermalMode.PAUSED):
        level = fr.lowest_run_idx
    return _keep(state, ThermalMode.CONSERVATIVE, level, fr.ladder[level].load, f"conservative: {why}",
                 ("conservative:telemetry",))


def os_pressure(inp: ControlInput, state: ControllerState, cfg: ControllerConfig,
                fr: Frame) -> Thermal | None:
    """OS pressure only (macOS without root): NOMINAL full, MODERATE half (HEAVY+ is a guard)."""
    if fr.temp_known or inp.thermal_pressure is None:
        return None
    budget = 1.0 if inp.thermal_pressure is PressureLevel.NOMINAL else cfg.conservative_load
    target = level_for_budget(fr.ladder, budget)
    level = target if fr.since_change_s >= cfg.down_interval_s or target < state.level else state.level
    mode = ThermalMode.NOMINAL if level == 0 else ThermalMode.LIMITING
    tags = ("limiting:os_pressure",) if level else ()
    return _keep(state, mode, level, budget, f"OS thermal pressure {inp.thermal_pressure.name.lower()}", tags)


# --- regulation -------------------------------------------------------------------------------


def pi_budget(err_c: float, u_sus: float, integral_c_s: float, cfg: ControllerConfig) -> float:
    """u = u_sus - k * err - k_i * I; power_allocator scales its gains by the sustainable power (floored)."""
    k = (cfg.k_pu if err_c < 0 else cfg.k_po) * max(cfg.gain_floor, u_sus)
    return min(1.0, max(0.0, u_sus - k * err_c - cfg.k_i_per_c_s * integral_c_s))


def _binding(state: ControllerState, fr: Frame) -> bool:
    """The cap binds: the engine runs at what the current (running, capped) level allows."""
    return (state.level not in (0, fr.paused_idx)
            and fr.applied >= BINDING_FRACTION * fr.ladder[state.level].load)


def integrate(err_c: float, temp_c: float, slope: float, state: ControllerState, cfg: ControllerConfig,
              fr: Frame) -> float:
    """The integral winds up above target; below it, it winds down (raising the budget) only while
    the cap binds and the temperature is near target and not rising: that removes the steady offset
    a proportional term leaves, without growing a credit while demand, not the cap, keeps it cool."""
    integral = state.integral_c_s
    if err_c > 0:
        return min(cfg.integral_max_c_s, integral + err_c * fr.dt_s)
    if _binding(state, fr) and temp_c > fr.t_set_c - cfg.integral_band_c and slope <= cfg.u_sus_slope_c_per_s:
        return max(cfg.integral_min_c_s, integral + err_c * fr.dt_s)
    return integral * math.exp(-fr.dt_s / cfg.integral_decay_s)


def learn(err_c: float, temp_c: float, slope: float, state: ControllerState, cfg: ControllerConfig,
          fr: Frame) -> tuple[float, float]:
    """(u_sus, learned_s): the sustainable load, learned on the ladder's scale while the engine is
    really busy near target and flat; learned down fast while heating above target at a cap no
    higher than u_sus (the device changed: a fan failed, the room warmed up)."""
    u_sus, learned_s, dt = state.u_sus, state.learned_s, fr.dt_s
    allowed = fr.ladder[state.level].load if state.level != fr.paused_idx else 0.0
    if (abs(temp_c - fr.t_set_c) <= cfg.u_sus_band_c and abs(slope) <= cfg.u_sus_slope_c_per_s
            and allowed > 0 and fr.applied > 0 and dt > 0):
        return u_sus + cfg.u_sus_rate * (allowed - u_sus) * min(1.0, dt), learned_s + dt
    if (err_c > 0 and temp_c > fr.t_set_c and slope > cfg.u_sus_slope_c_per_s and _binding(state, fr)
            and dt > 0 and allowed < u_sus + DROP_SLACK_LOAD):
        u_sus += cfg.u_sus_drop_rate * (DROP_FACTOR * min(allowed, u_sus) - u_sus) * min(1.0, dt)
    return u_sus, learned_s


def step_level(budget: float, budget_up: float, cool: bool, state: ControllerState, cfg: ControllerConfig,
               fr: Frame) -> int:
    """Turn down at once (rate-limited), up slowly and in bounded steps (hysteresis)."""
    level, ladder = state.level, fr.ladder
    target, target_up = level_for_budget(ladder, budget), level_for_budget(ladder, budget_up)
    if state.mode is ThermalMode.GUARD:
        return fr.lowest_run_idx  # leaving a guard: restart from the bottom and climb
    if target > level and fr.since_change_s >= cfg.down_interval_s:
        return target
    if target_up < level and fr.since_change_s >= cfg.up_interval_s:
        if cool:
            return target_up  # below T_on: no cap at all, no reason to crawl back
        # within T_on..T_set climb in bounded steps: a jump to full load heats the die by
        # R_die * dP within seconds, before any forecast can see it
        cur_load = ladder[level].load if level != fr.paused_idx else 0.0
        step = min(budget_up - cfg.hysteresis_load, cur_load + MAX_UP_LOAD_STEP)
        return min(level, max(target_up, level_for_budget(ladder, step)))
    return level


def pre_guard_reason(inp: ControlInput, t_guard_c: float, cfg: ControllerConfig) -> str:
    """Why the latest raw reading calls for a cut before the guard fires, else ''."""
    raw = inp.raw_temp_c if inp.raw_temp_c is not None else inp.temp_c
    fast = inp.fast_slope_c_per_s
    if raw is None or fast is None or inp.stale:
        return ""
    if raw >= t_guard_c - cfg.pre_guard_c and fast >= cfg.pre_guard_slope_c_per_s:
        return f"pre-guard: {raw:.1f} C rising {fast:+.2f} C/s, {t_guard_c - raw:.1f} C under the guard"
    return ""


def regulate(inp: ControlInput, state: ControllerState, cfg: ControllerConfig, fr: Frame) -> Thermal:
    """Forecast, integrate, learn, budget, level, then the pre-guard cut."""
    temp = float(inp.temp_c)  # type: ignore[arg-type]
    slope = inp.slope_c_per_s or 0.0
    forecast = temp + cfg.horizon_s * slope
    err = forecast - fr.t_set_c  # > 0: over target
    integral = integrate(err, temp, slope, state, cfg, fr)
    u_sus, learned_s = learn(err, temp, slope, state, cfg, fr)
    cool = temp < fr.t_on_c and forecast < fr.t_set_c
    if cool:
        budget = budget_up = 1.0
        integral = 0.0
    else:
        budget = pi_budget(err, u_sus, integral, cfg)
        # stepping up: a falling temperature is the work of the current, lower load, so the
        # step-up budget takes no credit for it (else it jumps to full and bounces off the guard)
        budget_up = min(budget, pi_budget(max(temp, forecast) - fr.t_set_c, u_sus, integral, cfg))
    level = step_level(budget, budget_up, cool, state, cfg, fr)
    # right under the guard and rising fast: the 15 s slope has not seen it yet (a fan just
    # failed, demand jumped back onto a high cap); cut now rather than at the guard
    pre = "" if state.mode is ThermalMode.GUARD else pre_guard_reason(inp, fr.t_guard_c, cfg)
    if pre:
        level = max(level, level_at_most(fr.ladder, fr.applied * cfg.pre_guard_cut))
    tags: tuple[str, ...]
    if level == 0:
        mode, reason, tags = ThermalMode.NOMINAL, f"{temp:.1f} C, forecast {forecast:.1f} C: full speed", ()
    elif level == fr.paused_idx:
        mode, tags = ThermalMode.PAUSED, ("paused:thermal",)
        reason = f"{temp:.1f} C, forecast {forecast:.1f} C over {fr.t_set_c:.1f} C: paused"
    else:
        mode, tags = ThermalMode.LIMITING, ("limiting:thermal",)
        reason = (f"{temp:.1f} C, forecast {forecast:.1f} C, target {fr.t_set_c:.1f} C: "
                  f"budget {budget:.2f} -> {fr.ladder[level].label}")
    if pre and level != fr.paused_idx:
        reason, tags = f"{reason}; {pre}", (*tags, "limiting:pre_guard")
    return Thermal(mode, level, budget, reason, tags, integral, u_sus, learned_s, forecast)


def cooldown_s(inp: ControlInput, resume_c: float) -> float:
    """Time until the temperature should be back under `resume_c`, from the current slope."""
    if inp.temp_c is None or inp.temp_c <= resume_c:
        return 1.0
    slope = inp.slope_c_per_s or 0.0
    if slope < -0.01:
        return min(120.0, max(1.0, (inp.temp_c - resume_c) / -slope))
    return DEFAULT_COOLDOWN_S
