"""The scheduler loop with a scripted engine, a fake monitor and a ManualClock (no real sleeps)."""

from __future__ import annotations

import logging
import threading
from dataclasses import replace

from edge.clock import ManualClock
from edge.config import load_profile
from edge.errors import EdgeError, RequestShed
from edge.runtime.types import EngineState, EngineStats, Knobs, Priority
from edge.scheduler.admission import Admission
from edge.scheduler.loop import FAST_INTERVAL_S, INTERVAL_S, SchedulerLoop
from edge.scheduler.state import ControllerConfig, MemoryMode, ThermalMode
from edge.sim.device import SimulatedDevice, SimulatedSource
from edge.sim.throughput import ThroughputModel
from edge.telemetry.detect import NullSource
from edge.telemetry.monitor import LimitOrigin, Monitor, MonitorReading
from edge.telemetry.sample import Sample
from tests.fakes import ScriptedEngine, engine_stats

CFG = ControllerConfig(n_slots=2, max_threads=2, limit_c=99.0, reserve_bytes=1 << 30)


def Reading(
    t_s: float, temp_c: float | None, slope_c_per_s: float | None = 0.0, stale: bool = False,
    limit_c: float | None = 99.0, kernel_throttling: bool | None = False,
    psi_some_avg10: float | None = None, psi_full_avg10: float | None = None,
    mem_available_bytes: int | None = None,
) -> MonitorReading:
    """A monitor reading over a sample, as the shipped Monitor gives the loop."""
    sample = Sample(t_s, "scripted", temp_c=temp_c, limit_c=limit_c, kernel_throttling=kernel_throttling,
                    psi_some_avg10=psi_some_avg10, psi_full_avg10=psi_full_avg10,
                    mem_available_bytes=mem_available_bytes)
    return MonitorReading(t_s, "scripted", sample, temp_c, temp_c, slope_c_per_s, limit_c, None,
                          LimitOrigin.SENSOR, stale, 0.0, 1.0)


class ScriptedMonitor:
    """Returns the readings it is given, one per poll (the last one repeats)."""

    source = NullSource()

    def __init__(self, readings: list[MonitorReading], on_poll: object = None) -> None:
        self.readings = readings
        self.polls: list[float] = []
        self.on_poll = on_poll

    def poll(self, now_s: float, max_age_s: float | None = None) -> None:
        self.polls.append(now_s)
        if callable(self.on_poll):
            self.on_poll(len(self.polls))

    def latest(self, now_s: float | None = None) -> MonitorReading:
        r = self.readings[min(len(self.polls), len(self.readings)) - 1]
        return replace(r, t_s=self.polls[-1])


def _engine() -> ScriptedEngine:
    e = ScriptedEngine(n_slots=2, autostep=False)
    e.start()
    return e


def test_tick_applies_knobs_logs_and_reports(caplog) -> None:
    engine = _engine()
    mon = ScriptedMonitor([Reading(0, 40.0), Reading(0, 40.0), Reading(0, 98.0)])
    loop = SchedulerLoop(mon, engine, ManualClock(), CFG)
    with caplog.at_level(logging.INFO, logger="edge.scheduler"):
        d1 = loop.tick(1.0)
        assert d1.mode is ThermalMode.NOMINAL and engine.knobs == d1.knobs
        loop.tick(2.0)
        d3 = loop.tick(3.0)
    assert d3.mode is ThermalMode.GUARD and engine.knobs.paused
    assert loop.knob_changes == 2  # unchanged decisions are not re-applied
    assert any("guard" in rec.getMessage() for rec in caplog.records)
    st = loop.status()
    assert st["decision"]["mode"] == "guard" and st["decision"]["knobs"]["paused"] is True
    assert st["throttle_events"] == {"guard:temperature": 1} and st["temp_c"] == 98.0
    assert st["u_sus_learned_s"] == 0.0  # nothing learned yet, and a guard trip resets it anyway
    assert loop.interval_s() == FAST_INTERVAL_S


def test_throttle_events_count_transitions_not_ticks() -> None:
    temps = [98.0, 98.0, 98.0, 80.0, 60.0, 98.0]
    mon = ScriptedMonitor([Reading(0, t) for t in temps])
    loop = SchedulerLoop(mon, _engine(), ManualClock(), CFG)
    for i in range(len(temps)):
        loop.tick(float(i * 10))
    assert loop.throttle_events["guard:temperature"] == 2


def test_broken_or_missing_monitor_is_conservative() -> None:
    class Broken:
        def poll(self, now_s: float, max_age_s: float | None = None) -> None:
            raise OSError("sensor gone")

        def latest(self, now_s: float | None = None) -> None:  # pragma: no cover - never reached
            return None

    engine = _engine()
    loop = SchedulerLoop(Broken(), engine, ManualClock(), CFG)
    d = loop.tick(1.0)
    assert d.mode is ThermalMode.CONSERVATIVE and not engine.knobs.paused and loop.errors == 1
    d2 = SchedulerLoop(None, _engine(), ManualClock(), CFG).tick(1.0)
    assert d2.mode is ThermalMode.CONSERVATIVE


def test_run_forever_paces_on_the_injected_clock() -> None:
    clock = ManualClock()
    stop = threading.Event()
    mon = ScriptedMonitor([Reading(0, 40.0)], on_poll=lambda n: stop.set() if n >= 5 else None)
    loop = SchedulerLoop(mon, _engine(), clock, CFG)
    loop.run_forever(stop)
    assert loop.ticks == 5
    assert mon.polls == [0.0, 1.0, 2.0, 3.0, 4.0]  # one poll per INTERVAL_S while cool
    assert clock.sleeps_s == [INTERVAL_S] * 5


def test_memory_pressure_sheds_background_through_admission() -> None:
    clock = ManualClock()
    engine = _engine()
    adm = Admission(max_queue=8, stats_provider=engine.stats, clock=clock)
    got: list[EdgeError] = []
    bg = adm.admit(Priority.BACKGROUND, 4, 4)
    bg.bind(got.append)
    fg = adm.admit(Priority.INTERACTIVE, 4, 4)
    mon = ScriptedMonitor([Reading(0, 40.0, psi_full_avg10=5.0, mem_available_bytes=4 << 30)])
    loop = SchedulerLoop(mon, engine, clock, CFG, admission=adm)
    d = loop.tick(1.0)
    assert d.memory is MemoryMode.SHED and not d.knobs.admit_background
    assert len(got) == 1 and isinstance(got[0], RequestShed)
    assert adm.queue_state().waiting_interactive == 1 and fg.error is None
    assert loop.status()["throttle_events"]["memory:shed"] == 1


class SaturatedEngine:
    """Always has work for every allowed slot: the worst case for heat."""

    n_slots = 8

    def __init__(self) -> None:
        self.knobs = Knobs(8, 2)

    def apply(self, knobs: Knobs) -> None:
        self.knobs = knobs

    def stats(self) -> EngineStats:
        k = self.knobs
        active = 0 if k.paused else k.active_limit
        return engine_stats(active=active, waiting=4, waiting_interactive=4, knobs=k)


def test_closed_loop_keeps_a_hot_device_below_its_limit() -> None:
    """Production loop + simulated device under full demand at 40 C ambient for 20 simulated minutes."""
    tp = ThroughputModel({(1, 1): 40.0, (1, 8): 70.0, (2, 1): 70.0, (2, 8): 120.0}, {1: 300.0, 2: 550.0})
    clock = ManualClock()
    engine = SaturatedEngine()
    dev = SimulatedDevice(load_profile("jetson-orin-nano"), tp, order=2)
    dev.ambient_c = dev.die_c = dev.sink_c = 40.0  # unmanaged full load would settle at 107.5 C
    src = SimulatedSource(dev, clock=clock, load_provider=engine.stats)
    monitor = Monitor(src, clock=clock, profile=dev.profile)  # the shipped monitor, as `edge serve` wires it
    loop = SchedulerLoop(monitor, engine, clock, ControllerConfig(n_slots=8, max_threads=2))
    max_c, running_s = 0.0, 0.0
    for _ in range(1200):
        clock.advance(1.0)
        loop.tick()
        max_c = max(max_c, dev.temp_c)
        running_s += 0.0 if engine.knobs.paused else 1.0
    assert dev.throttle_events == 0 and max_c < 99.0 - 3.0
    assert running_s > 0.9 * 1200  # it regulates, it does not just stop
    assert 99.0 - 16.0 < dev.temp_c < 99.0 - 3.0  # settled near T_set


def test_no_sensor_machine_is_unavailable_logged_once_and_visible(caplog) -> None:
    """A VM/container with no thermal sensor: full speed, warned once with what to do, never 'nominal'."""

    clock = ManualClock()
    engine = _engine()
    adm = Admission(8, clock=clock)
    loop = SchedulerLoop(Monitor(NullSource(clock), clock=clock), engine, clock, CFG, admission=adm)
    with caplog.at_level(logging.WARNING, logger="edge.scheduler"):
        for _ in range(5):
            clock.advance(1.0)
            d = loop.tick()
    assert d.mode is ThermalMode.UNAVAILABLE and engine.knobs.admit_background and not engine.knobs.paused
    warnings = [r.getMessage() for r in caplog.records if "UNAVAILABLE" in r.getMessage()]
    assert len(warnings) == 1 and "--telemetry sim:PROFILE" in warnings[0]
    st = loop.status()
    assert st["thermal_mode"]["unavailable"] == 1 and st["thermal_mode"]["nominal"] == 0
    assert st["thermal_control_available"] is False and st["decision"]["mode"] == "unavailable"
    adm.admit(Priority.BACKGROUND, 10, 10)  # background is served, not left hanging


class _UnloadableEngine(ScriptedEngine):
    def __init__(self) -> None:
        super().__init__(n_slots=2, autostep=False)
        self.unload_calls = 0

    def unload(self) -> bool:
        self.unload_calls += 1
        self.set_state(EngineState.UNLOADED)
        return True


def test_scaled_scheduler_clock_never_unloads_for_idle_time() -> None:
    """Keep-alive has one owner, the engine, on the engine's clock. The scheduler under
    sim:PROFILE@SCALE runs on a compressed clock while admission stamps wall time; it used to
    subtract one from the other and unload a 300 s keep-alive after ~10 wall seconds."""
    from edge.config import Settings
    from edge.service.launch import build_scheduler

    wall = ManualClock(1000.0)
    engine = _UnloadableEngine()
    engine.start()
    settings = Settings(telemetry="sim:raspberry-pi-5@30", keep_alive_s=300.0)
    loop = build_scheduler(settings, engine, base_clock=wall)
    loop.admission.admit(Priority.INTERACTIVE, 4, 4).release()  # activity at wall time 1000
    for _ in range(60):  # one wall minute idle = 30 device minutes on the scheduler's clock
        wall.advance(1.0)
        assert not loop.tick().unload
    assert engine.unload_calls == 0 and engine.state is EngineState.READY
    assert loop.status()["evictions"] == 0


def test_memory_emergency_sheds_everything_then_unloads() -> None:
    engine = _UnloadableEngine()
    engine.start()
    adm = Admission(8, stats_provider=engine.stats, clock=ManualClock(), reserve_bytes=CFG.reserve_bytes)
    errors: list[EdgeError] = []
    for prio in (Priority.INTERACTIVE, Priority.BACKGROUND):
        adm.admit(prio, 10, 10).bind(errors.append)
    gib = 1 << 30
    monitor = ScriptedMonitor([Reading(0, 40.0, mem_available_bytes=4 * gib),
                               Reading(1, 40.0, mem_available_bytes=gib // 3)])
    loop = SchedulerLoop(monitor, engine, ManualClock(), CFG, admission=adm)
    assert not loop.tick(0.0).evict
    d = loop.tick(1.0)
    assert d.evict and d.unload and "memory:evict" in d.throttle_reasons
    assert len(errors) == 2 and all(isinstance(e, RequestShed) for e in errors)
    assert engine.unload_calls == 1 and loop.status()["evictions"] == 1


def test_limits_follow_the_last_decision_for_ready_and_the_balancer() -> None:
    from edge.scheduler.state import LimitKind

    clock = ManualClock()
    readings = [Reading(0.0, 50.0), Reading(0.0, 88.0, slope_c_per_s=0.2), Reading(0.0, 97.5)]
    loop = SchedulerLoop(ScriptedMonitor(readings), _engine(), clock=clock, config=CFG)
    assert loop.limits() == ()  # before the first decision nothing is known, nothing blocks
    cool = loop.tick()
    thermal = loop.limits()[0]
    assert cool.mode is ThermalMode.NOMINAL and thermal.kind is LimitKind.THERMAL
    assert thermal.headroom == 1.0 and not thermal.blocking
    clock.advance(1.0)
    loop.tick()
    warm = loop.limits()[0]
    assert 0.0 < warm.headroom < 1.0 and not warm.blocking and "forecast" in warm.reason
    clock.advance(1.0)
    hot = loop.tick()
    assert hot.mode is ThermalMode.GUARD and loop.limits()[0].blocking
    assert [lim.kind for lim in loop.limits()] == [LimitKind.THERMAL, LimitKind.MEMORY]


def test_a_model_load_in_flight_counts_against_available_memory() -> None:
    """The model host's loading bytes are spoken for before MemAvailable shows them taken."""

    class LoadingEngine(ScriptedEngine):
        def stats(self) -> EngineStats:
            return replace(super().stats(), loading_bytes=3 << 30)

    engine = LoadingEngine(n_slots=2, autostep=False)
    engine.start()
    mon = ScriptedMonitor([Reading(0, 40.0, mem_available_bytes=4 << 30)])
    loop = SchedulerLoop(mon, engine, ManualClock(), CFG)
    loop.tick(1.0)
    assert loop.reading is not None and loop.reading.mem_available_bytes == 1 << 30


class _NeighbourSource:
    """CPU contention as /proc/stat gives it: the share of the time since the previous read that a
    neighbour process was busy (it runs until `stops_s`), read on the monitor's clock."""

    name = "scripted-cpu"

    def __init__(self, clock: ManualClock, stops_s: float) -> None:
        self.clock, self.stops_s, self.prev_s = clock, stops_s, 0.0

    def read(self) -> Sample:
        now = self.clock.monotonic()
        busy = max(0.0, min(now, self.stops_s) - self.prev_s)
        other = busy / (now - self.prev_s) if now > self.prev_s else 0.0
        self.prev_s = now
        return Sample(now, self.name, temp_c=40.0, limit_c=99.0, cpu_cores=2, cpu_other_cores=other)

    def close(self) -> None:
        pass


def test_a_neighbour_that_stops_gets_the_threads_back_within_a_second_through_the_monitor() -> None:
    """The shipped Monitor samples once a second; while the threads are capped the loop asks it for
    rates over the last quarter second, so the restore does not wait for a one-second window that
    still holds the neighbour (it took 2 s and more with a real neighbour process)."""
    clock = ManualClock()
    source = _NeighbourSource(clock, stops_s=10.1)
    loop = SchedulerLoop(Monitor(source, clock=clock), _engine(), clock, CFG)
    capped_at = restored_at = None
    while clock.monotonic() < 20.0:
        d = loop.tick()
        now = clock.monotonic()
        if d.threads_cap is not None and capped_at is None:
            capped_at = now
        if capped_at is not None and d.threads_cap is None and restored_at is None:
            restored_at = now
        clock.advance(loop.interval_s())
    assert capped_at is not None and capped_at <= 4.0
    assert restored_at is not None and restored_at - 10.1 <= 1.0, restored_at
