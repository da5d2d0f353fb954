"""Power in the scheduler loop's status (/v1/status, /metrics) and in `edge status`: watts, budget,
battery, and joules per token integrated over the time power was known."""

from __future__ import annotations

from dataclasses import dataclass

from edge.clock import ManualClock
from edge.commands.status import power_line
from edge.runtime.types import EngineState, EngineStats, Knobs
from edge.scheduler.loop import SchedulerLoop
from edge.scheduler.state import ControllerConfig
from tests.fakes import engine_stats


@dataclass
class Reading:
    t_s: float
    temp_c: float | None = 50.0
    slope_c_per_s: float | None = 0.0
    limit_c: float | None = 99.0
    kernel_throttling: bool | None = False
    power_w: float | None = 8.0
    power_stale: bool = False
    on_battery: bool | None = True
    battery_pct: float | None = 55.0


class Monitor:
    def __init__(self) -> None:
        self.reading = Reading(0.0)

    def poll(self, now_s: float) -> None:
        self.reading.t_s = now_s

    def latest(self, now_s: float | None = None) -> Reading:
        return self.reading


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
    mon = Monitor()
    cfg = ControllerConfig(n_slots=2, max_threads=2, battery_power_budget_w=10.0, battery_reserve_pct=20.0)
    loop = SchedulerLoop(mon, Engine(clock), clock=clock, config=cfg)
    for _ in range(5):
        loop.tick(clock.monotonic())
        clock.advance(1.0)
    p = loop.status()["power"]
    assert p["power_w"] == 8.0 and p["budget_w"] == 10.0 and p["budget_origin"] == "battery"
    assert p["on_battery"] is True and p["battery_pct"] == 55.0 and p["battery_low"] is False
    assert p["energy_j"] == 32.0 and p["energy_tokens"] == 80  # 4 intervals of 1 s at 8 W, 20 tokens/s
    assert p["joules_per_token"] == 0.4 and p["tokens_per_joule"] == 2.5
    assert p["headroom_w"] == 2.0 and p["headroom_frac"] == 0.2
    line = power_line(p)
    assert "8.00 W of 10 W budget (battery" in line and "on battery 55%" in line and "0.400 J/token" in line
    # a stale reading stops the accounting (and the power stage fails closed)
    mon.reading.power_stale = True
    loop.tick(clock.monotonic())
    clock.advance(1.0)
    loop.tick(clock.monotonic())
    p = loop.status()["power"]
    assert p["energy_j"] == 32.0 and p["control"] == "fail_closed" and p["headroom_frac"] == 0.0
    assert "(stale)" in power_line(p)


def test_without_power_inputs_the_status_says_unknown_and_nothing_is_capped() -> None:
    clock = ManualClock()
    mon = Monitor()
    mon.reading.power_w, mon.reading.on_battery, mon.reading.battery_pct = None, None, None
    loop = SchedulerLoop(mon, Engine(clock), clock=clock, config=ControllerConfig(n_slots=2, max_threads=2))
    d = loop.tick(0.0)
    p = loop.status()["power"]
    assert p["power_w"] is None and p["budget_w"] is None and p["control"] == "off"
    assert p["joules_per_token"] is None and d.knobs.active_limit == 2 and not d.knobs.paused
    assert power_line(p) == "power     unknown no budget"


def test_metrics_export_the_power_fields() -> None:
    from edge.api.metrics import _flatten

    clock = ManualClock()
    loop = SchedulerLoop(Monitor(), Engine(clock), clock=clock,
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
