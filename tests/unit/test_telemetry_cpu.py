"""CPU contention telemetry on fake /proc and cgroup trees: other processes, steal, niced
neighbours, cgroup throttling, unknown before two readings."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge.clock import ManualClock
from edge.telemetry.cpu import LinuxCpuReader, PsutilCpuReader, contention, parse_proc_stat
from edge.telemetry.linux import LinuxSource
from edge.telemetry.readlog import ReadLog
from tests.fakesys import FakeSys

HZ = 100


def stat_text(*cpus: tuple[int, int, int, int, int, int, int, int]) -> str:
    """Per-CPU lines: (user, nice, system, idle, iowait, irq, softirq, steal) in ticks."""
    total = [sum(c[i] for c in cpus) for i in range(8)]
    lines = ["cpu  " + " ".join(map(str, total)) + " 0 0"]
    lines += [f"cpu{i} " + " ".join(map(str, c)) + " 0 0" for i, c in enumerate(cpus)]
    return "\n".join([*lines, "intr 0", "ctxt 0", ""])


class Box:
    """A fake 2-core machine whose counters tests advance by hand."""

    def __init__(self, tmp: Path, cgroup: str | None = None) -> None:
        self.fs = FakeSys(tmp)
        self.cpus = [[0] * 8, [0] * 8]
        self.own_s = 0.0
        self.niced = False
        self.throttled = 0
        self.cgroup = cgroup
        if cgroup == "v2":
            self.fs.write("sys/fs/cgroup/cgroup.controllers", "cpu memory")
            self.fs.write("proc/self/cgroup", "0::/edge.service\n")
        elif cgroup == "v1":
            self.fs.write("sys/fs/cgroup/cpu/cpu.cfs_period_us", 100000)
            self.fs.write("proc/self/cgroup", "4:cpu,cpuacct:/edge\n")
        self.flush()

    def flush(self) -> None:
        self.fs.write("proc/stat", stat_text(*[tuple(c) for c in self.cpus]))  # type: ignore[misc]
        if self.cgroup == "v2":
            self.fs.write("sys/fs/cgroup/edge.service/cpu.stat",
                          f"usage_usec 1\nnr_periods 10\nnr_throttled 2\nthrottled_usec {self.throttled}\n")
        elif self.cgroup == "v1":
            self.fs.write("sys/fs/cgroup/cpu/edge/cpu.stat",
                          f"nr_periods 10\nnr_throttled 2\nthrottled_time {self.throttled * 1000}\n")

    def run(self, cpu: int, *, user_s: float = 0.0, nice_s: float = 0.0, steal_s: float = 0.0,
            idle_s: float = 0.0) -> None:
        c = self.cpus[cpu]
        c[0] += int(user_s * HZ)
        c[1] += int(nice_s * HZ)
        c[3] += int(idle_s * HZ)
        c[7] += int(steal_s * HZ)

    def reader(self, affinity: set[int] | None = None) -> LinuxCpuReader:
        return LinuxCpuReader(self.fs.proc, self.fs.sys, own_cpu=lambda: (self.own_s, self.niced),
                              affinity=lambda: affinity, clk_tck=HZ)

    def read(self, r: LinuxCpuReader, t_s: float) -> dict[str, object]:
        self.flush()
        return r.read(t_s, ReadLog(self.fs.reader))


def test_first_reading_is_unknown_then_other_processes_are_counted(tmp_path: Path) -> None:
    box = Box(tmp_path)
    r = box.reader()
    first = box.read(r, 0.0)
    assert first["cpu_cores"] == 2 and first["cpu_other_cores"] is None  # unknown, not zero
    # one second: edge uses 1.2 s of CPU over both cores, a neighbour 0.9 s on cpu1
    box.run(0, user_s=0.8, idle_s=0.2)
    box.run(1, user_s=1.3, idle_s=0.7 - 0.0)
    box.own_s += 1.2
    got = box.read(r, 1.0)
    assert got["cpu_other_cores"] == pytest.approx(0.9)
    assert got["cpu_steal_cores"] == 0.0 and got["cpu_throttled_pct"] is None


def test_niced_neighbours_yield_and_are_not_contention_unless_edge_is_niced(tmp_path: Path) -> None:
    box = Box(tmp_path)
    r = box.reader()
    box.read(r, 0.0)
    box.run(0, nice_s=1.0)  # a niced batch job busy on cpu0
    box.run(1, user_s=1.0)
    box.own_s += 1.0  # edge on cpu1
    assert box.read(r, 1.0)["cpu_other_cores"] == pytest.approx(0.0)
    box.niced = True  # edge runs niced itself: the other niced process competes as an equal
    box.run(0, nice_s=1.0)
    box.run(1, nice_s=1.0)
    box.own_s += 1.0
    assert box.read(r, 2.0)["cpu_other_cores"] is None  # counted differently: not comparable
    box.run(0, nice_s=1.0)
    box.run(1, nice_s=1.0)
    box.own_s += 1.0
    assert box.read(r, 3.0)["cpu_other_cores"] == pytest.approx(1.0)


def test_steal_counts_as_taken_and_only_edges_cores_are_read(tmp_path: Path) -> None:
    box = Box(tmp_path)
    r = box.reader(affinity={1})  # edge is pinned to cpu1
    assert box.read(r, 0.0)["cpu_cores"] == 1
    box.run(0, user_s=1.0)  # someone busy on cpu0: not edge's core
    box.run(1, user_s=0.5, steal_s=0.4)  # the hypervisor gave 0.4 s of cpu1 to another guest
    box.own_s += 0.5
    got = box.read(r, 1.0)
    assert got["cpu_steal_cores"] == pytest.approx(0.4) and got["cpu_other_cores"] == pytest.approx(0.4)


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_cgroup_cpu_throttling_is_a_share_of_wall_time(tmp_path: Path, version: str) -> None:
    box = Box(tmp_path, cgroup=version)
    r = box.reader()
    box.read(r, 0.0)
    box.throttled += 250_000  # 0.25 s throttled by the quota in the next 0.5 s
    got = box.read(r, 0.5)
    assert got["cpu_throttled_pct"] == pytest.approx(50.0)


def test_no_proc_stat_is_unknown_without_an_error_line(tmp_path: Path) -> None:
    fs = FakeSys(tmp_path)
    log = ReadLog(fs.reader)
    got = LinuxCpuReader(fs.proc, fs.sys).read(0.0, log)
    assert got["cpu_cores"] is None and got["cpu_other_cores"] is None and log.errors == []


def test_linux_source_reports_contention_and_psi_cpu(tmp_path: Path) -> None:
    box = Box(tmp_path)
    box.fs.write("proc/pressure/cpu", "some avg10=12.50 avg60=3.00 avg300=1.00 total=1\n")
    clock = ManualClock()
    src = LinuxSource(box.fs.sys, box.fs.proc, clock=clock, reader=box.fs.reader, cpu_reader=box.reader())
    assert src.read().cpu_other_cores is None
    box.run(0, user_s=1.0)
    box.run(1, user_s=1.0)
    box.own_s += 1.0
    box.flush()
    clock.advance(1.0)
    s = src.read()
    assert s.cpu_cores == 2 and s.cpu_other_cores == pytest.approx(1.0) and s.psi_cpu_some_avg10 == 12.5


def test_psutil_reader_for_macos() -> None:
    times = {"busy": [(0.0, 0.0, 0.0), (0.0, 0.0, 0.0)]}
    own = {"s": 0.0}
    r = PsutilCpuReader(lambda: times["busy"], lambda: (own["s"], False))
    assert r.read(0.0)["cpu_other_cores"] is None
    times["busy"] = [(1.0, 0.0, 0.0), (0.5, 0.3, 0.2)]  # (user, nice, system): nice is not counted
    own["s"] = 0.9
    got = r.read(1.0)
    assert got["cpu_cores"] == 2 and got["cpu_other_cores"] == pytest.approx(0.8)


def test_parse_and_rates_edge_cases() -> None:
    text = stat_text((10, 5, 10, 0, 0, 1, 1, 3), (0, 0, 0, 0, 0, 0, 0, 0)) + "cpuX garbage\ncpu2 1 2\n"
    n, busy, steal = parse_proc_stat(text, None, HZ, niced=False)
    assert (n, busy, steal) == (2, pytest.approx(0.22), pytest.approx(0.03))
    from edge.telemetry.cpu import CpuCounters

    a = CpuCounters(0.0, 2, 0.0, 0.0, 0.0)
    assert contention(a, CpuCounters(0.01, 2, 1.0, 0.0, 0.0)) is None  # too close to compare
    assert contention(a, CpuCounters(1.0, 1, 1.0, 0.0, 0.0)) is None  # the core set changed
    capped = contention(a, CpuCounters(1.0, 2, 9.0, 0.0, 0.0))
    assert capped is not None and capped.cpu_other_cores == 2.0  # never more than the cores
