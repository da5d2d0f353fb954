"""Monitor on a fake clock: schedule (1 Hz, 2 Hz near the limit), EMA, slope fit, staleness."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import replace

import pytest

from edge.clock import ManualClock
from edge.config import load_profile
from edge.scheduler.controller import decide
from edge.scheduler.state import ControlInput, ControllerConfig, ControllerState, QueueState, ThermalMode
from edge.telemetry.monitor import LimitOrigin, Monitor, MonitorThread, ThermalSensing, least_squares_slope
from edge.telemetry.sample import PressureLevel, Sample, ThermalZone


class CurveSource:
    """Temperature as a function of clock time; can be told to fail."""

    name = "fake"

    def __init__(
        self,
        clock: ManualClock,
        temp_at: Callable[[float], float | None],
        limit_c: float | None = 80.0,
    ) -> None:
        self.clock = clock
        self.temp_at = temp_at
        self.limit_c = limit_c
        self.fail: Exception | None = None
        self.read_times: list[float] = []
        self.closed = False

    def read(self) -> Sample:
        now = self.clock.monotonic()
        if self.fail is not None:
            raise self.fail
        self.read_times.append(now)
        return Sample(t_s=now, source=self.name, temp_c=self.temp_at(now), limit_c=self.limit_c)

    def close(self) -> None:
        self.closed = True


def run_for(mon: Monitor, clock: ManualClock, seconds: float, step_s: float = 0.125) -> None:
    """The scheduler loop: poll every `step_s` of fake time (a binary fraction: no float drift)."""
    for _ in range(round(seconds / step_s)):
        clock.advance(step_s)
        mon.poll()


def test_samples_at_1hz_far_from_the_limit() -> None:
    clock = ManualClock()
    src = CurveSource(clock, lambda t: 50.0)
    mon = Monitor(src, clock)
    mon.poll()
    run_for(mon, clock, 10.0)
    gaps = [b - a for a, b in zip(src.read_times, src.read_times[1:], strict=False)]
    assert len(src.read_times) == 11
    assert all(g == pytest.approx(1.0) for g in gaps)
    assert mon.latest().period_s == 1.0


def test_samples_at_2hz_within_10c_of_the_limit() -> None:
    clock = ManualClock()
    src = CurveSource(clock, lambda t: 72.0, limit_c=80.0)
    mon = Monitor(src, clock)
    mon.poll()
    run_for(mon, clock, 10.0)
    assert len(src.read_times) == 21
    assert mon.latest().period_s == 0.5


def test_rate_switches_as_the_device_heats() -> None:
    clock = ManualClock()
    src = CurveSource(clock, lambda t: 50.0 + 2.0 * t, limit_c=90.0)  # crosses 80 °C at t = 15
    mon = Monitor(src, clock)
    mon.poll()
    run_for(mon, clock, 30.0)
    early = [t for t in src.read_times if t < 10.0]
    late = [t for t in src.read_times if t >= 22.0]
    assert len(early) == 10  # 1 Hz
    assert len(late) == pytest.approx(16, abs=1)  # 2 Hz over 8 s


def test_macos_pressure_speeds_up_sampling() -> None:
    clock = ManualClock()
    level = {"p": PressureLevel.NOMINAL}

    class PressureSource(CurveSource):
        def read(self) -> Sample:
            self.read_times.append(self.clock.monotonic())
            return Sample(t_s=self.clock.monotonic(), source="macos", thermal_pressure=level["p"])

    src = PressureSource(clock, lambda t: None, limit_c=None)
    mon = Monitor(src, clock)
    mon.poll()
    run_for(mon, clock, 4.0)
    assert mon.latest().period_s == 1.0 and mon.latest().temp_c is None
    level["p"] = PressureLevel.MODERATE
    run_for(mon, clock, 4.0)
    assert mon.latest().period_s == 0.5
    assert len([t for t in src.read_times if t > 5.0]) >= 6


def test_slope_of_a_ramp() -> None:
    clock = ManualClock()
    mon = Monitor(CurveSource(clock, lambda t: 40.0 + 0.2 * t, limit_c=95.0), clock)
    mon.poll()
    run_for(mon, clock, 40.0)
    r = mon.latest()
    assert r.slope_c_per_s == pytest.approx(0.2, rel=0.02)
    # the EMA lags a ramp by about tau * slope = 3 s * 0.2 °C/s
    assert r.temp_c == pytest.approx(40.0 + 0.2 * 40.0 - 0.6, abs=0.15)
    assert r.raw_temp_c == pytest.approx(48.0)


def test_slope_ignores_sensor_noise() -> None:
    clock = ManualClock()
    noisy = CurveSource(clock, lambda t: 60.0 + (0.5 if round(t) % 2 else -0.5))
    mon = Monitor(noisy, clock)
    mon.poll()
    run_for(mon, clock, 30.0)
    r = mon.latest()
    assert r.slope_c_per_s is not None and abs(r.slope_c_per_s) < 0.03
    assert r.temp_c == pytest.approx(60.0, abs=0.4)


def test_no_slope_until_the_window_has_data() -> None:
    clock = ManualClock()
    mon = Monitor(CurveSource(clock, lambda t: 50.0 + t), clock)
    assert mon.poll().slope_c_per_s is None
    run_for(mon, clock, 2.0)
    assert mon.latest().slope_c_per_s is None  # 3 points over 2 s: too short to trust
    run_for(mon, clock, 2.0)
    assert mon.latest().slope_c_per_s is not None


def test_source_raising_marks_stale_then_recovers() -> None:
    clock = ManualClock()
    src = CurveSource(clock, lambda t: 50.0)
    mon = Monitor(src, clock)
    assert mon.poll().stale is False
    src.fail = OSError("EIO")
    clock.advance(1.0)
    r = mon.poll()
    assert r.stale is True and r.error == "OSError: EIO"
    assert r.temp_c == 50.0  # last value kept for display, flagged stale
    assert mon.failures == 1
    src.fail = None
    clock.advance(1.0)
    r = mon.poll()
    assert r.stale is False and r.error is None


def test_no_fresh_reading_for_three_periods_is_stale() -> None:
    clock = ManualClock()
    mon = Monitor(CurveSource(clock, lambda t: 50.0), clock)
    mon.poll()
    assert mon.latest(3.0).stale is False
    assert mon.latest(3.01).stale is True  # nobody polled for more than 3 periods
    assert mon.latest(3.01).age_s == pytest.approx(3.01)


def test_unknown_temperature_is_reported_unknown_not_last_value() -> None:
    clock = ManualClock()
    temps: dict[int, float | None] = {0: 50.0, 1: 51.0, 2: None}
    mon = Monitor(CurveSource(clock, lambda t: temps.get(round(t), 52.0)), clock)
    mon.poll()
    run_for(mon, clock, 1.0)
    assert mon.latest().temp_c is not None
    run_for(mon, clock, 1.0)
    r = mon.latest()
    assert r.temp_c is None and r.raw_temp_c is None and r.slope_c_per_s is None
    assert r.headroom_c is None
    run_for(mon, clock, 1.0)
    ema = 50.0 + (51.0 - 50.0) * (1 - math.exp(-1 / 3))  # t=1; tau = 3 s
    ema += (52.0 - ema) * (1 - math.exp(-2 / 3))  # t=3: the filter bridges the 2 s gap
    assert mon.latest().temp_c == pytest.approx(ema)


def test_long_gap_restarts_the_filter() -> None:
    clock = ManualClock()
    level = {"t": 40.0}
    mon = Monitor(CurveSource(clock, lambda t: level["t"]), clock)
    mon.poll()
    run_for(mon, clock, 5.0)
    clock.advance(60.0)  # the scheduler was stuck: the old history says nothing now
    level["t"] = 85.0
    r = mon.poll()
    assert r.temp_c == 85.0 and r.slope_c_per_s is None


def test_limit_from_sensor_then_profile_then_unknown() -> None:
    clock = ManualClock()
    nano = load_profile("jetson-orin-nano")
    r = Monitor(CurveSource(clock, lambda t: 50.0, limit_c=97.0), clock, nano).poll()
    assert (r.limit_c, r.limit_origin, r.critical_c) == (97.0, LimitOrigin.SENSOR, nano.thermal_critical_c)
    r = Monitor(CurveSource(clock, lambda t: 50.0, limit_c=None), clock, nano).poll()
    assert (r.limit_c, r.limit_origin) == (nano.thermal_limit_c, LimitOrigin.PROFILE)
    assert r.headroom_c == pytest.approx(nano.thermal_limit_c - 50.0)
    r = Monitor(CurveSource(clock, lambda t: 50.0, limit_c=None), clock).poll()
    assert r.limit_c is None and r.limit_origin is LimitOrigin.UNKNOWN


def test_least_squares_slope() -> None:
    pts = [(float(t), 3.0 * t + 1.0) for t in range(10)]
    assert least_squares_slope(pts) == pytest.approx(3.0)
    assert least_squares_slope([(1.0, 2.0)]) is None
    assert least_squares_slope([(1.0, 2.0), (1.0, 3.0)]) is None
    assert math.isclose(least_squares_slope([(0.0, 5.0), (2.0, 5.0)]) or 0.0, 0.0)


def test_thread_wrapper_polls_in_background_and_closes_the_source() -> None:
    clock = ManualClock()
    got = threading.Event()
    src = CurveSource(clock, lambda t: 50.0)
    inner_read = src.read

    def read() -> Sample:
        s = inner_read()
        got.set()
        return s

    src.read = read  # type: ignore[method-assign]
    thread = MonitorThread(Monitor(src, clock))
    thread.start()
    try:
        assert got.wait(5.0)
    finally:
        thread.stop()
    assert src.closed
    assert thread.monitor.latest().temp_c == 50.0


class FixedSource:
    """Returns the samples it is given, in order (the last one repeats)."""

    name = "fixed"

    def __init__(self, clock: ManualClock, *samples: Sample) -> None:
        self.clock, self.samples = clock, list(samples)

    def read(self) -> Sample:
        s = self.samples.pop(0) if len(self.samples) > 1 else self.samples[0]
        return replace(s, t_s=self.clock.monotonic())

    def close(self) -> None:
        """Nothing to release."""


def test_machine_without_any_thermal_sensor_is_absent_and_unavailable(tmp_path) -> None:
    """This VM's case: no thermal zones, no hwmon, no OS pressure, no read errors."""
    from edge.telemetry.linux import LinuxSource

    (tmp_path / "sys").mkdir()
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text("MemTotal: 8000000 kB\nMemAvailable: 6000000 kB\n")
    clock = ManualClock()
    mon = Monitor(LinuxSource(tmp_path / "sys", tmp_path / "proc", clock), clock=clock)
    assert mon.latest().thermal_sensing is ThermalSensing.UNKNOWN
    run_for(mon, clock, 2.0)
    r = mon.latest()
    assert r.thermal_sensing is ThermalSensing.ABSENT and r.temp_c is None and not r.stale
    inp = ControlInput.from_reading(r)
    assert inp.thermal_sensor_absent and inp.mem_available_bytes == 6000000 * 1024
    d, _ = decide(inp, QueueState(), None, ControllerState(), ControllerConfig())
    assert d.mode is ThermalMode.UNAVAILABLE


@pytest.mark.parametrize("sample", [
    Sample(t_s=0, source="linux", zones=(ThermalZone("cpu-thermal", None),),
           errors=("/sys/class/thermal/thermal_zone0/temp: ENODATA",)),  # zone exists, read fails
    Sample(t_s=0, source="macos", errors=("native layer unavailable",)),  # OS signal exists, fails
])
def test_failing_sensor_is_present_hence_conservative(sample: Sample) -> None:
    clock = ManualClock()
    mon = Monitor(FixedSource(clock, sample), clock=clock)
    run_for(mon, clock, 2.0)
    r = mon.latest()
    assert r.thermal_sensing is ThermalSensing.PRESENT
    d, _ = decide(ControlInput.from_reading(r), QueueState(), None, ControllerState(), ControllerConfig())
    assert d.mode is ThermalMode.CONSERVATIVE


def test_sensor_seen_once_never_becomes_absent() -> None:
    clock = ManualClock()
    hot = Sample(t_s=0, source="linux", zones=(ThermalZone("cpu", 60.0),), temp_c=60.0)
    gone = Sample(t_s=0, source="linux")
    mon = Monitor(FixedSource(clock, hot, gone), clock=clock)
    run_for(mon, clock, 3.0)
    r = mon.latest()
    assert r.thermal_sensing is ThermalSensing.PRESENT and r.temp_c is None
    d, _ = decide(ControlInput.from_reading(r), QueueState(), None, ControllerState(), ControllerConfig())
    assert d.mode is ThermalMode.CONSERVATIVE


def test_null_source_is_absent() -> None:
    from edge.telemetry.detect import NullSource

    clock = ManualClock()
    mon = Monitor(NullSource(clock), clock=clock)
    run_for(mon, clock, 1.0)
    assert mon.latest().thermal_sensing is ThermalSensing.ABSENT


def test_fast_slope_sees_a_sudden_rise_the_window_fit_still_averages_away() -> None:
    """After a fan fails the die heats at once; the 15 s fit of smoothed points lags that by seconds."""
    clock = ManualClock()
    mon = Monitor(CurveSource(clock, lambda t: 70.0 if t < 30.0 else 70.0 + 0.3 * (t - 30.0), limit_c=80.0),
                  clock)
    mon.poll()
    run_for(mon, clock, 29.0)
    flat = mon.latest()
    assert flat.fast_slope_c_per_s is not None and abs(flat.fast_slope_c_per_s) < 1e-6
    run_for(mon, clock, 4.0)  # 3 s into the rise
    r = mon.latest()
    assert r.fast_slope_c_per_s is not None and r.slope_c_per_s is not None
    assert r.fast_slope_c_per_s > 0.2  # most of the true 0.3 C/s ...
    assert r.slope_c_per_s < 0.1  # ... while the window fit has seen little of it
    inp = ControlInput.from_reading(r)  # and the controller gets both, with the raw reading
    assert inp.fast_slope_c_per_s == r.fast_slope_c_per_s and inp.raw_temp_c == r.raw_temp_c


def test_no_fast_slope_from_too_few_readings() -> None:
    clock = ManualClock()
    mon = Monitor(CurveSource(clock, lambda t: 50.0 + t), clock)
    assert mon.poll().fast_slope_c_per_s is None
    run_for(mon, clock, 1.0)
    assert mon.latest().fast_slope_c_per_s is None  # 2 readings over 1 s
