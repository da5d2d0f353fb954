"""Policies compared by the harness; `edge` is the production controller, unchanged.

* `none`: full speed always; only the hardware's own throttling protects the device.
* `threshold`: pause at a fixed temperature, resume after a fixed cooldown (the
  proposal in Ollama's tracker).
* `constant`: fixed knobs, for the sweep of the best setting that never throttles.
* `edge`: `edge.scheduler.controller.decide()` fed by the same kind of smoothed
  reading the monitor produces, with `Admission` doing admission and shedding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edge.runtime.types import EngineStats, Knobs
from edge.scheduler.controller import decide
from edge.scheduler.state import (
    ControlInput,
    ControllerConfig,
    ControllerState,
    Decision,
    QueueState,
)
from edge.telemetry.monitor import least_squares_slope
from edge.telemetry.sample import Sample


@dataclass
class Trend:
    """EMA-smoothed temperature, a least-squares slope over a window, and a fast slope of the raw
    readings: what the monitor reports."""

    alpha: float = 0.5
    window_s: float = 15.0
    fast_window_s: float = 4.0
    temp_c: float | None = None
    raw_temp_c: float | None = None
    points: list[tuple[float, float]] = field(default_factory=list)
    raw: list[tuple[float, float]] = field(default_factory=list)

    def update(self, t_s: float, temp_c: float) -> None:
        self.raw_temp_c = temp_c
        self.temp_c = temp_c if self.temp_c is None else self.temp_c + self.alpha * (temp_c - self.temp_c)
        self.points.append((t_s, self.temp_c))
        while self.points and t_s - self.points[0][0] > self.window_s:
            self.points.pop(0)
        self.raw.append((t_s, temp_c))
        while self.raw and t_s - self.raw[0][0] > self.fast_window_s:
            self.raw.pop(0)

    @property
    def slope_c_per_s(self) -> float:
        return _slope(self.points)

    @property
    def fast_slope_c_per_s(self) -> float:
        return _slope(self.raw)


def _slope(points: list[tuple[float, float]]) -> float:
    n = len(points)
    if n < 3:
        return 0.0
    return least_squares_slope(points) or 0.0


class Policy:
    name = "base"

    def control(self, sample: Sample, trend: Trend, queue: QueueState, stats: EngineStats) -> Knobs:
        raise NotImplementedError

    @property
    def decision(self) -> Decision | None:
        return None


class ConstantPolicy(Policy):
    def __init__(self, knobs: Knobs, name: str = "constant") -> None:
        self.knobs, self.name = knobs, name

    def control(self, sample: Sample, trend: Trend, queue: QueueState, stats: EngineStats) -> Knobs:
        return self.knobs


class ThresholdPolicy(Policy):
    """Pause at `pause_c`, resume `cooldown_s` later."""

    name = "threshold"

    def __init__(self, full: Knobs, pause_c: float, cooldown_s: float = 30.0) -> None:
        self.full, self.pause_c, self.cooldown_s = full, pause_c, cooldown_s
        self.paused_until_s: float | None = None

    def control(self, sample: Sample, trend: Trend, queue: QueueState, stats: EngineStats) -> Knobs:
        now = sample.t_s
        if self.paused_until_s is not None and now >= self.paused_until_s:
            self.paused_until_s = None
        if self.paused_until_s is None and sample.temp_c is not None and sample.temp_c >= self.pause_c:
            self.paused_until_s = now + self.cooldown_s
        if self.paused_until_s is not None:
            return Knobs(self.full.active_limit, self.full.n_threads, self.full.duty, paused=True)
        return self.full


class EdgePolicy(Policy):
    name = "edge"

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.state = ControllerState()
        self._decision: Decision | None = None

    @property
    def decision(self) -> Decision | None:
        return self._decision

    def control(self, sample: Sample, trend: Trend, queue: QueueState, stats: EngineStats) -> Knobs:
        inp = ControlInput(
            t_s=sample.t_s, temp_c=trend.temp_c, slope_c_per_s=trend.slope_c_per_s,
            raw_temp_c=trend.raw_temp_c, fast_slope_c_per_s=trend.fast_slope_c_per_s,
            limit_c=sample.limit_c, stale=False, kernel_throttling=sample.kernel_throttling,
            thermal_pressure=sample.thermal_pressure, mem_available_bytes=sample.mem_available_bytes,
            psi_some_avg10=sample.psi_some_avg10, psi_full_avg10=sample.psi_full_avg10,
            memory_pressure=sample.memory_pressure,
        )
        self._decision, self.state = decide(inp, queue, stats, self.state, self.config)
        return self._decision.knobs
