"""The CPU-contention stage of `decide()`: decode threads = the cores actually free.

llama.cpp's CPU threads meet at a barrier after every op, so a decode thread that
shares its core with a busy process of equal priority holds all the others up:
on a 2-core box, 2 threads beside such a neighbour decoded at 34 tok/s, 1 thread
on the free core at ~80 (SmolLM2-135M; docs/ARCHITECTURE.md has the table). So
when other processes take about a core (telemetry/cpu.py: `cpu_other_cores`,
steal included; niced neighbours yield and are not counted), the engine decodes
with one thread fewer, and goes back up once the cores have been free for a
while. Dropping is quick (`contention_down_s`), restoring slower
(`contention_up_s`), so a bursty neighbour does not make the knob flap.
Unknown contention (no reading yet, no /proc/stat) changes nothing, and the
status says "unknown", never "none".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from edge.scheduler.state import ControlInput, ControllerConfig, ControllerState


@dataclass(frozen=True)
class ThreadsVerdict:
    cap: int | None  # decode threads allowed (None: no cap)
    pending_s: float | None  # since when a different cap has been called for
    reason: str  # why there is a cap, or why it just changed ('' when none)


def wanted_threads(cores: int, other_cores: float, max_threads: int) -> int:
    """Threads that fit the free cores: a neighbour taking more than half a core takes one."""
    free = cores - other_cores
    return max(1, min(max_threads, math.floor(free + 0.5 - 1e-9)))


def threads_for_contention(inp: ControlInput, state: ControllerState,
                           cfg: ControllerConfig) -> ThreadsVerdict:
    cap = state.threads_cap
    current = cap if cap is not None else cfg.max_threads
    if inp.cpu_cores is None or inp.cpu_other_cores is None:
        held = f"{current} of {cfg.max_threads} threads; CPU contention unknown" if cap is not None else ""
        return ThreadsVerdict(cap, None, held)
    other = inp.cpu_other_cores
    taken = f"{other:.1f} core taken by other processes"
    held = f"{current} of {cfg.max_threads} threads: {taken}" if cap is not None else ""
    want = wanted_threads(inp.cpu_cores, other, cfg.max_threads)
    if want == current:
        return ThreadsVerdict(cap, None, held)
    since = state.threads_pending_s if state.threads_pending_s is not None else inp.t_s
    wait_s = cfg.contention_down_s if want < current else cfg.contention_up_s
    if inp.t_s - since < wait_s:
        return ThreadsVerdict(cap, since, held)
    new_cap = None if want >= cfg.max_threads else want
    return ThreadsVerdict(new_cap, None, f"{current} -> {want} threads: {taken}")
