"""The CPU-contention stage of `decide()`: decode threads = the cores actually free.

llama.cpp's CPU threads meet at a barrier after every op, so a decode thread that
shares its core with a busy process of equal priority holds all the others up:
on a 2-core box, 2 threads beside such a neighbour decoded at 34 tok/s, 1 thread
on the free core at ~80 (SmolLM2-135M; docs/ARCHITECTURE.md has the table). So
when other processes take about a core (telemetry/cpu.py: `cpu_other_cores`,
steal included; niced neighbours yield and are not counted), the engine decodes
with one thread fewer once that has lasted `contention_down_s`, and goes back up
as soon as the cores are free again: `contention_up_s` (a quarter second, read
every quarter second while capped: scheduler/loop.py), so a neighbour that stops
costs under a second of one-thread decoding. A neighbour that comes back within
`contention_flap_s` of a restore made it a flap: each one doubles the next
restore's wait (`threads_backoff`, at most `contention_backoff_max` times), so a
neighbour that starts and stops every few seconds settles the knob instead of
flipping it every cycle; a drop long after the last restore starts over at 1.
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
    restored_s: float | None = None  # when threads were last given back
    backoff: float = 1.0  # the next restore's wait, in contention_up_s


def wanted_threads(cores: int, other_cores: float, max_threads: int) -> int:
    """Threads that fit the free cores: a neighbour taking more than half a core takes one."""
    free = cores - other_cores
    return max(1, min(max_threads, math.floor(free + 0.5 - 1e-9)))


def threads_for_contention(inp: ControlInput, state: ControllerState,
                           cfg: ControllerConfig) -> ThreadsVerdict:
    cap, restored, backoff = state.threads_cap, state.threads_restored_s, state.threads_backoff
    current = cap if cap is not None else cfg.max_threads
    if inp.cpu_cores is None or inp.cpu_other_cores is None:
        held = f"{current} of {cfg.max_threads} threads; CPU contention unknown" if cap is not None else ""
        return ThreadsVerdict(cap, None, held, restored, backoff)
    other = inp.cpu_other_cores
    taken = f"{other:.1f} core taken by other processes"
    held = f"{current} of {cfg.max_threads} threads: {taken}" if cap is not None else ""
    want = wanted_threads(inp.cpu_cores, other, cfg.max_threads)
    if want == current:
        return ThreadsVerdict(cap, None, held, restored, backoff)
    since = state.threads_pending_s if state.threads_pending_s is not None else inp.t_s
    dropping = want < current
    wait_s = cfg.contention_down_s if dropping else cfg.contention_up_s * backoff
    if inp.t_s - since < wait_s:
        return ThreadsVerdict(cap, since, held, restored, backoff)
    new_cap = None if want >= cfg.max_threads else want
    reason = f"{current} -> {want} threads: {taken}"
    if not dropping:
        return ThreadsVerdict(new_cap, None, reason, inp.t_s, backoff)
    flap = restored is not None and inp.t_s - restored < cfg.contention_flap_s
    backoff = min(backoff * 2.0, cfg.contention_backoff_max) if flap else 1.0
    return ThreadsVerdict(new_cap, None, reason, restored, backoff)
