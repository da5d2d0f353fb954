"""CPU contention: how much of the cores edge may use other processes take.

Decode threads wait for each other at a barrier after every op, so one decode
thread sharing its core with a busy process of equal priority stalls all of them:
on a 2-core box, 2 threads beside such a neighbour decoded ~3x slower than 1
thread on the free core. The scheduler answers by decoding with the cores that
are actually free (`scheduler/thermal.py`'s sibling stage in the controller);
this module measures what it needs, as rates between two readings:

    other cores = (busy time of those cores - this process's own CPU time) / wall time
                  + steal time (a hypervisor ran someone else on them) / wall time

Busy time is user + system + irq + softirq from /proc/stat for the CPUs in this
process's affinity; `nice` time is left out unless edge itself runs niced: a
niced neighbour yields to edge (it took ~7 % of a 2-thread decode's speed). The
cgroup's CPU throttling (cpu.stat) and PSI cpu are reported too. The first
reading, and any reading that cannot be taken, is unknown (None), never "none".
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edge.telemetry.linux_memory import cgroup_chain, cgroup_rel, cgroup_v2_mount, parse_psi
from edge.telemetry.readlog import ReadLog


@dataclass(frozen=True)
class CpuCounters:
    """Cumulative CPU seconds at monotonic time `t_s`, over the cores edge may use."""

    t_s: float
    n_cores: int
    busy_s: float  # user + system + irq + softirq (+ nice when edge itself runs niced)
    steal_s: float | None  # None where the platform does not report steal
    own_s: float  # this process: user + system
    throttled_s: float | None = None  # cgroup cpu.stat throttled time (None: no cgroup CPU controller)
    niced: bool = False  # edge ran niced: busy_s includes nice time


@dataclass(frozen=True)
class Contention:
    """Rates between two readings; the Sample fields of the same names."""

    cpu_cores: int
    cpu_other_cores: float  # CPU time others took on edge's cores, in cores (steal included)
    cpu_steal_cores: float | None
    cpu_throttled_pct: float | None  # cgroup: share of wall time this cgroup was throttled


def contention(prev: CpuCounters, now: CpuCounters) -> Contention | None:
    """The rates from `prev` to `now`; None when they cannot be compared."""
    dt = now.t_s - prev.t_s
    if dt <= 0.05 or now.n_cores != prev.n_cores or now.niced != prev.niced:
        return None
    steal = None
    if now.steal_s is not None and prev.steal_s is not None:
        steal = max(0.0, (now.steal_s - prev.steal_s) / dt)
    busy = max(0.0, now.busy_s - prev.busy_s)
    own = max(0.0, now.own_s - prev.own_s)
    other = max(0.0, busy - own) / dt + (steal or 0.0)
    throttled = None
    if now.throttled_s is not None and prev.throttled_s is not None:
        throttled = min(100.0, max(0.0, 100.0 * (now.throttled_s - prev.throttled_s) / dt))
    return Contention(now.n_cores, min(float(now.n_cores), round(other, 3)),
                      None if steal is None else round(steal, 3), throttled)


def parse_proc_stat(text: str, cpus: set[int] | None, clk_tck: int, niced: bool) -> tuple[int, float, float]:
    """(cores counted, busy seconds, steal seconds) from /proc/stat's per-CPU lines."""
    n, busy, steal = 0, 0, 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        try:
            idx = int(name[3:])
            f = [int(x) for x in rest.split()]
        except ValueError:
            continue
        if (cpus is not None and idx not in cpus) or len(f) < 7:
            continue
        user, nice, system, _idle, _iowait, irq, softirq = f[:7]
        n += 1
        busy += user + system + irq + softirq + (nice if niced else 0)
        steal += f[7] if len(f) > 7 else 0
    return n, busy / clk_tck, steal / clk_tck


def _own_cpu_s() -> tuple[float, bool]:
    """This process's user + system CPU seconds, and whether it runs niced."""
    t = os.times()
    try:
        niced = os.getpriority(os.PRIO_PROCESS, 0) > 0
    except (AttributeError, OSError):
        niced = False
    return t.user + t.system, niced


def _affinity() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


class LinuxCpuReader:
    """Reads the counters from procfs/sysfs (roots are parameters so tests use fake trees)."""

    def __init__(
        self,
        procfs_root: Path = Path("/proc"),
        sysfs_root: Path = Path("/sys"),
        own_cpu: Callable[[], tuple[float, bool]] = _own_cpu_s,
        affinity: Callable[[], set[int] | None] = _affinity,
        clk_tck: int | None = None,
    ) -> None:
        self.procfs_root, self.sysfs_root = procfs_root, sysfs_root
        self.own_cpu, self.affinity = own_cpu, affinity
        self.clk_tck = clk_tck or (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
        self._prev: CpuCounters | None = None

    def counters(self, t_s: float, log: ReadLog) -> CpuCounters | None:
        raw = log.text(self.procfs_root / "stat", required=False)  # absent: unknown, not an error
        if raw is None:
            return None
        own_s, niced = self.own_cpu()
        n, busy_s, steal_s = parse_proc_stat(raw, self.affinity(), self.clk_tck, niced)
        if n == 0:
            log.note(f"{self.procfs_root / 'stat'}: no per-CPU lines for this process's CPUs")
            return None
        return CpuCounters(t_s, n, busy_s, steal_s, own_s, self._throttled_s(log), niced)

    def _throttled_s(self, log: ReadLog) -> float | None:
        """Cumulative throttled time of this process's cgroup (v2 throttled_usec, v1 throttled_time ns)."""
        v2 = cgroup_v2_mount(self.sysfs_root)
        if v2 is not None:
            leaf = cgroup_chain(v2, cgroup_rel(self.procfs_root, log, None))[0]
            key, scale = "throttled_usec", 1e-6
        else:
            mount = next((self.sysfs_root / "fs" / "cgroup" / m for m in ("cpu", "cpu,cpuacct", "cpuacct,cpu")
                          if (self.sysfs_root / "fs" / "cgroup" / m).is_dir()), None)
            if mount is None:
                return None
            leaf = cgroup_chain(mount, cgroup_rel(self.procfs_root, log, "cpu"))[0]
            key, scale = "throttled_time", 1e-9
        for line in (log.text(leaf / "cpu.stat", required=False) or "").splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value) * scale
        return None

    def read(self, t_s: float, log: ReadLog) -> dict[str, object]:
        """Sample fields: contention since the previous read (None the first time), PSI cpu."""
        now = self.counters(t_s, log)
        prev, self._prev = self._prev, now
        rates = contention(prev, now) if prev is not None and now is not None else None
        psi = None
        raw = log.text(self.procfs_root / "pressure" / "cpu", required=False)
        if raw is not None:
            parsed = parse_psi(raw)
            psi = parsed.get("some") if parsed else None
        return {
            "cpu_cores": now.n_cores if now is not None else None,
            "cpu_other_cores": rates.cpu_other_cores if rates else None,
            "cpu_steal_cores": rates.cpu_steal_cores if rates else None,
            "cpu_throttled_pct": rates.cpu_throttled_pct if rates else None,
            "psi_cpu_some_avg10": psi,
        }


def _psutil_percpu() -> list[tuple[float, float, float]]:
    """(user, nice, system) seconds per CPU, from psutil (macOS has no /proc/stat)."""
    import psutil

    return [(t.user, getattr(t, "nice", 0.0), t.system) for t in psutil.cpu_times(percpu=True)]


class PsutilCpuReader:
    """The same rates where there is no procfs (macOS): every core, no steal, no cgroup."""

    def __init__(self, percpu: Callable[[], list[tuple[float, float, float]]] = _psutil_percpu,
                 own_cpu: Callable[[], tuple[float, bool]] = _own_cpu_s) -> None:
        self.percpu, self.own_cpu = percpu, own_cpu
        self._prev: CpuCounters | None = None

    def read(self, t_s: float) -> dict[str, object]:
        cores = self.percpu()
        own_s, niced = self.own_cpu()
        busy = sum(u + s + (n if niced else 0.0) for u, n, s in cores)
        now = CpuCounters(t_s, len(cores), busy, None, own_s, niced=niced) if cores else None
        prev, self._prev = self._prev, now
        rates = contention(prev, now) if prev is not None and now is not None else None
        return {
            "cpu_cores": now.n_cores if now is not None else None,
            "cpu_other_cores": rates.cpu_other_cores if rates else None,
        }
