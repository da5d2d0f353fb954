"""What machine is this? Platform, CPUs, memory, thermal zones and the device profile.

Static facts read once (by `edge doctor`, the planner and `serve` at start),
as opposed to `edge.telemetry`, which samples the same files every second.
Every function takes the filesystem roots (and the platform calls) as
parameters, so tests describe a Jetson or a container as a fake tree.
Anything missing or unreadable comes back as None plus an error line, never as
an exception and never as a guessed value.
"""

from __future__ import annotations

import math
import os
import platform as _platform
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, is_dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from edge.platforms import (
    PlatformInfo,
    PlatformKind,
    detect_platform,
    detected_profile_name,
    fs_roots,
    profile_for,
    read_device_model,
)
from edge.telemetry.linux import (
    CoolingDevice,
    CpuFreq,
    HwmonTemp,
    ZoneReading,
    read_cooling_devices,
    read_cpu_freqs,
    read_hwmon_temps,
    read_thermal_zones,
)
from edge.telemetry.linux_memory import (
    CgroupMemory,
    cgroup_chain,
    cgroup_rel,
    cgroup_v2_mount,
    read_cgroup_memory,
    read_meminfo,
)
from edge.telemetry.readlog import Reader, ReadLog, read_file

__all__ = [
    "PlatformInfo",
    "PlatformKind",
    "SystemFacts",
    "detect_platform",
    "detected_profile_name",
    "probe_system",
    "profile_for",
    "read_device_model",
]


# --- CPUs ---------------------------------------------------------------------------


def _affinity() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS has no sched_getaffinity
        return None


def cpu_quota(
    root: Path = Path("/"),
    sysfs_root: Path | None = None,
    procfs_root: Path | None = None,
    reader: Reader = read_file,
) -> float | None:
    """CPUs' worth of time the cgroup may use (cpu.max / cfs quota), tightest up the tree."""
    sys_root, proc_root = fs_roots(root, sysfs_root, procfs_root)
    log = ReadLog(reader)
    v2 = cgroup_v2_mount(sys_root)
    quotas: list[float] = []
    if v2 is not None:
        for cdir in cgroup_chain(v2, cgroup_rel(proc_root, log, None)):
            parts = (log.text(cdir / "cpu.max", required=False) or "").split()
            if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit() and int(parts[1]) > 0:
                quotas.append(int(parts[0]) / int(parts[1]))
    else:
        for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
            mount = sys_root / "fs" / "cgroup" / name
            if not mount.is_dir():
                continue
            for cdir in cgroup_chain(mount, cgroup_rel(proc_root, log, "cpu")):
                quota = log.integer(cdir / "cpu.cfs_quota_us", required=False)
                period = log.integer(cdir / "cpu.cfs_period_us", required=False)
                if quota is not None and quota > 0 and period:
                    quotas.append(quota / period)
            break
    return min(quotas) if quotas else None


def parse_cpu_list(text: str) -> int | None:
    """'0-3,6,8-9' (sysfs cpu lists) -> 7; None when malformed."""
    n = 0
    try:
        for part in text.strip().split(","):
            lo, _, hi = part.partition("-")
            n += int(hi or lo) - int(lo) + 1
    except ValueError:
        return None
    return n or None


@dataclass(frozen=True)
class CpuInfo:
    logical: int | None  # online CPUs (sysfs cpu/online), else os.cpu_count()
    usable: int | None  # CPUs this process may run on (sched_getaffinity)
    quota_cpus: float | None  # cgroup CPU quota in CPUs (None: no quota)
    effective: int  # what thread counts should be sized to: min(usable, ceil(quota)), >= 1


def cpu_info(
    root: Path = Path("/"),
    sysfs_root: Path | None = None,
    procfs_root: Path | None = None,
    reader: Reader = read_file,
    cpu_count: Callable[[], int | None] = os.cpu_count,
    affinity: Callable[[], int | None] = _affinity,
) -> CpuInfo:
    sys_root, _ = fs_roots(root, sysfs_root, procfs_root)
    online = ReadLog(reader).text(sys_root / "devices" / "system" / "cpu" / "online", required=False)
    logical = (parse_cpu_list(online) if online else None) or cpu_count()
    usable = affinity()
    quota = cpu_quota(root, sysfs_root, procfs_root, reader)
    candidates = [n for n in (usable or logical, math.ceil(quota) if quota else None) if n]
    return CpuInfo(logical, usable, quota, max(1, min(candidates)) if candidates else 1)


# --- memory ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryInfo:
    total_bytes: int | None  # MemTotal (psutil on macOS)
    meminfo_available_bytes: int | None  # MemAvailable as the kernel reports it
    available_bytes: int | None  # min(MemAvailable, cgroup headroom): what we may use
    cgroup: CgroupMemory | None
    nvmap_used_bytes: int | None = None  # Jetson: GPU buffers (NvMap) in the shared RAM


def memory_info(
    root: Path = Path("/"),
    sysfs_root: Path | None = None,
    procfs_root: Path | None = None,
    reader: Reader = read_file,
    log: ReadLog | None = None,
) -> MemoryInfo:
    sys_root, proc_root = fs_roots(root, sysfs_root, procfs_root)
    log = log or ReadLog(reader)
    meminfo = read_meminfo(proc_root, log)
    available = meminfo.get("MemAvailable")
    cg = read_cgroup_memory(sys_root, proc_root, log)
    usable = available
    if usable is not None and cg is not None and cg.headroom_bytes is not None:
        usable = min(usable, cg.headroom_bytes)
    return MemoryInfo(meminfo.get("MemTotal"), available, usable, cg, meminfo.get("NvMapMemUsed"))


def memory_available_bytes(
    root: Path = Path("/"),
    sysfs_root: Path | None = None,
    procfs_root: Path | None = None,
    reader: Reader = read_file,
) -> int | None:
    """min(MemAvailable, cgroup limit - working set); None when /proc/meminfo is unreadable."""
    return memory_info(root, sysfs_root, procfs_root, reader).available_bytes


def memory_total_bytes(
    root: Path = Path("/"),
    sysfs_root: Path | None = None,
    procfs_root: Path | None = None,
    reader: Reader = read_file,
) -> int | None:
    """MemTotal, or the cgroup limit when that is smaller (a container sees the host's RAM)."""
    info = memory_info(root, sysfs_root, procfs_root, reader)
    limit = info.cgroup.limit_bytes if info.cgroup else None
    if info.total_bytes is None:
        return None
    return min(info.total_bytes, limit) if limit is not None else info.total_bytes


def nvmap_used_bytes(root: Path = Path("/"), procfs_root: Path | None = None) -> int | None:
    return read_meminfo(procfs_root or root / "proc", ReadLog()).get("NvMapMemUsed")


def thermal_zones(
    root: Path = Path("/"), sysfs_root: Path | None = None, reader: Reader = read_file
) -> list[ZoneReading]:
    """Every thermal zone with its type, temperature and all trips."""
    return read_thermal_zones(sysfs_root or root / "sys", ReadLog(reader))


# --- everything at once (edge doctor) ----------------------------------------------------


@dataclass(frozen=True)
class SystemFacts:
    platform: PlatformInfo
    profile: str
    profile_source: str  # "settings" or "detected"
    cpu: CpuInfo
    memory: MemoryInfo
    zones: tuple[ZoneReading, ...]
    hwmon: tuple[HwmonTemp, ...]
    cooling: tuple[CoolingDevice, ...]
    cpufreq: tuple[CpuFreq, ...]
    backends: Any | None  # edge.runtime.llama.backend.BackendInfo
    backends_error: str | None = None
    errors: tuple[str, ...] = field(default_factory=tuple)


def probe_system(
    root: Path = Path("/"),
    sysfs_root: Path | None = None,
    procfs_root: Path | None = None,
    profile_override: str | None = None,
    system: Callable[[], str] = _platform.system,
    machine: Callable[[], str] = _platform.machine,
    reader: Reader = read_file,
    cpu_count: Callable[[], int | None] = os.cpu_count,
    affinity: Callable[[], int | None] = _affinity,
    backends: Callable[[], Any] | None = None,  # edge.runtime.llama.backend.probe_backends (doctor passes it)
    virtual_memory: Callable[[], Any] | None = None,
) -> SystemFacts:
    """Gather every static fact; each part is read on its own and may come back unknown."""
    sys_root, proc_root = fs_roots(root, sysfs_root, procfs_root)
    log = ReadLog(reader)
    info = detect_platform(root, sys_root, proc_root, system, machine, reader)
    profile = profile_override or profile_for(info)
    if info.system == "Darwin":  # no /proc: psutil asks the Mach VM statistics
        mem = _psutil_memory(virtual_memory, log)
    else:
        mem = memory_info(root, sys_root, proc_root, reader, log)
    backend_info, backend_error = None, None
    if backends is not None:
        try:
            backend_info = backends()
            backend_error = getattr(backend_info, "error", None)
        except Exception as exc:  # ImportError while backend.py is missing, or a broken build
            backend_error = f"{type(exc).__name__}: {exc}"
    return SystemFacts(
        platform=info,
        profile=profile,
        profile_source="settings" if profile_override else "detected",
        cpu=cpu_info(root, sys_root, proc_root, reader, cpu_count, affinity),
        memory=mem,
        zones=tuple(read_thermal_zones(sys_root, log)),
        hwmon=tuple(read_hwmon_temps(sys_root, log)),
        cooling=tuple(read_cooling_devices(sys_root, log)),
        cpufreq=tuple(read_cpu_freqs(sys_root, log)),
        backends=backend_info,
        backends_error=backend_error,
        errors=tuple(log.errors),
    )


def _psutil_memory(virtual_memory: Callable[[], Any] | None, log: ReadLog) -> MemoryInfo:
    try:
        if virtual_memory is None:
            import psutil

            virtual_memory = psutil.virtual_memory
        vm = virtual_memory()
        return MemoryInfo(int(vm.total), int(vm.available), int(vm.available), None)
    except Exception as exc:
        log.note(f"memory: {type(exc).__name__}: {exc}")
        return MemoryInfo(None, None, None, None)


def to_plain(value: Any) -> Any:
    """Dataclasses, enums and paths as JSON-ready values (for `edge doctor --json`)."""
    if is_dataclass(value) and not isinstance(value, type):
        return to_plain(asdict(value))
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value
