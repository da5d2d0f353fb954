"""Types of the scheduler: modes, inputs, configuration, state and decisions.

All frozen: `decide()` takes these and returns new ones, so a decision can be
replayed from a log and tested without threads or clocks.

Thermal mode transitions (see controller.py):
    NOMINAL  --T above T_on, budget below full-->  LIMITING  --budget below lowest level-->  PAUSED
    any      --throttle flag / OS pressure >= HEAVY / T >= T_lim - 3-->  GUARD (paused, KV kept)
    GUARD    --T < T_lim - 3 - release band and no throttle flag-->  LIMITING at the lowest level
    any      --stale or failing telemetry-->  CONSERVATIVE (reduced, never nominal)
    any      --the machine exposes no thermal sensor and no OS pressure signal-->  UNAVAILABLE
             (full speed, not throttled on heat; memory guard and kernel-throttle guard still on)
Memory mode: OK <-> TIGHT (admission paused) <-> SHED (background cancelled); from SHED a deep
or fast shortage evicts (every request shed, model unloaded) until memory is back with room.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from edge.contracts.device import DeviceProfile
from edge.contracts.engine import Knobs
from edge.telemetry.monitor import MonitorReading, ThermalSensing
from edge.telemetry.sample import PressureLevel, Sample


class ThermalMode(str, Enum):
    NOMINAL = "nominal"  # below T_on or no cap needed: full speed
    LIMITING = "limiting"  # budget below full: some actuators turned down
    PAUSED = "paused"  # budget below the lowest running level: no steps, KV kept
    GUARD = "guard"  # a hard guard fired: paused until clearly cooler
    CONSERVATIVE = "conservative"  # telemetry stale or failing: reduced, never nominal
    UNAVAILABLE = "unavailable"  # no thermal sensor at all on this machine: thermal control off


class PowerControl(str, Enum):
    OFF = "off"  # no budget in force
    HOLDING = "holding"  # a budget is held; heat or demand binds, not power
    LIMITING = "limiting"  # power is the binding constraint
    FAIL_CLOSED = "fail_closed"  # budget set, power unknown/stale/stuck: conservative cap


class BudgetOrigin(str, Enum):
    NONE = "none"
    SETTING = "setting"  # --power-budget / EDGE_POWER_BUDGET_W
    POWER_MODE = "power_mode"  # the nvpmodel mode's
    PROFILE = "profile"  # profile power_budget_w
    BATTERY = "battery"  # profile battery_power_budget_w, on battery
    SUPPLY = "supply"  # the supply reports less than the budget


@dataclass(frozen=True)
class PowerStatus:
    """The power side of a decision, typed for the API and for load balancers (an HAProxy agent
    check weight can be read from `headroom_frac`)."""

    control: PowerControl = PowerControl.OFF
    budget_w: float | None = None
    origin: BudgetOrigin = BudgetOrigin.NONE
    power_w: float | None = None  # what the decision was taken on (None: unknown)
    cap_load: float | None = None  # estimated load the budget allows (None: no cap)
    on_battery: bool | None = None
    battery_pct: float | None = None
    battery_low: bool = False  # on battery under the reserve: background waits

    @property
    def headroom_w(self) -> float | None:
        if self.budget_w is None or self.power_w is None or self.control is PowerControl.FAIL_CLOSED:
            return None
        return self.budget_w - self.power_w

    @property
    def headroom_frac(self) -> float | None:
        """(budget - power) / budget in [0, 1]; 1.0 without a budget; 0.0 while failing closed."""
        if self.control is PowerControl.OFF:
            return 1.0
        if self.control is PowerControl.FAIL_CLOSED or self.budget_w is None or self.budget_w <= 0:
            return 0.0
        h = self.headroom_w
        return None if h is None else min(1.0, max(0.0, h / self.budget_w))

    def as_dict(self) -> dict[str, Any]:
        def r(v: float | None, n: int = 2) -> float | None:
            return None if v is None else round(v, n)

        return {"control": self.control.value, "budget_w": self.budget_w, "origin": self.origin.value,
                "power_w": r(self.power_w), "headroom_w": r(self.headroom_w),
                "headroom_frac": r(self.headroom_frac, 3), "cap_load": r(self.cap_load, 3),
                "on_battery": self.on_battery, "battery_pct": self.battery_pct,
                "battery_low": self.battery_low}


class MemoryMode(str, Enum):
    OK = "ok"
    TIGHT = "tight"  # PSI some or low MemAvailable: admit nothing new
    SHED = "shed"  # PSI full or below the reserve: cancel background work too


@dataclass(frozen=True)
class ControlInput:
    """What the controller needs from one monitor reading; None is unknown."""

    t_s: float
    temp_c: float | None = None  # smoothed
    slope_c_per_s: float | None = None
    raw_temp_c: float | None = None  # the latest reading itself, unsmoothed
    fast_slope_c_per_s: float | None = None  # slope of the raw readings over the last few seconds
    limit_c: float | None = None  # lowest passive trip found
    stale: bool = False
    kernel_throttling: bool | None = None
    thermal_pressure: PressureLevel | None = None
    mem_available_bytes: int | None = None
    psi_some_avg10: float | None = None
    psi_full_avg10: float | None = None
    memory_pressure: PressureLevel | None = None
    # the source has no thermal sensor and no OS thermal signal at all (static, not a failure)
    thermal_sensor_absent: bool = False
    cpu_cores: int | None = None  # cores edge may run on
    cpu_other_cores: float | None = None  # CPU time other processes take on them, in cores
    cpu_steal_cores: float | None = None  # (shown in the status only)
    cpu_throttled_pct: float | None = None
    psi_cpu_some_avg10: float | None = None
    # power (scheduler/power.py)
    power_w: float | None = None  # smoothed by the monitor
    power_stale: bool = False  # the power reading is old or stuck (a rail that stopped updating)
    power_noise_w: float | None = None  # how much single readings scatter (the target keeps clear of it)
    on_battery: bool | None = None
    battery_pct: float | None = None
    power_mode_budget_w: float | None = None  # nvpmodel mode's budget
    supply_limit_w: float | None = None  # what the supply can deliver now

    @classmethod
    def from_reading(cls, reading: MonitorReading | Sample) -> ControlInput:
        """A telemetry.monitor MonitorReading (smoothing, slopes, limit, staleness are the
        monitor's), or a bare Sample read as it is (tests, tools)."""
        if isinstance(reading, Sample):
            return cls._build(reading.t_s, reading, temp_c=reading.temp_c, limit_c=reading.limit_c,
                              power_w=reading.power_w)
        return cls._build(
            reading.t_s, reading.sample, temp_c=reading.temp_c, slope_c_per_s=reading.slope_c_per_s,
            raw_temp_c=reading.raw_temp_c, fast_slope_c_per_s=reading.fast_slope_c_per_s,
            limit_c=reading.limit_c, stale=reading.stale,
            thermal_sensor_absent=reading.thermal_sensing is ThermalSensing.ABSENT,
            power_w=reading.power_w, power_stale=reading.power_stale, power_noise_w=reading.power_noise_w)

    @classmethod
    def _build(cls, t_s: float, s: Sample | None, **monitor: Any) -> ControlInput:
        if s is None:
            return cls(t_s=t_s, **monitor)
        return cls(
            t_s=t_s, kernel_throttling=s.kernel_throttling, thermal_pressure=s.thermal_pressure,
            mem_available_bytes=s.mem_available_bytes, psi_some_avg10=s.psi_some_avg10,
            psi_full_avg10=s.psi_full_avg10, memory_pressure=s.memory_pressure, cpu_cores=s.cpu_cores,
            cpu_other_cores=s.cpu_other_cores, cpu_steal_cores=s.cpu_steal_cores,
            cpu_throttled_pct=s.cpu_throttled_pct, psi_cpu_some_avg10=s.psi_cpu_some_avg10,
            on_battery=s.on_battery, battery_pct=s.battery_pct, power_mode_budget_w=s.power_mode_budget_w,
            supply_limit_w=s.supply_limit_w, **monitor)


@dataclass(frozen=True)
class QueueState:
    """Requests the admission layer holds, by priority."""

    waiting_interactive: int = 0
    waiting_background: int = 0
    running_interactive: int = 0
    running_background: int = 0
    last_activity_s: float | None = None  # when a request last arrived or finished

    @property
    def busy(self) -> bool:
        return (self.waiting_interactive + self.waiting_background
                + self.running_interactive + self.running_background) > 0


@dataclass(frozen=True)
class ControllerConfig:
    """Gains and thresholds; the same values serve every device (T_lim comes from the device)."""

    n_slots: int = 4
    max_threads: int = 2
    limit_c: float = 90.0  # profile fallback when no passive trip is exposed
    margin_c: float = 4.5  # T_set = T_lim - margin (design: ~12). `edge sim`, 5 thermal scenarios,
    # many seeds per profile: no second within 3 C of the limit; without the pre-guard a fan
    # failure crossed the Pi's 82 C line at 4.5 (and at 4.75)
    learning_margin_c: float = 1.5  # extra margin while the sustainable load is still a guess ...
    learn_confidence_s: float = 60.0  # ... shrinking to 0 over this much learning time
    on_band_c: float = 10.0  # T_on = T_set - on_band: below, no cap at all
    guard_band_c: float = 3.0  # hard guard at T_lim - guard_band
    guard_release_c: float = 3.0  # leave GUARD below T_lim - guard_band - release
    pre_guard_c: float = 0.6  # a reading this close under the guard while rising fast ...
    pre_guard_slope_c_per_s: float = 0.05  # ... (raw slope over ~4 s at least this) ...
    pre_guard_cut: float = 0.6  # ... cuts at once to this share of the load that ran
    horizon_s: float = 10.0  # forecast T + h * slope (15 s overshot after a fan failure in `edge sim`)
    gain_floor: float = 0.25  # gains scale with u_sus but never below this fraction
    k_i_per_c_s: float = 0.004  # integral gain (budget per degree-second above target)
    integral_max_c_s: float = 100.0  # anti-windup clamp
    integral_min_c_s: float = -50.0  # clamp below target (raises the budget by at most k_i * 50)
    integral_band_c: float = 4.0  # wind below target only within this band of T_set
    integral_decay_s: float = 60.0  # integral bleeds off with this time constant below target
    u_sus_rate: float = 0.05  # learning rate of the sustainable load
    u_sus_drop_rate: float = 0.1  # ... downwards while heating above target at a binding cap.
    # `edge sim` seeds 19-42, Pi: 0 (was 2.0) s near the limit after a fan failure, tokens -0.1 %
    u_sus_band_c: float = 2.0  # learn only within this band of T_set ...
    u_sus_slope_c_per_s: float = 0.03  # ... and while the temperature is nearly flat
    hysteresis_load: float = 0.05  # step up only when the budget clears the next level by this much
    down_interval_s: float = 2.0  # rate limit for turning down
    up_interval_s: float = 5.0  # rate limit for turning up
    interactive_band_c: float = 1.0  # interactive work alone may run at full speed up to T_set + this
    # (kept inside the T_set -> guard gap of margin - guard_band = 1.5 C)
    climb_band_c: float = 3.0  # background admission is expected back once T falls this far below T_set
    min_duty: float = 0.2
    # measured aggregate decode tokens/s as (threads, sequences, tok/s); () when none was measured.
    # With it the actuator ladder keeps only levels on the efficiency frontier (policy.py).
    decode_tps: tuple[tuple[int, int, float], ...] = ()
    conservative_load: float = 0.5  # stale/unknown telemetry: at most this estimated load
    # memory
    reserve_bytes: int = 1 << 30  # keep this much system memory free
    psi_some_pause_pct: float = 10.0  # admission pauses above this PSI some avg10
    psi_full_shed_pct: float = 2.0  # background is shed above this PSI full avg10
    memory_release_factor: float = 0.5  # leave TIGHT/SHED below threshold * factor
    footprint_bytes: int = 0  # memory a reload takes back (the memory plan's total less its reserve)
    # CPU contention: decode threads = cores actually free (other processes' use rounded, at least 1)
    contention_down_s: float = 2.0  # fewer threads once a neighbour has taken a core this long ...
    contention_up_s: float = 0.25  # ... and back up once the cores have been free this long,
    contention_flap_s: float = 10.0  # times 2 for each drop this soon after a restore (contention.py)
    contention_backoff_max: float = 32.0  # the restore's wait is at most contention_up_s times this
    # power (scheduler/power.py); budgets in watts, None: none
    power_budget_w: float | None = None  # --power-budget: beats every other budget
    profile_power_budget_w: float | None = None  # the profile's, on mains
    battery_power_budget_w: float | None = None  # the profile's, on battery
    battery_reserve_pct: float = 20.0  # on battery below this charge, background work waits
    idle_power_w: float = 5.0  # priors of the power model (the profile's), learned from readings
    max_power_w: float = 15.0
    power_target_frac: float = 1.0  # aim at this share of the budget (the 10 s windows may show +5 %)
    power_noise_margin: float = 0.5  # the target sits this many mean deviations of the readings lower ...
    power_noise_floor_frac: float = 0.02  # ... beyond this share of the budget
    power_learn_rate: float = 0.2
    power_k_p: float = 0.1  # extra load cut per unit of load-equivalent overshoot (pays the energy back)
    power_k_i: float = 0.05  # per load-second of error
    power_integral_max: float = 2.0  # anti-windup clamp (load-seconds) over budget ...
    power_integral_credit: float = 0.5  # ... and under it: a small credit, a surge of demand spends it
    power_up_interval_s: float = 3.0  # at most one step up this often

    @property
    def k_pu(self) -> float:
        """Gain below target per unit of sustainable load (power_allocator: 2 * SP / (T_set - T_on))."""
        return 2.0 / self.on_band_c

    @property
    def k_po(self) -> float:
        """Gain above target per unit of sustainable load (power_allocator: SP / (T_set - T_on))."""
        return 1.0 / self.on_band_c


def config_for_device(
    n_slots: int,
    max_threads: int,
    profile: DeviceProfile | None,
    *,
    reserve_bytes: int | None = None,
    footprint_bytes: int = 0,
    decode_tps: tuple[tuple[int, int, float], ...] = (),
    power_budget_w: float | None = None,
    battery_reserve_pct: float | None = None,
    battery_power_budget_w: float | None = None,
) -> ControllerConfig:
    """Production gains with this device's facts: `edge serve` and `edge sim` both build it here,
    so the simulator checks the controller that ships. `reserve_bytes` overrides the profile's."""
    facts: dict[str, Any] = {"n_slots": n_slots, "max_threads": max_threads,
                             "footprint_bytes": footprint_bytes, "decode_tps": decode_tps}
    if profile is not None:
        facts["limit_c"] = profile.thermal_limit_c
        facts["reserve_bytes"] = profile.memory_reserve_bytes
        facts.update(profile_power_budget_w=profile.power_budget_w,
                     battery_power_budget_w=profile.battery_power_budget_w,
                     idle_power_w=profile.idle_power_w, max_power_w=profile.max_power_w)
    if power_budget_w is not None:
        facts["power_budget_w"] = power_budget_w
    if battery_reserve_pct is not None:
        facts["battery_reserve_pct"] = battery_reserve_pct
    if battery_power_budget_w is not None:
        facts["battery_power_budget_w"] = battery_power_budget_w
    if reserve_bytes is not None:
        facts["reserve_bytes"] = reserve_bytes
    return ControllerConfig(**facts)


@dataclass(frozen=True)
class ControllerState:
    """Memory of the controller between decisions."""

    mode: ThermalMode = ThermalMode.NOMINAL
    memory: MemoryMode = MemoryMode.OK
    level: int = 0  # the thermal stage's index into the actuator ladder; 0 is full speed
    last_change_s: float | None = None
    last_t_s: float | None = None
    integral_c_s: float = 0.0
    u_sus: float = 1.0  # learned sustainable load; starts optimistic, learned near T_set
    psi_prev: tuple[float | None, float | None] = (None, None)  # last (some, full) PSI avg10
    mem_short_at_s: float | None = None  # last time MemAvailable was near or below the reserve
    mem_prev: tuple[float, int] | None = None  # (t_s, MemAvailable) of the last reading
    learned_s: float = 0.0  # seconds the sustainable load has been learned near target (0 after a guard)
    evicted: bool = False  # memory emergency: all work shed, model unloaded until memory is back
    threads_cap: int | None = None  # decode threads the CPU contention allows (None: no cap)
    threads_pending_s: float | None = None  # since when contention has called for another cap
    threads_restored_s: float | None = None  # when contention last gave threads back
    threads_backoff: float = 1.0  # the restore's wait, in contention_up_s: doubled by each flap
    power_level: int = 0  # ladder index the power budget allowed last time
    power_change_s: float | None = None  # when it last changed (steps up are rate-limited)
    power_integral: float = 0.0  # load-seconds
    power_w_per_load: float | None = None  # learned watts per unit of estimated load (None: prior)
    power_idle_w: float | None = None  # learned idle watts (None: the profile's)


class LimitKind(str, Enum):
    """What a box can run short of; a load balancer is told the tightest one."""

    THERMAL = "thermal"
    MEMORY = "memory"
    POWER = "power"


@dataclass(frozen=True)
class LimitHeadroom:
    """How far the box is from one limit: 1 far below it, 0 where work must stop.

    `blocking` is True while the box refuses new work for this limit (/ready 503).
    The thermal and memory ones are derived from a Decision (edge.scheduler.headroom);
    a controller that keeps other budgets (a power cap) adds its own to `Decision.limits`.
    """

    kind: LimitKind
    headroom: float
    blocking: bool
    reason: str


@dataclass(frozen=True)
class Decision:
    """What to do now; `knobs` go to the engine, the flags to admission and the API."""

    knobs: Knobs
    mode: ThermalMode
    memory: MemoryMode
    admit_interactive: bool
    admit_background: bool
    shed_background: bool
    unload: bool  # give the model's memory back (a memory emergency; keep-alive is the engine's)
    reason: str
    t_s: float
    budget: float = 1.0  # allowed load fraction, 0..1
    t_lim_c: float | None = None
    t_set_c: float | None = None
    forecast_c: float | None = None
    cooldown_s: float = 0.0  # estimated time until work can resume (paused/guard)
    background_retry_s: float = 0.0  # estimated time until background admission reopens (0: open)
    throttle_reasons: tuple[str, ...] = field(default_factory=tuple)
    evict: bool = False  # memory emergency: shed every request (interactive too) and unload the model
    threads_cap: int | None = None  # decode threads CPU contention allows (None: no cap)
    cpu_other_cores: float | None = None  # what the cap was decided on (None: unknown)
    # limits besides heat and memory (e.g. a power budget): /ready and the balancer's agent read them
    limits: tuple[LimitHeadroom, ...] = ()
    power: PowerStatus = field(default_factory=PowerStatus)

    def as_dict(self) -> dict[str, Any]:
        k = self.knobs
        return {
            "mode": self.mode.value,
            "memory": self.memory.value,
            "reason": self.reason,
            "t_s": self.t_s,
            "budget": round(self.budget, 3),
            "t_lim_c": self.t_lim_c,
            "t_set_c": self.t_set_c,
            "forecast_c": None if self.forecast_c is None else round(self.forecast_c, 2),
            "admit_interactive": self.admit_interactive,
            "admit_background": self.admit_background,
            "shed_background": self.shed_background,
            "evict": self.evict,
            "unload": self.unload,
            "cooldown_s": round(self.cooldown_s, 1),
            "threads_cap": self.threads_cap,
            "cpu_other_cores": self.cpu_other_cores,
            "background_retry_s": round(self.background_retry_s, 1),
            "power": self.power.as_dict(),
            "knobs": {
                "active_limit": k.active_limit,
                "n_threads": k.n_threads,
                "duty": round(k.duty, 3),
                "off_threads": k.off_threads,
                "paused": k.paused,
                "admit_background": k.admit_background,
            },
        }
