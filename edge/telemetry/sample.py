"""What one telemetry reading says about the device.

Every field may be None: None means *unknown* (sensor missing or unreadable),
never "nominal". The scheduler treats unknown thermal state conservatively.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class PressureLevel(IntEnum):
    """OS-reported pressure, ordered so that larger is worse.

    Thermal: macOS `com.apple.system.thermalpressurelevel` 0..4 maps onto
    NOMINAL..SLEEPING. Memory: macOS `kern.memorystatus_vm_pressure_level`
    1/2/4 maps to NOMINAL/MODERATE/CRITICAL; Linux PSI is mapped by thresholds.
    """

    NOMINAL = 0
    MODERATE = 1
    HEAVY = 2
    CRITICAL = 3  # macOS "trapping"
    SLEEPING = 4


@dataclass(frozen=True)
class ThermalZone:
    name: str
    temp_c: float | None
    passive_trip_c: float | None = None  # lowest passive trip: where the kernel throttles
    critical_trip_c: float | None = None


@dataclass(frozen=True)
class PowerRail:
    """One measured supply rail (Jetson INA3221 channel or jtop rail)."""

    name: str  # e.g. "VDD_IN" (whole module), "VDD_CPU_GPU_CV", "VDD_SOC"
    power_w: float | None
    voltage_v: float | None = None
    current_a: float | None = None


@dataclass(frozen=True)
class Sample:
    """One reading of every sensor, taken at monotonic time `t_s`."""

    t_s: float
    source: str  # "linux", "jetson", "jtop", "macos", "sim:PROFILE", "none"
    # --- thermal ---
    zones: tuple[ThermalZone, ...] = ()
    temp_c: float | None = None  # the hottest relevant sensor
    limit_c: float | None = None  # lowest passive trip found (None: use the profile)
    critical_c: float | None = None
    kernel_throttling: bool | None = None  # cooling device active or frequency capped
    thermal_pressure: PressureLevel | None = None  # OS-level (macOS)
    power_w: float | None = None
    # --- memory ---
    mem_total_bytes: int | None = None
    mem_available_bytes: int | None = None  # min(MemAvailable, cgroup headroom)
    cgroup_limit_bytes: int | None = None
    cgroup_current_bytes: int | None = None
    psi_some_avg10: float | None = None  # percent
    psi_full_avg10: float | None = None
    memory_pressure: PressureLevel | None = None  # OS-level (macOS) or derived from PSI
    # --- CPU contention (telemetry/cpu.py): what other processes take from edge's cores ---
    cpu_cores: int | None = None  # cores this process may run on
    cpu_other_cores: float | None = None  # CPU time others took on them, in cores (steal included)
    cpu_steal_cores: float | None = None  # of which a hypervisor gave to other guests
    cpu_throttled_pct: float | None = None  # cgroup: share of time throttled by its CPU quota
    psi_cpu_some_avg10: float | None = None  # percent of time some task waited for a CPU
    # --- extra ---
    gpu_load_pct: float | None = None
    rails: tuple[PowerRail, ...] = ()  # power_w is the total (VDD_IN) when a rail says so
    cooling_active: bool | None = None  # a CPU/GPU cooling device has cur_state > 0
    freq_capped: bool | None = None  # some CPU has scaling_max_freq < cpuinfo_max_freq (any cause)
    nvmap_used_bytes: int | None = None  # Jetson: NvMapMemUsed (GPU buffers in shared RAM)
    # --- power (telemetry/power.py, powermode.py) ---
    power_source: str | None = None  # which input fed power_w: ina3221, battery, hwmon, rapl, jtop, sim
    on_battery: bool | None = None  # None: no power supply information at all
    battery_pct: float | None = None
    power_mode: str | None = None  # Jetson nvpmodel mode name, e.g. "7W", "MAXN"
    power_mode_budget_w: float | None = None  # the mode's budget when its name gives one
    supply_limit_w: float | None = None  # what the supply can deliver now (a sagging or renegotiated one)
    fan_rpm: int | None = None
    fan_pwm: int | None = None  # 0..255
    errors: tuple[str, ...] = field(default_factory=tuple)  # one line per failed read

    @property
    def thermal_known(self) -> bool:
        return self.temp_c is not None or self.thermal_pressure is not None
