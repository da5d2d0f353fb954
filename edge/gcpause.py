"""The cyclic garbage collector held off while a server starts, and settled once it serves.

A start imports FastAPI, pydantic and the runtime and builds ~120k objects that live as long as
the process. The collector runs whenever allocations outnumber frees by 700, so it walks that
growing heap again and again while it is built: ~70-90 ms of a SmolLM2 start on 2 cores (13 %
of `import edge.api.app`), all of it on the Python thread that the first token waits for, and
none of it finds much (the start's garbage is a few thousand cycles). `pause()` turns it off for
the start; `settle()`, once the first requests had the cores, collects what the start left,
freezes the survivors (`gc.freeze`: later full collections no longer walk the start's objects,
so they stall decode steps less) and turns it back on. CPython's documented use of `freeze` is
the same, for a process that forks its workers.
"""

from __future__ import annotations

import gc


class GcPause:
    """Whether this process paused the collector (`settle` undoes only its own pause)."""

    def __init__(self) -> None:
        self.paused = False

    def pause(self) -> None:
        if gc.isenabled():
            gc.disable()
            self.paused = True

    def settle(self) -> int:
        """Collect, freeze, re-enable; returns the unreachable objects found (0: not paused)."""
        if not self.paused:
            return 0
        self.paused = False
        found = gc.collect()
        gc.freeze()
        gc.enable()
        return found


START = GcPause()  # the process's own: `edge serve` pauses at its first line, settles after its load
