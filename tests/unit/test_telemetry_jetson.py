"""JetsonSource: Tegra zones, INA3221 rails, GPU load, NvMap, and jtop with sysfs fallback."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from edge.clock import ManualClock
from edge.telemetry.jetson import JetsonSource, JtopLike
from tests import fakesys
from tests.fakesys import FakeSys, MiB


class JtopException(Exception):
    """Stands in for jtop.JtopException (service missing, permissions, version mismatch)."""


class FakeJtop:
    def __init__(self, fail_start: Exception | None = None, fail_power: bool = False) -> None:
        self.fail_start = fail_start
        self.fail_power = fail_power
        self.alive = True
        self.started = 0
        self.closed = 0

    def start(self) -> None:
        self.started += 1
        if self.fail_start is not None:
            raise self.fail_start

    def close(self) -> None:
        self.closed += 1

    def ok(self) -> bool:
        return self.alive

    @property
    def temperature(self) -> Mapping[str, Any]:
        return {
            "cpu": {"temp": 70.5, "online": True},
            "tj": {"temp": 72.0, "online": True},
            "cv0": {"temp": -256.0, "online": False},
        }

    @property
    def power(self) -> Mapping[str, Any]:
        if self.fail_power:
            raise JtopException("lost connection to jtop.service")
        return {
            "rail": {
                "VDD_IN": {"online": True, "volt": 5040, "curr": 2000, "power": 10080},
                "VDD_SOC": {"online": True, "volt": 5040, "curr": 400, "power": 2016},
            },
            "tot": {"power": 10080, "name": "VDD_IN"},
        }

    @property
    def gpu(self) -> Mapping[str, Any]:
        return {"gpu": {"status": {"load": 55.0}}}


class Factory:
    def __init__(self, *handles: FakeJtop | Exception) -> None:
        self.handles = list(handles)
        self.calls = 0

    def __call__(self) -> JtopLike:
        self.calls += 1
        h = self.handles[min(self.calls, len(self.handles)) - 1]
        if isinstance(h, Exception):
            raise h
        return h


def no_nvpmodel(argv: object) -> str:
    raise FileNotFoundError("nvpmodel")


def make(fs: FakeSys, clock: ManualClock, factory: Any = None) -> JetsonSource:
    return JetsonSource(fs.sys, fs.proc, clock, reader=fs.reader, jtop_factory=factory, jtop_retry_s=60.0,
                        jtop_socket=None, runner=no_nvpmodel, etc_root=fs.root / "etc")


def test_orin_nano_from_sysfs(tmp_path: Path) -> None:
    fs = fakesys.orin_nano(tmp_path)
    fs.set_temp("cpu-thermal", 70.0)  # tj is preferred even when another zone reads higher
    s = make(fs, ManualClock()).read()
    assert s.source == "jetson"
    assert s.temp_c == 53.0
    assert s.limit_c == 99.0 and s.critical_c == 104.5
    rails = {r.name: r for r in s.rails}
    assert set(rails) == {"VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"}
    assert rails["VDD_IN"].voltage_v == pytest.approx(5.056)
    assert rails["VDD_IN"].current_a == pytest.approx(1.48)
    assert s.power_w == pytest.approx(5.056 * 1.48)  # VDD_IN is the whole module
    assert s.gpu_load_pct == pytest.approx(34.5)
    assert s.nvmap_used_bytes == 300 * MiB
    assert s.errors == ()


def test_agx_orin_sums_rails_and_skips_unconnected_channels(tmp_path: Path) -> None:
    s = make(fakesys.agx_orin(tmp_path), ManualClock()).read()
    names = [r.name for r in s.rails]
    assert "NC" not in names and len(names) == 4
    assert s.power_w == pytest.approx(10.0 + 5.0 + 4.0 + 2.0)
    assert s.gpu_load_pct == pytest.approx(87.0)
    assert s.temp_c == 62.25  # tj


def test_tj_unreadable_falls_back_to_hottest_zone(tmp_path: Path) -> None:
    fs = fakesys.orin_nano(tmp_path)
    fs.break_file(fs.sys / "class/thermal/thermal_zone8/temp")  # tj
    fs.set_temp("gpu-thermal", 66.0)
    s = make(fs, ManualClock()).read()
    assert s.temp_c == 66.0
    assert any("thermal_zone8/temp: ENODATA" in e for e in s.errors)


def test_jtop_supplies_readings_and_trips_still_come_from_sysfs(tmp_path: Path) -> None:
    jt = FakeJtop()
    s = make(fakesys.orin_nano(tmp_path), ManualClock(), Factory(jt)).read()
    assert jt.started == 1
    assert s.source == "jtop"
    assert s.temp_c == 72.0  # jtop's tj
    assert s.power_w == pytest.approx(10.08)
    assert {r.name: r.power_w for r in s.rails} == pytest.approx({"VDD_IN": 10.08, "VDD_SOC": 2.016})
    assert s.gpu_load_pct == 55.0
    assert s.limit_c == 99.0 and s.critical_c == 104.5  # jtop has no trip points
    assert s.mem_available_bytes is not None


def test_jtop_start_failure_falls_back_and_retries_later(tmp_path: Path) -> None:
    clock = ManualClock(100.0)
    factory = Factory(FakeJtop(fail_start=JtopException("jtop.service is not active")), FakeJtop())
    src = make(fakesys.orin_nano(tmp_path), clock, factory)
    s = src.read()
    assert s.source == "jetson" and s.temp_c == 53.0 and s.power_w is not None  # sysfs values
    assert any("jtop unavailable" in e and "not active" in e for e in s.errors)
    assert src.jtop_error is not None
    clock.advance(30.0)
    assert src.read().source == "jetson" and factory.calls == 1  # not retried before 60 s
    clock.advance(31.0)
    assert src.read().source == "jtop" and factory.calls == 2
    assert src.jtop_error is None


def test_jtop_not_installed_is_not_retried(tmp_path: Path) -> None:
    clock = ManualClock()
    factory = Factory(ModuleNotFoundError("No module named 'jtop'"))
    src = make(fakesys.orin_nano(tmp_path), clock, factory)
    first = src.read()
    assert any("jetson-stats not installed" in e for e in first.errors)
    clock.advance(3600.0)
    second = src.read()
    assert factory.calls == 1 and second.errors == ()
    assert second.power_w == pytest.approx(5.056 * 1.48)


def test_jtop_dying_mid_run_falls_back_at_once(tmp_path: Path) -> None:
    jt = FakeJtop()
    src = make(fakesys.orin_nano(tmp_path), ManualClock(), Factory(jt))
    assert src.read().source == "jtop"
    jt.fail_power = True
    s = src.read()
    assert s.source == "jetson" and s.temp_c == 53.0
    assert jt.closed == 1
    assert any("lost connection" in e for e in s.errors)


def test_jtop_ok_false_falls_back(tmp_path: Path) -> None:
    jt = FakeJtop()
    src = make(fakesys.orin_nano(tmp_path), ManualClock(), Factory(jt))
    src.read()
    jt.alive = False
    s = src.read()
    assert s.source == "jetson" and any("ok() is False" in e for e in s.errors)


def test_unreadable_rail_is_unknown_not_zero(tmp_path: Path) -> None:
    fs = fakesys.orin_nano(tmp_path)
    hw = fs.sys / "bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon3"
    fs.break_file(hw / "curr1_input", 5)  # EIO on VDD_IN's current
    s = make(fs, ManualClock()).read()
    vdd_in = next(r for r in s.rails if r.name == "VDD_IN")
    assert vdd_in.power_w is None and vdd_in.voltage_v == pytest.approx(5.056)
    assert s.power_w is None  # total unknown, not 0 W
    assert any("curr1_input: EIO" in e for e in s.errors)
