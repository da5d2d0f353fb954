"""`edge sim` and `edge serve` run one control path: the same trace gives the same decisions.

A short `edge sim` run is recorded (every sample the monitor read, every engine
snapshot and queue the loop saw, every decision). The trace is replayed through
the simulator's control path (`edge.sim.harness.control_loop`) and through the
server's (`edge.service.launch.build_scheduler`), each on its own manual clock.
Both must reproduce the recorded decisions tick for tick: same monitor, same
loop, same controller configuration for the same device facts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from edge.clock import ManualClock
from edge.config import Settings, load_profile
from edge.runtime.types import EngineState, EngineStats, Knobs
from edge.scheduler.admission import Admission
from edge.scheduler.state import Decision, QueueState
from edge.sim import harness
from edge.sim.throughput import DEFAULT_CALIBRATION, load_throughput
from edge.telemetry.sample import Sample

PROFILE = "raspberry-pi-5"


@dataclass
class Trace:
    reads: list[tuple[float, Sample]]  # (clock time, what the source returned)
    ticks: list[tuple[float, EngineStats, QueueState, Decision]]


def record(duration_s: float) -> Trace:
    """Run `edge sim` (chat-hot: it heats up, limits, learns) and record what its loop saw."""
    prof, tp = load_profile(PROFILE), load_throughput()
    run = harness._Run(harness.SCENARIOS["chat-hot"], "edge", prof, tp, duration_s, 7, "chat")
    loop = run.loop
    assert loop is not None
    source = loop.monitor.source  # type: ignore[union-attr]
    trace = Trace([], [])
    real_read, real_tick = source.read, loop.tick

    def read() -> Sample:
        s = real_read()
        trace.reads.append((run.clock.monotonic(), s))
        return s

    def tick(now_s: float | None = None) -> Decision:
        stats, queue = run.engine.stats(), run.admission.queue_state()
        d = real_tick(now_s)
        trace.ticks.append((run.clock.monotonic(), stats, queue, d))
        return d

    source.read = read  # type: ignore[method-assign]
    loop.tick = tick  # type: ignore[method-assign]
    run.run()
    return trace


class ReplaySource:
    name = f"sim:{PROFILE}"

    def __init__(self, trace: Trace, clock: ManualClock) -> None:
        self.reads, self.clock = dict(trace.reads), clock

    def read(self) -> Sample:
        return self.reads[self.clock.monotonic()]  # a read the recording did not make fails loudly

    def close(self) -> None:
        pass


class ReplayEngine:
    """The recorded engine snapshots, one per tick; records what the loop applied."""

    n_slots = harness.N_SLOTS

    def __init__(self, trace: Trace) -> None:
        self.snaps = [t[1] for t in trace.ticks]
        self.i = 0
        self.applied: list[Knobs] = []
        plan_bytes = harness.MODEL_BYTES + harness.KV_BYTES_PER_CELL * harness.KV_CELLS_TOTAL
        self.plan = type("Plan", (), {"total_bytes": plan_bytes, "reserve_bytes": 0})()

    def stats(self) -> EngineStats:
        return self.snaps[min(self.i, len(self.snaps) - 1)]

    def apply(self, knobs: Knobs) -> None:
        self.applied.append(knobs)

    def unload(self, timeout_s: float | None = 60.0) -> bool:
        return True

    @property
    def state(self) -> EngineState:
        return self.stats().state


class ReplayAdmission(Admission):
    def __init__(self, trace: Trace, engine: ReplayEngine) -> None:
        super().__init__(harness.MAX_QUEUE, n_slots=harness.N_SLOTS, scheduled=True)
        self.queues, self.engine = [t[2] for t in trace.ticks], engine

    def queue_state(self) -> QueueState:
        return self.queues[self.engine.i]


def replay(trace: Trace, build: Any) -> list[Decision]:
    clock = ManualClock()
    engine = ReplayEngine(trace)
    loop = build(ReplaySource(trace, clock), engine, clock)
    loop.admission = ReplayAdmission(trace, engine)
    out = []
    for i, (t_s, *_rest) in enumerate(trace.ticks):
        engine.i = i
        clock.set(t_s)
        out.append(loop.tick(t_s))
    return out


def sim_path(source: ReplaySource, engine: ReplayEngine, clock: ManualClock) -> Any:
    prof, tp = load_profile(PROFILE), load_throughput()
    return harness.control_loop(source, engine, clock, prof, harness.controller_config(prof, tp),  # type: ignore[arg-type]
                                Admission(harness.MAX_QUEUE, n_slots=harness.N_SLOTS))


def server_path(source: ReplaySource, engine: ReplayEngine, clock: ManualClock) -> Any:
    from edge.service.launch import build_scheduler

    settings = Settings(profile=PROFILE, calibration=DEFAULT_CALIBRATION, slots=harness.N_SLOTS)
    return build_scheduler(settings, engine, source_factory=lambda _s: source, base_clock=clock)  # type: ignore[arg-type]


def view(d: Decision) -> tuple[Any, ...]:
    return (d.t_s, d.mode, d.memory, d.knobs, d.admit_interactive, d.admit_background, d.reason,
            d.throttle_reasons)


@pytest.fixture(scope="module")
def trace() -> Trace:
    return record(240.0)


def test_the_trace_exercises_the_controller(trace: Trace) -> None:
    modes = {t[3].mode.value for t in trace.ticks}
    assert {"nominal", "limiting"} <= modes  # it heated up and regulated
    assert len({t[3].knobs for t in trace.ticks}) >= 3 and len(trace.reads) >= 100


@pytest.mark.parametrize("path", [sim_path, server_path], ids=["edge-sim", "edge-serve"])
def test_both_control_paths_reproduce_the_recorded_decisions(trace: Trace, path: Any) -> None:
    got = replay(trace, path)
    want = [t[3] for t in trace.ticks]
    assert [view(d) for d in got] == [view(d) for d in want]
