"""The thermal and memory controller: one pure function, `decide()`, as a pipeline of stages.

No I/O and no clock reads: time comes in the reading, history in the state.
Each stage is pure and takes and returns small frozen records:

    frame ─► thermal_verdict (thermal.py) ─┐
    memory_verdict (memory.py) ────────────┤
    power_verdict (power.py) ──────────────┤  (the lower of the thermal and power loads wins)
    threads_for_contention (contention.py) ┼─► shape_knobs ─► battery_hold ─► admission_flags ─► Decision
    queue, engine stats ───────────────────┘
The control law (docs/thermal.md, after Linux's power_allocator governor and
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

from dataclasses import dataclass, replace
from typing import Any

from edge.contracts.engine import EngineStats, Knobs
from edge.scheduler.contention import ThreadsVerdict, threads_for_contention
from edge.scheduler.memory import MemoryVerdict, memory_verdict
from edge.scheduler.policy import interactive_first
from edge.scheduler.power import Demand, PowerVerdict, power_verdict
from edge.scheduler.state import (
    ControlInput,
    ControllerConfig,
    ControllerState,
    Decision,
    MemoryMode,
    PowerControl,
    QueueState,
    ThermalMode,
)
from edge.scheduler.thermal import (
    DEFAULT_COOLDOWN_S,
    Frame,
    Thermal,
    cooldown_s,
    frame,
    ladder_for,
    rates_for,
    thermal_verdict,
)

__all__ = ["decide", "ladder_for", "rates_for"]


@dataclass(frozen=True)
class Shaped:
    """The knobs after shaping for who is waiting, with what shaping added to the reason."""

    knobs: Knobs
    reason: str
    tags: tuple[str, ...]


@dataclass(frozen=True)
class Admit:
    """What admission may let in now, and when a refused client should come back."""

    interactive: bool
    background: bool
    cooldown_s: float  # estimated time until work can resume (paused/guard)
    background_retry_s: float


def shape_knobs(th: Thermal, mem: MemoryVerdict, threads: ThreadsVerdict, queue: QueueState,
                stats: EngineStats | None, fr: Frame, cfg: ControllerConfig,
                power_cap: float | None = None) -> Shaped:
    """Interactive first: park background while a chat waits for its first token; hold background
    to the level's efficient batch; background alone is the workload; nothing new under memory
    pressure; no more decode threads than free cores."""
    level = fr.ladder[th.level]
    knobs, reason, tags = level.knobs, "", ()
    n_interactive = queue.running_interactive + queue.waiting_interactive
    n_background = queue.running_background + queue.waiting_background
    # interactive requests still waiting for their first token (queued, or prefilling in a slot)
    n_first = queue.waiting_interactive + (stats.interactive_awaiting_first if stats is not None else 0)
    if (th.mode is ThermalMode.LIMITING and th.level >= 2 and n_first > 0 and n_interactive > 0
            and n_background > 0):
        # time to first token is what a user waits on: until it comes, interactive work runs
        # alone; once it streams, it shares the batch with background work (below)
        # while power binds: no boost (a budget in watts has no heat capacity to borrow), and the
        # chat alone gets what the budget allows, not what the level would draw with every slot busy
        headroom = (power_cap is None and th.forecast_c is not None
                    and th.forecast_c < fr.t_set_c + cfg.interactive_band_c)
        budget_level = level if power_cap is None else replace(level, load=min(level.load, power_cap))
        knobs = interactive_first(budget_level, n_interactive, cfg.n_slots, cfg.max_threads, cfg.min_duty,
                                  headroom, rates_for(cfg))
        reason, tags = "interactive first, background parked", ("limiting:background_parked",)
    elif n_background > 0 and not knobs.paused and level.batch > 0:
        # background work runs at the batch that gives the most tokens per heat; interactive
        # requests are never held back by it
        batch = max(level.batch, n_interactive)
        knobs = replace(knobs, active_limit=min(knobs.active_limit, batch))
    if th.mode in (ThermalMode.LIMITING, ThermalMode.CONSERVATIVE) and n_interactive == 0 \
            and not knobs.admit_background:
        knobs = replace(knobs, admit_background=True)  # background alone is the workload
    if mem.mode is not MemoryMode.OK and knobs.admit_background:
        knobs = replace(knobs, admit_background=False)
    if threads.cap is not None and knobs.n_threads > threads.cap:
        knobs = replace(knobs, n_threads=threads.cap, off_threads=min(knobs.off_threads, threads.cap - 1))
        tags = (*tags, "contention:threads")
    if threads.reason:
        reason = f"{reason}; {threads.reason}" if reason else threads.reason
    # speculative decoding only at full load: a guess that fails is work thrown away, and the
    # controller cutting threads or duty is saving exactly that work
    full = level.knobs.duty >= 1.0 and level.knobs.n_threads >= cfg.max_threads and not knobs.paused
    if not full and knobs.speculate:
        knobs = replace(knobs, speculate=False)  # visible as the knob (edge_knob_speculate)
    return Shaped(knobs, reason, tags)


def combine_power(th: Thermal, pv: PowerVerdict, fr: Frame) -> Thermal:
    """The binding one of heat and power wins: the higher ladder index (the lower load)."""
    if pv.level <= th.level:
        return th
    mode = ThermalMode.LIMITING if th.mode is ThermalMode.NOMINAL else th.mode
    budget = min(th.budget, pv.cap_load if pv.cap_load is not None else th.budget)
    tag = "limiting:power_fail_closed" if pv.control is PowerControl.FAIL_CLOSED else "limiting:power"
    return replace(th, mode=mode, level=pv.level, budget=budget, reason=f"{th.reason}; {pv.reason}",
                   tags=(*th.tags, tag))


def battery_hold(knobs: Knobs, queue: QueueState) -> Knobs:
    """On battery under the reserve: background work waits (parked, KV kept), interactive runs."""
    n_interactive = queue.running_interactive + queue.waiting_interactive
    if n_interactive > 0:
        return replace(knobs, active_limit=max(1, min(knobs.active_limit, n_interactive)),
                       admit_background=False)
    return replace(knobs, paused=True, admit_background=False)


def admission_flags(th: Thermal, mem: MemoryVerdict, knobs: Knobs, inp: ControlInput, fr: Frame,
                    cfg: ControllerConfig) -> Admit:
    """Nothing is admitted under a heat stop or memory pressure; background follows the knob."""
    heat_stop = th.mode in (ThermalMode.GUARD, ThermalMode.PAUSED)
    interactive = not heat_stop and mem.mode is MemoryMode.OK
    cooldown = 0.0
    if heat_stop:
        cooldown = cooldown_s(inp, fr.resume_c if th.mode is ThermalMode.GUARD else fr.t_set_c)
    background = interactive and knobs.admit_background
    retry = 0.0
    if not background:
        cool_s = cooldown_s(inp, fr.t_set_c - cfg.climb_band_c) if fr.temp_known else DEFAULT_COOLDOWN_S
        retry = cooldown if heat_stop else max(cfg.up_interval_s, cool_s)
    return Admit(interactive, background, cooldown, retry)


@dataclass(frozen=True)
class Verdicts:
    """What each sensing stage concluded; `heat` is the thermal stage alone, `thermal` after power."""

    heat: Thermal
    thermal: Thermal
    power: PowerVerdict
    memory: MemoryVerdict
    threads: ThreadsVerdict


def decide(
    reading: ControlInput | Any,
    queue: QueueState,
    stats: EngineStats | None,
    state: ControllerState,
    cfg: ControllerConfig,
) -> tuple[Decision, ControllerState]:
    """One control decision; pure, deterministic, replayable: the stages of the module docstring."""
    inp = reading if isinstance(reading, ControlInput) else ControlInput.from_reading(reading)
    fr = frame(inp, stats, state, cfg)
    v = verdicts(inp, queue, state, cfg, fr)
    shaped = shape(v, queue, stats, fr, cfg)
    admit = admission_flags(v.thermal, v.memory, shaped.knobs, inp, fr, cfg)
    return compose_decision(v, shaped, admit, inp, fr), next_state(v, inp, state, fr)


def verdicts(inp: ControlInput, queue: QueueState, state: ControllerState, cfg: ControllerConfig,
             fr: Frame) -> Verdicts:
    """Heat, power (combined into one thermal verdict), memory and CPU contention, each on its own."""
    heat = thermal_verdict(inp, state, cfg, fr)
    demand = Demand(queue.running_interactive + queue.waiting_interactive,
                    queue.running_background + queue.waiting_background)
    pv = power_verdict(inp, state, cfg, fr.ladder, fr.applied, fr.dt_s, demand)
    return Verdicts(heat=heat, thermal=combine_power(heat, pv, fr), power=pv,
                    memory=memory_verdict(inp, state, cfg), threads=threads_for_contention(inp, state, cfg))


def shape(v: Verdicts, queue: QueueState, stats: EngineStats | None, fr: Frame,
          cfg: ControllerConfig) -> Shaped:
    """The knobs for who is waiting (`shape_knobs`), then held for a battery under its reserve."""
    power_binds = v.thermal.level > v.heat.level
    shaped = shape_knobs(v.thermal, v.memory, v.threads, queue, stats, fr, cfg,
                         power_cap=v.power.cap_load if power_binds else None)
    if not v.power.battery_low:
        return shaped
    lead = f"{shaped.reason}; " if shaped.reason else ""
    return Shaped(knobs=battery_hold(shaped.knobs, queue),
                  reason=f"{lead}battery {v.power.battery_pct:.0f}% under the "
                  f"{cfg.battery_reserve_pct:.0f}% reserve: background waits",
                  tags=(*shaped.tags, "battery:reserve"))


def explain(v: Verdicts, shaped: Shaped) -> tuple[str, tuple[str, ...]]:
    """The decision's reason and throttle tags: thermal first, then memory, then shaping."""
    mem = v.memory
    reason, tags = v.thermal.reason, list(v.thermal.tags)
    if mem.evict:
        tags.append("memory:evict")
    if mem.mode is not MemoryMode.OK:
        tags.append(f"memory:{mem.mode.value}")
        reason = f"{reason}; {mem.reason}"
    if shaped.reason:
        reason = f"{reason}; {shaped.reason}"
    tags.extend(shaped.tags)
    return reason, tuple(tags)


def compose_decision(v: Verdicts, shaped: Shaped, admit: Admit, inp: ControlInput, fr: Frame) -> Decision:
    """The Decision record the engine, admission and the API read."""
    th, mem, pv = v.thermal, v.memory, v.power
    reason, tags = explain(v, shaped)
    holding = pv.control is PowerControl.LIMITING and pv.level <= v.heat.level
    return Decision(
        knobs=shaped.knobs,
        mode=th.mode,
        memory=mem.mode,
        admit_interactive=admit.interactive,
        admit_background=admit.background,
        shed_background=mem.mode is MemoryMode.SHED or mem.evict,
        evict=mem.evict,
        unload=mem.evict,  # keep-alive unloading is the engine's own
        reason=reason,
        t_s=fr.now_s,
        budget=th.budget,
        t_lim_c=fr.t_lim_c,
        t_set_c=fr.t_set_c,
        forecast_c=th.forecast_c,
        cooldown_s=admit.cooldown_s,
        background_retry_s=admit.background_retry_s,
        throttle_reasons=tags,
        threads_cap=v.threads.cap,
        cpu_other_cores=inp.cpu_other_cores,
        power=replace(pv.status(), control=PowerControl.HOLDING) if holding else pv.status(),
    )


def next_state(v: Verdicts, inp: ControlInput, state: ControllerState, fr: Frame) -> ControllerState:
    """The history the next decision needs."""
    th, mem, pv, now = v.thermal, v.memory, v.power, fr.now_s
    return ControllerState(
        mode=th.mode,
        memory=mem.mode,
        level=v.heat.level,  # the thermal stage's own level: a power cap is not a thermal one
        last_change_s=now if v.heat.level != state.level else state.last_change_s,
        last_t_s=now,
        integral_c_s=th.integral_c_s,
        u_sus=min(1.0, max(0.05, th.u_sus)),
        psi_prev=(inp.psi_some_avg10, inp.psi_full_avg10),
        mem_short_at_s=mem.short_at_s,
        mem_prev=None if inp.mem_available_bytes is None else (now, inp.mem_available_bytes),
        evicted=mem.evict,
        learned_s=th.learned_s,
        threads_cap=v.threads.cap,
        threads_pending_s=v.threads.pending_s,
        threads_restored_s=v.threads.restored_s,
        threads_backoff=v.threads.backoff,
        power_level=pv.level,
        power_change_s=now if pv.level != state.power_level else state.power_change_s,
        power_integral=pv.integral,
        power_w_per_load=pv.w_per_load,
        power_idle_w=pv.idle_w,
    )
