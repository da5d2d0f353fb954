"""The engine's typed residency controls (Ollama's keep_alive and load/unload) on the real SmolLM2:
`set_keep_alive`, `ensure_loaded`, `residency_status`. Time is a ManualClock; only the engine
thread's answers are waited for."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge.clock import ManualClock
from edge.errors import InvalidRequest
from edge.runtime import Engine, EngineConfig, EngineState

pytestmark = pytest.mark.model


def _idle(eng: Engine) -> None:
    """The engine thread settles its bookkeeping just after the last event is delivered."""
    deadline = time.monotonic() + 10
    while eng.residency_status().busy and time.monotonic() < deadline:
        time.sleep(0.005)


@pytest.fixture
def engine(smollm2_path: Path) -> Iterator[tuple[Engine, ManualClock]]:
    clock = ManualClock()
    eng = Engine(EngineConfig(smollm2_path, n_ctx=512, n_slots=1, n_threads=1, keep_alive_s=None,
                              idle_poll_s=3600), clock=clock)
    with eng:
        yield eng, clock


def test_keep_alive_zero_unloads_and_ensure_loaded_reloads(engine: tuple[Engine, ManualClock]) -> None:
    eng, _ = engine
    assert eng.residency_status().loaded and eng.residency_status().expires_in_s is None  # never
    eng.complete("Hello", max_tokens=2, temperature=0.0)
    eng.set_keep_alive(0.0)  # wakes the idle engine thread, which unloads at once
    assert eng.wait_for_state(EngineState.UNLOADED, 30)
    status = eng.residency_status()
    assert not status.loaded and status.keep_alive_s == 0.0
    eng.set_keep_alive(None)  # (with 0 still in force, the loaded model would go again at once)
    assert eng.ensure_loaded(timeout_s=60)
    assert eng.state is EngineState.READY and eng.residency_status().loaded
    assert eng.complete("Hello", max_tokens=2, temperature=0.0).text
    assert eng.ensure_loaded() is True  # already loaded: at once


def test_keep_alive_counts_down_from_the_last_work(engine: tuple[Engine, ManualClock]) -> None:
    eng, clock = engine
    eng.complete("Hello", max_tokens=2, temperature=0.0)
    eng.set_keep_alive(300.0)
    _idle(eng)
    clock.advance(100)
    assert eng.residency_status().expires_in_s == pytest.approx(200, abs=1)
    eng.tick()
    assert eng.state is EngineState.READY
    clock.advance(201)
    eng.tick()
    assert eng.wait_for_state(EngineState.UNLOADED, 30)
    with pytest.raises(InvalidRequest):
        eng.set_keep_alive(-1.0)
