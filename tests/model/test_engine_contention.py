"""A real busy neighbour makes the real engine decode with fewer threads, and it gets them back.

The production path end to end: LinuxSource reads this machine's /proc/stat, the
Monitor smooths, the SchedulerLoop decides and applies knobs to a real Engine.
The neighbour is a busy Python loop of the same priority; it takes a core while
it runs. Real time (this tier may sleep): about 10 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge.runtime.engine.config import EngineConfig
from edge.runtime.engine.core import Engine
from edge.scheduler.loop import SchedulerLoop
from edge.scheduler.state import ControllerConfig
from edge.telemetry.linux import LinuxSource
from edge.telemetry.monitor import Monitor

pytestmark = pytest.mark.model


def _until(loop: SchedulerLoop, engine: Engine, threads: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        loop.tick()
        if engine.stats().knobs.n_threads == threads:
            return True
        time.sleep(0.5)
    return False


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) != 2,
                    reason="sized for a 2-core box (one neighbour takes one of two cores)")
def test_a_busy_neighbour_takes_a_decode_thread_and_gives_it_back(smollm2_path: Path) -> None:
    cfg = ControllerConfig(n_slots=2, max_threads=2, limit_c=99.0, contention_down_s=1.0, contention_up_s=2.0)
    with Engine(EngineConfig(smollm2_path, n_ctx=512, n_slots=2, n_threads=2)) as engine:
        loop = SchedulerLoop(Monitor(LinuxSource(), period_s=0.5, fast_period_s=0.5), engine, config=cfg)
        neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            assert _until(loop, engine, 1, 20.0), loop.status()
            status = loop.status()
            assert status["threads_cap"] == 1 and status["cpu_contention"]["known"]
            assert status["cpu_contention"]["other_cores"] >= 0.5
            assert "core taken by other processes" in status["decision"]["reason"]
            assert engine.complete("One, two, three,", max_tokens=8, temperature=0.0).usage.completion_tokens
        finally:
            neighbour.kill()
            neighbour.wait(10)
        assert _until(loop, engine, 2, 30.0), loop.status()
        assert loop.status()["threads_cap"] is None
