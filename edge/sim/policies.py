"""The baseline policies `edge sim` compares edge against.

* `none`: full speed always; only the hardware's own throttling protects the device.
* `threshold`: pause at a fixed temperature, resume after a fixed cooldown (the
  proposal in Ollama's tracker).
* `constant`: fixed knobs, for the sweep of the best setting that never throttles.

`edge` itself is not a policy here: the harness runs the shipped telemetry
`Monitor` and `SchedulerLoop` (controller, admission, shedding, eviction) on a
manual clock, exactly as `edge serve` wires them.
"""

from __future__ import annotations

from edge.contracts.engine import EngineStats, Knobs
from edge.scheduler.state import QueueState
from edge.telemetry.sample import Sample


class Policy:
    name = "base"

    def control(self, sample: Sample, queue: QueueState, stats: EngineStats) -> Knobs:
        raise NotImplementedError


class ConstantPolicy(Policy):
    def __init__(self, knobs: Knobs, name: str = "constant") -> None:
        self.knobs, self.name = knobs, name

    def control(self, sample: Sample, queue: QueueState, stats: EngineStats) -> Knobs:
        return self.knobs


class ThresholdPolicy(Policy):
    """Pause at `pause_c`, resume `cooldown_s` later."""

    name = "threshold"

    def __init__(self, full: Knobs, pause_c: float, cooldown_s: float = 30.0) -> None:
        self.full, self.pause_c, self.cooldown_s = full, pause_c, cooldown_s
        self.paused_until_s: float | None = None

    def control(self, sample: Sample, queue: QueueState, stats: EngineStats) -> Knobs:
        now = sample.t_s
        if self.paused_until_s is not None and now >= self.paused_until_s:
            self.paused_until_s = None
        if self.paused_until_s is None and sample.temp_c is not None and sample.temp_c >= self.pause_c:
            self.paused_until_s = now + self.cooldown_s
        if self.paused_until_s is not None:
            return Knobs(self.full.active_limit, self.full.n_threads, self.full.duty, paused=True)
        return self.full
