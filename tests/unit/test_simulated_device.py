"""Physics of the simulated device: steady state, throttling, power, memory, and the telemetry source."""

from __future__ import annotations

import pytest

from edge.clock import ManualClock
from edge.config import load_profile
from edge.runtime.types import EngineStats, Knobs
from edge.sim.device import GiB, SimulatedDevice, SimulatedSource, make_source
from edge.sim.throughput import ThroughputModel
from edge.telemetry.sample import PressureLevel
from tests.fakes import engine_stats

TP = ThroughputModel(
    decode_tps={(1, 1): 40.0, (1, 4): 60.0, (1, 8): 70.0, (2, 1): 70.0, (2, 4): 100.0, (2, 8): 120.0},
    prefill_tps={1: 300.0, 2: 550.0},
)


def _device(order: int = 1, **kw: object) -> SimulatedDevice:
    return SimulatedDevice(load_profile("jetson-orin-nano"), TP, order=order, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("order", [1, 2])
def test_steady_state_is_ambient_plus_r_times_p(order: int) -> None:
    dev = _device(order)
    dev.set_load(active=4, threads=1, duty=0.8)
    p_w = dev.power_w
    assert dev.profile.idle_power_w < p_w < dev.profile.max_power_w
    for _ in range(200):
        dev.step(10.0)  # 2000 s >> tau
    expected = dev.profile.ambient_c + dev.profile.thermal_resistance_c_per_w * p_w
    assert dev.temp_c == pytest.approx(expected, abs=0.05)
    assert dev.steady_state_c() == pytest.approx(expected)


def test_first_order_time_constant() -> None:
    dev = _device(1)
    dev.set_load(8, 2, 1.0)
    target = dev.steady_state_c()
    start = dev.temp_c
    dev.step(dev.profile.thermal_tau_s)
    # after one tau the first-order system covers 1 - 1/e of the step
    assert (dev.temp_c - start) / (target - start) == pytest.approx(0.632, abs=0.01)


def test_second_order_die_leads_heatsink() -> None:
    dev = _device(2)
    dev.set_load(8, 2, 1.0)
    dev.step(10.0)
    assert dev.die_c > dev.sink_c + 3.0  # the fast die heats first: why a forecast is needed


def test_power_follows_work() -> None:
    dev = _device()
    dev.set_load(0, 2, 1.0)
    assert dev.power_w == pytest.approx(dev.profile.idle_power_w)
    powers = []
    for load in [(1, 1, 0.5), (1, 1, 1.0), (1, 2, 1.0), (8, 2, 1.0)]:
        dev.set_load(*load)
        powers.append(dev.power_w)
    assert powers == sorted(powers) and len(set(powers)) == 4
    assert powers[-1] == pytest.approx(dev.profile.max_power_w)


def test_hardware_throttles_above_trip_and_recovers_below_hysteresis() -> None:
    dev = SimulatedDevice(load_profile("jetson-orin-nano"), TP, order=1, throttle_hyst_c=4.0)
    dev.ambient_c = 60.0  # hot enclosure: full load settles above the 99 C trip
    dev.set_load(8, 2, 1.0)
    full_power_w = dev.power_w
    while not dev.hw_throttled:
        dev.step(1.0)
    assert dev.temp_c >= dev.limit_c
    assert dev.clock_factor == 0.5
    assert dev.power_w < full_power_w
    assert dev.throttle_events == 1
    dev.set_load(0, 2, 1.0)
    while dev.temp_c >= dev.limit_c - 4.0:
        assert dev.hw_throttled  # still throttled inside the hysteresis band
        dev.step(0.5)
    dev.step(0.5)
    assert not dev.hw_throttled and dev.clock_factor == 1.0


def test_sample_exposes_trip_points_throttle_and_power() -> None:
    dev = _device()
    dev.set_load(4, 2, 1.0)
    dev.step(30.0)
    s = dev.sample(12.0)
    assert s.source == "sim:jetson-orin-nano" and s.t_s == 12.0
    die = next(z for z in s.zones if z.name == "sim-die")
    assert die.passive_trip_c == dev.profile.thermal_limit_c
    assert die.critical_trip_c == dev.profile.thermal_critical_c
    assert s.temp_c == pytest.approx(dev.temp_c, abs=1e-3)
    assert s.kernel_throttling is False
    assert s.power_w == pytest.approx(dev.power_w, abs=1e-3)
    dev.hw_throttled = True
    assert dev.sample(13.0).kernel_throttling is True


def test_memory_hog_lowers_available_and_raises_psi() -> None:
    dev = _device(mem_total_bytes=8 * GiB, os_used_bytes=2 * GiB)
    dev.set_engine_memory(1 * GiB)
    dev.step(30.0)
    s = dev.sample(0.0)
    assert s.mem_available_bytes == 5 * GiB
    assert s.psi_some_avg10 == 0 and s.memory_pressure is PressureLevel.NOMINAL
    dev.set_memory_hog(int(4.9 * GiB))  # leaves 0.1 GiB, below the 0.8 GiB low watermark
    dev.step(30.0)
    s = dev.sample(30.0)
    assert s.mem_available_bytes == pytest.approx(0.1 * GiB, rel=0.01)
    assert s.psi_some_avg10 is not None and s.psi_some_avg10 > 10
    assert s.psi_full_avg10 is not None and s.psi_full_avg10 > 2
    assert s.memory_pressure is not None and s.memory_pressure >= PressureLevel.HEAVY
    assert not dev.check_oom()
    dev.set_memory_hog(5 * GiB)
    assert dev.check_oom() and dev.oom_events == 1


def _stats(active: int, threads: int, duty: float, paused: bool = False) -> EngineStats:
    return engine_stats(active=active, kv_cells_total=1024, knobs=Knobs(8, threads, duty, paused=paused))


def test_source_time_scale_and_engine_load() -> None:
    clock = ManualClock()
    current = {"stats": _stats(8, 2, 1.0)}
    src = SimulatedSource(_device(1), clock=clock, time_scale=60.0, load_provider=lambda: current["stats"])
    first = src.read()
    assert first.temp_c == pytest.approx(src.device.profile.ambient_c)
    clock.advance(5.0)  # 5 real seconds = 300 simulated seconds
    hot = src.read()
    assert hot.temp_c is not None and hot.temp_c > first.temp_c + 20  # type: ignore[operator]
    assert src.device.load.active == 8
    current["stats"] = _stats(8, 2, 1.0, paused=True)
    src.read()
    assert src.device.load.active == 0  # a paused engine draws idle power
    assert src.device.power_w == pytest.approx(src.device.profile.idle_power_w)


def test_make_source_uses_profile() -> None:
    clock = ManualClock(100.0)
    src = make_source("raspberry-pi-5", clock=clock, time_scale=10.0, throughput=TP)
    src.set_load(1, 1, 1.0)
    clock.advance(1.0)
    s = src.read()
    assert s.source == "sim:raspberry-pi-5" and s.limit_c == 85.0 and s.t_s == 101.0
    with pytest.raises(ValueError):
        SimulatedSource(src.device, clock=clock, time_scale=0)


def test_device_keeps_an_account_of_peak_temperature_and_time_near_the_limit() -> None:
    dev = SimulatedDevice(load_profile("jetson-orin-nano"), TP, order=1)
    dev.ambient_c = 60.0
    dev.set_load(8, 2, 1.0)
    peak, near_s, throttled_s = 0.0, 0.0, 0.0
    for _ in range(600):
        dev.step(1.0)  # 1 s per call; the physics sub-steps at 1 s for order 1
        peak = max(peak, dev.temp_c)
        near_s += 1.0 if dev.temp_c >= dev.limit_c - 3.0 else 0.0
        throttled_s += 1.0 if dev.hw_throttled else 0.0
    assert dev.max_temp_c == pytest.approx(peak)
    assert dev.near_limit_s == pytest.approx(near_s, abs=1.0) and near_s > 0
    assert dev.hw_throttled_s == pytest.approx(throttled_s, abs=1.0) and throttled_s > 0
    src = SimulatedSource(dev, ManualClock())
    st = src.status()
    assert st["max_temp_c"] == round(peak, 3) and st["hw_throttle_events"] == dev.throttle_events >= 1
