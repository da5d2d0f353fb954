"""A memory emergency on the real engine: every request is shed with an error, the model is unloaded,
and the first request after memory recovers reloads it.

The scheduler loop runs on a ManualClock with scripted memory readings; the only real-time waits
are for the engine thread's answers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edge.clock import ManualClock
from edge.errors import EdgeError, RequestShed
from edge.runtime import Engine, EngineConfig, EngineState, GenerationRequest, SamplingParams
from edge.runtime.types import FinishReason, Priority
from edge.scheduler.admission import Admission
from edge.scheduler.loop import SchedulerLoop
from edge.scheduler.state import ControllerConfig, MemoryMode
from edge.telemetry.detect import NullSource
from edge.telemetry.monitor import LimitOrigin, MonitorReading
from edge.telemetry.sample import Sample

pytestmark = pytest.mark.model

GiB = 1 << 30
GREEDY = SamplingParams(temperature=0.0)


def Reading(t_s: float, mem_available_bytes: int) -> MonitorReading:
    """A cool device with `mem_available_bytes` free, as the shipped Monitor gives it to the loop."""
    sample = Sample(t_s, "scripted", temp_c=45.0, limit_c=99.0, kernel_throttling=False,
                    mem_available_bytes=mem_available_bytes)
    return MonitorReading(t_s, "scripted", sample, 45.0, 45.0, 0.0, 99.0, None, LimitOrigin.SENSOR,
                          False, 0.0, 1.0)


class Memory:
    """Monitor stand-in whose MemAvailable the test sets."""

    source = NullSource()

    def __init__(self) -> None:
        self.avail = 8 * GiB
        self.t = 0.0

    def poll(self, now_s: float, max_age_s: float | None = None) -> None:
        self.t = now_s

    def latest(self, now_s: float | None = None) -> Reading:
        return Reading(self.t, self.avail)


@pytest.fixture
def engine(smollm2_path: Path) -> Iterator[Engine]:
    with Engine(EngineConfig(smollm2_path, n_ctx=2048, n_slots=2, n_threads=1)) as eng:
        yield eng


def test_memory_emergency_evicts_the_real_engine_and_reloads_after(engine: Engine) -> None:
    cfg = ControllerConfig(n_slots=2, max_threads=1, limit_c=99.0, reserve_bytes=1 * GiB,
                           footprint_bytes=256 << 20)
    clock = ManualClock()
    adm = Admission(8, stats_provider=engine.stats, clock=clock, reserve_bytes=cfg.reserve_bytes)
    mem = Memory()
    loop = SchedulerLoop(mem, engine, clock, cfg, admission=adm)
    assert loop.tick(0.0).memory is MemoryMode.OK

    errors: list[EdgeError] = []
    ticket = adm.admit(Priority.INTERACTIVE, 8, 2000)
    handle = engine.submit(GenerationRequest("Tell me a long story about the sea.", max_tokens=2000,
                                             sampling=GREEDY))
    ticket.bind(lambda err: (errors.append(err), handle.cancel()))  # what the API does
    stream = iter(handle)
    first = next(stream)  # streaming
    assert first.text or first.n_tokens

    mem.avail = GiB // 3  # a hog took the memory: under half the reserve
    d = loop.tick(1.0)
    assert d.evict and not d.admit_interactive
    assert len(errors) == 1 and isinstance(errors[0], RequestShed)
    events = list(stream)  # the stream ends (cancelled), long before its 2000 tokens
    assert first.n_tokens + sum(e.n_tokens for e in events) < 2000
    assert all(e.finish_reason in (None, FinishReason.CANCELLED) for e in events)
    for t in (1.5, 2.0, 2.5):  # the loop retries the unload until the engine is empty
        if engine.state is EngineState.UNLOADED:
            break
        loop.tick(t)
    assert engine.wait_for_state(EngineState.UNLOADED, timeout_s=30)
    assert loop.status()["evictions"] == 1
    with pytest.raises(EdgeError):
        adm.admit(Priority.INTERACTIVE, 8, 16)  # still short: refused with an error, not queued

    mem.avail = int(1.6 * GiB)  # above the 1.5 GiB release level, no room for the 256 MiB model yet
    assert loop.tick(3.0).evict
    mem.avail = 4 * GiB
    d = loop.tick(4.0)
    assert not d.evict and d.memory is MemoryMode.OK and d.admit_interactive
    ticket = adm.admit(Priority.INTERACTIVE, 8, 16)
    out = engine.complete("The capital of France is", max_tokens=8, temperature=0.0)  # reloads
    ticket.release()
    assert engine.state is EngineState.READY and out.usage.completion_tokens > 0
