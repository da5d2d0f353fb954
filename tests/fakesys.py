"""Builders of fake /sys, /proc and /etc trees for telemetry and probe tests.

A `FakeSys` writes files the way the kernel lays them out (milli-°C, kB,
trip_point_K_{temp,type,hyst}, cooling_deviceN, cpuN/cpufreq, hwmonN, INA3221
under /sys/bus/i2c/drivers, cgroup v2 and v1, device-tree model with a trailing
NUL). `reader` is the injected file reader: paths marked with `break_file` raise
OSError with the chosen errno (ENODATA, EIO), as a real driver does.

Ready-made machines: `orin_nano`, `agx_orin`, `raspberry_pi`, `generic_x86`,
`cgroup_container`, `cgroup_v1_container`, `broken_box`.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

GiB = 1 << 30
MiB = 1 << 20

# Tegra234 thermal zones: passive sw-throttle at 99.0 °C, critical sw-shutdown at 104.5 °C.
ORIN_ZONES = ("cpu", "gpu", "cv0", "cv1", "cv2", "soc0", "soc1", "soc2", "tj")
ORIN_PASSIVE_C = 99.0
ORIN_CRITICAL_C = 104.5


class FakeSys:
    """One fake machine rooted at `root` (root/sys, root/proc, root/etc)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sys = root / "sys"
        self.proc = root / "proc"
        self.broken: dict[Path, int] = {}
        self._zones: dict[str, Path] = {}
        self.sys.mkdir(parents=True, exist_ok=True)
        self.proc.mkdir(parents=True, exist_ok=True)

    # --- raw files ---

    def write(self, path: Path | str, content: str | int) -> Path:
        p = self.root / path if isinstance(path, str) else path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"{content}\n" if isinstance(content, int) else content)
        return p

    def break_file(self, path: Path, code: int = errno.ENODATA) -> None:
        """Reading `path` raises OSError(code), like a sensor that is not ready."""
        if not path.exists():
            self.write(path, "0")
        self.broken[path] = code

    def reader(self, path: Path) -> str:
        if path in self.broken:
            code = self.broken[path]
            raise OSError(code, os.strerror(code), str(path))
        return path.read_text()

    # --- thermal ---

    def thermal_zone(
        self,
        ztype: str,
        temp_c: float | None,
        trips: tuple[tuple[str, float], ...] = (),
        hyst_c: float = 0.0,
    ) -> Path:
        base = self.sys / "class" / "thermal"
        n = len(list(base.glob("thermal_zone*"))) if base.exists() else 0
        zdir = base / f"thermal_zone{n}"
        self.write(zdir / "type", f"{ztype}\n")
        self.write(zdir / "policy", "step_wise\n")
        if temp_c is not None:
            self.write(zdir / "temp", round(temp_c * 1000))
        for k, (kind, trip_c) in enumerate(trips):
            self.write(zdir / f"trip_point_{k}_type", f"{kind}\n")
            self.write(zdir / f"trip_point_{k}_temp", round(trip_c * 1000))
            self.write(zdir / f"trip_point_{k}_hyst", round(hyst_c * 1000))
        self._zones[ztype] = zdir
        return zdir

    def set_temp(self, ztype: str, temp_c: float) -> None:
        self.write(self._zones[ztype] / "temp", round(temp_c * 1000))

    def cooling_device(self, ctype: str, cur_state: int, max_state: int) -> Path:
        base = self.sys / "class" / "thermal"
        n = len(list(base.glob("cooling_device*"))) if base.exists() else 0
        cdir = base / f"cooling_device{n}"
        self.write(cdir / "type", f"{ctype}\n")
        self.write(cdir / "cur_state", cur_state)
        self.write(cdir / "max_state", max_state)
        return cdir

    def cpus(self, n: int, cpuinfo_max_khz: int, scaling_max_khz: int | None = None) -> None:
        for i in range(n):
            fdir = self.sys / "devices" / "system" / "cpu" / f"cpu{i}" / "cpufreq"
            self.write(fdir / "cpuinfo_max_freq", cpuinfo_max_khz)
            self.write(fdir / "cpuinfo_min_freq", cpuinfo_max_khz // 8)
            self.write(fdir / "scaling_max_freq", scaling_max_khz or cpuinfo_max_khz)
            self.write(fdir / "scaling_cur_freq", scaling_max_khz or cpuinfo_max_khz)
        self.write(self.sys / "devices" / "system" / "cpu" / "online", f"0-{n - 1}\n")

    def cap_cpus(self, scaling_max_khz: int) -> None:
        for f in (self.sys / "devices" / "system" / "cpu").glob("cpu*/cpufreq/scaling_max_freq"):
            self.write(f, scaling_max_khz)

    def hwmon(self, name: str, temps: tuple[tuple[str, float, float | None, float | None], ...]) -> Path:
        """temps: (label, temp_c, max_c, crit_c)."""
        base = self.sys / "class" / "hwmon"
        n = len(list(base.glob("hwmon*"))) if base.exists() else 0
        hdir = base / f"hwmon{n}"
        self.write(hdir / "name", f"{name}\n")
        for i, (label, temp_c, max_c, crit_c) in enumerate(temps, start=1):
            self.write(hdir / f"temp{i}_label", f"{label}\n")
            self.write(hdir / f"temp{i}_input", round(temp_c * 1000))
            if max_c is not None:
                self.write(hdir / f"temp{i}_max", round(max_c * 1000))
            if crit_c is not None:
                self.write(hdir / f"temp{i}_crit", round(crit_c * 1000))
        return hdir

    def ina3221(self, device: str, rails: tuple[tuple[str, int, int], ...], hwmon: int = 3) -> Path:
        """rails: (label, millivolts, milliamps) on channels 1..3."""
        hdir = self.sys / "bus" / "i2c" / "drivers" / "ina3221" / device / "hwmon" / f"hwmon{hwmon}"
        self.write(hdir / "name", "ina3221\n")
        for ch, (label, mv, ma) in enumerate(rails, start=1):
            self.write(hdir / f"in{ch}_label", f"{label}\n")
            self.write(hdir / f"in{ch}_input", mv)
            self.write(hdir / f"curr{ch}_input", ma)
            self.write(hdir / f"curr{ch}_max", 4000)
        return hdir

    def ina3221_iio(self, device: str, rails: tuple[tuple[str, int, int, int], ...]) -> Path:
        """JetPack 4 layout (driver ina3221x): (rail name, mV, mA, mW) on channels 0..2."""
        idir = self.sys / "bus" / "i2c" / "drivers" / "ina3221x" / device / "iio:device0"
        for ch, (name, mv, ma, mw) in enumerate(rails):
            self.write(idir / f"rail_name_{ch}", f"{name}\n")
            self.write(idir / f"in_voltage{ch}_input", mv)
            self.write(idir / f"in_current{ch}_input", ma)
            self.write(idir / f"in_power{ch}_input", mw)
        return idir

    def _next_hwmon(self) -> Path:
        base = self.sys / "class" / "hwmon"
        return base / f"hwmon{len(list(base.glob('hwmon*'))) if base.exists() else 0}"

    def hwmon_power(self, name: str, powers_uw: tuple[tuple[str, int], ...]) -> Path:
        hdir = self._next_hwmon()
        self.write(hdir / "name", f"{name}\n")
        for i, (label, uw) in enumerate(powers_uw, start=1):
            self.write(hdir / f"power{i}_input", uw)
            self.write(hdir / f"power{i}_label", f"{label}\n")
        return hdir

    def fan(self, name: str, pwm: int | None, rpm: int | None) -> Path:
        hdir = self._next_hwmon()
        self.write(hdir / "name", f"{name}\n")
        if pwm is not None:
            self.write(hdir / "pwm1", pwm)
        if rpm is not None:
            self.write(hdir / "fan1_input", rpm)
        return hdir

    def power_supply(self, name: str, kind: str, **files: int | str) -> Path:
        """/sys/class/power_supply/NAME with `type` and the given files (online, status, capacity, ...)."""
        sdir = self.sys / "class" / "power_supply" / name
        self.write(sdir / "type", f"{kind}\n")
        for key, value in files.items():
            self.write(sdir / key, value if isinstance(value, int) else f"{value}\n")
        return sdir

    def rapl(self, index: int, energy_uj: int, max_energy_range_uj: int = 262143328850) -> Path:
        ddir = self.sys / "class" / "powercap" / f"intel-rapl:{index}"
        self.write(ddir / "name", f"package-{index}\n")
        self.write(ddir / "energy_uj", energy_uj)
        self.write(ddir / "max_energy_range_uj", max_energy_range_uj)
        sub = self.sys / "class" / "powercap" / f"intel-rapl:{index}:0"  # a sub-domain: not summed
        self.write(sub / "name", "core\n")
        self.write(sub / "energy_uj", energy_uj // 2)
        return ddir

    def etc(self, name: str, text: str) -> Path:
        return self.write(self.root / "etc" / name, text)

    def gpu_devfreq(self, name: str, load_per_mille: int) -> Path:
        ddir = self.sys / "class" / "devfreq" / name
        self.write(ddir / "cur_freq", 624750000)
        self.write(ddir / "device" / "load", load_per_mille)
        return ddir / "device" / "load"

    # --- memory ---

    def meminfo(
        self, total: int, available: int | None, free: int | None = None, nvmap: int | None = None
    ) -> None:
        kb = 1024
        lines = [f"MemTotal:       {total // kb} kB", f"MemFree:        {(free or total // 4) // kb} kB"]
        if available is not None:
            lines.append(f"MemAvailable:   {available // kb} kB")
        lines += ["Buffers:           20480 kB", f"Cached:         {total // 8 // kb} kB", "SwapTotal: 0 kB"]
        if nvmap is not None:
            lines.append(f"NvMapMemUsed:   {nvmap // kb} kB")
        self.write(self.proc / "meminfo", "\n".join(lines) + "\n")

    def psi(self, some_avg10: float, full_avg10: float, path: Path | None = None) -> None:
        text = (
            f"some avg10={some_avg10:.2f} avg60=0.50 avg300=0.10 total=123456\n"
            f"full avg10={full_avg10:.2f} avg60=0.10 avg300=0.02 total=23456\n"
        )
        self.write(path or self.proc / "pressure" / "memory", text)

    def cgroup_v2(
        self,
        rel: str = "",
        max_bytes: int | None = None,
        current_bytes: int = 0,
        inactive_file_bytes: int = 0,
        high_bytes: int | None = None,
        psi: tuple[float, float] | None = None,
        cpu_max: str = "max 100000",
    ) -> Path:
        """A pure v2 hierarchy; the process sits in `rel` ('' = namespace root, as in a container)."""
        mount = self.sys / "fs" / "cgroup"
        self.write(mount / "cgroup.controllers", "cpuset cpu io memory pids\n")
        cdir = mount / rel if rel else mount
        self.write(cdir / "memory.max", "max\n" if max_bytes is None else f"{max_bytes}\n")
        self.write(cdir / "memory.high", "max\n" if high_bytes is None else f"{high_bytes}\n")
        self.write(cdir / "memory.current", current_bytes)
        self.write(cdir / "memory.stat", f"anon {current_bytes}\ninactive_file {inactive_file_bytes}\n")
        self.write(cdir / "cpu.max", f"{cpu_max}\n")
        if psi is not None:
            self.psi(psi[0], psi[1], cdir / "memory.pressure")
        self.write(self.proc / "self" / "cgroup", f"0::/{rel}\n")
        return cdir

    def cgroup_v1(self, rel: str, limit_bytes: int, usage_bytes: int, quota_us: int = -1) -> Path:
        mount = self.sys / "fs" / "cgroup"
        mdir = mount / "memory" / rel
        self.write(mdir / "memory.limit_in_bytes", limit_bytes)
        self.write(mdir / "memory.usage_in_bytes", usage_bytes)
        self.write(mdir / "memory.stat", f"cache 0\ntotal_inactive_file {8 * MiB}\n")
        self.write(mount / "memory" / "memory.limit_in_bytes", 9223372036854771712)
        self.write(mount / "cpu" / "cpu.cfs_quota_us", quota_us)
        self.write(mount / "cpu" / "cpu.cfs_period_us", 100000)
        self.write(mount / "unified" / "cgroup.procs", "1\n")
        self.write(self.proc / "self" / "cgroup", f"4:memory:/{rel}\n1:cpu,cpuacct:/\n0::/\n")
        return mdir

    # --- identity ---

    def model(self, text: str) -> None:
        self.write(self.proc / "device-tree" / "model", text + "\x00")

    def nv_tegra_release(self, text: str) -> None:
        self.write(self.root / "etc" / "nv_tegra_release", text)


def _orin(fs: FakeSys, model: str, zone_fmt: str, temps_c: dict[str, float]) -> FakeSys:
    fs.model(model)
    fs.nv_tegra_release("# R36 (release), REVISION: 4.0, GCID: 37537400, BOARD: generic, EABI: aarch64\n")
    for z in ORIN_ZONES:
        trips: tuple[tuple[str, float], ...] = (("passive", ORIN_PASSIVE_C), ("critical", ORIN_CRITICAL_C))
        if z == "tj":  # the fan's active trips live on the junction zone
            trips = (("active", 46.0), ("active", 60.0), *trips)
        fs.thermal_zone(zone_fmt.format(z), temps_c.get(z, 45.0), trips, hyst_c=2.0)
    fs.cooling_device("pwm-fan", 3, 10)  # a spinning fan is not throttling
    fs.cooling_device("cpufreq-cpu0", 0, 20)
    fs.cooling_device("devfreq-17000000.gpu", 0, 10)
    return fs


def orin_nano(root: Path) -> FakeSys:
    """Orin Nano 8 GB: upstream zone names (cpu-thermal), one INA3221 with VDD_IN."""
    fs = _orin(
        FakeSys(root),
        "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super",
        "{}-thermal",
        {"cpu": 52.5, "gpu": 50.0, "cv0": 49.0, "soc0": 48.0, "tj": 53.0},
    )
    fs.cpus(6, cpuinfo_max_khz=1728000)
    fs.meminfo(total=7620 * MiB, available=5 * GiB, nvmap=300 * MiB)
    fs.psi(0.0, 0.0)
    fs.cgroup_v2(rel="user.slice/user-1000.slice/session-1.scope")
    fs.ina3221("1-0040", (("VDD_IN", 5056, 1480), ("VDD_CPU_GPU_CV", 5064, 420), ("VDD_SOC", 5072, 300)))
    fs.gpu_devfreq("17000000.gpu", 345)
    return fs


def agx_orin(root: Path) -> FakeSys:
    """AGX Orin 64 GB: L4T zone names (CPU-therm), cv2 offline (-256 °C), two INA3221s."""
    fs = _orin(
        FakeSys(root),
        "NVIDIA Jetson AGX Orin Developer Kit",
        "{}-therm",
        {"cpu": 61.0, "gpu": 58.5, "cv2": -256.0, "tj": 62.25},
    )
    fs.cpus(12, cpuinfo_max_khz=2201600)
    fs.meminfo(total=62 * GiB, available=50 * GiB, nvmap=2 * GiB)
    fs.psi(0.0, 0.0)
    fs.cgroup_v2(rel="system.slice/edge.service")
    fs.ina3221(
        "1-0040", (("VDD_GPU_SOC", 5000, 2000), ("VDD_CPU_CV", 5000, 1000), ("VIN_SYS_5V0", 5000, 800))
    )
    fs.ina3221("1-0041", (("NC", 0, 0), ("VDDQ_VDD2_1V8AO", 5000, 400), ("NC", 0, 0)), hwmon=4)
    fs.gpu_devfreq("17000000.ga10b", 870)
    return fs


def laptop_with_battery(root: Path, *, ac_online: bool = False, capacity: int = 64) -> FakeSys:
    """An x86 laptop: AC adapter, a battery reporting power_now, RAPL, a wireless mouse's battery."""
    fs = generic_x86(root)
    fs.power_supply("AC", "Mains", online=int(ac_online))
    fs.power_supply("BAT0", "Battery", status="Charging" if ac_online else "Discharging",
                    capacity=capacity, power_now=11_250_000, voltage_now=11_400_000)
    fs.power_supply("hidpp_battery_0", "Battery", scope="Device", capacity=5, status="Discharging")
    fs.rapl(0, 1_000_000_000)
    return fs


def x86_rapl(root: Path) -> FakeSys:
    """An x86 desktop with RAPL only (no battery, no hwmon power)."""
    fs = generic_x86(root)
    fs.rapl(0, 5_000_000)
    return fs


def raspberry_pi(root: Path) -> FakeSys:
    fs = FakeSys(root)
    fs.model("Raspberry Pi 5 Model B Rev 1.0")
    fs.thermal_zone("cpu-thermal", 58.3, (("passive", 85.0), ("critical", 110.0)))
    fs.hwmon("cpu_thermal", (("temp1", 58.3, None, 110.0),))
    fs.cooling_device("pwm-fan", 1, 4)
    fs.cpus(4, cpuinfo_max_khz=2400000)
    fs.meminfo(total=8 * GiB, available=6 * GiB)
    fs.psi(1.5, 0.0)
    fs.cgroup_v2(rel="user.slice")
    return fs


def generic_x86(root: Path) -> FakeSys:
    """A laptop: acpitz + x86_pkg_temp zones, a battery zone with a low trip, coretemp hwmon."""
    fs = FakeSys(root)
    fs.thermal_zone("acpitz", 48.0, (("critical", 120.0),))
    fs.thermal_zone("x86_pkg_temp", 71.0, (("passive", 95.0),))
    fs.thermal_zone("battery", 36.0, (("passive", 45.0),))
    fs.thermal_zone("iwlwifi_1", 41.0)
    fs.hwmon("coretemp", (("Package id 0", 71.0, 100.0, 100.0), ("Core 0", 69.0, 100.0, 100.0)))
    fs.hwmon("nvme", (("Composite", 39.9, 81.8, 84.8),))
    fs.cooling_device("Fan", 2, 5)
    fs.cooling_device("Processor", 0, 3)
    fs.cooling_device("intel_powerclamp", 0, 50)
    fs.cpus(8, cpuinfo_max_khz=4700000)
    fs.meminfo(total=32 * GiB, available=20 * GiB)
    fs.psi(0.0, 0.0)
    fs.cgroup_v2(rel="user.slice/user-1000.slice/user@1000.service/app.slice")
    return fs


def cgroup_container(root: Path) -> FakeSys:
    """A container limited to 2 GiB and 1.5 CPUs (cgroup namespace: '0::/') on a 64 GiB host."""
    fs = FakeSys(root)
    fs.thermal_zone("x86_pkg_temp", 55.0, (("passive", 95.0),))
    fs.cpus(16, cpuinfo_max_khz=3000000)
    fs.meminfo(total=64 * GiB, available=40 * GiB)
    fs.psi(0.0, 0.0)
    fs.cgroup_v2(
        max_bytes=2 * GiB,
        current_bytes=1536 * MiB,
        inactive_file_bytes=256 * MiB,
        psi=(12.0, 3.0),
        cpu_max="150000 100000",
    )
    return fs


def cgroup_v1_container(root: Path) -> FakeSys:
    """Hybrid v1 hierarchy (no cgroup.controllers at the top): 4 GiB limit, 2 CPUs of quota."""
    fs = FakeSys(root)
    fs.meminfo(total=64 * GiB, available=40 * GiB)
    fs.cgroup_v1("docker/abc123", limit_bytes=4 * GiB, usage_bytes=1 * GiB, quota_us=200000)
    return fs


def broken_box(root: Path) -> FakeSys:
    """Sensors that fail in every way a real box shows, next to ones that work.

    - zone0 cpu-thermal: temp raises ENODATA (sensor not ready)
    - zone1 gpu-thermal: temp is a directory (EISDIR), trip files missing
    - zone2 soc-thermal: temp is garbage text
    - zone3 tj-thermal: temp raises EIO
    - zone4 ddr-thermal: a good reading (63 °C) whose trip type file raises EIO
    - cooling_device0 Processor: cur_state garbage; cpu0 scaling_max_freq missing
    - /proc/pressure/memory missing (kernel without PSI); meminfo fine
    """
    fs = FakeSys(root)
    z0 = fs.thermal_zone("cpu-thermal", 50.0, (("passive", 95.0),))
    fs.break_file(z0 / "temp", errno.ENODATA)
    z1 = fs.thermal_zone("gpu-thermal", None)
    (z1 / "temp").mkdir(parents=True)
    z2 = fs.thermal_zone("soc-thermal", None, (("critical", 105.0),))
    fs.write(z2 / "temp", "n/a\n")
    z3 = fs.thermal_zone("tj-thermal", 70.0, (("passive", 90.0),))
    fs.break_file(z3 / "temp", errno.EIO)
    z4 = fs.thermal_zone("ddr-thermal", 63.0, (("passive", 92.0),))
    fs.break_file(z4 / "trip_point_0_type", errno.EIO)
    cdev = fs.cooling_device("Processor", 0, 3)
    fs.write(cdev / "cur_state", "???\n")
    fs.cpus(2, cpuinfo_max_khz=2000000)
    (fs.sys / "devices" / "system" / "cpu" / "cpu0" / "cpufreq" / "scaling_max_freq").unlink()
    fs.meminfo(total=4 * GiB, available=3 * GiB)
    return fs
