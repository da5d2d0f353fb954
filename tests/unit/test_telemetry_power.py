"""Power readers on fake sysfs trees: Orin Nano, AGX Orin, JetPack 4, a laptop on battery, x86 RAPL,
and broken sensors (missing files, EIO, garbage, a counter that wraps)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from edge.clock import ManualClock
from edge.telemetry.linux import LinuxSource
from edge.telemetry.power import (
    PowerReader,
    RaplMeter,
    on_battery,
    read_hwmon_power,
    read_ina3221,
    read_power_supplies,
)
from edge.telemetry.readlog import ReadLog
from tests import fakesys
from tests.fakesys import FakeSys


def read(fs: FakeSys, t_s: float = 0.0, reader: PowerReader | None = None) -> tuple[object, ReadLog]:
    log = ReadLog(fs.reader)
    return (reader or PowerReader(fs.sys)).read(log, t_s), log


def test_orin_nano_total_is_vdd_in(tmp_path: Path) -> None:
    p, log = read(fakesys.orin_nano(tmp_path))
    assert p.power_source == "ina3221"
    assert p.power_w == pytest.approx(5.056 * 1.48)
    assert {r.name for r in p.rails} == {"VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"}
    assert p.on_battery is None and p.battery_pct is None  # no power_supply class: unknown, not "mains"
    assert "ina3221" in p.present and "rapl" in p.absent and "power_supply" in p.absent
    assert log.errors == []


def test_agx_orin_sums_sub_rails_without_unconnected(tmp_path: Path) -> None:
    p, _ = read(fakesys.agx_orin(tmp_path))
    assert p.power_w == pytest.approx(10.0 + 5.0 + 4.0 + 2.0)
    assert "NC" not in {r.name for r in p.rails}


def test_jetpack4_iio_layout_and_pom_5v_in_total(tmp_path: Path) -> None:
    fs = FakeSys(tmp_path)
    fs.ina3221_iio("6-0040", (("POM_5V_IN", 5000, 1200, 6000), ("POM_5V_GPU", 5000, 200, 1000),
                              ("POM_5V_CPU", 5000, 400, 2000)))
    rails = read_ina3221(fs.sys, ReadLog(fs.reader))
    assert [r.name for r in rails] == ["POM_5V_IN", "POM_5V_GPU", "POM_5V_CPU"]
    p, _ = read(fs)
    assert p.power_w == pytest.approx(6.0) and p.power_source == "ina3221"


def test_laptop_on_battery_uses_battery_power_and_skips_device_batteries(tmp_path: Path) -> None:
    fs = fakesys.laptop_with_battery(tmp_path, ac_online=False, capacity=64)
    p, _ = read(fs)
    assert p.on_battery is True
    assert p.battery_pct == 64.0  # the mouse's 5 % is not the machine's
    assert p.power_source == "battery" and p.power_w == pytest.approx(11.25)
    assert set(p.present) >= {"power_supply", "rapl"}


def test_laptop_on_ac_is_not_on_battery_and_falls_to_rapl(tmp_path: Path) -> None:
    fs = fakesys.laptop_with_battery(tmp_path, ac_online=True)
    reader = PowerReader(fs.sys)
    p, _ = read(fs, 0.0, reader)
    # a charging battery says nothing of the draw, and RAPL needs two reads
    assert p.on_battery is False and p.power_w is None
    fs.write(fs.sys / "class/powercap/intel-rapl:0/energy_uj", 1_000_000_000 + 15_000_000)
    p, _ = read(fs, 1.0, reader)
    assert p.power_source == "rapl" and p.power_w == pytest.approx(15.0)


def test_battery_current_times_voltage_when_no_power_now(tmp_path: Path) -> None:
    fs = FakeSys(tmp_path)
    fs.power_supply("BAT1", "Battery", status="Discharging", capacity=30, current_now=-1_500_000,
                    voltage_now=12_000_000)
    (supply,) = read_power_supplies(fs.sys, ReadLog(fs.reader))
    assert supply.power_w == pytest.approx(18.0)
    assert on_battery([supply]) is True


def test_rapl_deltas_over_the_injected_clock_and_wraparound(tmp_path: Path) -> None:
    fs = fakesys.x86_rapl(tmp_path)
    energy = fs.sys / "class/powercap/intel-rapl:0/energy_uj"
    fs.write(fs.sys / "class/powercap/intel-rapl:0/max_energy_range_uj", 10_000_000)
    fs.write(energy, 9_000_000)
    meter, log = RaplMeter(), ReadLog(fs.reader)
    assert meter.read(fs.sys, log, 10.0) == (None, True)  # one read: no rate yet
    fs.write(energy, 1_000_000)  # wrapped: 1 J to the top + 1 J after = 2 J in 0.5 s
    watts, seen = meter.read(fs.sys, log, 10.5)
    assert seen and watts == pytest.approx(4.0)
    assert log.errors == []


def test_rapl_unreadable_counter_is_unknown_and_reported(tmp_path: Path) -> None:
    fs = fakesys.x86_rapl(tmp_path)
    fs.break_file(fs.sys / "class/powercap/intel-rapl:0/energy_uj", errno.EACCES)
    p, log = read(fs)
    assert p.power_w is None and "rapl" in p.present
    assert any("energy_uj: EACCES" in e for e in log.errors)


def test_hwmon_power_microwatts(tmp_path: Path) -> None:
    fs = FakeSys(tmp_path)
    fs.hwmon_power("amdgpu", (("PPT", 23_500_000),))
    rails = read_hwmon_power(fs.sys, ReadLog(fs.reader))
    assert rails[0].name == "amdgpu:PPT" and rails[0].power_w == pytest.approx(23.5)
    p, _ = read(fs)
    assert p.power_source == "hwmon" and p.power_w == pytest.approx(23.5)


def test_broken_rail_eio_is_unknown_never_zero(tmp_path: Path) -> None:
    fs = fakesys.orin_nano(tmp_path)
    fs.break_file(next(fs.sys.glob("bus/i2c/drivers/ina3221/*/hwmon/hwmon*")) / "curr1_input", errno.EIO)
    p, log = read(fs)
    assert p.power_w is None and p.power_source == "ina3221"  # a failed total is unknown, not another source
    assert any("curr1_input: EIO" in e for e in log.errors)


def test_garbage_and_missing_files_are_errors_not_crashes(tmp_path: Path) -> None:
    fs = fakesys.orin_nano(tmp_path)
    hdir = next(fs.sys.glob("bus/i2c/drivers/ina3221/*/hwmon/hwmon*"))
    fs.write(hdir / "in1_input", "\x00\xffgarbage\n")
    (hdir / "curr2_input").unlink()
    fs.power_supply("BAT0", "Battery", status="Discharging", capacity="lots")
    p, log = read(fs)
    assert p.power_w is None
    assert any("in1_input: not a number" in e for e in log.errors)
    assert any("curr2_input: missing" in e for e in log.errors)
    assert any("capacity: not a number" in e for e in log.errors)
    assert p.battery_pct is None


def test_implausible_capacity_is_unknown(tmp_path: Path) -> None:
    fs = FakeSys(tmp_path)
    fs.power_supply("BAT0", "Battery", status="Discharging", capacity=250, power_now=5_000_000)
    p, log = read(fs)
    assert p.battery_pct is None and any("implausible 250%" in e for e in log.errors)


def test_no_power_inputs_at_all_says_so(tmp_path: Path) -> None:
    fs = FakeSys(tmp_path)  # this VM: nothing
    p, log = read(fs)
    assert p.power_w is None and p.on_battery is None and p.present == ()
    assert set(p.absent) == {"ina3221", "power_supply", "hwmon_power", "rapl"}
    assert log.errors == []


def test_linux_source_carries_power_into_the_sample(tmp_path: Path) -> None:
    fs = fakesys.laptop_with_battery(tmp_path, capacity=12)
    s = LinuxSource(fs.sys, fs.proc, ManualClock(), reader=fs.reader).read()
    assert s.on_battery is True and s.battery_pct == 12.0
    assert s.power_w == pytest.approx(11.25) and s.power_source == "battery"
    assert s.temp_c is not None  # the thermal readings are unchanged
