"""Linux telemetry read straight from sysfs and procfs, one sensor at a time.

Why not psutil: it drops trip points, ignores cooling devices and cgroups, and
falls back to thermal zones only when hwmon is empty (see docs/thermal.md).
Every reader takes its filesystem roots and a `ReadLog` (readlog.py), so tests
run on fake trees and can make one file fail with ENODATA while the others still
read. Memory, PSI and cgroup readers live in linux_memory.py.

Which sensors feed `Sample.temp_c`: every thermal zone with a plausible reading
(-40..200 °C; Jetson reports -256 for an offline zone) except zones that are not
the SoC or CPU (wifi, battery, charger, PMIC die - a constant 100 °C on older
Jetsons - and the fan estimator). Their trips are also ignored for `limit_c`, since
a battery's passive trip at 45 °C says nothing about the CPU. When no zone
counts, CPU hwmon chips (coretemp, k10temp, ...) are used instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from edge.clock import Clock, SystemClock
from edge.telemetry.cpu import LinuxCpuReader
from edge.telemetry.linux_memory import (
    CgroupMemory,
    combine_psi,
    parse_psi,
    psi_pressure_level,
    read_cgroup_memory,
    read_meminfo,
)
from edge.telemetry.power import PowerReader
from edge.telemetry.readlog import Reader, ReadLog, numbered, read_file
from edge.telemetry.sample import Sample, ThermalZone

PLAUSIBLE_MIN_C = -40.0
PLAUSIBLE_MAX_C = 200.0
_IGNORED_ZONE = re.compile(
    r"wifi|iwl|ath\d|mt7\d|battery|^bat\d*$|charger|pmic|fan-est|thermal-fan|^ambient", re.IGNORECASE
)
_ZONE_SUFFIX = re.compile(r"[-_](thermal|therm|zone)$", re.IGNORECASE)
CPU_HWMON_CHIPS = frozenset({"coretemp", "k10temp", "zenpower", "cpu_thermal", "cpu-thermal", "soc_thermal"})
# Cooling devices whose activity means the kernel is slowing compute down (fans do not count).
_THROTTLING_COOLER = re.compile(r"processor|cpufreq|cpu|devfreq|gpu|powerclamp|throttl", re.IGNORECASE)
_FAN_COOLER = re.compile(r"fan|pwm", re.IGNORECASE)


def plausible_c(temp_c: float | None) -> bool:
    return temp_c is not None and PLAUSIBLE_MIN_C < temp_c < PLAUSIBLE_MAX_C


def normalize_zone_name(zone_type: str) -> str:
    """'CPU-therm' (L4T), 'cpu-thermal' (upstream DT), 'cpu' -> 'cpu'."""
    return _ZONE_SUFFIX.sub("", zone_type.strip()).lower()


def zone_counts(zone_type: str) -> bool:
    """Whether a zone of this type says something about compute temperature."""
    return not _IGNORED_ZONE.search(zone_type)


# --- thermal zones ------------------------------------------------------------


@dataclass(frozen=True)
class TripPoint:
    index: int
    kind: str  # passive | active | hot | critical (as the kernel writes it)
    temp_c: float | None
    hyst_c: float | None = None


@dataclass(frozen=True)
class ZoneReading:
    zone: str  # directory name, e.g. "thermal_zone3"
    type: str  # the kernel's type string, e.g. "tj-thermal"
    temp_c: float | None  # None when unreadable or implausible
    trips: tuple[TripPoint, ...] = ()
    counts: bool = True  # feeds Sample.temp_c and limit_c

    @property
    def name(self) -> str:
        return normalize_zone_name(self.type) or self.zone

    def _lowest(self, kind: str) -> float | None:
        temps = [t.temp_c for t in self.trips if t.kind == kind and t.temp_c is not None]
        return min(temps) if temps else None

    @property
    def passive_trip_c(self) -> float | None:
        return self._lowest("passive")

    @property
    def critical_trip_c(self) -> float | None:
        return self._lowest("critical")

    def to_zone(self) -> ThermalZone:
        return ThermalZone(self.name, self.temp_c, self.passive_trip_c, self.critical_trip_c)


def read_thermal_zones(sysfs_root: Path, log: ReadLog) -> list[ZoneReading]:
    """Every /sys/class/thermal/thermal_zoneN with its trips; each zone read on its own."""
    zones: list[ZoneReading] = []
    for zdir in numbered(sysfs_root / "class" / "thermal", "thermal_zone"):
        ztype = log.text(zdir / "type", static=True) or zdir.name
        temp_c = log.milli(zdir / "temp")
        if temp_c is not None and not plausible_c(temp_c):
            log.note(f"{zdir / 'temp'}: implausible reading {temp_c:.1f} C (sensor offline?)")
            temp_c = None
        trips: list[TripPoint] = []
        for k in range(64):
            kind = log.text(zdir / f"trip_point_{k}_type", required=False, static=True)
            trip_c = log.milli(zdir / f"trip_point_{k}_temp", required=False, static=True)
            if kind is None and trip_c is None:
                break
            if trip_c is not None and not 0.0 < trip_c < PLAUSIBLE_MAX_C:
                trip_c = None  # disabled trips read 0 or a huge sentinel
            hyst_c = log.milli(zdir / f"trip_point_{k}_hyst", required=False, static=True)
            trips.append(TripPoint(k, (kind or "unknown").lower(), trip_c, hyst_c))
        zones.append(ZoneReading(zdir.name, ztype, temp_c, tuple(trips), zone_counts(ztype)))
    return zones


# --- hwmon ----------------------------------------------------------------------


@dataclass(frozen=True)
class HwmonTemp:
    chip: str  # hwmonN/name, e.g. "coretemp"
    label: str  # tempN_label, else "tempN"
    temp_c: float | None
    max_c: float | None = None
    crit_c: float | None = None

    def to_zone(self) -> ThermalZone:
        return ThermalZone(f"hwmon:{self.chip}:{self.label}", self.temp_c, None, self.crit_c)


def read_hwmon_temps(sysfs_root: Path, log: ReadLog) -> list[HwmonTemp]:
    temps: list[HwmonTemp] = []
    for hdir in numbered(sysfs_root / "class" / "hwmon", "hwmon"):
        chip = log.text(hdir / "name", required=False, static=True) or hdir.name
        try:
            inputs = sorted(hdir.glob("temp*_input"), key=lambda p: int(p.name[4:-6] or 0))
        except (OSError, ValueError):
            continue
        for inp in inputs:
            stem = inp.name[: -len("_input")]
            temp_c = log.milli(inp)
            if temp_c is not None and not plausible_c(temp_c):
                log.note(f"{inp}: implausible reading {temp_c:.1f} C")
                temp_c = None
            label = log.text(hdir / f"{stem}_label", required=False, static=True) or stem
            max_c = log.milli(hdir / f"{stem}_max", required=False, static=True)
            crit_c = log.milli(hdir / f"{stem}_crit", required=False, static=True)
            temps.append(HwmonTemp(chip, label, temp_c, max_c, crit_c))
    return temps


# --- cooling devices and CPU frequency caps -----------------------------------------


@dataclass(frozen=True)
class CoolingDevice:
    name: str  # "cooling_device0"
    type: str  # "Processor", "cpufreq-cpu0", "pwm-fan", ...
    cur_state: int | None
    max_state: int | None

    @property
    def throttles_compute(self) -> bool:
        return bool(_THROTTLING_COOLER.search(self.type)) and not _FAN_COOLER.search(self.type)


def read_cooling_devices(sysfs_root: Path, log: ReadLog) -> list[CoolingDevice]:
    devices: list[CoolingDevice] = []
    for cdir in numbered(sysfs_root / "class" / "thermal", "cooling_device"):
        ctype = log.text(cdir / "type", static=True) or cdir.name
        devices.append(
            CoolingDevice(
                cdir.name,
                ctype,
                log.integer(cdir / "cur_state"),
                log.integer(cdir / "max_state", static=True),
            )
        )
    return devices


def cooling_active(devices: list[CoolingDevice]) -> bool | None:
    """True when a compute cooling device is engaged; None when none can be read."""
    relevant = [d for d in devices if d.throttles_compute]
    if any(d.cur_state is not None and d.cur_state > 0 for d in relevant):
        return True
    if not relevant or any(d.cur_state is None for d in relevant):
        return None
    return False


@dataclass(frozen=True)
class CpuFreq:
    cpu: int
    cur_khz: int | None  # scaling_cur_freq: the requested frequency
    scaling_max_khz: int | None  # the cap in force (thermal, nvpmodel, user)
    cpuinfo_max_khz: int | None  # what the silicon can do

    @property
    def capped(self) -> bool | None:
        if self.scaling_max_khz is None or self.cpuinfo_max_khz is None:
            return None
        return self.scaling_max_khz < self.cpuinfo_max_khz


def read_cpu_freqs(sysfs_root: Path, log: ReadLog, with_cur: bool = True) -> list[CpuFreq]:
    """Per-CPU caps; `with_cur=False` skips scaling_cur_freq, which throttling checks do not need."""
    freqs: list[CpuFreq] = []
    for cdir in numbered(sysfs_root / "devices" / "system" / "cpu", "cpu"):
        fdir = cdir / "cpufreq"
        if not fdir.exists():
            continue
        freqs.append(
            CpuFreq(
                int(cdir.name[3:]),
                log.integer(fdir / "scaling_cur_freq", required=False) if with_cur else None,
                log.integer(fdir / "scaling_max_freq"),
                log.integer(fdir / "cpuinfo_max_freq", static=True),
            )
        )
    return freqs


def any_true(flags: list[bool | None]) -> bool | None:
    """True if any is True; False if all are False; None if unknown (or empty)."""
    if any(f is True for f in flags):
        return True
    if not flags or any(f is None for f in flags):
        return None
    return False


# --- the source -----------------------------------------------------------------------


class LinuxSource:
    """Reads every Linux sensor independently into one `Sample`.

    `kernel_throttling` is True when a compute cooling device is engaged or a CPU's
    frequency cap dropped below the cap seen at the first reading. A cap that was
    already there at start (nvpmodel power modes, a user's cpupower setting) is
    reported as `freq_capped` but is not thermal throttling.
    """

    name = "linux"

    def __init__(
        self,
        sysfs_root: Path = Path("/sys"),
        procfs_root: Path = Path("/proc"),
        clock: Clock | None = None,
        reader: Reader = read_file,
        static_refresh_s: float = 60.0,
        cpu_reader: LinuxCpuReader | None = None,
    ) -> None:
        self.sysfs_root = sysfs_root
        self.procfs_root = procfs_root
        self.clock = clock or SystemClock()
        self.reader = reader
        self.static_refresh_s = static_refresh_s  # trips and labels are re-read this often
        self._static: dict[Path, str | None] = {}
        self._static_t_s: float | None = None
        self._cap_baseline_khz: dict[int, int] = {}
        self.cpu = cpu_reader or LinuxCpuReader(procfs_root, sysfs_root)
        self.power = PowerReader(sysfs_root)

    def new_log(self, now_s: float) -> ReadLog:
        """A ReadLog sharing the static-file cache, emptied every `static_refresh_s`."""
        if self._static_t_s is None or now_s - self._static_t_s >= self.static_refresh_s:
            self._static.clear()
            self._static_t_s = now_s
        return ReadLog(self.reader, self._static)

    def read(self) -> Sample:
        t_s = self.clock.monotonic()
        log = self.new_log(t_s)
        fields: dict[str, object] = {}
        groups = (("thermal", self._thermal), ("cpufreq", self._throttle), ("memory", self._memory),
                  ("cpu", lambda lg: self.cpu.read(t_s, lg)), ("power", lambda lg: self._power(lg, t_s)))
        for group, fn in groups:
            try:
                fields.update(fn(log))
            except Exception as exc:  # a bug or odd tree in one group must not hide the others
                log.note(f"{group}: {type(exc).__name__}: {exc}")
        return Sample(t_s=t_s, source=self.name, errors=tuple(log.errors), **fields)  # type: ignore[arg-type]

    def close(self) -> None:
        """Nothing to release; every telemetry source can be closed alike."""

    # Each group returns Sample fields; subclasses (Jetson) reuse them.

    def _thermal(self, log: ReadLog) -> dict[str, object]:
        zones = read_thermal_zones(self.sysfs_root, log)
        hwmon = read_hwmon_temps(self.sysfs_root, log)
        counted = [z for z in zones if z.counts]
        temps = [z.temp_c for z in counted if z.temp_c is not None]
        if not temps:
            temps = [h.temp_c for h in hwmon if h.chip in CPU_HWMON_CHIPS and h.temp_c is not None]
        passive = [z.passive_trip_c for z in counted if z.passive_trip_c is not None]
        critical = [z.critical_trip_c for z in counted if z.critical_trip_c is not None]
        if not critical:
            critical = [h.crit_c for h in hwmon if h.chip in CPU_HWMON_CHIPS and h.crit_c is not None]
        return {
            "zones": tuple(z.to_zone() for z in zones) + tuple(h.to_zone() for h in hwmon),
            "temp_c": max(temps) if temps else None,
            "limit_c": min(passive) if passive else None,
            "critical_c": min(critical) if critical else None,
        }

    def _power(self, log: ReadLog, t_s: float) -> dict[str, object]:
        p = self.power.read(log, t_s)
        return {"power_w": p.power_w, "power_source": p.power_source, "rails": p.rails,
                "on_battery": p.on_battery, "battery_pct": p.battery_pct}

    def _throttle(self, log: ReadLog) -> dict[str, object]:
        active = cooling_active(read_cooling_devices(self.sysfs_root, log))
        freqs = read_cpu_freqs(self.sysfs_root, log, with_cur=False)
        tightened: list[bool | None] = []
        for f in freqs:
            if f.scaling_max_khz is None:
                tightened.append(None)
                continue
            base = self._cap_baseline_khz.setdefault(f.cpu, f.scaling_max_khz)
            self._cap_baseline_khz[f.cpu] = max(base, f.scaling_max_khz)
            tightened.append(f.scaling_max_khz < self._cap_baseline_khz[f.cpu])
        new_cap = any_true(tightened) if freqs else False
        return {
            "cooling_active": active,
            "freq_capped": any_true([f.capped for f in freqs]),
            "kernel_throttling": any_true([active, new_cap]),
        }

    def _memory(self, log: ReadLog) -> dict[str, object]:
        meminfo = read_meminfo(self.procfs_root, log)
        total = meminfo.get("MemTotal")
        available = meminfo.get("MemAvailable")
        if available is None and "MemFree" in meminfo:
            available = meminfo["MemFree"] + meminfo.get("Buffers", 0) + meminfo.get("Cached", 0)
        cg: CgroupMemory | None = None
        try:
            cg = read_cgroup_memory(self.sysfs_root, self.procfs_root, log)
        except Exception as exc:
            log.note(f"cgroup: {type(exc).__name__}: {exc}")
        if available is not None and cg is not None and cg.headroom_bytes is not None:
            available = min(available, cg.headroom_bytes)
        sys_psi = None
        raw = log.text(self.procfs_root / "pressure" / "memory", required=False)
        if raw is not None:
            sys_psi = parse_psi(raw)
            if sys_psi is None:
                log.note(f"{self.procfs_root / 'pressure' / 'memory'}: unparsable {raw[:40]!r}")
        some, full = combine_psi(sys_psi, cg.psi if cg else None)
        return {
            "mem_total_bytes": total,
            "mem_available_bytes": available,
            "cgroup_limit_bytes": cg.limit_bytes if cg else None,
            "cgroup_current_bytes": cg.current_bytes if cg else None,
            "psi_some_avg10": some,
            "psi_full_avg10": full,
            "memory_pressure": psi_pressure_level(some, full),
            "nvmap_used_bytes": meminfo.get("NvMapMemUsed"),
        }
