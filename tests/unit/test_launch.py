"""build_scheduler wiring: sim telemetry driven by the engine's load, time scale, profile, reserve."""

from __future__ import annotations

from dataclasses import replace

import pytest

from edge.clock import ManualClock, ScaledClock
from edge.config import Settings, load_profile
from edge.errors import ConfigError
from edge.runtime.types import EngineStats, Knobs
from edge.scheduler.state import ThermalMode
from edge.service.launch import build_scheduler
from edge.sim.device import SimulatedSource
from edge.telemetry.detect import parse_sim_spec, resolve
from tests.fakes import ScriptedEngine

HOT_PROFILE = """description = "test device: hot box that crosses its trip at full load"
unified_memory = false
memory_reserve_bytes = 268435456
gpu_layers = 0
thermal_limit_c = 80.0
thermal_critical_c = 90.0
ambient_c = 40.0
idle_power_w = 2.0
max_power_w = 20.0
thermal_resistance_c_per_w = 4.0
thermal_tau_s = 30.0
"""


class BusyEngine(ScriptedEngine):
    """A scripted engine that is always decoding as many sequences as its knobs allow."""

    def stats(self) -> EngineStats:
        s = super().stats()
        k = s.knobs
        return replace(s, active=0 if k.paused else min(self.n_slots, k.active_limit))


def _engine(n_slots: int = 4, threads: int = 2) -> BusyEngine:
    e = BusyEngine(n_slots=n_slots)
    e.apply(Knobs(active_limit=n_slots, n_threads=threads))
    return e


@pytest.mark.parametrize(("spec", "profile", "scale"), [
    ("sim:jetson-orin-nano", "jetson-orin-nano", 1.0),
    ("sim:jetson-orin-nano@30", "jetson-orin-nano", 30.0),
    ("sim:/tmp/x/hot.toml@2.5", "/tmp/x/hot.toml", 2.5),
])
def test_sim_spec_parses_profile_and_scale(spec: str, profile: str, scale: float) -> None:
    got = parse_sim_spec(spec)
    assert (got.profile, got.time_scale) == (profile, scale)
    choice = resolve(spec)
    assert (choice.kind, choice.profile, choice.time_scale) == ("sim", profile, scale)


@pytest.mark.parametrize("spec", ["sim:", "sim:@30", "sim:jetson-orin-nano@fast", "sim:jetson-orin-nano@0"])
def test_bad_sim_spec_is_a_config_error(spec: str) -> None:
    with pytest.raises(ConfigError):
        parse_sim_spec(spec)


def test_scaled_clock_compresses_wall_time() -> None:
    base = ManualClock(100.0)
    clock = ScaledClock(30.0, base)
    base.advance(2.0)
    assert clock.monotonic() == pytest.approx(160.0)
    clock.sleep(30.0)  # 30 device seconds are 1 wall second
    assert base.monotonic() == pytest.approx(103.0)


def test_sim_source_is_fed_the_engines_real_load_and_heats() -> None:
    """Issue: without load_provider, --telemetry sim:PROFILE never heated up."""
    engine = _engine()
    engine.start()
    base = ManualClock()
    sched = build_scheduler(Settings(telemetry="sim:jetson-orin-nano@30"), engine, base_clock=base)
    source = sched.monitor.source
    assert isinstance(source, SimulatedSource) and source.load_provider == engine.stats
    assert isinstance(sched.clock, ScaledClock) and sched.clock.scale == 30.0
    assert sched.monitor.clock is sched.clock and source.clock is sched.clock
    profile = load_profile("jetson-orin-nano")
    assert sched.config.limit_c == profile.thermal_limit_c  # the simulated device's profile
    assert sched.admission.reserve_bytes == sched.config.reserve_bytes == profile.memory_reserve_bytes
    start_c = source.device.temp_c
    for _ in range(40):  # 4 wall seconds = 120 device seconds
        base.advance(0.1)
        sched.tick()
    assert source.device.temp_c > start_c + 15.0
    assert source.device.utilisation > 0.5


def test_sim_time_scale_lets_the_controller_hold_a_hot_device_below_its_limit(tmp_path) -> None:
    """A device that would cross its trip at full load stays below limit - 3 in compressed time."""
    path = tmp_path / "hot-box.toml"
    path.write_text(HOT_PROFILE)
    engine = _engine()
    engine.start()
    base = ManualClock()
    sched = build_scheduler(Settings(telemetry=f"sim:{path}@20"), engine, base_clock=base)
    device = sched.monitor.source.device
    assert device.steady_state_c(device.profile.max_power_w) > device.limit_c  # unmanaged would cross
    max_c, modes = 0.0, set()
    for _ in range(1200):  # 60 wall seconds = 20 device minutes, ticks every 0.05 s wall (1 device s)
        base.advance(0.05)
        modes.add(sched.tick().mode)
        max_c = max(max_c, device.temp_c)
    assert max_c < device.limit_c - 3.0
    assert ThermalMode.LIMITING in modes and device.throttle_events == 0
    sim = sched.status()["sim_device"]  # what /v1/status and /metrics show
    assert sim["max_temp_c"] == pytest.approx(device.max_temp_c, abs=1e-3)
    assert sim["max_temp_c"] >= max_c - 1e-3
    assert sim["near_limit_s"] == 0 and sim["hw_throttled_s"] == 0 and sim["time_scale"] == 20.0
    assert device.temp_c > device.profile.ambient_c + 20.0  # still working, not parked cold


def test_real_telemetry_keeps_profile_and_reserve_from_settings() -> None:
    engine = _engine(n_slots=3, threads=6)
    settings = Settings(telemetry="none", profile="raspberry-pi-5", memory_reserve_bytes=123 << 20)
    sched = build_scheduler(settings, engine, base_clock=ManualClock())
    assert sched.config.limit_c == load_profile("raspberry-pi-5").thermal_limit_c
    assert sched.admission.reserve_bytes == sched.config.reserve_bytes == 123 << 20
    assert sched.admission.wall_s_per_decision_s == 1.0


def test_calibration_feeds_the_ladder_its_measured_figures(tmp_path) -> None:
    """--calibration (or a simulated device's own figures) reaches ControllerConfig.decode_tps."""
    from edge.sim.throughput import load_throughput

    engine = _engine(n_slots=4, threads=2)
    engine.start()
    sim = build_scheduler(Settings(telemetry="sim:jetson-orin-nano"), engine, base_clock=ManualClock())
    expected = load_throughput().decode_table(4, 2)
    assert sim.config.decode_tps == expected and len(expected) == 8
    plain = build_scheduler(Settings(telemetry="none"), engine, base_clock=ManualClock())
    assert plain.config.decode_tps == ()
    named = build_scheduler(Settings(telemetry="none", calibration="cpu-2core-smollm2"), engine,
                            base_clock=ManualClock())
    assert named.config.decode_tps == load_throughput("cpu-2core-smollm2").decode_table(4, 2)
    with pytest.raises(ConfigError):
        build_scheduler(Settings(telemetry="none", calibration=str(tmp_path / "missing.json")), engine,
                        base_clock=ManualClock())


def test_memory_plan_gives_the_controller_the_reload_footprint() -> None:
    """After an eviction, admission waits for room for the model: its size comes from the memory plan."""
    from types import SimpleNamespace

    engine = _engine()
    engine.start()
    plain = build_scheduler(Settings(telemetry="none"), engine, base_clock=ManualClock())
    assert plain.config.footprint_bytes == 0  # no plan: evictions wait for the release level only
    plan = SimpleNamespace(total_bytes=900 << 20, reserve_bytes=512 << 20)
    sched = build_scheduler(Settings(telemetry="none"), engine, base_clock=ManualClock(), plan=plan)  # type: ignore[arg-type]
    assert sched.config.footprint_bytes == 388 << 20
