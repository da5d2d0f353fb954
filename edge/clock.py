"""Time as an injected dependency.

What waits, and every timestamp a decision reads, takes a `Clock`, so production uses
the real monotonic clock while tests and the simulator use `ManualClock`, whose
`sleep()` advances time instantly: no unit test ever sleeps on real time. (Durations
measured only for stats, such as a step's decode time, use `time.perf_counter`.)
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic time in seconds and a way to wait."""

    def monotonic(self) -> float: ...

    def sleep(self, t_s: float) -> None: ...


class SystemClock:
    """The real clock (production default)."""

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, t_s: float) -> None:
        if t_s > 0:
            time.sleep(t_s)


class ManualClock:
    """A fake clock: time moves only through `advance()` or `sleep()`.

    Thread-safe, so an engine thread and a test thread may share one. `sleeps_s`
    records every requested sleep so tests can assert on pacing.
    """

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = float(start_s)
        self._lock = threading.Lock()
        self.sleeps_s: list[float] = []

    def monotonic(self) -> float:
        with self._lock:
            return self._now_s

    def sleep(self, t_s: float) -> None:
        with self._lock:
            self.sleeps_s.append(t_s)
            if t_s > 0:
                self._now_s += t_s

    def advance(self, t_s: float) -> float:
        """Move time forward by `t_s` (never backward) and return the new time."""
        if t_s < 0:
            raise ValueError(f"a monotonic clock cannot go back ({t_s} s)")
        with self._lock:
            self._now_s += t_s
            return self._now_s

    def set(self, now_s: float) -> None:
        """Jump to an absolute time not earlier than the current one."""
        with self._lock:
            if now_s < self._now_s:
                raise ValueError(f"a monotonic clock cannot go back ({now_s} < {self._now_s})")
            self._now_s = float(now_s)


class ScaledClock:
    """Simulated time that runs `scale` times faster than `base`, for `sim:PROFILE@SCALE`.

    The whole control loop (monitor, scheduler) runs on it so the controller sees
    the device's dynamics exactly as on hardware, only compressed: its horizons,
    rate limits and slope windows stay in device seconds. `sleep()` waits
    `t_s / scale` of base time.
    """

    def __init__(self, scale: float, base: Clock | None = None) -> None:
        if scale <= 0:
            raise ValueError("scale must be positive")
        self.scale = scale
        self.base = base or SystemClock()
        self._origin_s = self.base.monotonic()

    def monotonic(self) -> float:
        return self._origin_s + (self.base.monotonic() - self._origin_s) * self.scale

    def sleep(self, t_s: float) -> None:
        self.base.sleep(t_s / self.scale)
