"""The simulated device's physics: RC thermal model, hardware throttling, memory and PSI.

`edge.sim.device` wraps it as a telemetry source (the clock, the engine's load, sensor
faults). The physics is deliberately simple and documented so results can be checked by hand:

* first order:  tau * dT/dt = T_amb + R * P - T            (steady state T_amb + R*P)
* second order: die (tau ~4 s) on a heatsink (tau from the profile); R is split
  die->sink / sink->ambient, steady state is still T_amb + R*P. The fast die
  is why the controller forecasts instead of reacting to the current value.
* power: P = P_idle + (P_max - P_idle) * f * clock^1.5, with f the utilisation of
  the running work (sequences, threads, duty, off-duty threads) from the measured
  throughput model; several engines at once (a model host's resident models) add up,
  capped at the whole box.
* hardware throttling: at the passive trip the clock drops to `throttle_clock`
  (tokens slow down and power falls); it recovers below trip - hysteresis.
* memory: total - OS base - engine - hog; PSI avg10 values are 10 s exponential
  averages of a pressure that rises as available memory nears the low watermark.
* power supply: `supply_limit_w` is what the supply can deliver (a sagging or renegotiated
  one reports less); drawing more counts `supply_over_s`. On battery (`battery_wh` set,
  `on_battery` True) the charge drains by the power drawn.
* a neighbour process: `neighbour_cores` busy cores of another program. It adds
  its share of the cores to the utilisation (heat) and is what the CPU
  contention telemetry reports (`cpu_other_cores`, out of `cores`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from edge.contracts.device import DeviceProfile
from edge.sim.throughput import ThroughputModel, load_throughput
from edge.telemetry.sample import PressureLevel, Sample, ThermalZone

GiB = 1 << 30
DIE_TAU_S = 4.0  # silicon die on its spreader: seconds
DIE_R_FRACTION = 0.2  # share of the total thermal resistance between die and heatsink
PSI_AVG_WINDOW_S = 10.0


@dataclass(frozen=True)
class DeviceLoad:
    """The work running now, as the engine reports it."""

    active: int = 0
    threads: int = 1
    duty: float = 1.0
    off_threads: int = 0  # threads stepping in the rest of the duty cycle (0: idle)


class SimulatedDevice:
    """State of one simulated device; advance it with `step(dt_s)` in simulated seconds."""

    def __init__(
        self,
        profile: DeviceProfile,
        throughput: ThroughputModel | None = None,
        order: Literal[1, 2] = 2,
        mem_total_bytes: int = 8 * GiB,
        os_used_bytes: int = 2 * GiB,
        throttle_clock: float = 0.5,
        throttle_hyst_c: float = 4.0,
        low_watermark_fraction: float = 0.1,
        oom_floor_bytes: int = 64 << 20,
    ) -> None:
        self.profile = profile
        self.throughput = throughput or load_throughput()
        self.order = order
        self.ambient_c = profile.ambient_c
        self.resistance_factor = 1.0  # multiplies sink->ambient resistance (fan failure > 1)
        self.throttle_clock = throttle_clock
        self.throttle_hyst_c = throttle_hyst_c
        self.limit_c = profile.thermal_limit_c
        self.critical_c = profile.thermal_critical_c
        self.die_c = profile.ambient_c
        self.sink_c = profile.ambient_c
        self.load = DeviceLoad()
        self.co_loads: tuple[DeviceLoad, ...] = ()  # other engines' work on the box (more resident models)
        self.hw_throttled = False
        self.shut_down = False  # reached the critical trip; halted until it cools
        self.critical_events = 0
        self.throttle_events = 0
        self.max_temp_c = self.die_c  # hottest die temperature so far (at physics-step resolution)
        self.hw_throttled_s = 0.0  # device seconds spent hardware-throttled
        self.near_limit_s = 0.0  # device seconds at or above limit - 3 C (edge's own safety line)
        self.mem_total_bytes = mem_total_bytes
        self.os_used_bytes = os_used_bytes
        self.engine_bytes = 0
        self.hog_bytes = 0
        self.low_watermark_bytes = int(low_watermark_fraction * mem_total_bytes)
        self.oom_floor_bytes = oom_floor_bytes
        self.oom_events = 0
        self.psi_some_avg10 = 0.0
        self.psi_full_avg10 = 0.0
        self.cores = self.throughput.max_threads  # the modelled box has as many cores as decode threads
        self.neighbour_cores = 0.0  # CPU another busy process takes, in cores
        self.supply_limit_w: float | None = None  # None: the supply is not a limit (or not reported)
        self.supply_over_s = 0.0  # device seconds drawing more than the supply can give
        self.battery_wh: float | None = None  # None: no battery
        self.battery_pct: float | None = None
        self.on_battery = False
        self.energy_j = 0.0  # energy drawn so far

    # --- inputs ---------------------------------------------------------
    def set_load(self, active: int, threads: int, duty: float = 1.0, off_threads: int = 0) -> None:
        self.load = DeviceLoad(max(0, active), max(1, threads), min(1.0, max(0.0, duty)), max(0, off_threads))

    def set_loads(self, loads: Sequence[DeviceLoad]) -> None:
        """Every engine's work at once: the first is `load`, the others `co_loads`."""
        first = loads[0] if loads else DeviceLoad()
        self.set_load(first.active, first.threads, first.duty, first.off_threads)
        self.co_loads = tuple(loads[1:])

    def set_engine_memory(self, mem_bytes: int) -> None:
        self.engine_bytes = max(0, mem_bytes)

    def set_memory_hog(self, mem_bytes: int) -> None:
        self.hog_bytes = max(0, mem_bytes)

    # --- derived --------------------------------------------------------
    @property
    def clock_factor(self) -> float:
        """Fraction of full clock the hardware allows now (1 normal, <1 throttled, 0 halted)."""
        if self.shut_down:
            return 0.0
        return self.throttle_clock if self.hw_throttled else 1.0

    @property
    def utilisation(self) -> float:
        engine = sum(self.throughput.utilisation(ld.active, ld.threads, ld.duty, ld.off_threads)
                     for ld in (self.load, *self.co_loads))
        return min(1.0, engine + self.neighbour_cores / max(1, self.cores))

    @property
    def free_cores(self) -> float:
        return max(0.0, self.cores - self.neighbour_cores)

    def set_neighbour(self, cores: float) -> None:
        """Another program starts (or stops, 0) keeping `cores` cores busy."""
        self.neighbour_cores = min(float(self.cores), max(0.0, cores))

    @property
    def power_w(self) -> float:
        p = self.profile
        return p.idle_power_w + (p.max_power_w - p.idle_power_w) * self.utilisation * self.clock_factor**1.5

    @property
    def fan_rpm(self) -> int:
        """What a tachometer shows: the fan slows as sink->ambient resistance rises (a failing fan)."""
        return round(3000 / max(1.0, self.resistance_factor))

    @property
    def resistance_c_per_w(self) -> float:
        r = self.profile.thermal_resistance_c_per_w
        return r * DIE_R_FRACTION + r * (1 - DIE_R_FRACTION) * self.resistance_factor

    def steady_state_c(self, power_w: float | None = None) -> float:
        """Temperature the device settles at under constant power: T_amb + R * P."""
        return self.ambient_c + self.resistance_c_per_w * (self.power_w if power_w is None else power_w)

    @property
    def temp_c(self) -> float:
        return self.die_c

    @property
    def mem_available_bytes(self) -> int:
        return self.mem_total_bytes - self.os_used_bytes - self.engine_bytes - self.hog_bytes

    # --- physics --------------------------------------------------------
    def step(self, dt_s: float) -> None:
        """Advance the physics by `dt_s` simulated seconds."""
        remaining = dt_s
        max_sub_s = 0.25 if self.order == 2 else 1.0
        while remaining > 1e-12:
            h = min(max_sub_s, remaining)
            self._step_thermal(h)
            self._step_memory(h)
            remaining -= h

    def _step_power(self, h: float, p_w: float) -> None:
        self.energy_j += p_w * h
        if self.supply_limit_w is not None and p_w > self.supply_limit_w:
            self.supply_over_s += h
        if self.on_battery and self.battery_wh and self.battery_pct is not None:
            self.battery_pct = max(0.0, self.battery_pct - 100.0 * p_w * h / 3600.0 / self.battery_wh)

    def _step_thermal(self, h: float) -> None:
        p_w = self.power_w
        self._step_power(h, p_w)
        r = self.profile.thermal_resistance_c_per_w
        tau = self.profile.thermal_tau_s
        if self.order == 1:
            target = self.ambient_c + self.resistance_c_per_w * p_w
            self.die_c = target + (self.die_c - target) * math.exp(-h / tau)
            self.sink_c = self.die_c
        else:
            r_ds = r * DIE_R_FRACTION
            r_sa = r * (1 - DIE_R_FRACTION) * self.resistance_factor
            c_die = DIE_TAU_S / r_ds
            c_sink = tau / (r * (1 - DIE_R_FRACTION))  # heat capacity does not change with the fan
            q_ds = (self.die_c - self.sink_c) / r_ds
            q_sa = (self.sink_c - self.ambient_c) / r_sa
            self.die_c += h * (p_w - q_ds) / c_die
            self.sink_c += h * (q_ds - q_sa) / c_sink
        self.max_temp_c = max(self.max_temp_c, self.die_c)
        if self.die_c >= self.limit_c - 3.0:
            self.near_limit_s += h
        if self.hw_throttled:
            self.hw_throttled_s += h
        if self.die_c >= self.critical_c and not self.shut_down:
            self.shut_down = True
            self.critical_events += 1
        elif self.shut_down and self.die_c < self.limit_c - 10.0:
            self.shut_down = False
        if self.die_c >= self.limit_c and not self.hw_throttled:
            self.hw_throttled = True
            self.throttle_events += 1
        elif self.hw_throttled and self.die_c < self.limit_c - self.throttle_hyst_c:
            self.hw_throttled = False

    def _step_memory(self, h: float) -> None:
        avail = self.mem_available_bytes
        x = min(1.0, max(0.0, (self.low_watermark_bytes - avail) / self.low_watermark_bytes))
        some_target, full_target = 60.0 * x, 20.0 * x * x
        a = 1.0 - math.exp(-h / PSI_AVG_WINDOW_S)
        self.psi_some_avg10 += (some_target - self.psi_some_avg10) * a
        self.psi_full_avg10 += (full_target - self.psi_full_avg10) * a

    def check_oom(self) -> bool:
        """True (and counted) when available memory fell below the OOM killer's floor."""
        if self.mem_available_bytes < self.oom_floor_bytes:
            self.oom_events += 1
            return True
        return False

    # --- telemetry ------------------------------------------------------
    def sample(self, t_s: float, source: str | None = None) -> Sample:
        """One telemetry reading shaped like a Linux box: zones with trips, PSI, MemAvailable."""
        name = source or f"sim:{self.profile.name}"
        zones = (
            ThermalZone("sim-die", round(self.die_c, 3), self.limit_c, self.critical_c),
            ThermalZone("sim-heatsink", round(self.sink_c, 3), None, None),
        )
        some, full = round(self.psi_some_avg10, 2), round(self.psi_full_avg10, 2)
        if full >= 10:
            mem_p = PressureLevel.CRITICAL
        elif full >= 2:
            mem_p = PressureLevel.HEAVY
        elif some >= 10:
            mem_p = PressureLevel.MODERATE
        else:
            mem_p = PressureLevel.NOMINAL
        return Sample(
            t_s=t_s,
            source=name,
            zones=zones,
            temp_c=round(self.die_c, 3),
            limit_c=self.limit_c,
            critical_c=self.critical_c,
            kernel_throttling=self.hw_throttled or self.shut_down,
            thermal_pressure=None,
            power_w=round(self.power_w, 3),
            power_source="sim",
            on_battery=self.on_battery if self.battery_wh is not None else None,
            battery_pct=None if self.battery_pct is None else round(self.battery_pct, 1),
            supply_limit_w=self.supply_limit_w,
            mem_total_bytes=self.mem_total_bytes,
            mem_available_bytes=max(0, self.mem_available_bytes),
            psi_some_avg10=some,
            psi_full_avg10=full,
            memory_pressure=mem_p,
            cpu_cores=self.cores,
            cpu_other_cores=round(self.neighbour_cores, 3),
        )
