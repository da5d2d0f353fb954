"""Turns raw samples into what the thermal controller needs: a smoothed temperature,
its slope, the limit it must stay under, and whether the data can be trusted.

Sampling runs at 1 Hz, and at 2 Hz within `near_limit_c` of the limit (or at
macOS thermal pressure >= moderate), where a late reaction costs most.
Temperature is smoothed with a time-constant EMA (the
alpha follows the real gap between samples, so 1 Hz and 2 Hz smooth alike) and
the slope is a least-squares fit over the last `slope_window_s` of smoothed
points: a two-point difference of a noisy sensor would swing the forecast
`T + h * dT/dt` by tens of degrees. That fit lags a sudden change by several
seconds (after a fan fails the die heats at ~0.3 C/s in `edge sim`), so a second,
fast slope over the last `fast_slope_window_s` of raw readings is reported too;
the controller trusts it only right under its guard, where reacting late costs most.

`Monitor.poll(now_s)` is called from the scheduler's loop (tests drive it with a
fake clock); `MonitorThread` runs the same poll in the background in production.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from edge.clock import Clock, SystemClock
from edge.contracts.device import DeviceProfile
from edge.telemetry.sample import PressureLevel, Sample


class TelemetrySource(Protocol):
    """What every platform source provides (linux, jetson, macos, sim:PROFILE, none)."""

    name: str

    def read(self) -> Sample: ...

    def close(self) -> None: ...


class ThermalSensing(str, Enum):
    """Whether the source can see heat at all; decided by readings, latched once sensors are seen.

    ABSENT is static (no zone, no hwmon temperature, no OS thermal signal and no
    thermal read error since start): thermal control is unavailable, not failing.
    Once any sensor has been seen the state is PRESENT for good, so a sensor that
    later disappears or fails reads as stale/unknown (conservative), never ABSENT.
    """

    UNKNOWN = "unknown"  # no successful read yet
    PRESENT = "present"
    ABSENT = "absent"


_THERMAL_ERROR_WORDS = ("thermal", "hwmon", "temp", "native layer")


def has_thermal_signal(sample: Sample) -> bool:
    """A sensor exists: a zone (even unreadable), a temperature, an OS level, or a thermal read error."""
    if sample.zones or sample.temp_c is not None or sample.thermal_pressure is not None:
        return True
    return any(w in e.lower() for e in sample.errors for w in _THERMAL_ERROR_WORDS)


class LimitOrigin(str, Enum):
    SENSOR = "sensor"  # lowest passive trip point read from the device
    PROFILE = "profile"  # the device profile's thermal_limit_c
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class MonitorReading:
    """The latest state of the device as the scheduler sees it. None = unknown."""

    t_s: float  # monitor clock time this reading describes
    source: str
    sample: Sample | None  # the last sample read (None before the first success)
    temp_c: float | None  # EMA-smoothed; None when the latest sample had no temperature
    raw_temp_c: float | None
    slope_c_per_s: float | None  # least-squares slope of temp_c; None until enough points
    limit_c: float | None  # sample.limit_c, else the profile's thermal_limit_c
    critical_c: float | None
    limit_origin: LimitOrigin
    stale: bool  # no fresh sample for > stale_periods periods, or the source raised
    age_s: float | None  # time since the last successful read
    period_s: float  # sampling period in force (1 s, or 0.5 s near the limit)
    error: str | None = None  # why the last read failed, when it did
    thermal_sensing: ThermalSensing = ThermalSensing.UNKNOWN
    fast_slope_c_per_s: float | None = None  # slope of the raw readings over `fast_slope_window_s`
    power_w: float | None = None  # EMA-smoothed total power; None when unknown
    power_stale: bool = False  # the power reading is old, or has not changed for `power_stuck_s`
    power_noise_w: float | None = None  # mean absolute deviation of the raw readings from the EMA

    @property
    def headroom_c(self) -> float | None:
        if self.temp_c is None or self.limit_c is None:
            return None
        return self.limit_c - self.temp_c


def least_squares_slope(points: list[tuple[float, float]]) -> float | None:
    """Slope of y over t by ordinary least squares; None for fewer than 2 distinct t."""
    n = len(points)
    if n < 2:
        return None
    mean_t = sum(t for t, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var_t = sum((t - mean_t) ** 2 for t, _ in points)
    if var_t <= 0:
        return None
    return sum((t - mean_t) * (y - mean_y) for t, y in points) / var_t


class Monitor:
    """Samples a source on a schedule and keeps the smoothed state. Thread-safe."""

    def __init__(
        self,
        source: TelemetrySource,
        clock: Clock | None = None,
        profile: DeviceProfile | None = None,
        *,
        period_s: float = 1.0,
        fast_period_s: float = 0.5,
        near_limit_c: float = 10.0,
        ema_tau_s: float = 3.0,
        slope_window_s: float = 15.0,
        fast_slope_window_s: float = 4.0,
        min_slope_span_s: float = 3.0,
        stale_periods: float = 3.0,
        power_tau_s: float = 1.0,
        power_stuck_s: float = 10.0,
        battery_stuck_s: float = 90.0,
    ) -> None:
        if not 0 < fast_period_s <= period_s:
            raise ValueError("need 0 < fast_period_s <= period_s")
        self.source = source
        self.clock = clock or SystemClock()
        self.profile = profile
        self.period_s = period_s
        self.fast_period_s = fast_period_s
        self.near_limit_c = near_limit_c
        self.ema_tau_s = ema_tau_s
        self.slope_window_s = slope_window_s
        self.fast_slope_window_s = fast_slope_window_s
        self.min_slope_span_s = min_slope_span_s
        self.stale_after_s = stale_periods * period_s
        self.power_tau_s = power_tau_s
        # a rail whose reading has not moved at all for this long has stopped updating (real rails
        # jitter by a few mW); a battery's fuel gauge updates every 5-60 s, so it gets longer
        self.power_stuck_s = power_stuck_s
        self.battery_stuck_s = battery_stuck_s
        self._power_ema: float | None = None
        self._power_t_s: float | None = None
        self._power_raw: float | None = None
        self._power_moved_s: float | None = None  # when the raw power reading last changed
        self._power_mad: float | None = None
        self._lock = threading.Lock()
        self._sample: Sample | None = None
        self._ema_c: float | None = None
        self._last_temp_s: float | None = None
        self._history: deque[tuple[float, float]] = deque()  # (t_s, smoothed °C)
        self._raw: deque[tuple[float, float]] = deque()  # (t_s, raw °C), the fast slope's window
        self._last_ok_s: float | None = None
        self._error: str | None = None
        self._period_s = period_s
        self._next_due_s: float | None = None
        self._sensing = ThermalSensing.UNKNOWN
        self.reads = 0  # successful reads, for tests and /metrics
        self.failures = 0

    # --- driving ---

    @property
    def next_due_s(self) -> float | None:
        """When the next sample is due (None before the first poll)."""
        return self._next_due_s

    def poll(self, now_s: float | None = None, max_age_s: float | None = None) -> MonitorReading:
        """Read the source if a sample is due, or if the latest is `max_age_s` old (a caller that
        needs fresher rates than the period gives: the scheduler while CPU contention holds
        threads back), then return the latest reading."""
        now = self.clock.monotonic() if now_s is None else now_s
        due = self._next_due_s is None or now >= self._next_due_s
        stale = max_age_s is not None and (self._last_ok_s is None or now - self._last_ok_s >= max_age_s)
        if due or stale:
            self.sample_now(now)
        return self.latest(now)

    def sample_now(self, now_s: float | None = None) -> None:
        """Read the source at once (outside the schedule), then reschedule."""
        now = self.clock.monotonic() if now_s is None else now_s
        try:
            sample = self.source.read()
        except Exception as exc:  # any source failure makes the data stale, never fatal
            with self._lock:
                self.failures += 1
                self._error = f"{type(exc).__name__}: {exc}"
                self._next_due_s = self._after(now)
            return
        with self._lock:
            self.reads += 1
            self._error = None
            self._sample = sample
            self._last_ok_s = now
            if self._sensing is not ThermalSensing.PRESENT:
                seen = has_thermal_signal(sample)
                self._sensing = ThermalSensing.PRESENT if seen else ThermalSensing.ABSENT
            self._update_temp(now, sample.temp_c)
            self._update_power(now, sample.power_w)
            self._period_s = self._choose_period(sample)
            self._next_due_s = self._after(now)

    def _after(self, now: float) -> float:
        """Next due time, anchored to the previous one so a late poll does not drift the rate."""
        due = self._next_due_s
        if due is not None and 0.0 <= now - due < self._period_s:
            return due + self._period_s
        return now + self._period_s

    def _update_temp(self, now: float, temp_c: float | None) -> None:
        if temp_c is None:
            return  # keep the filter; latest() reports unknown while the sensor is silent
        gap_s = None if self._last_temp_s is None else now - self._last_temp_s
        if self._ema_c is None or gap_s is None or gap_s > self.stale_after_s:
            self._ema_c = temp_c  # first reading, or a gap too long to bridge: restart
            self._history.clear()
            self._raw.clear()
        else:
            alpha = 1.0 - math.exp(-max(gap_s, 0.0) / self.ema_tau_s) if self.ema_tau_s > 0 else 1.0
            self._ema_c += alpha * (temp_c - self._ema_c)
        self._last_temp_s = now
        self._history.append((now, self._ema_c))
        while self._history and self._history[0][0] < now - self.slope_window_s:
            self._history.popleft()
        self._raw.append((now, temp_c))
        while self._raw and self._raw[0][0] < now - self.fast_slope_window_s:
            self._raw.popleft()

    def _update_power(self, now: float, power_w: float | None) -> None:
        if power_w is None:
            return
        gap_s = None if self._power_t_s is None else now - self._power_t_s
        if self._power_ema is None or gap_s is None or gap_s > self.stale_after_s:
            self._power_ema = power_w
            self._power_mad = None
        else:
            dev = abs(power_w - self._power_ema)  # noise (and real changes) around the smoothed value
            mad = self._power_mad
            self._power_mad = dev if mad is None else mad + 0.1 * (dev - mad)
            alpha = 1.0 - math.exp(-max(gap_s, 0.0) / self.power_tau_s) if self.power_tau_s > 0 else 1.0
            self._power_ema += alpha * (power_w - self._power_ema)
        if self._power_raw is None or power_w != self._power_raw or self._power_moved_s is None:
            self._power_moved_s = now
        self._power_raw, self._power_t_s = power_w, now

    def _power_state(self, sample: Sample | None, now: float, stale: bool) -> tuple[float | None, bool]:
        """(smoothed power or None, stale): unknown when the latest sample has none."""
        if sample is None or sample.power_w is None or self._power_ema is None:
            return None, stale
        slow = sample.power_source in ("battery", "powermetrics")  # read every 5-60 s
        stuck_s = self.battery_stuck_s if slow else self.power_stuck_s
        stuck = self._power_moved_s is not None and now - self._power_moved_s >= stuck_s
        return self._power_ema, stale or stuck

    def _limits(self, sample: Sample | None) -> tuple[float | None, float | None, LimitOrigin]:
        limit_c = sample.limit_c if sample is not None else None
        critical_c = sample.critical_c if sample is not None else None
        origin = LimitOrigin.SENSOR if limit_c is not None else LimitOrigin.UNKNOWN
        if limit_c is None and self.profile is not None:
            limit_c, origin = self.profile.thermal_limit_c, LimitOrigin.PROFILE
        if critical_c is None and self.profile is not None:
            critical_c = self.profile.thermal_critical_c
        return limit_c, critical_c, origin

    def _choose_period(self, sample: Sample) -> float:
        limit_c, _, _ = self._limits(sample)
        temps = [t for t in (sample.temp_c, self._ema_c) if t is not None]
        if limit_c is not None and temps and max(temps) >= limit_c - self.near_limit_c:
            return self.fast_period_s
        if sample.thermal_pressure is not None and sample.thermal_pressure >= PressureLevel.MODERATE:
            return self.fast_period_s  # macOS: no temperature, but the OS says it is warming
        return self.period_s

    # --- reading ---

    def latest(self, now_s: float | None = None) -> MonitorReading:
        now = self.clock.monotonic() if now_s is None else now_s
        with self._lock:
            sample = self._sample
            age_s = None if self._last_ok_s is None else now - self._last_ok_s
            stale = self._error is not None or age_s is None or age_s > self.stale_after_s
            live = sample is not None and sample.temp_c is not None
            span_ok = len(self._history) >= 3 and (
                self._history[-1][0] - self._history[0][0] >= self.min_slope_span_s
            )
            slope = least_squares_slope(list(self._history)) if live and span_ok else None
            fast_ok = live and len(self._raw) >= 3 and self._raw[-1][0] - self._raw[0][0] >= 1.5
            fast = least_squares_slope(list(self._raw)) if fast_ok else None
            limit_c, critical_c, origin = self._limits(sample)
            power_w, power_stale = self._power_state(sample, now, stale)
            return MonitorReading(
                t_s=now,
                source=sample.source if sample is not None else self.source.name,
                sample=sample,
                temp_c=self._ema_c if live else None,
                raw_temp_c=sample.temp_c if sample is not None else None,
                slope_c_per_s=slope,
                limit_c=limit_c,
                critical_c=critical_c,
                limit_origin=origin,
                stale=stale,
                age_s=age_s,
                period_s=self._period_s,
                error=self._error,
                thermal_sensing=self._sensing,
                fast_slope_c_per_s=fast,
                power_w=power_w,
                power_stale=power_stale,
                power_noise_w=self._power_mad,
            )


class MonitorThread:
    """Runs `monitor.poll()` in a daemon thread, sleeping until the next sample is due."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="edge-telemetry", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        clock = self.monitor.clock
        while not self._stop.is_set():
            self.monitor.poll()
            due = self.monitor.next_due_s
            wait_s = self.monitor.period_s if due is None else max(0.0, due - clock.monotonic())
            self._stop.wait(min(wait_s, self.monitor.period_s))

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        self.monitor.source.close()
