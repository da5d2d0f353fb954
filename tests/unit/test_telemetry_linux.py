"""LinuxSource on fake sysfs/procfs trees: every sensor read on its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge.clock import ManualClock
from edge.telemetry.linux import LinuxSource, normalize_zone_name, zone_counts
from edge.telemetry.linux_memory import psi_pressure_level
from edge.telemetry.sample import PressureLevel
from tests import fakesys
from tests.fakesys import FakeSys, GiB, MiB


def source(fs: FakeSys, clock: ManualClock | None = None) -> LinuxSource:
    return LinuxSource(fs.sys, fs.proc, clock or ManualClock(5.0), reader=fs.reader)


def test_orin_zones_trips_and_memory(tmp_path: Path) -> None:
    fs = fakesys.orin_nano(tmp_path)
    s = source(fs).read()
    assert s.source == "linux" and s.t_s == 5.0
    assert [z.name for z in s.zones] == list(fakesys.ORIN_ZONES)
    assert s.temp_c == 53.0  # hottest zone
    assert s.limit_c == fakesys.ORIN_PASSIVE_C  # the tj active (fan) trips at 46/60 are not the limit
    assert s.critical_c == fakesys.ORIN_CRITICAL_C
    assert all(z.passive_trip_c == 99.0 and z.critical_trip_c == 104.5 for z in s.zones)
    assert s.cooling_active is False  # the fan spins (cur_state 3) but that is not throttling
    assert s.freq_capped is False and s.kernel_throttling is False
    assert s.mem_total_bytes == 7620 * MiB
    assert s.mem_available_bytes == 5 * GiB
    assert s.nvmap_used_bytes == 300 * MiB
    assert s.cgroup_limit_bytes is None  # a session scope without a limit
    assert s.psi_some_avg10 == 0.0 and s.memory_pressure is PressureLevel.NOMINAL
    assert s.errors == ()


def test_offline_zone_is_unknown_and_others_still_read(tmp_path: Path) -> None:
    s = source(fakesys.agx_orin(tmp_path)).read()
    cv2 = next(z for z in s.zones if z.name == "cv2")
    assert cv2.temp_c is None  # -256 °C means offline, never a cold chip
    assert s.temp_c == 62.25
    assert len(s.errors) == 1 and "implausible" in s.errors[0] and "-256" in s.errors[0]


def test_laptop_ignores_battery_and_wifi_zones(tmp_path: Path) -> None:
    fs = fakesys.generic_x86(tmp_path)
    fs.set_temp("iwlwifi_1", 88.0)  # hot wifi must not drive compute throttling
    s = source(fs).read()
    assert s.temp_c == 71.0
    assert s.limit_c == 95.0  # the battery's 45 °C passive trip is ignored
    assert s.critical_c == 120.0
    names = [z.name for z in s.zones]
    assert "hwmon:coretemp:Package id 0" in names and "hwmon:nvme:Composite" in names
    assert s.cooling_active is False  # Fan at 2/5 does not count; Processor and powerclamp are 0


def test_hwmon_fallback_when_no_zone_counts(tmp_path: Path) -> None:
    fs = FakeSys(tmp_path)
    fs.thermal_zone("battery", 35.0, (("passive", 45.0),))
    fs.hwmon("k10temp", (("Tctl", 77.5, None, 95.0),))
    fs.hwmon("nvme", (("Composite", 90.0, None, None),))  # not a CPU chip
    fs.meminfo(total=8 * GiB, available=4 * GiB)
    s = source(fs).read()
    assert s.temp_c == 77.5
    assert s.limit_c is None  # no passive trip anywhere that counts: the profile decides
    assert s.critical_c == 95.0


def test_processor_cooling_device_means_throttling(tmp_path: Path) -> None:
    fs = fakesys.generic_x86(tmp_path)
    src = source(fs)
    assert src.read().kernel_throttling is False
    fs.write(fs.sys / "class/thermal/cooling_device1/cur_state", 2)  # Processor
    s = src.read()
    assert s.cooling_active is True and s.kernel_throttling is True


def test_new_frequency_cap_is_throttling_but_a_standing_cap_is_not(tmp_path: Path) -> None:
    fs = fakesys.orin_nano(tmp_path)
    fs.cap_cpus(1510400)  # nvpmodel's 15 W mode caps the CPUs from boot
    src = source(fs)
    first = src.read()
    assert first.freq_capped is True and first.kernel_throttling is False
    fs.cap_cpus(1113600)  # the thermal governor lowers the cap further
    second = src.read()
    assert second.freq_capped is True and second.kernel_throttling is True
    fs.cap_cpus(1510400)
    assert src.read().kernel_throttling is False


def test_cgroup_v2_container_limits_available_memory(tmp_path: Path) -> None:
    s = source(fakesys.cgroup_container(tmp_path)).read()
    assert s.cgroup_limit_bytes == 2 * GiB
    assert s.cgroup_current_bytes == 1536 * MiB
    # 2 GiB - (1.5 GiB used - 256 MiB inactive file cache), far below the host's 40 GiB
    assert s.mem_available_bytes == 2 * GiB - (1536 - 256) * MiB
    assert s.psi_some_avg10 == 12.0 and s.psi_full_avg10 == 3.0  # the cgroup's, worse than the host's
    assert s.memory_pressure is PressureLevel.HEAVY


def test_parent_cgroup_and_memory_high_bound_the_headroom(tmp_path: Path) -> None:
    fs = FakeSys(tmp_path)
    fs.meminfo(total=16 * GiB, available=12 * GiB)
    fs.cgroup_v2(rel="edge.slice/edge.service", max_bytes=8 * GiB, current_bytes=1 * GiB)
    parent = fs.sys / "fs/cgroup/edge.slice"
    fs.write(parent / "memory.max", f"{3 * GiB}\n")
    fs.write(parent / "memory.current", 2 * GiB)
    s = source(fs).read()
    assert s.cgroup_limit_bytes == 3 * GiB
    assert s.mem_available_bytes == 1 * GiB  # the slice has 1 GiB left, the leaf 7 GiB
    fs.write(fs.sys / "fs/cgroup/edge.slice/edge.service/memory.high", f"{GiB + 512 * MiB}\n")
    s = source(fs).read()
    assert s.cgroup_limit_bytes == GiB + 512 * MiB
    assert s.mem_available_bytes == 512 * MiB


def test_cgroup_v1_hierarchy(tmp_path: Path) -> None:
    s = source(fakesys.cgroup_v1_container(tmp_path)).read()
    assert s.cgroup_limit_bytes == 4 * GiB
    assert s.mem_available_bytes == 4 * GiB - (GiB - 8 * MiB)
    assert s.psi_some_avg10 is None and s.memory_pressure is None  # no PSI: unknown, not nominal


def test_meminfo_without_memavailable_falls_back(tmp_path: Path) -> None:
    fs = FakeSys(tmp_path)
    fs.meminfo(total=4 * GiB, available=None, free=1 * GiB)
    s = source(fs).read()
    assert s.mem_available_bytes == GiB + 20480 * 1024 + (4 * GiB) // 8


@pytest.mark.parametrize(
    ("some", "full", "level"),
    [
        (0.0, 0.0, PressureLevel.NOMINAL),
        (9.9, 1.9, PressureLevel.NOMINAL),
        (10.0, 0.0, PressureLevel.MODERATE),
        (30.0, 2.0, PressureLevel.HEAVY),
        (50.0, 10.0, PressureLevel.CRITICAL),
        (None, None, None),
    ],
)
def test_psi_levels(some: float | None, full: float | None, level: PressureLevel | None) -> None:
    assert psi_pressure_level(some, full) is level


def test_system_psi_drives_memory_pressure(tmp_path: Path) -> None:
    fs = fakesys.raspberry_pi(tmp_path)
    fs.psi(25.0, 0.5)
    s = source(fs).read()
    assert s.psi_some_avg10 == 25.0 and s.memory_pressure is PressureLevel.MODERATE


def test_broken_box_reports_unknowns_and_keeps_good_readings(tmp_path: Path) -> None:
    fs = fakesys.broken_box(tmp_path)
    s = source(fs).read()
    by_name = {z.name: z for z in s.zones}
    for bad in ("cpu", "gpu", "soc", "tj"):
        assert by_name[bad].temp_c is None  # unknown, never 0 °C or "cool"
    assert by_name["ddr"].temp_c == 63.0  # the one good sensor still counts
    assert s.temp_c == 63.0
    assert by_name["ddr"].passive_trip_c is None  # its trip type was unreadable: not a guessed limit
    assert s.limit_c == 90.0 and s.critical_c == 105.0  # trips of the failing zones still read
    assert s.kernel_throttling is None and s.cooling_active is None  # unreadable, not "False"
    assert s.freq_capped is None
    assert s.mem_available_bytes == 3 * GiB  # memory unaffected by thermal failures
    assert s.psi_some_avg10 is None and s.memory_pressure is None
    text = "\n".join(s.errors)
    assert "thermal_zone0/temp: ENODATA" in text
    assert "thermal_zone1/temp: EISDIR" in text
    assert "thermal_zone2/temp: not a number: 'n/a'" in text
    assert "thermal_zone3/temp: EIO" in text
    assert "trip_point_0_type: EIO" in text
    assert "cooling_device0/cur_state: not a number" in text
    assert "cpu0/cpufreq/scaling_max_freq: missing" in text


def test_a_crashing_group_does_not_hide_the_others(tmp_path: Path) -> None:
    fs = fakesys.orin_nano(tmp_path)

    def reader(path: Path) -> str:
        if path.name == "meminfo":
            raise RuntimeError("driver bug")  # not an OSError: escapes the per-file guard
        return fs.reader(path)

    s = LinuxSource(fs.sys, fs.proc, ManualClock(), reader=reader).read()
    assert s.temp_c == 53.0 and s.limit_c == 99.0
    assert s.mem_available_bytes is None
    assert any(e.startswith("memory: RuntimeError: driver bug") for e in s.errors)


def test_empty_machine_is_all_unknown(tmp_path: Path) -> None:
    s = LinuxSource(tmp_path / "sys", tmp_path / "proc", ManualClock()).read()
    assert s.temp_c is None and s.limit_c is None and s.kernel_throttling is None
    assert s.mem_available_bytes is None and not s.thermal_known
    assert any("meminfo: missing" in e for e in s.errors)


@pytest.mark.parametrize(
    ("ztype", "name", "counts"),
    [
        ("CPU-therm", "cpu", True),
        ("tj-thermal", "tj", True),
        ("x86_pkg_temp", "x86_pkg_temp", True),
        ("PMIC-Die", "pmic-die", False),
        ("BAT0", "bat0", False),
        ("iwlwifi_1", "iwlwifi_1", False),
    ],
)
def test_zone_names(ztype: str, name: str, counts: bool) -> None:
    assert normalize_zone_name(ztype) == name
    assert zone_counts(ztype) is counts


def test_static_files_are_cached_and_refreshed(tmp_path: Path) -> None:
    fs = fakesys.orin_nano(tmp_path)
    reads: list[Path] = []

    def reader(path: Path) -> str:
        reads.append(path)
        return fs.reader(path)

    clock = ManualClock()
    src = LinuxSource(fs.sys, fs.proc, clock, reader=reader, static_refresh_s=60.0)
    src.read()
    first = len(reads)
    reads.clear()
    fs.write(fs.sys / "class/thermal/thermal_zone8/trip_point_2_temp", 95000)  # tj passive trip moved
    fs.set_temp("tj-thermal", 57.0)
    clock.advance(1.0)
    s = src.read()
    assert len(reads) < first / 2  # trips, types, labels come from the cache
    assert not any("trip_point" in p.name for p in reads)
    assert s.temp_c == 57.0 and s.limit_c == 99.0  # temperatures are always fresh
    clock.advance(60.0)
    assert src.read().limit_c == 95.0  # trips re-read after static_refresh_s


def test_cgroup_path_outside_the_namespace_uses_the_mount(tmp_path: Path) -> None:
    fs = fakesys.cgroup_container(tmp_path)
    fs.write(fs.sys / "fs/user.slice/memory.max", f"{GiB}\n")  # outside the cgroup mount
    fs.write(fs.proc / "self/cgroup", "0::/../user.slice\n")
    s = source(fs).read()
    assert s.cgroup_limit_bytes == 2 * GiB  # the namespace root's limit, nothing above the mount
