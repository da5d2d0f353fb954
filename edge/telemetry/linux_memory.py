"""Linux memory telemetry: /proc/meminfo, PSI, and the cgroup (v2 and v1) memory limits.

Read independently of the thermal sensors (linux.py); `MemAvailable`, not
`MemFree`, is what can be used, and the cgroup limit may be tighter than the host's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edge.telemetry.readlog import ReadLog
from edge.telemetry.sample import PressureLevel

# PSI thresholds (percent of wall time stalled over 10 s); inferred, see docs/thermal.md.
PSI_SOME_MODERATE = 10.0
PSI_FULL_HEAVY = 2.0
PSI_FULL_CRITICAL = 10.0
_V1_UNLIMITED = 1 << 62  # v1 writes "no limit" as 0x7FFFFFFFFFFFF000 (page-rounded LONG_MAX)


def read_meminfo(procfs_root: Path, log: ReadLog) -> dict[str, int]:
    """/proc/meminfo as bytes per key; {} when unreadable."""
    raw = log.text(procfs_root / "meminfo")
    out: dict[str, int] = {}
    for line in (raw or "").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    if raw is not None and "MemTotal" not in out:
        log.note(f"{procfs_root / 'meminfo'}: no MemTotal line")
    return out


def parse_psi(text: str) -> dict[str, float] | None:
    """'some avg10=1.00 ...' / 'full avg10=...' -> {'some': 1.0, 'full': ...} (avg10, percent)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        for item in rest.split():
            key, _, val = item.partition("=")
            if key == "avg10":
                try:
                    out[kind] = float(val)
                except ValueError:
                    return None
    return out if "some" in out else None


def psi_pressure_level(some: float | None, full: float | None) -> PressureLevel | None:
    if some is None and full is None:
        return None
    if full is not None and full >= PSI_FULL_CRITICAL:
        return PressureLevel.CRITICAL
    if full is not None and full >= PSI_FULL_HEAVY:
        return PressureLevel.HEAVY
    if some is not None and some >= PSI_SOME_MODERATE:
        return PressureLevel.MODERATE
    return PressureLevel.NOMINAL


@dataclass(frozen=True)
class CgroupMemory:
    """Memory facts of this process's cgroup, walked up to the root of the mount.

    `headroom_bytes` is min over the leaf and its ancestors of limit - working set,
    where working set = usage - inactive_file (what the kernel cannot just drop;
    the same accounting Kubernetes uses for evictions). `limit_bytes` is the
    tightest of memory.max and memory.high (above high, the kernel throttles).
    """

    version: int  # 1 or 2
    path: Path  # the leaf cgroup directory
    limit_bytes: int | None
    current_bytes: int | None
    headroom_bytes: int | None
    psi: dict[str, float] | None = None  # v2 memory.pressure of the leaf


def cgroup_rel(procfs_root: Path, log: ReadLog, controller: str | None) -> str | None:
    """This process's cgroup path: the '0::/x' line (v2) or the 'N:memory:/x' line (v1)."""
    for line in (log.text(procfs_root / "self" / "cgroup", required=False, static=True) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if (controller is None and parts[0] == "0") or (controller and controller in parts[1].split(",")):
            return parts[2].lstrip("/")
    return None


def cgroup_chain(mount: Path, rel: str | None) -> list[Path]:
    """Leaf first, then ancestors up to the mount; the mount alone when the leaf is
    not visible (a cgroup namespace or a v1 container shows the host's path)."""
    leaf = mount / rel if rel else mount
    if ".." in Path(rel or ".").parts or not leaf.is_dir():  # "/../x": outside our namespace
        leaf = mount
    chain = [leaf]
    while chain[-1] != mount and mount in chain[-1].parents:
        chain.append(chain[-1].parent)
    return chain


def cgroup_v2_mount(sysfs_root: Path) -> Path | None:
    mount = sysfs_root / "fs" / "cgroup"
    return mount if (mount / "cgroup.controllers").exists() else None


def read_cgroup_memory(sysfs_root: Path, procfs_root: Path, log: ReadLog) -> CgroupMemory | None:
    """The cgroup memory limit and headroom; None when there is no cgroup fs."""
    v2 = cgroup_v2_mount(sysfs_root)
    if v2 is not None:
        chain = cgroup_chain(v2, cgroup_rel(procfs_root, log, None))
        files = ("memory.max", "memory.current", "inactive_file")
        version = 2
    else:
        mount = sysfs_root / "fs" / "cgroup" / "memory"
        if not mount.is_dir():
            return None
        chain = cgroup_chain(mount, cgroup_rel(procfs_root, log, "memory"))
        files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        version = 1
    limits: list[int] = []
    headrooms: list[int] = []
    leaf_current: int | None = None
    for i, cdir in enumerate(chain):
        caps = [log.text(cdir / files[0], required=False)]
        if version == 2:
            caps.append(log.text(cdir / "memory.high", required=False))
        cap = None
        for raw in caps:
            if raw is None or raw == "max":
                continue
            try:
                value = int(raw)
            except ValueError:
                log.note(f"{cdir}: limit not a number: {raw[:40]!r}")
                continue
            if value < _V1_UNLIMITED:
                cap = value if cap is None else min(cap, value)
        current = log.integer(cdir / files[1], required=False)
        if i == 0:
            leaf_current = current
        if cap is None:
            continue
        limits.append(cap)
        if current is not None:
            stat = log.text(cdir / "memory.stat", required=False) or ""
            fields = dict(ln.split(" ", 1) for ln in stat.splitlines() if " " in ln)
            inactive = int(fields.get(files[2], "0")) if fields.get(files[2], "0").isdigit() else 0
            headrooms.append(max(0, cap - max(0, current - inactive)))
    psi = None
    if version == 2:
        raw_psi = log.text(chain[0] / "memory.pressure", required=False)
        psi = parse_psi(raw_psi) if raw_psi else None
    return CgroupMemory(
        version,
        chain[0],
        min(limits) if limits else None,
        leaf_current,
        min(headrooms) if headrooms else None,
        psi,
    )


def combine_psi(*psis: dict[str, float] | None) -> tuple[float | None, float | None]:
    """Worst 'some' and 'full' avg10 of the system and the cgroup."""
    some = [p["some"] for p in psis if p and "some" in p]
    full = [p["full"] for p in psis if p and "full" in p]
    return (max(some) if some else None, max(full) if full else None)
