"""The thermal and memory controller: one pure function, `decide()`.

No I/O and no clock reads: time comes in the reading, history in the state.
The control law (design/thermal.md, after Linux's power_allocator governor and
Android's thermal headroom forecast):

    T_lim = lowest passive trip (else profile);  T_set = T_lim - margin - m_learn;  T_on = T_set - band
    T_hat = T + h * dT/dt                                   (forecast, h ~ 10 s)
    u     = u_sus + k * (T_set - T_hat) - k_i * I           (k = k_pu or k_po times u_sus)
    I     integrates (T_hat - T_set), clamped both ways (anti-windup); below target only while
          the cap binds and T is near target and not rising, else it bleeds off
    u_sus learned as the load at which dT/dt ~ 0 near T_set, and learned down fast while T rises
          above T_set at a cap no higher than u_sus (the device changed: a fan failed)
    m_learn extra margin while u_sus is still a guess, shrinking to 0 over a minute of learning

The 15 s slope fit lags a sudden change by several seconds (after a fan fails
the die heats ~0.3 C/s at once in `edge sim`). So a raw reading within
`pre_guard_c` of the guard that rises fast over the last few seconds cuts the
load at once to `pre_guard_cut` of what ran (the pre-guard), without the
learning reset of a guard trip. It is what lets the target sit 4.5 C under the
limit instead of 5.

A temperature guard trip is evidence too: the load that ran into it was not
sustainable, so u_sus drops below it at once, the integral loses any credit it
built under target, and the extra margin comes back until u_sus is relearned.
Without that, the controller climbed back from the guard on its old guess and
tripped again every ~30 s after a fan failure in `edge sim`.

The budget picks a level on the actuator ladder (policy.py) with hysteresis and
a rate limit; hard guards skip all that and pause. Final allowed work is the
minimum of the thermal, OS and memory verdicts.

Missing versus failing sensors. Telemetry that exists but is stale or failing
gives CONSERVATIVE (reduced load, never nominal): the device may be hot and we
cannot tell. A machine that exposes no thermal sensor and no OS thermal signal
at all (many x86 boxes, VMs and containers; `--telemetry none`) is a static fact
known from the first reading, not a failure: there the mode is UNAVAILABLE. It
runs at full speed, as any runtime without thermal control would, because
throttling forever on a signal that will never come only costs the user
throughput; the memory guard and the kernel-throttle guard still act, and the
mode is shown as "unavailable" (never "nominal") in /v1/status and /metrics and
logged once with what to do (`--telemetry sim:PROFILE` to try the controller,
or run where sensors are exposed).

Interactive first. While an interactive request waits for its first token
(queued, or prefilling in a slot), background work is parked and the chat runs
alone, with a short boost if the forecast allows; once it streams, it shares the
batch with background work, which runs at the level's most efficient batch size
(`Level.batch`). Interactive requests are never held to that batch.

Background admission. Background requests are refused at once (DevicePaused,
Retry-After from `background_retry_s`) whenever `admit_background` is off, and
the engine never starts them then, so none can wait forever. It is off while
interactive work shares a limited device (interactive first), under a heat stop,
and under memory pressure. With no interactive work at all, background work is
the workload: it is admitted at whatever level the thermal budget allows rather
than starved, because parking it would only idle the device.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache
from typing import Any

from edge.runtime.types import EngineState, EngineStats, Knobs
from edge.scheduler.memory import PSI_TRAIL_S, memory_mode, memory_short, should_evict, should_unload
from edge.scheduler.policy import (
    Level,
    Rates,
    build_ladder,
    estimated_load,
    interactive_first,
    level_at_most,
    level_for_budget,
    rates_of,
)
from edge.scheduler.state import (
    ControlInput,
    ControllerConfig,
    ControllerState,
    Decision,
    MemoryMode,
    QueueState,
    ThermalMode,
)
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


def _applied_load(stats: EngineStats | None, cfg: ControllerConfig) -> float:
    """Estimated load the engine really ran at (fewer sequences than allowed draw less)."""
    if stats is None or stats.state is not EngineState.READY or stats.knobs.paused:
        return 0.0
    k = stats.knobs
    return estimated_load(stats.active, k.n_threads, k.duty, cfg.n_slots, cfg.max_threads, k.off_threads,
                          rates_for(cfg))


def _guard_reason(inp: ControlInput, t_guard_c: float) -> tuple[str, str] | None:
    """(tag, reason) of the first hard guard that fires, else None."""
    if inp.kernel_throttling:
        return "guard:kernel_throttling", "kernel is throttling (cooling device or frequency cap active)"
    if inp.thermal_pressure is not None and inp.thermal_pressure >= PressureLevel.HEAVY:
        return "guard:os_pressure", f"OS thermal pressure {inp.thermal_pressure.name.lower()}"
    if inp.temp_c is not None and not inp.stale and inp.temp_c >= t_guard_c:
        return "guard:temperature", f"{inp.temp_c:.1f} C at or above guard {t_guard_c:.1f} C"
    return None


def _pre_guard(inp: ControlInput, t_guard_c: float, cfg: ControllerConfig) -> str:
    """Why the latest raw reading calls for a cut before the guard fires, else ''."""
    raw = inp.raw_temp_c if inp.raw_temp_c is not None else inp.temp_c
    fast = inp.fast_slope_c_per_s
    if raw is None or fast is None or inp.stale:
        return ""
    if raw >= t_guard_c - cfg.pre_guard_c and fast >= cfg.pre_guard_slope_c_per_s:
        return f"pre-guard: {raw:.1f} C rising {fast:+.2f} C/s, {t_guard_c - raw:.1f} C under the guard"
    return ""


def _cooldown_s(inp: ControlInput, resume_c: float) -> float:
    """Time until the temperature should be back under `resume_c`, from the current slope."""
    if inp.temp_c is None or inp.temp_c <= resume_c:
        return 1.0
    slope = inp.slope_c_per_s or 0.0
    if slope < -0.01:
        return min(120.0, max(1.0, (inp.temp_c - resume_c) / -slope))
    return DEFAULT_COOLDOWN_S


def _pi_budget(err_c: float, u_sus: float, integral_c_s: float, cfg: ControllerConfig) -> float:
    """u = u_sus - k * err - k_i * I; power_allocator scales its gains by the sustainable power (floored)."""
    k = (cfg.k_pu if err_c < 0 else cfg.k_po) * max(cfg.gain_floor, u_sus)
    return min(1.0, max(0.0, u_sus - k * err_c - cfg.k_i_per_c_s * integral_c_s))


def decide(
    reading: ControlInput | Any,
    queue: QueueState,
    stats: EngineStats | None,
    state: ControllerState,
    cfg: ControllerConfig,
) -> tuple[Decision, ControllerState]:
    """One control decision; pure, deterministic, replayable."""
    inp = reading if isinstance(reading, ControlInput) else ControlInput.from_reading(reading)
    ladder = ladder_for(cfg)
    paused_idx, lowest_run_idx = len(ladder) - 1, len(ladder) - 2
    now = inp.t_s
    dt = 0.0 if state.last_t_s is None else max(0.0, now - state.last_t_s)
    since_change = math.inf if state.last_change_s is None else now - state.last_change_s

    t_lim = inp.limit_c if inp.limit_c is not None else cfg.limit_c
    # until the sustainable load is learned the PI runs on a guess: keep a wider margin meanwhile
    learned_s = state.learned_s
    unsure = cfg.learning_margin_c * max(0.0, 1.0 - learned_s / cfg.learn_confidence_s)
    t_set, t_guard = t_lim - cfg.margin_c - unsure, t_lim - cfg.guard_band_c
    t_on = t_set - cfg.on_band_c
    resume_c = t_guard - cfg.guard_release_c

    integral, u_sus = state.integral_c_s, state.u_sus
    level, mode = state.level, state.mode
    budget, forecast = 1.0, None
    tags: list[str] = []
    guard = _guard_reason(inp, t_guard)
    temp_known = inp.temp_c is not None and not inp.stale
    applied = _applied_load(stats, cfg)  # what the engine really ran at since the last decision

    if guard is not None:
        if state.mode is not ThermalMode.GUARD and guard[0] == "guard:temperature":
            # the load that ran into the guard was not sustainable: learn that at once, and drop
            # any credit the integral had built below target
            if applied > 0:
                u_sus = min(u_sus, applied * GUARD_U_SUS_FACTOR)
            integral = max(0.0, integral)
            learned_s = 0.0
        mode, level, reason = ThermalMode.GUARD, paused_idx, guard[1]
        tags.append(guard[0])
        budget = 0.0
    elif state.mode is ThermalMode.GUARD and temp_known and inp.temp_c >= resume_c:  # type: ignore[operator]
        level, reason, budget = paused_idx, f"cooling: {inp.temp_c:.1f} C, resume below {resume_c:.1f} C", 0.0
        tags.append("guard:cooling")
    elif (inp.thermal_sensor_absent and not inp.stale and inp.temp_c is None
          and inp.thermal_pressure is None):
        # no sensor exists: thermal control is off (not "nominal"), memory guard still on
        mode, level, budget = ThermalMode.UNAVAILABLE, 0, 1.0
        reason = ("thermal control unavailable: no thermal sensor or OS thermal signal on this "
                  "machine; running unthrottled, memory guard only")
    elif not temp_known and (inp.stale or inp.thermal_pressure is None):
        # unknown or stale: never nominal, never paused on that alone
        why = "telemetry stale" if inp.stale else "no temperature or OS pressure available"
        mode, reason = ThermalMode.CONSERVATIVE, f"conservative: {why}"
        level = max(level, level_at_most(ladder, cfg.conservative_load))
        if state.mode in (ThermalMode.GUARD, ThermalMode.PAUSED):
            level = lowest_run_idx
        budget = ladder[level].load
        tags.append("conservative:telemetry")
    elif not temp_known:
        # OS pressure only (macOS without root): NOMINAL full, MODERATE half (HEAVY+ is a guard)
        assert inp.thermal_pressure is not None
        budget = 1.0 if inp.thermal_pressure is PressureLevel.NOMINAL else cfg.conservative_load
        target = level_for_budget(ladder, budget)
        level = target if since_change >= cfg.down_interval_s or target < level else level
        mode = ThermalMode.NOMINAL if level == 0 else ThermalMode.LIMITING
        reason = f"OS thermal pressure {inp.thermal_pressure.name.lower()}"
        if level:
            tags.append("limiting:os_pressure")
    else:
        temp = float(inp.temp_c)  # type: ignore[arg-type]
        slope = inp.slope_c_per_s or 0.0
        forecast = temp + cfg.horizon_s * slope
        err = forecast - t_set  # > 0: over target
        # the integral winds up above target; below it, it winds down (raising the budget) only
        # while the cap binds (the engine runs at what the level allows) and the temperature is
        # near target: that removes the steady offset under the target that a proportional term
        # leaves, without growing a credit while demand, not the cap, keeps the device cool
        binding = (state.level not in (0, paused_idx)
                   and applied >= BINDING_FRACTION * ladder[state.level].load)
        if err > 0:
            integral = min(cfg.integral_max_c_s, integral + err * dt)
        elif binding and temp > t_set - cfg.integral_band_c and slope <= cfg.u_sus_slope_c_per_s:
            integral = max(cfg.integral_min_c_s, integral + err * dt)
        else:
            integral *= math.exp(-dt / cfg.integral_decay_s)
        # u_sus is learned on the ladder's scale (the load the current level allows), the
        # scale the budget is mapped on; it is learned only while the engine is really busy
        allowed = ladder[state.level].load if state.level != paused_idx else 0.0
        if (abs(temp - t_set) <= cfg.u_sus_band_c and abs(slope) <= cfg.u_sus_slope_c_per_s
                and allowed > 0 and applied > 0 and dt > 0):
            u_sus += cfg.u_sus_rate * (allowed - u_sus) * min(1.0, dt)
            learned_s += dt
        elif (err > 0 and temp > t_set and slope > cfg.u_sus_slope_c_per_s and binding and dt > 0
              and allowed < u_sus + DROP_SLACK_LOAD):
            # heating above target at a cap no higher than what was thought sustainable: the device
            # changed (a fan failed, the room warmed up), so learn down now rather than in minutes
            u_sus += cfg.u_sus_drop_rate * (DROP_FACTOR * min(allowed, u_sus) - u_sus) * min(1.0, dt)
        cool = temp < t_on and forecast < t_set
        if cool:
            budget = budget_up = 1.0
            integral = 0.0
        else:
            budget = _pi_budget(err, u_sus, integral, cfg)
            # stepping up: a falling temperature is the work of the current, lower load, so the
            # step-up budget takes no credit for it (else it jumps to full and bounces off the guard)
            budget_up = min(budget, _pi_budget(max(temp, forecast) - t_set, u_sus, integral, cfg))
        target = level_for_budget(ladder, budget)
        target_up = level_for_budget(ladder, budget_up)
        if state.mode is ThermalMode.GUARD:
            level = lowest_run_idx  # leaving a guard: restart from the bottom and climb
        elif target > level and since_change >= cfg.down_interval_s:
            level = target
        elif target_up < level and since_change >= cfg.up_interval_s:
            cur_load = ladder[level].load if level != paused_idx else 0.0
            if cool:
                level = target_up  # below T_on: no cap at all, no reason to crawl back
            else:
                # within T_on..T_set climb in bounded steps: a jump to full load heats the die by
                # R_die * dP within seconds, before any forecast can see it
                step = min(budget_up - cfg.hysteresis_load, cur_load + MAX_UP_LOAD_STEP)
                level = min(level, max(target_up, level_for_budget(ladder, step)))
        # right under the guard and rising fast: the 15 s slope has not seen it yet (a fan just
        # failed, demand jumped back onto a high cap); cut now rather than at the guard
        pre_guard = "" if state.mode is ThermalMode.GUARD else _pre_guard(inp, t_guard, cfg)
        if pre_guard:
            level = max(level, level_at_most(ladder, applied * cfg.pre_guard_cut))
        if level == 0:
            mode, reason = ThermalMode.NOMINAL, f"{temp:.1f} C, forecast {forecast:.1f} C: full speed"
        elif level == paused_idx:
            mode = ThermalMode.PAUSED
            reason = f"{temp:.1f} C, forecast {forecast:.1f} C over {t_set:.1f} C: paused"
            tags.append("paused:thermal")
        else:
            mode = ThermalMode.LIMITING
            reason = (f"{temp:.1f} C, forecast {forecast:.1f} C, target {t_set:.1f} C: "
                      f"budget {budget:.2f} -> {ladder[level].label}")
            tags.append("limiting:thermal")
        if pre_guard and level != paused_idx:
            reason = f"{reason}; {pre_guard}"
            tags.append("limiting:pre_guard")

    short_at = now if memory_short(inp, cfg.reserve_bytes) else state.mem_short_at_s
    short_recently = short_at is not None and now - short_at <= PSI_TRAIL_S
    mem, mem_reason = memory_mode(inp, state.memory, cfg, state.psi_prev, short_recently)
    evict, evict_reason = should_evict(inp, mem, state.mem_prev, state.evicted, cfg)
    if evict and mem is MemoryMode.OK:
        mem = MemoryMode.TIGHT  # evicted: nothing is admitted until memory is fully back
    if evict:
        tags.append("memory:evict")
        mem_reason = f"{mem_reason}; {evict_reason}"
    if mem is not MemoryMode.OK:
        tags.append(f"memory:{mem.value}")
        reason = f"{reason}; {mem_reason}"

    knobs: Knobs = ladder[level].knobs
    n_interactive = queue.running_interactive + queue.waiting_interactive
    n_background = queue.running_background + queue.waiting_background
    # interactive requests still waiting for their first token (queued, or prefilling in a slot)
    n_first = queue.waiting_interactive + (stats.interactive_awaiting_first if stats is not None else 0)
    if (mode is ThermalMode.LIMITING and level >= 2 and n_first > 0 and n_interactive > 0
            and n_background > 0):
        # time to first token is what a user waits on: until it comes, interactive work runs
        # alone; once it streams, it shares the batch with background work (below)
        headroom = forecast is not None and forecast < t_set + cfg.interactive_band_c
        knobs = interactive_first(ladder[level], n_interactive, cfg.n_slots, cfg.max_threads, cfg.min_duty,
                                  headroom, rates_for(cfg))
        reason = f"{reason}; interactive first, background parked"
        tags.append("limiting:background_parked")
    elif n_background > 0 and not knobs.paused and ladder[level].batch > 0:
        # background work runs at the batch that gives the most tokens per heat; interactive
        # requests are never held back by it
        batch = max(ladder[level].batch, n_interactive)
        knobs = replace(knobs, active_limit=min(knobs.active_limit, batch))
    if mode in (ThermalMode.LIMITING, ThermalMode.CONSERVATIVE) and n_interactive == 0 \
            and not knobs.admit_background:
        knobs = replace(knobs, admit_background=True)  # background alone is the workload
    if mem is not MemoryMode.OK and knobs.admit_background:
        knobs = replace(knobs, admit_background=False)
    heat_stop = mode in (ThermalMode.GUARD, ThermalMode.PAUSED)
    admit_interactive = not heat_stop and mem is MemoryMode.OK
    unload = should_unload(queue, now, cfg.keep_alive_s)
    if unload:
        reason = f"{reason}; idle for {cfg.keep_alive_s:g} s: unload"
    unload = unload or evict
    cooldown = _cooldown_s(inp, resume_c if mode is ThermalMode.GUARD else t_set) if heat_stop else 0.0

    admit_background = admit_interactive and knobs.admit_background
    bg_retry = 0.0
    if not admit_background:
        cool_s = _cooldown_s(inp, t_set - cfg.climb_band_c) if temp_known else DEFAULT_COOLDOWN_S
        bg_retry = cooldown if heat_stop else max(cfg.up_interval_s, cool_s)

    changed = level != state.level
    new_state = ControllerState(
        mode=mode,
        memory=mem,
        level=level,
        last_change_s=now if changed else state.last_change_s,
        last_t_s=now,
        integral_c_s=integral,
        u_sus=min(1.0, max(0.05, u_sus)),
        idle_since_s=queue.last_activity_s,
        unloaded=unload,
        psi_prev=(inp.psi_some_avg10, inp.psi_full_avg10),
        mem_short_at_s=short_at,
        mem_prev=None if inp.mem_available_bytes is None else (now, inp.mem_available_bytes),
        evicted=evict,
        learned_s=learned_s,
    )
    decision = Decision(
        knobs=knobs,
        mode=mode,
        memory=mem,
        admit_interactive=admit_interactive,
        admit_background=admit_background,
        shed_background=mem is MemoryMode.SHED or evict,
        evict=evict,
        unload=unload,
        reason=reason,
        t_s=now,
        budget=budget,
        t_lim_c=t_lim,
        t_set_c=t_set,
        forecast_c=forecast,
        cooldown_s=cooldown,
        background_retry_s=bg_retry,
        throttle_reasons=tuple(tags),
    )
    return decision, new_state
