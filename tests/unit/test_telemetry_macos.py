"""MacOSSource with a fake native layer (the ctypes layer only exists on darwin)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from edge.clock import ManualClock
from edge.telemetry.macos import DarwinNative, MacOSSource
from edge.telemetry.sample import PressureLevel

GiB = 1 << 30


class FakeNative:
    def __init__(self, thermal: int | Exception = 0, vm: int | Exception = 1) -> None:
        self.thermal = thermal
        self.vm = vm

    def thermal_pressure_level(self) -> int:
        if isinstance(self.thermal, Exception):
            raise self.thermal
        return self.thermal

    def vm_pressure_level(self) -> int:
        if isinstance(self.vm, Exception):
            raise self.vm
        return self.vm


def memory() -> SimpleNamespace:
    return SimpleNamespace(total=16 * GiB, available=9 * GiB)


PMSET_BATT = "Now drawing from 'Battery Power'\n -InternalBattery-0 (id=1)\t41%; discharging; present: true\n"


def pmset(argv: object) -> str:
    return PMSET_BATT


def make(native: FakeNative) -> MacOSSource:
    return MacOSSource(native, ManualClock(7.0), virtual_memory=memory, runner=pmset)


def test_battery_state_from_pmset_read_every_ten_seconds() -> None:
    calls: list[object] = []

    def runner(argv: object) -> str:
        calls.append(argv)
        return PMSET_BATT

    clock = ManualClock(0.0)
    src = MacOSSource(FakeNative(), clock, virtual_memory=memory, runner=runner)
    s = src.read()
    assert s.on_battery is True and s.battery_pct == 41.0 and s.power_w is None
    clock.advance(5.0)
    assert src.read().battery_pct == 41.0 and len(calls) == 1
    clock.advance(5.0)
    src.read()
    assert len(calls) == 2


@pytest.mark.parametrize(
    ("raw", "level"),
    [
        (0, PressureLevel.NOMINAL),
        (1, PressureLevel.MODERATE),
        (2, PressureLevel.HEAVY),
        (3, PressureLevel.CRITICAL),
        (4, PressureLevel.SLEEPING),
    ],
)
def test_thermal_pressure_levels(raw: int, level: PressureLevel) -> None:
    s = make(FakeNative(thermal=raw)).read()
    assert s.thermal_pressure is level
    assert s.thermal_known and s.temp_c is None  # a level, no temperature without root
    assert s.source == "macos" and s.t_s == 7.0


@pytest.mark.parametrize(
    ("raw", "level"), [(1, PressureLevel.NOMINAL), (2, PressureLevel.MODERATE), (4, PressureLevel.CRITICAL)]
)
def test_vm_pressure_levels(raw: int, level: PressureLevel) -> None:
    s = make(FakeNative(vm=raw)).read()
    assert s.memory_pressure is level
    assert s.mem_total_bytes == 16 * GiB and s.mem_available_bytes == 9 * GiB


def test_failing_thermal_call_is_unknown_and_memory_still_reads() -> None:
    s = make(FakeNative(thermal=OSError("notify_get_state failed with status 2"), vm=2)).read()
    assert s.thermal_pressure is None and not s.thermal_known
    assert s.memory_pressure is PressureLevel.MODERATE
    assert s.mem_available_bytes == 9 * GiB
    assert s.errors == ("thermal pressure: notify_get_state failed with status 2",)


def test_out_of_range_values_are_unknown() -> None:
    s = make(FakeNative(thermal=9, vm=3)).read()
    assert s.thermal_pressure is None and s.memory_pressure is None
    assert len(s.errors) == 2


def test_psutil_failure_is_isolated() -> None:
    def broken() -> SimpleNamespace:
        raise RuntimeError("host_statistics64 failed")

    s = MacOSSource(FakeNative(thermal=1), ManualClock(), virtual_memory=broken).read()
    assert s.thermal_pressure is PressureLevel.MODERATE
    assert s.mem_available_bytes is None
    assert any("host_statistics64" in e for e in s.errors)


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the non-darwin guard")
def test_no_native_layer_off_darwin() -> None:
    with pytest.raises(OSError, match="darwin"):
        DarwinNative()
    s = MacOSSource(clock=ManualClock(), virtual_memory=memory).read()
    assert s.thermal_pressure is None and s.memory_pressure is None
    assert s.mem_available_bytes == 9 * GiB
    assert any("native layer unavailable" in e for e in s.errors)


@pytest.mark.skipif(sys.platform != "darwin", reason="needs macOS")
def test_real_native_layer_on_darwin() -> None:  # pragma: no cover - runs on Mac CI only
    native = DarwinNative()
    assert 0 <= native.thermal_pressure_level() <= 4
    assert native.vm_pressure_level() in (1, 2, 4)
