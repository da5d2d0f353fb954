"""Power scenarios of `edge sim`: budgets, an unplugged laptop, a sagging supply, sensor faults.

`PowerPlan` is the scenario's power side: the budget a user sets (`--power-budget`), the
battery budget after unplugging, a supply that sags, and the sensor faults (a rail that
stops updating, noise and lag, a fan whose reading sticks while the fan fails). It
drives the simulated device and source over time and says which budget is in force,
which the metrics hold the measured power to.

`PowerWindows` judges the target "the average power over any 10 s window <= budget + 5 %".
A window is *settled* when the budget in force moved less than 5 % within it; a window
across a step (unplugging) is a *transition*: the controller needs a decision or two to
follow a step, so those are reported apart (`worst_transition_ratio`), not hidden.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from edge.contracts.device import DeviceProfile
from edge.sim.device import SimulatedDevice, SimulatedSource

WINDOW_S = 10.0
SETTLED_SPREAD = 1.05  # max/min budget within a settled window


@dataclass(frozen=True)
class PowerPlan:
    budget_w: float | None = None  # --power-budget, in watts ...
    budget_frac: float | None = None  # ... or as idle + frac * (max - idle) of the profile
    unplug_at: float | None = None  # fraction of the run at which the machine goes on battery
    battery_frac: float | None = None  # the profile's battery budget, as a fraction as above
    battery_hours: float = 0.26  # battery capacity, in hours at the battery budget, for a 30 min run
    battery_start_pct: float = 100.0
    sag_at: float | None = None  # the supply starts to sag ...
    sag_from_frac: float = 1.0  # ... from this share of the profile's range ...
    sag_to_frac: float = 0.3  # ... to this ...
    sag_ramp_s: float = 120.0  # ... over this many seconds
    rail_stuck_at: float | None = None  # the power reading stops updating
    fan_stick_at: float | None = None  # the fan fails (x2 sink resistance) and its reading sticks
    power_noise_frac: float = 0.01  # real rails jitter (a frozen value is how a stuck rail shows)
    temp_noise_c: float | None = None  # None: the harness default
    lag_s: float = 0.0  # every reading describes the device this long ago

    def _watts(self, profile: DeviceProfile, frac: float) -> float:
        return profile.idle_power_w + frac * (profile.max_power_w - profile.idle_power_w)

    def setting_w(self, profile: DeviceProfile) -> float | None:
        if self.budget_w is not None:
            return self.budget_w
        return None if self.budget_frac is None else self._watts(profile, self.budget_frac)

    def battery_w(self, profile: DeviceProfile) -> float | None:
        return None if self.battery_frac is None else self._watts(profile, self.battery_frac)

    def supply_w(self, profile: DeviceProfile, t_s: float, duration_s: float) -> float | None:
        if self.sag_at is None:
            return None
        start = self.sag_at * duration_s
        x = min(1.0, max(0.0, (t_s - start) / self.sag_ramp_s))
        return self._watts(profile, self.sag_from_frac + x * (self.sag_to_frac - self.sag_from_frac))

    def on_battery(self, t_s: float, duration_s: float) -> bool:
        return self.unplug_at is not None and t_s >= self.unplug_at * duration_s

    def budget_at(self, profile: DeviceProfile, t_s: float, duration_s: float) -> float | None:
        """The budget in force, as the controller should resolve it (setting > battery; supply lowers)."""
        budget = self.setting_w(profile)
        if budget is None and self.on_battery(t_s, duration_s):
            budget = self.battery_w(profile)
        supply = self.supply_w(profile, t_s, duration_s)
        if supply is not None and (budget is None or supply < budget):
            budget = supply
        return budget

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self.budget_w, self.budget_frac, self.unplug_at, self.sag_at,
                                           self.rail_stuck_at, self.fan_stick_at)) or self.lag_s > 0

    def start(self, device: SimulatedDevice, duration_s: float) -> None:
        """Size the battery to the run, so a short test run crosses the reserve like a 30 min one."""
        budget = self.battery_w(device.profile)
        if self.unplug_at is not None and budget is not None:
            device.battery_wh = self.battery_hours * budget * duration_s / 1800.0
            device.battery_pct = self.battery_start_pct

    def apply(self, device: SimulatedDevice, source: SimulatedSource | None, t_s: float,
              duration_s: float) -> None:
        """Move the device and its sensors to time `t_s` of the run."""
        frac = t_s / duration_s
        device.on_battery = self.on_battery(t_s, duration_s)
        device.supply_limit_w = self.supply_w(device.profile, t_s, duration_s)
        if self.fan_stick_at is not None and frac >= self.fan_stick_at:
            device.resistance_factor = 2.0
        if source is None:
            return
        source.lag_s = self.lag_s
        if self.rail_stuck_at is not None and frac >= self.rail_stuck_at and source.frozen_power_w is None:
            source.frozen_power_w = round(device.power_w, 3)
        if self.fan_stick_at is not None and frac < self.fan_stick_at:
            source.frozen_fan_rpm = device.fan_rpm  # the tachometer keeps showing the healthy speed


class PowerWindows:
    """Rolling 10 s averages of the device's power against the budget in force."""

    def __init__(self, dt_s: float) -> None:
        self.n = max(1, round(WINDOW_S / dt_s))
        self._win: deque[tuple[float, float | None]] = deque()
        self._sum_p = 0.0
        self.worst_settled = 0.0
        self.worst_transition = 0.0
        self.settled_windows = 0
        self.over_windows = 0  # settled windows above budget + 5 %
        self.max_avg_w = 0.0

    def add(self, power_w: float, budget_w: float | None) -> None:
        self._win.append((power_w, budget_w))
        self._sum_p += power_w
        if len(self._win) > self.n:
            self._sum_p -= self._win.popleft()[0]
        if len(self._win) < self.n:
            return
        avg = self._sum_p / self.n
        self.max_avg_w = max(self.max_avg_w, avg)
        budgets = [b for _, b in self._win]
        if any(b is None for b in budgets):
            return
        lo, hi = min(budgets), max(budgets)  # type: ignore[type-var]
        ratio = avg / (sum(budgets) / self.n)  # type: ignore[arg-type]
        if hi <= lo * SETTLED_SPREAD:  # type: ignore[operator]
            self.settled_windows += 1
            self.worst_settled = max(self.worst_settled, ratio)
            self.over_windows += ratio > 1.05
        else:
            self.worst_transition = max(self.worst_transition, ratio)
