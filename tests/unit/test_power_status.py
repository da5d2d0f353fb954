"""Power in the scheduler loop's status (/v1/status, /metrics) and in `edge status`: watts, budget,
battery, and joules per token integrated over the time power was known."""

from __future__ import annotations

import pytest

from edge.clock import ManualClock
from edge.commands.status import power_line
from edge.runtime.types import EngineState, EngineStats, Knobs
from edge.scheduler.loop import SchedulerLoop
from edge.scheduler.state import ControllerConfig
from edge.telemetry.monitor import Monitor
from edge.telemetry.sample import Sample
from tests.fakes import engine_stats


class Source:
    """A source whose power jitters by a milliwatt, as a real rail does (a frozen value is stuck)."""

    name = "fake"

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.power_w: float | None = 8.0
        self.on_battery: bool | None = True
        self.battery_pct: float | None = 55.0
        self.frozen = False
        self.n = 0

    def read(self) -> Sample:
        self.n += 1
        jitter = 0.0 if self.frozen else (0.001 if self.n % 2 else -0.001)
        power = None if self.power_w is None else self.power_w + jitter
        return Sample(t_s=self.clock.monotonic(), source=self.name, temp_c=50.0, limit_c=99.0,
                      kernel_throttling=False, power_w=power, power_source="ina3221",
                      on_battery=self.on_battery, battery_pct=self.battery_pct)

    def close(self) -> None:
        """Nothing to release."""


class Engine:
    """Generates 20 tokens per second of the loop's clock."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.knobs = Knobs(2, 2, 1.0)

    def stats(self) -> EngineStats:
        return engine_stats(active=2, knobs=self.knobs, total_tokens_decoded=int(20 * self.clock.monotonic()))

    def apply(self, knobs: Knobs) -> None:
        self.knobs = knobs

    def unload(self, timeout_s: float | None = 60.0) -> bool:
        return False

    @property
    def state(self) -> EngineState:
        return EngineState.READY


def test_status_reports_watts_budget_battery_and_joules_per_token() -> None:
    clock = ManualClock()
    src = Source(clock)
    cfg = ControllerConfig(n_slots=2, max_threads=2, battery_power_budget_w=10.0, battery_reserve_pct=20.0)
    loop = SchedulerLoop(Monitor(src, clock=clock), Engine(clock), clock=clock, config=cfg)
    for _ in range(5):
        loop.tick(clock.monotonic())
        clock.advance(1.0)
    p = loop.status()["power"]
    assert p["power_w"] == pytest.approx(8.0, abs=0.01) and p["budget_w"] == 10.0
    assert p["budget_origin"] == "battery"
    assert p["on_battery"] is True and p["battery_pct"] == 55.0 and p["battery_low"] is False
    # 4 intervals of 1 s at 8 W, 20 tokens/s
    assert p["energy_j"] == pytest.approx(32.0, abs=0.05) and p["energy_tokens"] == 80
    assert p["joules_per_token"] == pytest.approx(0.4, abs=0.001)
    assert p["tokens_per_joule"] == pytest.approx(2.5, abs=0.01)
    assert p["headroom_w"] == pytest.approx(2.0, abs=0.01)
    assert p["headroom_frac"] == pytest.approx(0.2, abs=0.002)
    line = power_line(p)
    assert "8.00 W of 10 W budget (battery" in line and "on battery 55%" in line and "0.400 J/token" in line
    # a rail that stops updating is stale after 10 s: the accounting stops, the power stage fails closed
    src.frozen = True
    for _ in range(12):
        loop.tick(clock.monotonic())
        clock.advance(1.0)
    p = loop.status()["power"]
    assert p["control"] == "fail_closed" and p["headroom_frac"] == 0.0 and p["power_stale"] is True
    assert "(stale)" in power_line(p)


def test_without_power_inputs_the_status_says_unknown_and_nothing_is_capped() -> None:
    clock = ManualClock()
    src = Source(clock)
    src.power_w, src.on_battery, src.battery_pct = None, None, None
    loop = SchedulerLoop(Monitor(src, clock=clock), Engine(clock), clock=clock,
                         config=ControllerConfig(n_slots=2, max_threads=2))
    d = loop.tick(0.0)
    p = loop.status()["power"]
    assert p["power_w"] is None and p["budget_w"] is None and p["control"] == "off"
    assert p["joules_per_token"] is None and d.knobs.active_limit == 2 and not d.knobs.paused
    assert power_line(p) == "power     unknown no budget"


def test_metrics_export_the_power_fields() -> None:
    from edge.api.metrics import _flatten

    clock = ManualClock()
    loop = SchedulerLoop(Monitor(Source(clock), clock=clock), Engine(clock), clock=clock,
                         config=ControllerConfig(n_slots=2, max_threads=2, power_budget_w=9.0))
    for _ in range(3):
        loop.tick(clock.monotonic())
        clock.advance(1.0)
    flat: dict[str, float] = {}
    _flatten("", loop.status(), flat)
    for key in ("power_power_w", "power_budget_w", "power_on_battery", "power_battery_pct",
                "power_joules_per_token", "power_headroom_frac", "decision_power_budget_w"):
        assert key in flat, key
    assert flat["power_on_battery"] == 1.0 and flat["power_budget_w"] == 9.0
